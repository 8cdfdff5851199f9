"""`sampler=vllm` for real, on vLLM's CPU build: the engine's rollouts against the HF sampler and the
learner, weight pushes after real optimizer steps (a tied head among them), LoRA, seeding, two
ranks each with an engine (external launcher) sampling their shares, and a GRPO sweep through a
real local Ray head. Runs in the vLLM environment (`make setup-vllm`; `make test` runs it there),
except the start-up checks at the top, which read no vLLM."""

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import run_isoflop


@pytest.mark.parametrize("installed", ["0.32.0", "0.32.0+cpu", "0.32.0+cu129"])
def test_the_pinned_vllm_starts(installed):
    from isoflop_cli.recipe.vllm_sampler import check_version

    check_version(installed)  # a build's local tag aside, the version the sampler is written against


@pytest.mark.parametrize("installed", ["0.11.0", "0.33.0", "0.32.1", "0.32.0.post1"])
def test_another_vllm_is_refused_in_one_line_naming_both_versions(installed):
    from isoflop_cli.recipe.vllm_sampler import check_version

    with pytest.raises(RuntimeError) as raised:
        check_version(installed)
    said = str(raised.value)
    assert "\n" not in said and "vLLM 0.32.0" in said and f"vLLM {installed}" in said, said


def test_no_vllm_is_refused_with_how_to_install_it(monkeypatch):
    from isoflop_cli import vllm_pin
    from isoflop_cli.recipe import vllm_sampler

    monkeypatch.setattr(vllm_pin, "DISTRIBUTIONS", ("no-such-distribution",))
    assert vllm_pin.installed_version() is None
    with pytest.raises(RuntimeError, match=r"needs vLLM 0\.32\.0 on the node: pip install 'isoflop\[vllm\]'"):
        vllm_sampler.check_version(None)


def test_another_vllm_where_the_runs_start_exits_2_before_any_compute(monkeypatch, tmp_path):
    """`isoflop run` reads the runs' vLLM version before it starts anything: this Python's (faked here),
    or cluster.python's (a stand-in interpreter that answers the probe with its version)."""
    from typer.testing import CliRunner

    from isoflop_cli import vllm_pin
    from isoflop_cli.cli import app

    monkeypatch.setattr(vllm_pin, "here", lambda: "0.11.0")
    stand_in = tmp_path / "python"
    stand_in.write_text("#!/bin/sh\necho 0.31.1+cu129\n")
    stand_in.chmod(0o755)
    for overrides, where in (([], "this environment has vLLM 0.11.0"), ([f"cluster.python={stand_in}"], "0.31.1")):
        result = CliRunner().invoke(app, ["run", "sampler=vllm", "--run-dir", str(tmp_path / "runs"), *overrides])
        line = result.output.strip()
        assert result.exit_code == 2 and "\n" not in line, result.output
        assert "needs vLLM 0.32.0" in line and where in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "rank, engine", [(1, 1), (2, 8), (4, 8), (8, 8), (12, 16), (32, 32), (100, 128), (300, 320), (512, 512)]
)
def test_the_engines_max_lora_rank_is_the_next_one_vllm_accepts(rank, engine):
    from isoflop_cli.recipe.vllm_sampler import max_lora_rank

    assert max_lora_rank(rank) == engine


def test_a_lora_rank_above_what_vllm_serves_is_refused():
    from isoflop_cli.errors import ConfigError
    from isoflop_cli.recipe.vllm_sampler import max_lora_rank

    with pytest.raises(ConfigError, match=r"lora\.rank=600 is above the largest LoRA rank vLLM serves \(512\)"):
        max_lora_rank(600)


PROMPTS = ["12+34=", "7+8=", "5+61="]
N, T, MAX_NEW = 4, 1.0, 6


@pytest.fixture(scope="module")
def tiny():
    from isoflop_cli import config
    from isoflop_cli.recipe import checkpoint

    cfg = config.load()
    tokenizer, model = checkpoint.load(cfg.model, cfg.task)
    return cfg, checkpoint.model_path(cfg.model, cfg.task), tokenizer, model


