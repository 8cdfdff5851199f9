"""The learner's two layouts: the prompt tree built by hand, and the same log-probs, entropies,
values and gradients as the plain rows on a random model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

from isoflop_cli.recipe.learner import Actor, Layout, pack, pieces, token_logprobs, tree_pieces, tree_tokens

# Two prompts (width 3, the first left-padded) with two completions each (width 3, eos = 1, pad = 0).
SEQ = torch.tensor(
    [
        [0, 5, 6, 10, 11, 1],
        [0, 5, 6, 12, 1, 0],
        [7, 8, 9, 13, 1, 0],
        [7, 8, 9, 1, 0, 0],
    ]
)
ATTN = torch.tensor(
    [
        [0, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0],
    ]
)


def test_tree_layout_by_hand():
    assert tree_tokens(ATTN, 3, 2) == 13  # 2 + 3 + 2 and 3 + 2 + 1
    t = Layout.tree(SEQ, ATTN, 3, 2)
    # the groups one after the other: prompt, completions; no padding
    assert t.input_ids.tolist() == [[5, 6, 10, 11, 1, 12, 1, 7, 8, 9, 13, 1, 1]]
    assert t.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3, 4, 3]]
    tree = t.prompt_tree
    # attention reads the rows back as the rollout holds them (positions in the sequence; padding: 0)
    assert tree.prompt.tolist() == [[0, 0, 1], [7, 8, 9]] and tree.prompt_on.tolist() == [
        [False, True, True],
        [True] * 3,
    ]
    assert tree.rows.tolist() == [[0, 0, 1, 2, 3, 4], [0, 0, 1, 5, 6, 0], [7, 8, 9, 10, 11, 0], [7, 8, 9, 12, 0, 0]]
    assert torch.equal(tree.rows_on, ATTN.bool())
    # each position's output: prompt slots 0..5 (group * 3 + slot), completion slots 6 + row * 3 + t
    assert tree.source.tolist() == [1, 2, 6, 7, 8, 9, 10, 3, 4, 5, 12, 13, 15]
    # each completion token's logits come from the prompt's last position (first token) or the token before
    assert t.picked.tolist() == [1, 2, 3, 1, 5, 9, 10, 9]
    assert t.targets.tolist() == [10, 11, 1, 12, 1, 13, 1, 1]
    assert t.dest[0].tolist() == [0, 0, 0, 1, 1, 2, 2, 3] and t.dest[1].tolist() == [2, 3, 4, 2, 3, 2, 3, 2]


def test_plain_layout_picks_the_completion_positions():
    p = Layout.plain(SEQ, ATTN, 3)
    assert p.input_ids is SEQ and p.out_shape == (4, 5)
    assert p.picked.tolist() == [2, 3, 4, 8, 9, 14, 15, 20]
    assert p.targets.tolist() == [10, 11, 1, 12, 1, 13, 1, 1]


COMMON = dict(
    vocab_size=16,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    pad_token_id=0,
    eos_token_id=1,
)
CONFIGS = {
    "qwen2": Qwen2Config(**COMMON),
    # sliding windows of 3 positions (the rows are 5 long): one layer of two, and every layer
    "qwen2, one sliding layer": Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=3, max_window_layers=1),
    "mistral, sliding": MistralConfig(**COMMON, sliding_window=3),
}


@pytest.mark.parametrize("value_head", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tree_gives_the_plain_outputs_and_gradients(name, value_head):
    torch.manual_seed(0)
    actor = Actor(AutoModelForCausalLM.from_config(CONFIGS[name], attn_implementation="sdpa"), value_head=value_head)
    if value_head:
        torch.nn.init.normal_(actor.value_head.weight)
    results = {}
    for layout_name, layout in (("plain", Layout.plain(SEQ, ATTN, 3)), ("tree", Layout.tree(SEQ, ATTN, 3, 2))):
        actor.zero_grad()
        out = actor(layout, 0.7, with_entropy=True, with_values=value_head)
        loss = (out.logp * torch.arange(1, 6)).sum() + out.entropy.sum() + (out.values.sum() if value_head else 0)
        loss.backward()
        results[layout_name] = out, {k: p.grad.clone() for k, p in actor.named_parameters()}
    (plain, plain_grads), (tree, tree_grads) = results["plain"], results["tree"]
    on = ATTN[:, 3:].bool()
    assert plain.logp[:, 2:][on].abs().min() > 0 and plain.logp[:, :2].abs().max() == 0  # completion tokens only
    for field in ("logp", "entropy", "values") if value_head else ("logp", "entropy"):
        torch.testing.assert_close(getattr(tree, field), getattr(plain, field), atol=1e-5, rtol=0)
    for k, g in plain_grads.items():
        torch.testing.assert_close(tree_grads[k], g, atol=5e-5, rtol=1e-4)  # float32 sums in another order


def test_the_window_matters_here():
    """The sliding-window cases above compare something: a window of 3 changes the plain rows' log-probs."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["mistral, sliding"], attn_implementation="sdpa")
    windowed = Actor(model)(Layout.plain(SEQ, ATTN, 3), 1.0).logp
    model.config.sliding_window = None
    assert (Actor(model)(Layout.plain(SEQ, ATTN, 3), 1.0).logp - windowed).abs().max() > 1e-3


