"""The GPU memory model (`memory.py`) against figures computed by hand for a Qwen2.5-7B shape, the
knobs that move it, the cells `plan` refuses, and planning from a checkpoint without weights."""

import json

import pytest
import torch
from typer.testing import CliRunner

from isoflop_cli import config, memory
from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.flops import model_shape

GIB = 2**30
runner = CliRunner()

# Qwen2.5-7B's shape, written out (nothing is downloaded).
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, VOCAB = 3584, 18944, 28, 28, 4, 152064


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory):
    """A checkpoint directory with Qwen2.5-7B's config.json and a small real tokenizer, no weights;
    and a problem file for task=dataset."""
    from transformers import Qwen2Config

    from isoflop_cli.recipe.checkpoint import char_tokenizer

    path = tmp_path_factory.mktemp("qwen2.5-7b")
    Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    problems = path.parent / "problems.jsonl"
    problems.write_text(
        "".join(
            f'{{"prompt": "What is {i} + 1?", "reward_model": {{"ground_truth": "{i + 1}"}}}}\n' for i in range(200)
        )
    )
    return path, problems


def seed_easy(qwen7b, *overrides):
    """seed-easy as shipped on the 7B directory, with the knobs the hand computations read pinned."""
    path, problems = qwen7b
    pinned = [
        "sampler.gpu_memory_utilization=0.6",
        "sampler.tensor_parallel=1",
        "learner.max_tokens_per_micro_batch=32768",
        "learner.logit_chunk_tokens=2048",
        "task.max_prompt_tokens=1024",
        "task.max_new_tokens=2048",
    ]
    return [f"model.path={path}", f"task.train={problems}", "eval.problems=16", *pinned, *overrides]


def predict(cfg, n, B_p):
    return memory.predict(
        model_shape(cfg.model).with_lora(cfg.lora.rank, cfg.lora.targets), cfg, n, B_p, cfg.task.max_prompt_tokens
    )