def engine(tiny, lora_rank: int = 0):
    from isoflop_cli.recipe.vllm_sampler import VllmSampler

    cfg, path, tokenizer, _ = tiny
    lora = copy.deepcopy(cfg.lora)
    lora.rank = lora_rank
    return VllmSampler(path, cfg.sampler, lora, tokenizer, seed=0, max_len=32)


@pytest.fixture(scope="module")
def full(tiny):
    return engine(tiny)


def learner_logprobs(model, rollouts) -> torch.Tensor:
    from isoflop_cli.recipe.learner import Actor, Layout

    with torch.no_grad():
        return Actor(model)(Layout.plain(rollouts.sequences, rollouts.attention_mask, rollouts.prompt_width), T).logp


def gap(model, rollouts) -> float:
    """The largest difference between the engine's and the learner's log-prob of a sampled token."""
    on = rollouts.completion_mask[:, 1:].bool()
    return float((learner_logprobs(model, rollouts) - rollouts.logprobs)[on].abs().max())


@pytest.mark.vllm
def test_vllm_rollouts_keep_the_hf_samplers_contract(tiny, full):
    from isoflop_cli.recipe.sampler import HFSampler

    _, _, tokenizer, model = tiny
    torch.manual_seed(0)
    ours = full.sample(PROMPTS, N, T, 1.0, MAX_NEW)
    hf = HFSampler(model, tokenizer).sample(PROMPTS, N, T, 1.0, MAX_NEW)
    assert ours.sequences.shape[0] == hf.sequences.shape[0] == len(PROMPTS) * N
    assert (ours.prompt_width, ours.prefill_rows) == (hf.prompt_width, hf.prefill_rows)
    assert torch.equal(ours.sequences[:, : ours.prompt_width], hf.sequences[:, : hf.prompt_width])  # the same tokens in
    completion, attention = ours.completion_mask.bool(), ours.attention_mask.bool()
    assert (attention | ~completion).all() and ours.generated_width <= MAX_NEW
    width = ours.prompt_width
    for row, mask, text in zip(ours.sequences, completion[:, width:], ours.texts):
        tokens = row[width:][mask].tolist()
        assert mask.tolist() == sorted(mask.tolist(), reverse=True)  # a completion, then padding
        assert tokenizer.eos_token_id not in tokens[:-1]  # ends at its first eos (or at MAX_NEW)
        assert text == tokenizer.decode(tokens, skip_special_tokens=True)
    assert torch.equal(ours.logprobs[~completion[:, 1:]], torch.zeros_like(ours.logprobs[~completion[:, 1:]]))
    assert gap(model, ours) < 1e-4  # the engine's log-probs are the learner's on the same weights


@pytest.mark.vllm
def test_same_seed_same_rollouts(full):
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(full.sample(PROMPTS * 4, N, T, 1.0, MAX_NEW).sequences)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


@pytest.mark.vllm
def test_evaluation_seeds_keep_a_prompts_completions_independent_of_its_batch(full):
    """Why evaluation keeps a seed per prompt on vLLM (`evaluate.stream_seeds`) rather than one seed for
    the batch: with its seed a prompt's completions are the same sampled alone or among 63 others (as
    an engine's share of a smaller or larger run would hold it, or another policy's batch whose rows
    finish at other steps), so evaluation stays paired across runs and engine counts. One seed for
    the batch is deterministic too, but a row's draws then depend on its place in the batch: the same
    prompt alone draws other completions."""
    prompts = [f"{a}+3=" for a in range(10, 74)]
    seeds = [1000 + 7 * i for i in range(len(prompts))]

    def texts(chosen: list[int], per_prompt: bool, generator_seed: int) -> list[str]:
        torch.manual_seed(generator_seed)  # the request's batch-level seed comes from here
        picked = [prompts[i] for i in chosen]
        return full.sample(picked, 8, T, 1.0, 24, seeds=[seeds[i] for i in chosen] if per_prompt else None).texts

    everyone = list(range(len(prompts)))
    assert texts(everyone, True, 0)[5 * 8 : 6 * 8] == texts([5], True, 1)
    batch = texts(everyone, False, 7)
    assert batch == texts(everyone, False, 7)  # a batch-level seed: deterministic for a fixed engine and seed
    assert batch[5 * 8 : 6 * 8] != texts([5], False, 7)  # but not batch-independent