def test_tree_needs_sdpa():
    model = AutoModelForCausalLM.from_config(CONFIGS["qwen2"], attn_implementation="eager")
    with pytest.raises(ValueError, match="needs SDPA"):
        Actor(model)(Layout.tree(SEQ, ATTN, 3, 2), 1.0)


def assert_within(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-6) -> None:
    """Within `tol`, relative to the largest entry where that is above 1: a weight's gradient sums
    over every position, and chunks change the order of that float32 sum."""
    assert (got - want).abs().max() <= tol * max(1.0, want.abs().max().item()), (got - want).abs().max()


def brute_force(head, hidden, targets, T):
    """log pi(target) and the entropy from the whole [N, vocab] log-softmax at once."""
    logprobs = torch.log_softmax(head(hidden) / T, dim=-1)
    return logprobs.gather(-1, targets[:, None]).squeeze(-1), -(logprobs.exp() * logprobs).sum(-1)


@pytest.mark.parametrize(
    "chunk", [7, 60, 300, 1000]
)  # 300 / 7 leaves 6, 60 divides 300; one chunk of all, one over all
def test_chunked_logprobs_and_entropy_equal_one_pass_and_so_do_their_gradients(chunk):
    torch.manual_seed(0)
    N, H, V, T = 300, 32, 1000, 0.7
    head = torch.nn.Linear(H, V, bias=False)
    hidden, targets = torch.randn(N, H, requires_grad=True), torch.randint(V, (N,))
    a, b = torch.randn(N), torch.randn(N)  # a loss that weighs every position's log-prob and entropy differently
    grads = {}
    for name, fn in (
        ("chunked", lambda: token_logprobs(head, hidden, targets, T, chunk, with_entropy=True)),
        ("brute force", lambda: brute_force(head, hidden, targets, T)),
    ):
        logp, entropy = fn()
        hidden.grad, head.weight.grad = None, None
        ((a * logp).sum() + (b * entropy).sum()).backward()
        grads[name] = logp.detach(), entropy.detach(), hidden.grad, head.weight.grad
    for got, want in zip(grads["chunked"], grads["brute force"]):
        assert_within(got, want)
    assert grads["chunked"][2].abs().max() > 1e-3 and grads["chunked"][3].abs().max() > 1e-3
    assert token_logprobs(head, hidden, targets, T, chunk)[1] is None


def test_a_chunked_pass_saves_no_logits_for_backward_and_recomputes_them_a_chunk_at_a_time():
    """What autograd saves for backward (the tensors saved_tensors_hooks packs, each distinct
    storage at its whole size) stays under one chunk's fp32 logits: the chunks' inputs, views of
    the [N, hidden] states and the targets. One pass over all N saves more than its own [N, vocab]
    (the hooks see those: the measure can fail). The LM head never sees more than a chunk of
    positions, in forward or in backward, where each chunk's logits are recomputed."""
    torch.manual_seed(0)
    N, H, V, T, chunk = 300, 16, 8192, 0.7, 64
    head = torch.nn.Linear(H, V, bias=False)
    rows = []  # positions per call of the head
    head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    measured = {}
    for name, size in (("chunked", chunk), ("one pass", N)):
        saved = {}

        def pack(x: torch.Tensor, saved: dict = saved) -> torch.Tensor:
            saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
            return x

        hidden = torch.randn(N, H, requires_grad=True)
        rows.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            logp, entropy = token_logprobs(head, hidden, torch.randint(V, (N,)), T, size, with_entropy=True)
        forward = list(rows)
        (logp.sum() + entropy.sum()).backward()
        measured[name] = sum(saved.values()), forward, rows[len(forward) :]
    (chunked, forward, backward), (whole, whole_forward, whole_backward) = measured["chunked"], measured["one pass"]
    assert (
        chunked <= N * H * 4 + N * 8 < chunk * V * 4 < N * V * 4 < whole
    )  # at most the hidden states (float32) and targets (int64)
    assert (
        forward == [64, 64, 64, 64, 44] and backward == forward[::-1]
    )  # backward recomputes each chunk, the last first
    assert whole_forward == [N] and whole_backward == []  # one chunk: nothing recomputed