def test_7b_full_fine_tuning_over_8_ranks_by_hand(qwen7b):
    """bf16, activation checkpointing, KL and entropy on, vLLM TP 1 asleep while learning; n = 16,
    B_p = 64: each rank takes 8 prompt groups of 1024 + 16 x 2048 = 33,792 positions, each over the
    32,768 budget, so a micro-batch is a piece of one group: its prompt and (32,768 - 1,024) // 2,048
    = 15 completions."""
    cfg = config.load("seed-easy", seed_easy(qwen7b))
    assert (
        cfg.cluster.gpus_per_run,
        cfg.learner.world_size,
        cfg.learner.bf16,
        cfg.learner.activation_checkpointing,
    ) == (8, 8, True, True)
    m = predict(cfg, n=16, B_p=64)

    # Parameters: one layer's projections q, k, v, o (GQA: k and v 4 x 128 = 512 wide) and a gated MLP.
    layer = 3584 * 3584 + 3584 * 512 + 3584 * 512 + 3584 * 3584 + 3584 * 18944 + 3584 * 18944 + 18944 * 3584
    assert layer == 233_046_016
    rest = 2 * 152064 * 3584  # embeddings and an untied LM head
    params = 28 * layer + rest
    assert params == 7_615_283_200
    # Learner state per rank: fp32 weights, gradients, 2 AdamW states, and the bf16 reference, each / 8.
    assert m.weights * GIB == pytest.approx(4 * params / 8)
    assert m.gradients * GIB == pytest.approx(4 * params / 8)
    assert m.optimizer * GIB == pytest.approx(8 * params / 8)
    assert m.reference * GIB == pytest.approx(2 * params / 8)
    # FSDP: the root (embeddings + head) and two layers gathered in bf16; the root's bf16 gradients,
    # one layer's in bf16 and again in fp32 for the reduce-scatter.
    assert m.gathered * GIB == pytest.approx(2 * rest + 2 * 2 * layer + 2 * rest + (2 + 4) * layer)
    # The micro-batch: one prompt tree of 1024 + 15 * 2048 positions; keys: the prompt's 1024 and
    # each completion's row of 3072; masks [1024, 1024] and 15 x [2048, 3072] booleans.
    S, K, N = 1024 + 15 * 2048, 1024 + 15 * 3072, 15 * 2048
    assert (m.micro_batch.groups, m.micro_batch.tokens, m.micro_batch.keys, m.micro_batch.logit_positions) == (
        1,
        S,
        K,
        N,
    )
    masks = 1024 * 1024 + 15 * 2048 * 3072
    # One layer's saved bytes per position (bf16): 2 norms (fp32 input + bf16 output), the
    # inputs of qkv and gate/up, q + attention out + o_proj in (3 x 3584 x 2), the MLP's 4 x 18944 x 2;
    # per key position k and v repeated to 28 heads (2 x 3584 x 2).
    per_position = 2 * (4 * 3584 + 2 * 3584) + 2 * 2 * 3584 + 3 * 2 * 3584 + 4 * 2 * 18944
    assert per_position == 230_400
    one_layer = S * per_position + K * 2 * 2 * 3584
    # Checkpointing: 28 layer inputs (bf16) + one layer's internals; the final norm, the hidden
    # states at the logit positions, the residual stream's two gradients, the masks.
    activations = 28 * 2 * 3584 * S + one_layer + S * (4 * 3584 + 2 * 3584) + N * 2 * 3584 + 2 * 2 * 3584 * S + masks
    assert m.activations * GIB == pytest.approx(activations)
    # One chunk of 2048 tokens x 152064: 3 fp32 copies, 2 more for the entropy, bf16 output and gradient.
    assert m.logits * GIB == pytest.approx(2048 * 152064 * (4 * (3 + 2) + 2 * 2))
    assert m.step_tensors * GIB == pytest.approx(5 * 64 * 16 * (1024 + 2048 - 1) * 4)
    # vLLM: one engine per GPU in bf16; its share is 0.6 x 141 GiB, the KV cache what its weights and
    # its CUDA graphs (1.5 GiB, inside the share) leave; asleep while learning, it keeps the graphs.
    assert m.sampler_weights * GIB == pytest.approx(2 * params)
    assert m.engine_graphs == 1.5 and m.sampler_kept == 1.5
    assert m.kv_cache * GIB == pytest.approx(0.6 * 141 * GIB - 2 * params - 1.5 * GIB)
    # Rank 0's buffers: while sampling, the gather of 8 engines' shares of 8 prompts each (a prompt
    # token pickled in 5 bytes, a completion token in 5 + 9 with its log-prob), its own and 8 more;
    # before scoring, the broadcast of 1,024 texts of 2,048 tokens (4 bytes each) and two int64
    # [1024, 3072] tensors at once.
    gather = 9 * 8 * (1024 * 5 + 16 * 2048 * 14)
    assert m.gather_buffers * GIB == pytest.approx(gather) and gather == 33_398_784
    assert m.broadcast_buffers * GIB == pytest.approx(1024 * 2048 * 4 + 2 * 1024 * 3072 * 8)
    assert m.reward_weights == m.reward_forward == 0  # a rule scores

    resident = (4 + 4 + 8 + 2) * params / 8 + 2 * GIB
    sampling = resident + 0.6 * 141 * GIB + gather
    learning = (
        resident
        + 1.5 * GIB
        + 5 * 64 * 16 * 3071 * 4
        + 2 * rest
        + 4 * layer
        + 2 * rest
        + 6 * layer
        + activations
        + 2048 * 152064 * 24
    )
    assert (m.sampling * GIB, m.learning * GIB) == (pytest.approx(sampling), pytest.approx(learning))
    assert m.peak == pytest.approx(max(sampling, learning) / GIB) == pytest.approx(102.59, abs=0.01)
    assert m.phase == "sampling" and m.learning == pytest.approx(47.44, abs=0.01)