@pytest.mark.vllm
def test_a_learner_step_reaches_the_engine(tiny, full):
    """After real AdamW steps and `load_weights`, the engine samples from the learner's new policy."""
    from isoflop_cli.recipe.learner import Actor, Layout

    _, _, _, base = tiny
    model = copy.deepcopy(base)
    actor = Actor(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(1)
    for _ in range(3):
        r = full.sample(PROMPTS, N, T, 1.0, MAX_NEW)
        out = actor(Layout.plain(r.sequences, r.attention_mask, r.prompt_width), T)
        loss = -(out.logp * r.completion_mask[:, 1:]).sum()  # make what was sampled likelier
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        full.load_weights(model.state_dict().items())
    r = full.sample(PROMPTS, N, T, 1.0, MAX_NEW)
    assert gap(base, r) > 1e-2  # the old weights no longer explain the engine's log-probs
    assert gap(model, r) < 1e-4
    full.load_weights(base.state_dict().items())  # the shared engine goes back to the base model


@pytest.mark.vllm
def test_a_tied_heads_weights_reach_the_engine(tiny, full):
    """The embedded model ties its head to its embedding (the push through a safetensors file
    crashed on that: "Some tensors share memory"). Streamed, the tensor comes once, as the
    embedding, and the engine's head follows it."""
    from isoflop_cli.recipe.distributed import stream_weights

    _, _, _, base = tiny
    model = copy.deepcopy(base)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)  # the embedding, hence the head: nothing else changes
    names = [name for name, _ in stream_weights(model, trainable_only=False, dtype=torch.float32)]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    full.load_weights(stream_weights(model, trainable_only=False, dtype=torch.float32))
    (embedding,) = full.llm.apply_model(
        lambda m: m.model.embed_tokens.weight.detach().clone()
    )  # the vocabulary padded to 64 rows
    assert torch.equal(embedding[: model.config.vocab_size], model.model.embed_tokens.weight)
    torch.manual_seed(4)
    r = full.sample(PROMPTS, N, T, 1.0, MAX_NEW)
    assert gap(model, r) < 1e-4 and gap(base, r) > 1e-2
    full.load_weights(base.state_dict().items())  # the shared engine goes back to the base model


def _two_engines(group, out: str) -> None:
    """One rank of two, each with an engine: what its engine was asked to sample, and on rank 0 what
    came back, before and after a push from an FSDP2-sharded learner (the tied embedding scaled)."""
    from isoflop_cli import config
    from isoflop_cli.recipe import checkpoint, distributed
    from isoflop_cli.recipe.vllm_sampler import VllmSampler

    cfg = config.load()
    tokenizer, base = checkpoint.load(cfg.model, cfg.task)
    sampler = VllmSampler(
        checkpoint.model_path(cfg.model, cfg.task), cfg.sampler, cfg.lora, tokenizer, seed=0, max_len=32, group=group
    )
    asked = []  # each request's prompt ids, as this rank's engine got them
    generate = sampler.llm.generate
    sampler.llm.generate = lambda prompts, *args, **kwargs: (
        asked.append([p["prompt_token_ids"] for p in prompts]),
        generate(prompts, *args, **kwargs),
    )[1]
    learner = copy.deepcopy(base)
    with torch.no_grad():
        learner.model.embed_tokens.weight.mul_(1.5)
    changed = copy.deepcopy(learner)
    distributed.shard(learner, bf16=False)
    found = {"asked": asked}
    if group.is_main:
        torch.manual_seed(5)
        same = sampler.sample(["12+34="] * 4, N, T, 1.0, MAX_NEW)  # two copies for each engine
        before = sampler.sample(PROMPTS, N, T, 1.0, MAX_NEW)
        sampler.release()
    else:
        sampler.serve()
    sampler.load_weights(distributed.stream_weights(learner, trainable_only=False, dtype=torch.float32))
    if group.is_main:
        after = sampler.sample(PROMPTS, N, T, 1.0, MAX_NEW)
        sampler.release()
        half = 2 * N
        found.update(
            rows=[same.sequences.shape[0], before.sequences.shape[0]],
            engines_differ=not torch.equal(same.sequences[:half], same.sequences[half:]),
            gaps=[gap(base, before), gap(changed, after), gap(base, after)],
        )
    else:
        sampler.serve()
    sampler.close()
    Path(out, f"rank{group.rank}.json").write_text(json.dumps(found))


