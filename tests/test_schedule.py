"""The adaptive schedule: its rule on hand-computed curves, replays of full grids with a known
n*(C), and a run paused at a budget that continues exactly as if it had never stopped."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.fit.data import RUN
from isoflop_cli.fit.replay import replay
from isoflop_cli.schedule import DEFAULT_MARGIN, Schedule, decide, noise

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_replay import synthetic  # noqa: E402

runner = CliRunner()


def curves(values: dict[str, list[float]], computes=(0, 0.5, 1, 2, 4, 8)) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": r, "rollouts": c, "val_avg@k": v} for r, ys in values.items() for c, v in zip(computes, ys)])


def test_the_rule_by_hand():
    """Budget 8 of 64 (3 doublings left), margin 0. `slowing` and `leader` rose less over their last
    doubling than over the one before: each is bounded by its own last gain (0.05). `late` is still
    speeding up: it is bounded by the fastest last gain of any cell (its own 0.08)."""
    points = curves({"slowing": [0.1, 0.15, 0.2, 0.4, 0.5, 0.55], "late": [0.1, 0.1, 0.1, 0.1, 0.12, 0.2], "leader": [0.1, 0.3, 0.5, 0.7, 0.8, 0.85]})
    got = {d.run: d for d in decide(points, 8, 64, margin=0.0)}
    assert got["slowing"].reach == pytest.approx(0.55 + 3 * 0.05) and not got["slowing"].go  # 0.70 < 0.85
    assert got["late"].reach == pytest.approx(0.2 + 3 * 0.08) and not got["late"].go  # 0.44 < 0.85
    assert got["leader"].reach == pytest.approx(0.85 + 3 * 0.05) and got["leader"].go
    assert {d.frontier for d in got.values()} == {0.85}
    # A margin of m noise sd adds m * sigma to every reach, and a cell counts as slowing down only
    # when its gain fell by more than that: with 2 sd (0.06 here) the leader's fall from 0.1 to 0.05
    # is noise, so it too is bounded by the fastest gain.
    sigma = noise(points, "val_avg@k", "rollouts", "run_id")
    assert 0.025 < sigma < 0.035
    loose = {d.run: d for d in decide(points, 8, 64, margin=2.0)}
    assert loose["leader"].reach == pytest.approx(0.85 + 3 * 0.08 + 2 * sigma)
    assert loose["late"].reach == pytest.approx(0.2 + 3 * 0.08 + 2 * sigma) and not loose["late"].go


def test_noise_is_read_from_second_differences():
    rng = np.random.default_rng(0)
    computes = [0] + [2.0**i for i in range(12)]
    flat = {f"r{i}": list(0.5 + rng.normal(0, 0.03, len(computes))) for i in range(20)}
    assert noise(curves(flat, computes), "val_avg@k", "rollouts", "run_id") == pytest.approx(0.03, rel=0.15)
    assert noise(curves({"a": [0.1, 0.2, 0.3]}, (0, 1, 2)), "val_avg@k", "rollouts", "run_id") is None  # too few to read
    # ... and then no cell is stopped, however far behind
    assert all(d.go for d in decide(curves({"a": [0.1, 0.1, 0.1], "b": [0.1, 0.9, 0.95]}, (0, 1, 2)), 2, 64, 0.0))


@pytest.mark.parametrize("noise_sd", [0.005, 0.02, 0.05])
def test_replay_keeps_the_frontier_of_a_grid_whose_n_star_rises_for_less_compute(noise_sd):
    """Synthetic full grids whose n*(C) rises from 4 to 64 and saturates (scripts/bench_replay.py)."""
    df = synthetic(noise_sd).assign(**{RUN: lambda d: d["run_id"]})
    r = replay(df, "val_avg@k", "n", "rollouts", Schedule.adaptive, DEFAULT_MARGIN)
    assert r.n_star_agreement >= 0.9 and r.max_value_gap <= 0.01
    assert r.compute_share < 0.9 and len(r.stopped) > 0
    stars = list(r.per_budget["full_star"])
    assert stars[0] == 4 and stars[-1] in (32, 64)  # the truth, 64, read through the noise
    # The share is what the stops imply: a stopped cell spends its compute at the budget it stopped at.
    full = df.groupby(RUN)["rollouts"].max()
    spent = full.copy()
    for s in r.stopped.itertuples():
        spent[s.run] = df[(df[RUN] == s.run) & (df["rollouts"] <= s.stopped_at * 1.1)]["rollouts"].max()
    assert r.compute_share == pytest.approx(spent.sum() / full.sum())
    assert (r.per_budget["cells_running"].diff().dropna() <= 0).all()
    # No margin would stop too early: the cells that win late are lost
    assert replay(df, "val_avg@k", "n", "rollouts", Schedule.adaptive, 0.0).max_value_gap > 0.01


def test_full_schedule_and_an_infinite_margin_stop_nothing():
    df = synthetic(0.02).assign(**{RUN: lambda d: d["run_id"]})
    for r in (replay(df, "val_avg@k", "n", "rollouts", Schedule.full, 0.0), replay(df, "val_avg@k", "n", "rollouts", Schedule.adaptive, 1e9)):
        assert r.compute_share == 1.0 and r.stopped.empty and r.n_star_agreement == 1.0 and r.max_value_gap == 0.0


def test_replay_command_writes_its_figures(tmp_path):
    path = tmp_path / "results.parquet"
    synthetic(0.02).to_parquet(path)
    result = runner.invoke(app, ["replay", str(path)], terminal_width=100)
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "replay" / "replay.json").read_text())
    assert {"compute_share", "n_star_agreement", "max_value_gap", "per_budget", "stopped_cells"} <= set(written)
    assert written["margin"] == DEFAULT_MARGIN and written["schedule"] == "adaptive"
    assert len(written["per_budget"]) == 10 and written["per_budget"][-1]["budget"] == 2.0**20
    assert (tmp_path / "replay" / "replay.png").stat().st_size > 1000
    assert "of the full grid's" in result.output
    for args, needle in ((["--schedule", "fast"], "--schedule"), (["--margin", "-1"], "--margin"), (["--budgets", "1,x"], "--budgets")):
        bad = runner.invoke(app, ["replay", str(path), *args])
        assert bad.exit_code == 2 and needle in bad.output, bad.output


@pytest.mark.parametrize("args, needle", [(["grid.schedule=adaptive", "grid.budgets=[64]"], "two or more"),
                                          (["grid.margin=-1"], "grid.margin"), (["grid.schedule=soon"], "grid.schedule")])
def test_bad_schedule_settings_are_one_line(args, needle):
    result = runner.invoke(app, ["plan", *args])
    assert result.exit_code == 2 and needle in result.output, result.output


RUN_ARGS = ["n=4", "B_p=2", "grid.budgets=[16,32]", "grid.eval_points=3", "eval.problems=8", "eval.samples=4"]


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("wall_s", "reward_cpu_s") and not k.startswith("time_")} for r in rows]  # timings vary


def test_a_paused_run_continues_as_if_it_never_stopped(tmp_path):
    whole = runner.invoke(app, ["run", *RUN_ARGS, "--out", str(tmp_path / "whole")])
    assert whole.exit_code == 0, whole.output
    paused = runner.invoke(app, ["run", *RUN_ARGS, "--pause-at", "16", "--out", str(tmp_path / "staged")])
    assert paused.exit_code == 0, paused.output
    status = json.loads((tmp_path / "staged" / "status.json").read_text())
    assert status["state"] == "paused" and status["paused_at"] == 16 and status["rollouts"] == 16
    assert (tmp_path / "staged" / "checkpoint").is_dir()
    assert [r["rollouts"] for r in metrics(tmp_path / "staged")] == [0, 8, 16]
    again = runner.invoke(app, ["run", *RUN_ARGS, "--out", str(tmp_path / "staged")])
    assert again.exit_code == 0 and "resumed from the checkpoint at step 2" in again.output, again.output
    assert metrics(tmp_path / "staged") == metrics(tmp_path / "whole")
    assert json.loads((tmp_path / "staged" / "status.json").read_text())["state"] == "finished"
    assert not (tmp_path / "staged" / "checkpoint").exists()
    assert math.isclose(metrics(tmp_path / "whole")[-1]["rollouts"], 32)
