"""One GRPO run in-process: deterministic on CPU, and its files."""

import itertools
import json

import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app

pytestmark = pytest.mark.slow  # every test trains the embedded model in this process

ARGS = ["n=4", "B_p=2", "grid.budgets=[32]", "grid.eval_points=2", "eval.problems=8", "eval.samples=4"]


def read(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if k not in ("wall_s", "reward_cpu_s") and not k.startswith("time_")} for r in rows
    ]  # timings vary


def test_run_is_deterministic_and_writes_its_files(tmp_path):
    runner = CliRunner()
    for name in ("a", "b"):
        result = runner.invoke(app, ["run", *ARGS, "--run-dir", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    a, b = read(tmp_path / "a"), read(tmp_path / "b")
    assert a == b
    assert [r["step"] for r in a] == [0, 2, 4]  # M = 32 // 8; eval points at 16 and 32 rollouts
    assert a[-1]["rollouts"] == 32 and a[-1]["tokens_generated"] > 0
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "finished"


@pytest.mark.parametrize(
    "updates",
    [["algo.epochs=1"], ["algo.epochs=2", "algo.minibatches=2"], ["algo.epochs=0.5"], ["lora.rank=4"], ["algo=ppo"]],
)
def test_run_ledger_agrees_with_measurement(tmp_path, updates):
    result = CliRunner().invoke(
        app, ["run", *ARGS, *updates, "flops.measure=true", "algo.kl_coef=0.1", "--run-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for part in ("search", "learning", "eval", "total"):
        assert last[f"flops_{part}"] > 0
        assert abs(last[f"flops_{part}"] - last[f"measured_flops_{part}"]) / last[f"measured_flops_{part}"] < 0.05
    assert last["flops_reward"] == last["measured_flops_reward"] == 0 and last["reward_cpu_s"] > 0
    assert last["flops_total"] == last["flops_search"] + last["flops_learning"]
    assert 0 < last["rho"] < 1 and last["rho"] == last["flops_learning"] / last["flops_total"]
    # the ledger only grows
    assert all(a["flops_total"] <= b["flops_total"] for a, b in itertools.pairwise(rows))


def test_flop_budget_run_stops_within_one_step_and_evaluates_on_the_flop_axis(tmp_path):
    from isoflop_cli import config
    from isoflop_cli.grid import plan_run, step_flops

    args = ["n=4", "B_p=2", "grid.budget.unit=flops", "grid.budgets=[1e9,3e9]", "grid.eval_points=3", "eval.problems=8"]
    result = CliRunner().invoke(app, ["run", *args, "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    cfg = config.load(None, args)
    plan, bound = plan_run(cfg), sum(step_flops(cfg))
    assert plan.column == "flops_total" and plan.limit == 3e9
    total = rows[-1]["flops_total"]
    assert 3e9 <= total < 3e9 + bound  # stopped at the first step that reached the budget
    for checkpoint in (7.5e8, 1.5e9, 3e9):  # 3e9 halved twice, and the budgets
        assert any(checkpoint <= r["flops_total"] < checkpoint + bound for r in rows), checkpoint
    assert rows[-1]["step"] > plan.M  # the plan's M is a lower bound from the upper bound per step


def test_local_checkpoint_by_path_and_gpu_hours(tmp_path):
    """Any local HF checkpoint runs by path (here the embedded model's own directory), and
    gpu_hours follows from the ledger where a device peak and utilisation are configured."""
    from isoflop_cli import config
    from isoflop_cli.recipe.checkpoint import ensure_embedded

    cfg = config.load(None, [])
    path = ensure_embedded(cfg.model, cfg.task)
    args = [*ARGS, "model=local", f"model.path={path}", "flops.peak_tflops=989", "flops.utilization=0.4"]
    result = CliRunner().invoke(app, ["run", *args, "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["gpu_hours"] == pytest.approx(last["flops_total"] / (989e12 * 0.4) / 3600)
    bad = CliRunner().invoke(app, ["run", *ARGS, "flops.peak_tflops=989"])
    assert bad.exit_code == 2 and "flops.utilization" in bad.output


@pytest.mark.parametrize(
    "algo",
    [
        ["algo=dr_grpo"],
        ["algo=cispo", "algo.epochs=2"],
        ["algo.loss_agg=seq-mean-token-mean", "algo.filter_zero_variance=true"],
        ["algo=ppo", "learner.micro_batch=3"],
        ["learner.activation_checkpointing=true", "lora.rank=4"],
    ],
)
def test_algorithms_run(tmp_path, algo):
    result = CliRunner().invoke(app, ["run", *ARGS, *algo, "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4 and all(r["train_loss"] is not None for r in rows[1:])


def test_a_fractional_epoch_learns_from_a_share_of_each_group(tmp_path):
    """algo.epochs=0.5 samples what one epoch samples and learns from half of each group's
    completions: the same search FLOPs and rollouts; learning FLOPs between half and the whole (the
    prompt tree keeps every prompt once: P + 2T positions per group instead of P + 4T); rho lower.
    The ledger's exactness against FlopCounterMode at epochs=0.5 is test_run_ledger_agrees_with_measurement."""
    rows = {}
    for epochs in ("1", "0.5"):
        result = CliRunner().invoke(app, ["run", *ARGS, f"algo.epochs={epochs}", "--run-dir", str(tmp_path / epochs)])
        assert result.exit_code == 0, result.output
        rows[epochs] = read(tmp_path / epochs)[1]  # the first step: same sampled batch (same seed, same weights)
    whole, half = rows["1"], rows["0.5"]
    assert (half["rollouts"], half["flops_search"], half["tokens_generated"]) == (
        whole["rollouts"],
        whole["flops_search"],
        whole["tokens_generated"],
    )
    assert 0.5 < half["flops_learning"] / whole["flops_learning"] < 0.8 and half["rho"] < whole["rho"]
    bad = CliRunner().invoke(app, ["plan", "algo.epochs=1.5"])
    assert bad.exit_code == 2 and "algo.epochs must be whole passes" in bad.output


@pytest.mark.parametrize(
    "updates",
    [
        [],
        ["algo.epochs=2", "algo.kl_coef=0.1"],
        ["algo.epochs=0.5"],
        ["algo=ppo"],
        ["lora.rank=4"],
        ["learner.shared_prompt=false"],
    ],
)
def test_plan_and_run_assemble_a_step_s_flops_the_same_way(tmp_path, updates):
    """Where every prompt has the same width and every completion the full task.max_new_tokens
    (two-digit operands, one new token), a step's measured sizes are the plan's bounds: the run's
    ledger is the plan's step cost times the steps, part for part (both call flops.step_cost).
    Sizes alone count, not what the weights say: the embedded model for two-digit operands is
    warm-started for one step (built in a second, not the 800-step build of a task variant)."""
    from isoflop_cli import config
    from isoflop_cli.grid import step_flops

    args = [
        "n=4",
        "B_p=2",
        "task.digits=[2]",
        "task.max_new_tokens=1",
        "model.build.steps=1",
        "grid.budgets=[24]",
        "grid.eval_points=1",
        "eval.problems=8",
        *updates,
    ]
    result = CliRunner().invoke(app, ["run", *args, "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    search, learning, reward = step_flops(config.load(None, args))
    assert last["step"] == 3 and last["tokens_generated"] == 24
    assert (last["flops_search"], last["flops_learning"], last["flops_reward"]) == pytest.approx(
        (3 * search, 3 * learning, 3 * reward), rel=1e-12
    )


def test_the_embedded_default_learns_to_stop_after_its_answer(tmp_path):
    """The embedded study's cell n=2, B_p=8 (README: 0.689 -> 0.920 at 2,048 rollouts on 256 problems),
    cut to 64 validation problems: GRPO lifts validation avg@4 well above the base, and what it
    learns is to stop: the share of completions longer than their answer falls."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            "n=2",
            "B_p=8",
            "grid.budgets=[2048]",
            "grid.eval_points=2",
            "eval.problems=64",
            "--run-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [r for r in read(tmp_path) if r.get("val_avg@k") is not None]
    base, last = rows[0], rows[-1]
    assert last["rollouts"] == 2048
    assert last["val_avg@k"] - base["val_avg@k"] > 0.12, (base["val_avg@k"], last["val_avg@k"])
    assert last["tokens_generated"] / last["rollouts"] < rows[1]["tokens_generated"] / rows[1]["rollouts"]


def test_a_fractional_epoch_learns_from_each_group_s_most_varied_rewards(tmp_path, monkeypatch):
    """In a run at algo.epochs=0.5 (n = 4, two of each group learned from), every step's learned
    completions are two of their group's, with their own rewards, whose variance is the largest of
    any two (brute force over the sampled group)."""
    from isoflop_cli.recipe.trainer import Trainer

    seen, arrange = [], Trainer.arrange

    def spy(self, batch):
        before = (batch.rewards.clone(), list(batch.sampled.texts))
        arrange(self, batch)
        seen.append((*before, batch.rewards.clone(), list(batch.rollouts.texts)))

    monkeypatch.setattr(Trainer, "arrange", spy)
    result = CliRunner().invoke(app, ["run", *ARGS, "algo.epochs=0.5", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(seen) == 4
    for rewards, texts, reordered, learned in seen:
        for g in range(rewards.shape[0]):
            group = list(zip(texts[4 * g : 4 * g + 4], rewards[g].tolist()))
            kept = list(zip(learned[2 * g : 2 * g + 2], reordered[g, :2].tolist()))
            assert all(pair in group for pair in kept)
            best = max(abs(a - b) for (_, a), (_, b) in itertools.combinations(group, 2))
            assert abs(kept[0][1] - kept[1][1]) == best