@pytest.mark.vllm
def test_two_ranks_each_sample_their_share_with_an_engine_of_their_own(tiny, tmp_path):
    """learner.world_size=2 with vLLM: each rank's engine (external launcher, in the rank's process,
    joined to the run's gloo group) samples a contiguous share of rank 0's prompts, seeded apart
    from the other's; rank 0 gets every row in prompt order; a push streamed from an FSDP2 learner
    reaches both engines."""
    from isoflop_cli.recipe import distributed

    _, _, tokenizer, _ = tiny
    distributed.launch(_two_engines, 2, str(tmp_path), timeout_s=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    ids = [tokenizer.encode(p) for p in PROMPTS]
    same = [tokenizer.encode("12+34=")] * 2
    assert ranks[0]["asked"] == [same, ids[:2], ids[:2]] and ranks[1]["asked"] == [
        same,
        ids[2:],
        ids[2:],
    ]  # PROMPTS split 2 + 1
    zero = ranks[0]
    assert zero["rows"] == [4 * N, len(PROMPTS) * N] and zero["engines_differ"]
    before, after_new, after_old = zero["gaps"]
    assert (
        before < 1e-4 and after_new < 1e-4 and after_old > 1e-2
    )  # the engines' log-probs are the learner's, on both engines' rows


@pytest.mark.vllm
def test_lora_updates_reuse_one_adapter(tiny):
    from peft import LoraConfig, get_peft_model

    cfg, _, _, base = tiny
    sampler = engine(tiny, lora_rank=4)
    policy = get_peft_model(
        copy.deepcopy(base),
        LoraConfig(r=4, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.targets), init_lora_weights=False),
    )
    torch.manual_seed(2)
    assert gap(base, sampler.sample(PROMPTS, N, T, 1.0, MAX_NEW)) < 1e-4  # no adapter yet: the base model
    for _ in range(2):  # the second push overwrites the first, and the engine reloads it
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.add_(0.2 * torch.randn_like(p))
        sampler.load_weights((k, v.detach()) for k, v in policy.named_parameters() if v.requires_grad)
        r = sampler.sample(PROMPTS, N, T, 1.0, MAX_NEW)
        # An adapter this far from the base (~10 nats a token) makes large activations: vLLM's CPU
        # LoRA kernels and the learner then differ by up to ~3e-4 on a few draws (2 of 20 random
        # adapters, with the old per-request seeds too); still 4 orders below the base's gap.
        assert gap(policy, r) < 1e-3 and gap(base, r) > 1
    assert sorted(p.name for p in sampler.scratch.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


@pytest.mark.vllm
def test_bad_vllm_settings_are_one_line_and_exit_2():
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    cases = {
        ("sampler.kv_cache_gib=0",): "sampler.kv_cache_gib must be > 0",
        ("flops.measure=true",): "measure with sampler=hf",
        ("sampler.tensor_parallel=2",): "needs that many GPUs",
    }
    for overrides, message in cases.items():
        result = CliRunner().invoke(app, ["plan", "sampler=vllm", *overrides])
        assert result.exit_code == 2 and message in result.output, (overrides, result.output)
    for ok in ([], ["learner.world_size=2"]):  # two ranks on the CPU: an engine each
        assert CliRunner().invoke(app, ["plan", "sampler=vllm", *ok]).exit_code == 0


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.vllm
def test_two_ranks_with_vllm_give_the_losses_of_one_process(tmp_path):
    """learner.world_size=2, an engine per rank, against one process with one engine: the first 3
    steps' losses within 1e-4 (the two-rank FSDP test's tolerance), rewards and tokens equal.

    Two engines draw other tokens than one (each seeds its own share: the fast batched sampler has
    no per-prompt streams), so sampling is made deterministic: top_p so small that the nucleus is
    the likeliest token. Each group's samples are then equal and their advantages zero; the loss is
    the KL and entropy terms', over the same tokens only if both engines sampled their shares from
    pushed weights and rank 0 put the rows back in prompt order (rewards would differ otherwise)."""
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    args = [
        "n=4",
        "B_p=4",
        "eval.problems=8",
        "eval.samples=4",
        "grid.budgets=[16,32,48]",
        "grid.eval_points=1",
        "algo.kl_coef=0.1",
        "algo.entropy_coef=0.01",
        "algo.minibatches=2",
        "algo.top_p=1e-6",
        "sampler=vllm",
    ]
    for ws in (1, 2):
        result = CliRunner().invoke(
            app, ["run", *args, f"learner.world_size={ws}", "--run-dir", str(tmp_path / f"ws{ws}")]
        )
        assert result.exit_code == 0, result.output
    one, two = metrics(tmp_path / "ws1"), metrics(tmp_path / "ws2")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3]
    for a, b in zip(one[1:], two[1:]):
        for key in ("train_loss", "kl", "entropy", "tis"):
            assert abs(a[key] - b[key]) < 1e-4, (a["step"], key, a[key], b[key])
        assert abs(a["entropy"]) > 0.05
        same = ("train_reward_mean", "val_avg@k", "tokens_generated", "flops_search")
        assert [a[k] for k in same] == [b[k] for k in same]