LARGE_VOCAB = dict(COMMON, vocab_size=512, tie_word_embeddings=True)


@pytest.mark.parametrize("lora", [False, True])
def test_the_actor_gives_the_same_outputs_and_gradients_in_chunks(lora):
    """A tied-embedding model, fully trained or through LoRA adapters (the head frozen), with a value
    head: chunks of 3 tokens against one chunk, on both layouts."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**LARGE_VOCAB), attn_implementation="sdpa")
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=4, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0, init_lora_weights=False
            ),
        )
    actor = Actor(model, value_head=True)
    torch.nn.init.normal_(actor.value_head.weight)
    trained = {k: p for k, p in actor.named_parameters() if p.requires_grad}
    for layout in (Layout.plain(SEQ, ATTN, 3), Layout.tree(SEQ, ATTN, 3, 2)):
        results = {}
        for chunk in (3, len(layout.targets)):
            actor.logit_chunk = chunk
            actor.zero_grad()
            out = actor(layout, 0.7, with_entropy=True, with_values=True)
            (out.logp * torch.arange(1, 6)).sum().add(out.entropy.sum()).add(out.values.sum()).backward()
            results[chunk] = out, {k: p.grad.clone() for k, p in trained.items()}
        (chunked, chunked_grads), (whole, whole_grads) = results.values()
        for field in ("logp", "entropy", "values"):
            assert_within(getattr(chunked, field), getattr(whole, field))
        for k, g in whole_grads.items():
            assert_within(chunked_grads[k], g)
        assert all(g.abs().max() > 0 for g in whole_grads.values())
        assert any("lora_" in k for k in whole_grads) == lora


def test_groups_pack_in_order_up_to_the_budget_and_split_past_it():
    # Groups of k = 2 rows: prompt (shared) positions and each row's; groups of 5, 4, 11 and 3 positions.
    shared, rows = torch.tensor([1, 1, 2, 1]), torch.tensor([[2, 2], [1, 2], [4, 5], [1, 1]])
    assert pack(shared, rows, 9) == [4, 1, 1, 2]  # 5 + 4; 11 over the budget: 2 + 4, then 2 + 5; 3
    assert pack(shared, rows, 100) == [8]
    assert pack(torch.zeros(3, dtype=torch.long), torch.full((3, 2), 4), 8) == [
        2,
        2,
        2,
    ]  # plain rows: no shared positions
    assert pieces(1, [3, 3, 3, 9, 1], 7) == [2, 1, 1, 1]  # 1 + 3 + 3; 1 + 3; 9 alone, over the budget; 1 + 1
    # ATTN as trees of 2 (test_tree_layout_by_hand): prompts of 2 and 3, completions [3, 2] and [2, 1].
    assert tree_pieces(ATTN, 3, 2, 0).tolist() == [1, 1] and tree_pieces(ATTN, 3, 2, 6).tolist() == [
        2,
        1,
    ]  # 2 + 3 + 2 = 7 > 6
    assert tree_tokens(ATTN, 3, 2, tree_pieces(ATTN, 3, 2, 6)) == 2 * 2 + 3 + 8  # the first prompt twice


@pytest.mark.vllm  # run in .venv-vllm, whose transformers (5.19) has only `gradient_checkpointing_enable`
def test_activation_checkpointing_turns_on_under_either_transformers_name():
    """`checkpoint.activation_checkpointing` under the transformers of vLLM's environment (the name
    the GPU image's 5.17 has too; .venv's 5.25 takes the new name, in the engine tests): the forward
    keeps a fraction of the bytes for backward (layers recompute theirs), and the gradients are a
    plain backward's."""
    from isoflop_cli.recipe import checkpoint

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Qwen2Config(
            vocab_size=19,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_cache=False,
        )
    ).train()
    ids = torch.randint(3, 19, (2, 8))

    def backward() -> tuple[int, list[torch.Tensor]]:
        """Bytes the forward saved for backward, and the gradients."""
        saved = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        model.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return saved[0], [p.grad.clone() for p in model.parameters()]

    plain_bytes, plain = backward()
    checkpoint.activation_checkpointing(model)
    checked_bytes, checked = backward()
    assert checked_bytes < plain_bytes / 4  # 17.7 KB against 185 KB with transformers 5.25
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, checked))