def test_7b_lora_on_one_gpu_by_hand(qwen7b):
    """LoRA rank 32 on every projection, one GPU (bf16: FSDP2 over one rank), KL on (the reference is
    the policy with its adapters off: no copy), vLLM with a 20 GiB KV cache; micro-batches of 16
    rows: two groups of n = 8."""
    cfg = config.load(
        "seed-easy",
        seed_easy(
            qwen7b,
            "cluster.gpus_per_run=1",
            "lora.rank=32",
            "sampler.kv_cache_gib=20",
            "learner.max_tokens_per_micro_batch=0",
            "learner.micro_batch=16",
            "task.max_prompt_tokens=512",
            "task.max_new_tokens=1024",
            "algo.entropy_coef=0",
        ),
    )
    assert (cfg.learner.world_size, cfg.algo.kl_coef > 0) == (1, True)
    m = predict(cfg, n=8, B_p=16)

    layer = 3584 * 3584 + 2 * 3584 * 512 + 3584 * 3584 + 3 * 3584 * 18944
    rest = 2 * 152064 * 3584
    params = 28 * layer + rest
    # An adapter: r x (in + out) per projection.
    adapter_layer = 32 * (
        (3584 + 3584) + (3584 + 512) + (3584 + 512) + (3584 + 3584) + (3584 + 18944) + (3584 + 18944) + (18944 + 3584)
    )
    assert adapter_layer == 2_883_584
    adapter = 28 * adapter_layer
    assert m.weights * GIB == pytest.approx(2 * params + 4 * adapter)  # frozen bf16 backbone, fp32 adapter
    assert m.gradients * GIB == pytest.approx(4 * adapter)
    assert m.optimizer * GIB == pytest.approx(8 * adapter)
    assert m.reference == 0
    assert m.gathered * GIB == pytest.approx(2 * (rest + 2 * (layer + adapter_layer)) + (2 + 4) * adapter_layer)
    S, K, N = 2 * (512 + 8 * 1024), 2 * 512 + 16 * 1536, 16 * 1024
    masks = 2 * 512 * 512 + 16 * 1024 * 1536
    assert (m.micro_batch.rows, m.micro_batch.tokens, m.micro_batch.keys) == (16, S, K)
    one_layer = S * 230_400 + K * 2 * 2 * 3584
    activations = 28 * 2 * 3584 * S + one_layer + S * 6 * 3584 + N * 2 * 3584 + 4 * 3584 * S + masks
    assert m.activations * GIB == pytest.approx(activations)
    assert m.logits * GIB == pytest.approx(2048 * 152064 * (4 * 3 + 2 * 2))  # no entropy bonus
    assert m.step_tensors * GIB == pytest.approx(5 * 16 * 8 * (512 + 1024 - 1) * 4)
    assert m.sampler_weights * GIB == pytest.approx(2 * (params + adapter))
    assert m.kv_cache * GIB == pytest.approx((20 + 1) * GIB)  # the cache and the engine's workspace
    assert m.engine_graphs == 1.5  # beside a cache given in bytes
    assert m.gather_buffers == m.broadcast_buffers == 0  # one rank: no collectives
    resident = 2 * params + 16 * adapter + 2 * GIB
    assert m.sampling * GIB == pytest.approx(resident + 2 * (params + adapter) + 21 * GIB + 1.5 * GIB)
    assert m.peak == pytest.approx(54.22, abs=0.01) and m.phase == "sampling"