@pytest.mark.vllm
def test_a_paused_two_rank_run_continues_as_if_never_stopped(tmp_path):
    """Two ranks, an engine each, sampling at the run's temperature: paused after its first step
    (a checkpoint), then continued by fresh processes with fresh engines, the run's rows equal an
    uninterrupted run's. Each engine's draws come from rank 0's checkpointed generator, and a
    request's tokens do not depend on what the engine ran before (a fresh engine's empty prefix
    cache, the other's warm one)."""
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    args = [
        "sampler=vllm",
        "learner.world_size=2",
        "n=4",
        "B_p=4",
        "eval.problems=4",
        "eval.samples=4",
        "grid.budgets=[16,32]",
        "grid.eval_points=1",
        "algo.kl_coef=0.1",
    ]
    for out, extra in (("paused", ["--pause-at", "16"]), ("paused", []), ("whole", [])):
        result = CliRunner().invoke(app, ["run", *args, *extra, "--run-dir", str(tmp_path / out)])
        assert result.exit_code == 0, result.output
        if extra:  # stopped after step 1, its state kept for the next attempt
            assert metrics(tmp_path / out)[-1]["step"] == 1 and (tmp_path / out / "checkpoint").is_dir()
    rows = {
        out: [
            {k: v for k, v in r.items() if not k.startswith("time_") and k not in ("wall_s", "reward_cpu_s")}
            for r in metrics(tmp_path / out)
        ]
        for out in ("paused", "whole")
    }
    assert [r["step"] for r in rows["whole"]] == [0, 1, 2] and rows["paused"] == rows["whole"]


@pytest.mark.vllm
def test_grpo_sweep_with_vllm_through_a_local_ray_head(tmp_path):
    args = [
        "sweep",
        "--root",
        str(tmp_path),
        "sampler=vllm",
        "grid.n=[4]",
        "grid.B_p=[4]",
        "grid.budgets=[48]",
        "grid.eval_points=2",
        "eval.problems=16",
        "eval.samples=4",
    ]
    result = run_isoflop(*args, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = tmp_path / "default"
    df = pd.read_parquet(sweep / "results.parquet")
    assert df["step"].max() == 3 and (df["rollouts"] == df["step"] * 16).all()
    assert df["val_avg@k"].notna().all() and (df["flops_search"] > 0).sum() == len(df) - 1
    (run_dir,) = (sweep / "runs").iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert "vllm" in (run_dir / "job.log").read_text().lower()
