"""The FLOP ledger: hand-computed values, supported architectures, and the truth check against
torch's FlopCounterMode (within 5% per part, as the ledger promises) on two model shapes."""

import contextlib
import functools
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
from typer.testing import CliRunner

import isoflop_cli.recipe.measure  # noqa: F401  (registers the CPU attention formulas)
from isoflop_cli import flops
from isoflop_cli.cli import app
from isoflop_cli.recipe.checkpoint import char_tokenizer
from isoflop_cli.recipe.learner import Actor, Layout, pack, tree_pieces, tree_tokens
from isoflop_cli.recipe.sampler import HFSampler

TINY = flops.Shape(layers=1, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10)


def test_decode_steps_count_only_the_rows_still_running():
    """A row that said eos leaves the batch: decode step t counts the rows still running, each one
    token over prompt + t keys (brute force), and every row at every step is the bound plan uses."""
    prefill = flops.forward(TINY, 4, 3, 3, 1).total
    expected = prefill + flops.forward(TINY, 3, 1, 4, 1).total + flops.forward(TINY, 1, 1, 5, 1).total
    assert flops.generate(TINY, 4, 3, 3, decode_rows=(3, 1)) == pytest.approx(expected, rel=1e-12)
    assert flops.generate(TINY, 4, 3, 3, decode_rows=(4, 4)) == pytest.approx(flops.generate(TINY, 4, 3, 3), rel=1e-12)
    with pytest.raises(ValueError, match="decode_rows has 1 steps"):
        flops.generate(TINY, 4, 3, 3, decode_rows=(4,))


def test_forward_hand_computed():
    # per token: q 4x4 + k,v 2x(4x2) + o 4x4 + MLP 3x(4x8) = 16 + 16 + 16 + 96 = 144 MACs
    assert TINY.linear_macs == 144
    f = flops.forward(TINY, rows=1, query_len=3, key_len=3, logit_positions=1)
    assert f.linear == 2 * 3 * 144
    assert f.attention == 2 * 3 * (2 * 2 * 2 * 3)  # QK^T and AV: 2 heads x head_dim 2 x 3 keys, twice
    assert f.head == 2 * 1 * 4 * 10
    # generate: prefill of 3, then 2 decode steps over 4 and 5 keys
    expected = f.total + sum(flops.forward(TINY, 1, 1, k, 1).total for k in (4, 5))
    assert flops.generate(TINY, 1, 3, 3) == expected
    # learning: forward + 2x linear and head + 2.5x attention per epoch; reference and old policy add a forward each
    t = flops.forward(TINY, 2, 5, 5, 5)
    step = 3 * (t.linear + t.head) + 3.5 * t.attention
    rows = flops.plain_work(2, 5)
    assert rows == (10, 50)
    assert flops.learning(TINY, *rows) == pytest.approx(step)
    assert flops.learning(TINY, *rows, reference=True) == pytest.approx(step + t.total)
    assert flops.learning(TINY, *rows, epochs=3, reference=True, old_policy=True) == pytest.approx(
        3 * step + 2 * t.total
    )
    # logits at 4 of the 10 positions: the head's share shrinks to 4/10, forward and backward
    head = 2 * 4 * 4 * 10
    assert flops.learning(TINY, *rows, logits=4) == pytest.approx(3 * (t.linear + head) + 3.5 * t.attention)
    # a prompt tree: 2 prompts (width 3) of 2 completions (rows 5 wide), 14 positions; attention:
    # 3 x 3 per prompt, 2 x 5 per completion
    assert flops.tree_work(2, 2, 3, 5, 14) == (14, 2 * 9 + 4 * 10)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "mistral"])
def test_supported_families(model_type):
    config = {
        "model_type": model_type,
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 100,
    }
    shape = flops.Shape.from_config(config)
    assert (shape.head_dim, shape.kv_heads) == (8, 2)
    assert flops.Shape.from_config({**config, "head_dim": 16}).head_dim == 16  # Qwen3 sets it explicitly
    # Sizes the ledger would miscount or crash on (fuzzed): a bool is an int in Python, a string or a
    # negative count is no count.
    for bad, needle in (
        ({"hidden_size": True}, "lacks hidden_size"),
        ({"num_key_value_heads": "x"}, "num_key_value_heads='x'"),
        ({"head_dim": -8}, "head_dim=-8"),
    ):
        with pytest.raises(flops.UnsupportedModel, match=needle):
            flops.Shape.from_config({**config, **bad})