def test_a_prm_cell_by_hand(qwen7b, tmp_path):
    """The 7B run of test_7b_full_fine_tuning_over_8_ranks_by_hand scored by a Qwen2.5-1.5B-shaped
    PRM (a token classifier: 28 layers, hidden 1536, MLP 8960, 12 heads over 2 key/value heads, a
    151,936-token vocabulary). Every rank holds it whole in bf16 and scores its share, 8 groups of
    16 completions of 1024 + 2048 + 1 positions, in forwards of 32,768 // 3,073 = 10 rows; a rule
    holds neither."""
    from transformers import Qwen2Config

    Qwen2Config(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        num_labels=1,
    ).save_pretrained(tmp_path / "prm")
    # the pinned knobs on the arithmetic task with steps
    steps = [a for a in seed_easy(qwen7b) if not a.startswith("task.train=")]
    cfg = config.load(
        "seed-easy", [*steps, "task=arith-steps", "task.train=null", "reward=prm", f"reward.path={tmp_path / 'prm'}"]
    )
    m = memory.predict(model_shape(cfg.model), cfg, 16, 64, 1024)
    layer = 1536 * 1536 + 2 * 1536 * 256 + 1536 * 1536 + 3 * 1536 * 8960
    # its embeddings, the head's 1536 x 1 aside
    assert m.reward_weights * GIB == pytest.approx(2 * (28 * layer + 151936 * 1536))
    rows, width = 10, 1024 + 2048 + 1
    S = rows * width
    # One layer's tensors as a learning pass keeps them (2 norms, the projections' inputs and
    # outputs, repeated keys and values over S key positions), the residual stream and the layer's
    # output, and the [width, width] boolean padding mask of each row.
    one_layer = S * (2 * (4 * 1536 + 2 * 1536) + 2 * 2 * 1536 + 3 * 2 * 1536 + 4 * 2 * 8960) + S * 2 * 2 * 1536
    assert m.reward_forward * GIB == pytest.approx(one_layer + 2 * 2 * 1536 * S + rows * width * width)
    # The scoring phase: the resident state (the PRM's weights in it), the sleeping engine's CUDA
    # graphs, rank 0's broadcast of the rollouts, one forward. Below sampling's peak here.
    assert m.scoring == pytest.approx(m.resident + 1.5 + m.broadcast_buffers + m.reward_forward)
    rule = predict(config.load("seed-easy", seed_easy(qwen7b)), 16, 64)
    assert m.resident == pytest.approx(rule.resident + m.reward_weights) and m.peak == pytest.approx(
        rule.peak + m.reward_weights
    )
    print(
        f"PRM 1.5B: weights {m.reward_weights:.2f} GiB, a forward "
        f"{m.reward_forward:.2f}; scoring {m.scoring:.2f} of a {m.peak:.2f} peak"
    )
    # A budget of 0 scores a rank's share in one forward: at n = 64, 512 rows; scoring peaks, and
    # the knob is named. With the budget, n = 64 scores in the same forwards of 10 rows.
    whole = memory.predict(
        model_shape(cfg.model), config.with_values(cfg, {"reward.max_tokens_per_forward": 0}), 64, 64, 1024
    )
    assert whole.reward_forward == pytest.approx(m.reward_forward * 512 / 10, rel=0.1) and whole.phase == "scoring"
    assert memory.predict(model_shape(cfg.model), cfg, 64, 64, 1024).reward_forward == m.reward_forward
    with pytest.raises(ConfigError, match=r"while scoring \(reward_forward .*lower reward\.max_tokens_per_forward"):
        memory.check(whole, cfg)


