"""`sampler=vllm` for real, on vLLM's CPU build: the engine's rollouts against the HF sampler and the
learner, weight pushes after real optimizer steps, LoRA, seeding, and a GRPO sweep through a real
local Ray head. Runs in the vLLM environment (`make setup-vllm`; `make test` runs it there)."""

import copy
import json
import subprocess
import sys

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.vllm

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


def test_same_seed_same_rollouts(full):
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(full.sample(PROMPTS * 4, N, T, 1.0, MAX_NEW).sequences)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


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
        full.load_weights(model.state_dict())
    r = full.sample(PROMPTS, N, T, 1.0, MAX_NEW)
    assert gap(base, r) > 1e-2  # the old weights no longer explain the engine's log-probs
    assert gap(model, r) < 1e-4
    full.load_weights(base.state_dict())  # the shared engine goes back to the base model


def test_lora_updates_reuse_one_adapter(tiny):
    from peft import LoraConfig, get_peft_model

    cfg, _, _, base = tiny
    sampler = engine(tiny, lora_rank=4)
    policy = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.targets),
                                                            init_lora_weights=False))
    torch.manual_seed(2)
    assert gap(base, sampler.sample(PROMPTS, N, T, 1.0, MAX_NEW)) < 1e-4  # no adapter yet: the base model
    for _ in range(2):  # the second push overwrites the first, and the engine reloads it
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.add_(0.2 * torch.randn_like(p))
        sampler.load_weights({k: v.detach() for k, v in policy.named_parameters() if v.requires_grad})
        r = sampler.sample(PROMPTS, N, T, 1.0, MAX_NEW)
        assert gap(policy, r) < 1e-4 and gap(base, r) > 1e-2
    assert sorted(p.name for p in sampler.scratch.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


def test_bad_vllm_settings_are_one_line_and_exit_2():
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    cases = {
        ("sampler.kv_cache_gib=0",): "sampler.kv_cache_gib must be > 0",
        ("flops.measure=true",): "measure with sampler=hf",
        ("sampler.tensor_parallel=2",): "needs that many GPUs",
        ("learner.world_size=2",): "sampler=vllm with learner.world_size > 1 needs GPUs",
    }
    for overrides, message in cases.items():
        result = CliRunner().invoke(app, ["plan", "sampler=vllm", *overrides])
        assert result.exit_code == 2 and message in result.output, (overrides, result.output)
    assert CliRunner().invoke(app, ["plan", "sampler=vllm"]).exit_code == 0


def test_grpo_sweep_with_vllm_through_a_local_ray_head(tmp_path):
    args = ["sweep", "--out", str(tmp_path), "sampler=vllm", "grid.n=[4]", "grid.B_p=[4]", "grid.budgets=[48]", "grid.eval_points=2",
            "eval.problems=16", "eval.samples=4"]
    result = subprocess.run([sys.executable, "-m", "isoflop_cli", *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = tmp_path / "default"
    df = pd.read_parquet(sweep / "results.parquet")
    assert df["step"].max() == 3 and (df["rollouts"] == df["step"] * 16).all()
    assert df["val_avg@k"].notna().all() and (df["flops_search"] > 0).sum() == len(df) - 1
    (run_dir,) = (sweep / "runs").iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert "vllm" in (run_dir / "job.log").read_text().lower()