def test_unsupported_architecture_is_an_error(tmp_path):
    with pytest.raises(flops.UnsupportedModel, match="gpt2"):
        flops.Shape.from_config({"model_type": "gpt2"})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    result = CliRunner().invoke(app, ["plan", f"model.path={tmp_path}"])
    assert result.exit_code == 2 and "gpt2" in result.output


def test_a_supported_family_whose_config_lacks_a_size_names_what_it_lacks(tmp_path):
    """A config.json of a supported family without its sizes (a hand-edited one, or a multimodal
    checkpoint's outer config that nests them) is one line naming the keys, not a TypeError."""
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64})
    )
    result = CliRunner().invoke(app, ["plan", f"model.path={tmp_path}"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "lacks intermediate_size, num_attention_heads, vocab_size" in result.output


def models():
    tok = char_tokenizer()
    common = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    yield (
        "qwen2, GQA, tied",
        tok,
        Qwen2Config(
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            **common,
        ),
    )
    yield (
        "llama, GQA, untied",
        tok,
        LlamaConfig(
            hidden_size=96,
            intermediate_size=200,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            **common,
        ),
    )


def measured(fn) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


LORA_CASES = {
    "full fine-tuning": (0, ()),
    "LoRA, all projections": (4, flops.PROJECTIONS),
    "LoRA, o and down only": (4, ("o_proj", "down_proj")),
}


@pytest.mark.parametrize("lora", list(LORA_CASES))
@pytest.mark.parametrize("name", ["qwen2, GQA, tied", "llama, GQA, untied"])
def test_ledger_matches_flop_counter(name, lora):
    _, tok, config = next(m for m in models() if m[0] == name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    rank, targets = LORA_CASES[lora]
    shape = flops.Shape.from_config(model.config).with_lora(rank, targets)
    if rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=8, target_modules=list(targets), lora_dropout=0.0))
    reference_off = model.disable_adapter if rank else contextlib.nullcontext
    box = {}
    for shared in (False, True):  # each row prefilled, or each prompt once for its group
        sampler = HFSampler(model, tok, shared_prefill=shared)
        search = measured(
            lambda sampler=sampler: box.update(r=sampler.sample(["12+34=", "5+6=", "70+8="], 4, 1.0, 1.0, 6))
        )
        r = box["r"]
        assert r.prefill_rows == (3 if shared else 12)
        analytic = flops.generate(shape, 12, r.prompt_width, r.generated_width, r.prefill_rows, r.decode_rows)
        assert abs(search - analytic) / search < 0.05
    actor = Actor(model)
    layouts = {
        "plain": Layout.plain(r.sequences, r.attention_mask, r.prompt_width),
        "tree": Layout.tree(r.sequences, r.attention_mask, r.prompt_width, 4),
    }
    tokens = r.tokens_generated
    work = {
        "plain": flops.plain_work(*r.sequences.shape),
        "tree": flops.tree_work(
            3, 4, r.prompt_width, r.sequences.shape[1], tree_tokens(r.attention_mask, r.prompt_width, 4)
        ),
    }
    assert work["tree"][0] == layouts["tree"].input_ids.numel()

    def learn(reference, layout):
        logp = actor(layout, 1.0).logp
        if reference:
            with torch.no_grad(), reference_off():
                actor(layout, 1.0)
        logp.sum().backward()

    for reference in (False, True):
        for name, layout in layouts.items():  # every row whole, or each prompt group as one sequence
            learning = measured(functools.partial(learn, reference, layout))
            analytic = flops.learning(shape, *work[name], reference=reference, logits=tokens)
            assert analytic == pytest.approx(learning, rel=1e-9), (reference, name)

    # A token budget below every group's positions: each group learns in pieces of its rows, each a
    # tree with the group's prompt once more; the ledger counts the repeated prompts (`trees`).
    P, L = r.prompt_width, r.sequences.shape[1]
    shared, own = r.attention_mask[::4, :P].sum(-1), r.attention_mask[:, P:].sum(-1).view(3, 4)
    budget = int((shared + own.sum(-1)).min()) - 1
    split = torch.arange(12).split(pack(shared, own, budget))
    trees = tree_pieces(r.attention_mask, P, 4, budget)
    assert len(split) == int(trees.sum()) > 3
    learning = measured(
        lambda: [
            learn(False, Layout.tree(r.sequences[idx], r.attention_mask[idx], P, min(4, len(idx)))) for idx in split
        ]
    )
    work = flops.tree_work(3, 4, P, L, tree_tokens(r.attention_mask, P, 4, trees), int(trees.sum()))
    assert flops.learning(shape, *work, logits=tokens) == pytest.approx(learning, rel=1e-9)


def test_grouped_query_attention_counts_as_its_query_heads():
    """torch < 2.13 asserted on SDPA with fewer key/value heads than query heads (seen on a GPU with
    torch 2.11); measure's formulas count a query head's two products whichever head it shares."""
    from torch.utils import flop_counter

    q, kv, full = (2, 14, 7, 64), (2, 2, 9, 64), (2, 14, 9, 64)
    product = 2 * 14 * 2 * 7 * 9 * 64  # one [7 x 64] @ [64 x 9] (or [7 x 9] @ [9 x 64]) per batch row and query head
    assert (
        flop_counter.sdpa_flop_count(q, kv, kv) == flop_counter.sdpa_flop_count(q, full, full) == 2 * product
    )  # QK^T, AV
    # backward: the scores recomputed, dP and dV, dQ and dK
    assert (
        flop_counter.sdpa_backward_flop_count(q, q, kv, kv)
        == flop_counter.sdpa_backward_flop_count(q, q, full, full)
        == 5 * product
    )
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.scaled_dot_product_attention(
            torch.randn(q), torch.randn(kv), torch.randn(kv), enable_gqa=True
        )
    assert counter.get_total_flops() == 2 * product


def test_monotone_in_n_and_kl():
    shape = flops.Shape(layers=4, hidden=128, intermediate=512, heads=4, kv_heads=2, head_dim=32, vocab=17)
    assert flops.generate(shape, 8 * 16, 6, 4) > flops.generate(shape, 8 * 8, 6, 4)
    rows = flops.plain_work(64, 10)
    assert flops.learning(shape, *rows, reference=True) > flops.learning(shape, *rows, reference=False)
    assert flops.learning(shape, *rows, epochs=2, old_policy=True) > flops.learning(shape, *rows)
    lora = shape.with_lora(8, flops.PROJECTIONS)
    assert flops.learning(lora, *rows) < flops.learning(shape, *rows)  # no weight gradients for the backbone
    assert flops.learning(shape, *flops.tree_work(8, 8, 6, 10, 8 * (6 + 8 * 4))) < flops.learning(shape, *rows)
    assert flops.generate(lora, 64, 6, 4) > flops.generate(shape, 64, 6, 4)  # the adapters run when sampling too


@pytest.mark.parametrize(
    "budget, shared, per_row, k",
    [(0, 5, 4, 8), (100, 5, 4, 8), (20, 5, 4, 8), (7, 5, 4, 8), (3, 0, 4, 8), (16, 0, 4, 8)],
)
def test_plan_splits_a_group_at_the_bound_as_the_learner_does(budget, shared, per_row, k):
    """flops.piece_rows (plan and the memory model, no torch) against learner.pieces on a group
    whose rows all run to the bound: the same rows a piece."""
    from isoflop_cli.recipe.learner import pieces

    split = pieces(shared, [per_row] * k, budget) if budget else [k]
    assert flops.piece_rows(budget, shared, per_row, k) == split[0]
    assert len(split) == -(-k // split[0])


def test_a_ledger_adds_step_costs_and_defines_total_and_rho_once():
    from isoflop_cli.flops import Ledger, StepCost

    ledger = Ledger().add(StepCost(3.0, 6.0, 1.0), steps=4).add(StepCost(1.0, 2.0, 0.0))
    assert ledger.columns() == {
        "flops_search": 13.0,
        "flops_learning": 26.0,
        "flops_reward": 4.0,
        "flops_total": 43.0,
        "rho": 26 / 43,
    }
    assert Ledger.of(ledger.columns()) == ledger and Ledger().rho is None
    assert list(StepCost(1.0, 2.0, 3.0)) == [1.0, 2.0, 3.0]  # the manifest's order


def test_a_plans_prediction_is_its_bound_times_the_measured_scale():
    from isoflop_cli import config
    from isoflop_cli.grid import plan_run

    cfg = config.load(None, ["grid.budget.unit=flops", "grid.budgets=[1e11]"])
    bound, scaled = plan_run(cfg), plan_run(cfg, flops_scale=0.5)
    assert scaled.step_bound == bound.step_bound and scaled.step_flops.total == 0.5 * bound.step_bound.total
    assert scaled.M >= 2 * bound.M - 1  # a FLOP budget buys more steps at half the predicted cost
    assert scaled.predicted_flops["flops_total"] == scaled.M * scaled.step_flops.total
    assert scaled.predicted_flops["rho"] == bound.step_bound.learning / bound.step_bound.total