def test_the_7b_lora_policy_the_recipe_builds_on_one_gpu_holds_what_the_model_counts(qwen7b):
    """The policy `Trainer` builds for a 7B LoRA run on one GPU (learner.bf16), built here on the meta
    device (no weights, no GPU): a frozen bf16 backbone and fp32 adapters, whose bytes are the hand
    computation's 2 bytes a backbone parameter and 4 an adapter's (norms and biases aside), and the
    memory model's weights term, both within 5%. An fp32 backbone would hold twice that."""
    from isoflop_cli.recipe import checkpoint
    from isoflop_cli.recipe.trainer import policy_dtype, with_adapters

    cfg = config.load(
        "seed-easy", seed_easy(qwen7b, "cluster.gpus_per_run=1", "lora.rank=32", "sampler.kv_cache_gib=20")
    )
    assert cfg.learner.bf16
    _, backbone = checkpoint.load(cfg.model, cfg.task, policy_dtype(cfg), meta=True)
    policy = with_adapters(backbone, cfg.lora)
    dtypes = {("lora_" in name, p.dtype) for name, p in policy.named_parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    held = sum(p.numel() * p.element_size() for p in policy.parameters())
    params, adapter = 7_615_283_200, 28 * 2_883_584  # as in test_7b_lora_on_one_gpu_by_hand
    by_hand = 2 * params + 4 * adapter
    print(
        f"7B LoRA policy: {held / GIB:.2f} GiB held, {by_hand / GIB:.2f} "
        f"by hand, {predict(cfg, n=8, B_p=16).weights:.2f} predicted"
    )
    assert held == pytest.approx(by_hand, rel=0.05)
    assert held == pytest.approx(predict(cfg, n=8, B_p=16).weights * GIB, rel=0.05)


def test_each_knob_moves_the_prediction_as_it_claims(qwen7b):
    cfg = config.load("seed-easy", seed_easy(qwen7b))

    def at(**values):
        return predict(config.with_values(cfg, values), n=8, B_p=64)  # groups of 1024 + 8 x 2048 = 17,408 positions

    base = at()
    assert base.micro_batch.tokens == 17_408  # 32,768 holds one group
    wide = at(**{"learner.max_tokens_per_micro_batch": 65536})
    assert wide.micro_batch.tokens == 3 * 17_408 and wide.activations > 2.5 * base.activations
    assert wide.sampling == base.sampling  # the sampler does not see micro-batches
    full = at(**{"learner.activation_checkpointing": False})
    assert full.activations > 10 * base.activations and full.gathered == base.gathered
    chunk = at(**{"learner.logit_chunk_tokens": 1024})
    assert chunk.logits == pytest.approx(base.logits / 2)
    # Tensor parallel halves the engine's weights on each GPU; its share (and the sampling phase)
    # stays, the cache takes what the weights gave back. With a KV cache in bytes the phase shrinks.
    tp2 = at(**{"sampler.tensor_parallel": 2})
    assert tp2.sampler_weights == pytest.approx(base.sampler_weights / 2)
    assert tp2.kv_cache == pytest.approx(base.kv_cache + base.sampler_weights / 2)
    assert tp2.sampling - tp2.gather_buffers == pytest.approx(
        base.sampling - base.gather_buffers
    )  # 4 engines' shares gathered, not 8
    sized = at(**{"sampler.kv_cache_gib": 30.0}), at(**{"sampler.kv_cache_gib": 30.0, "sampler.tensor_parallel": 2})
    assert sized[1].sampling - sized[1].gather_buffers == pytest.approx(
        sized[0].sampling - sized[0].gather_buffers - base.sampler_weights / 2
    )
    share = at(**{"sampler.gpu_memory_utilization": 0.4})
    assert share.kv_cache == pytest.approx(base.kv_cache - 0.2 * 141) and share.sampling == pytest.approx(
        base.sampling - 0.2 * 141
    )
    awake = at(**{"sampler.sleep": False})
    assert awake.learning == pytest.approx(
        base.learning + 0.6 * 141 - 1.5
    )  # the engine's whole share stays, not only its graphs
    eager = at(**{"sampler.enforce_eager": True})
    assert (
        eager.engine_graphs == 0
        and eager.kv_cache == pytest.approx(base.kv_cache + 1.5)
        and eager.learning == pytest.approx(base.learning - 1.5)
    )
    more = config.with_values(cfg, {"cluster.gpus_per_run": 16.0, "learner.world_size": 16})
    assert predict(more, 8, 64).optimizer == pytest.approx(base.optimizer / 2)


def test_a_cell_that_cannot_fit_is_refused_with_its_knob(qwen7b):
    # Without checkpointing one prompt group's activations (17,408 positions) need ~115 GiB.
    axes = "+grid.axes={learner.activation_checkpointing:[true,false]}"
    result = runner.invoke(
        app, ["plan", "--json", "--config", "seed-easy", *seed_easy(qwen7b, "grid.n=[8]", "grid.B_p=[64]", axes)]
    )
    assert result.exit_code == 0, result.output
    on, off = json.loads(result.stdout)["cells"]
    assert on["feasible"] and on["predicted"]["gpu_memory_gib"] <= 141
    reason = off["reason"]
    assert not off["feasible"] and reason.startswith(
        "needs 147.6 GiB of cluster.gpu_memory_gib=141 per GPU while learning (activations 114.9"
    )
    assert "turn learner.activation_checkpointing on" in reason
    # Micro-batches by rows hold a prompt group whole: one of 263,168 positions cannot fit, and the
    # message names the knob that splits it.
    rows = ("grid.n=[128]", "grid.B_p=[64]", "learner.max_tokens_per_micro_batch=0", "learner.micro_batch=128")
    only = runner.invoke(app, ["plan", "--config", "seed-easy", *seed_easy(qwen7b, *rows)])
    assert only.exit_code == 2 and "no feasible cell: needs" in only.output
    assert (
        "a prompt group alone feeds 263,168 positions: set learner.max_tokens_per_micro_batch (it splits groups)"
        in " ".join(only.output.split())
    )
    # vLLM's share smaller than its own weights: refused with the two knobs that fix it.
    small = runner.invoke(
        app,
        [
            "plan",
            "--config",
            "seed-easy",
            *seed_easy(qwen7b, "grid.n=[8]", "grid.B_p=[64]", "sampler.gpu_memory_utilization=0.1"),
        ],
    )
    assert (
        small.exit_code == 2
        and "does not hold the engine's weights" in small.output
        and "sampler.tensor_parallel" in small.output
    )


def test_plan_needs_no_weights_and_no_vllm_a_sweep_needs_both(qwen7b, tmp_path):
    """The 7B directory holds config.json and tokenizer files only: `plan` plans it (vLLM need not
    import here either); `sweep` and `run` refuse it before anything starts."""
    args = seed_easy(qwen7b, "grid.n=[8,16]", "grid.B_p=[64]")
    result = runner.invoke(app, ["plan", "--json", "--config", "seed-easy", *args])
    assert result.exit_code == 0, result.output
    assert [r["predicted"]["gpu_memory_gib"] for r in json.loads(result.stdout)["cells"]] == [
        pytest.approx(102.57, abs=0.01),
        pytest.approx(102.59, abs=0.01),
    ]
    table = runner.invoke(app, ["plan", "--config", "seed-easy", *args])
    assert table.exit_code == 0 and "GiB/GPU" in table.output and "103" in table.output
    for command in (["sweep", "--root", str(tmp_path / "out")], ["run", "--run-dir", str(tmp_path / "run")]):
        refused = runner.invoke(app, [*command, "--config", "seed-easy", *args])
        assert refused.exit_code == 2 and "has no weights" in refused.output, refused.output
        assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_seed_easy_on_8_h200s(qwen7b):
    """seed-easy as shipped on the 7B config: vLLM, every GPU a learner rank, every cell within
    grid.max_batch fits in 141 GiB. A prompt group over the token budget is split into pieces of its
    completions (`Trainer.micro_batches`), so n = 2048 (4.2M positions a group at 2048 new tokens)
    learns in forwards of 15 completions, each with its prompt."""
    from isoflop_cli.grid import expand

    path, problems = qwen7b
    cfg = config.load("seed-easy", [f"model.path={path}", f"task.train={problems}", "eval.problems=16"])
    assert (cfg.sampler.name, cfg.sampler.sleep, cfg.learner.world_size, cfg.cluster.gpus_per_run) == (
        "vllm",
        True,
        8,
        8,
    )
    assert cfg.learner.bf16 and cfg.learner.activation_checkpointing and cfg.learner.max_tokens_per_micro_batch > 0
    cells = expand(cfg)
    for c in cells:
        fits_batch = c.axes["n"] * c.axes["B_p"] <= cfg.grid.max_batch
        assert c.feasible == fits_batch, (c.axes, c.reason)
        if c.feasible:
            assert c.plan.gpu_memory.peak <= 141
            micro = c.plan.gpu_memory.micro_batch
            assert micro.tokens <= cfg.learner.max_tokens_per_micro_batch
            if (
                1024 + c.axes["n"] * 2048 > 32768
            ):  # a group over the budget: pieces of (32,768 - 1,024) // 2,048 completions
                assert (micro.groups, micro.rows) == (1, 15)
    # Every cell peaks while sampling: the learner's resident 16.0 GiB, the engine's share
    # 0.6 x 141, 2 GiB overhead, and rank 0's gather of 8 engines' shares (as by hand in
    # test_7b_full_fine_tuning_over_8_ranks_by_hand); learning peaks lower.
    params = 7_615_283_200
    for c in (c for c in cells if c.feasible):
        n, B_p = c.axes["n"], c.axes["B_p"]
        gather = 9 * -(-B_p // 8) * (1024 * 5 + n * 2048 * 14)
        assert c.plan.gpu_memory.phase == "sampling"
        assert c.plan.gpu_memory.peak * GIB == pytest.approx(18 * params / 8 + 2 * GIB + 0.6 * 141 * GIB + gather)


def test_a_cpu_run_whose_learner_state_cannot_fit_the_node_is_refused(qwen7b, monkeypatch):
    """On CPU (one fp32 rank) the 7B learner holds 4 + 4 + 8 bytes a parameter (weights, gradients,
    two AdamW states) and 4 more for the KL reference: 20 x 7,615,283,200 bytes = 141.8 GiB, 142.3
    with the process's 0.5, before any activation. The node's memory is cluster.node_memory_gib, else
    this machine's where the runs run here; LoRA (a frozen fp32 backbone, no reference) fits where
    full fine-tuning does not."""
    path, problems = qwen7b
    cpu = [
        f"model.path={path}",
        f"task.train={problems}",
        "task=dataset",
        "eval.problems=16",
        "grid.n=[8]",
        "grid.B_p=[8]",
        "algo.kl_coef=0.01",
    ]

    def plan(*more):
        return runner.invoke(app, ["plan", "--json", *cpu, *more])

    params = 7_615_283_200
    need = 20 * params / GIB + 0.5
    refused = plan("cluster.node_memory_gib=128")
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert f"a CPU run's learner state alone needs {need:.1f} GiB, above the 128 GiB of cluster.node_memory_gib" in said
    assert (
        f"(weights {4 * params / GIB:.1f}, gradients {4 * params / GIB:.1f}, "
        f"AdamW states {8 * params / GIB:.1f}, KL reference "
        f"{4 * params / GIB:.1f}, processes 0.5): train LoRA adapters (lora.rank)" in said
    )
    assert plan("cluster.node_memory_gib=142.5").exit_code == 0
    assert plan("cluster.node_memory_gib=64", "lora.rank=32").exit_code == 0  # the backbone alone: 4 bytes a parameter
    # null: this machine's memory where the runs run here, unchecked on a cluster elsewhere.
    monkeypatch.setattr(memory, "this_machine_gib", lambda: 24.0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert "above the 24.0 GiB of this machine's memory" in " ".join(plan().output.split())
    assert plan("cluster.address=http://127.0.0.1:1").exit_code == 0
    assert "above the 24.0 GiB" in " ".join(
        plan("cluster.launcher=slurm", "cluster.slurm.executor=local").output.split()
    )
    assert plan("cluster.launcher=slurm").exit_code == 0


@pytest.mark.parametrize(
    "own, files, limit",
    [
        (
            "0::/user.slice/job\n",
            {"memory.max": "max", "user.slice/job/memory.max": "8589934592"},
            8589934592,
        ),  # v2, the process's own cgroup
        (
            "4:memory:/process_api/x\n1:cpu:/\n",
            {
                "memory/memory.limit_in_bytes": "9223372036854771712",
                "memory/process_api/x/memory.limit_in_bytes": "4294967296",
            },
            4294967296,
        ),  # v1
        ("0::/\n", {"memory.max": "2147483648"}, 2147483648),  # a container that sees its cgroup as the root
        ("0::/a\n", {"memory.max": "max", "a/memory.max": "max"}, None),  # no limit anywhere
        ("4:cpu,cpuacct:/a\n", {}, None),  # no memory controller named, no files
    ],
)
def test_the_memory_cgroup_limit_is_read_where_proc_self_cgroup_points(tmp_path, own, files, limit):
    (tmp_path / "cgroup").write_text(own)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text + "\n")
    assert memory.cgroup_limit(tmp_path / "cgroup", tmp_path / "fs") == limit
