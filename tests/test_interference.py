"""`isoflop fit --method interference`: per-problem shares that rose, fell and regressed, checked by
hand, and the trend in n recovered from synthetic sweeps with a known share of regressions."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.fit.data import RUN
from isoflop_cli.fit.interference import intervals

runner = CliRunner()


def test_shares_by_hand():
    # pass rates of 3 problems at steps 0, 1, 2 (4 samples each):
    #   a: 0, .5, .25   rises, then falls; solved at step 1, so it regressed by step 2
    #   b: 1, 1, 1      never changes
    #   c: 1, .25, 1    falls (regressed: solved at step 0), then rises
    correct = {"a": [0, 2, 1], "b": [4, 4, 4], "c": [4, 1, 4]}
    rows = [{RUN: "r", "step": s, "problem_id": p, "correct": c[s], "samples": 4} for p, c in correct.items() for s in range(3)]
    got = intervals(pd.DataFrame(rows)).set_index("step")
    assert got.loc[1, ["rose", "fell"]].tolist() == pytest.approx([1 / 3, 1 / 3])
    assert got.loc[1, "solved_at_start"] == 2 and got.loc[1, "regressed"] == pytest.approx(1 / 2)  # b and c were solved; c regressed
    assert got.loc[2, ["rose", "fell"]].tolist() == pytest.approx([1 / 3, 1 / 3])
    assert got.loc[2, "solved_at_start"] == 2 and got.loc[2, "regressed"] == pytest.approx(1 / 2)  # a and b were solved; a regressed


def synthetic_sweep(path, fall: dict[int, float], runs: int = 4, problems: int = 200, steps: int = 8, seed: int = 0):
    """Runs whose solved problems each fall below 0.5 with probability fall[n] per interval (and
    unsolved ones get solved with probability 0.3): a known share of regressions per n."""
    rng = np.random.default_rng(seed)
    results, records = [], []
    for n, p_fall in fall.items():
        for r in range(runs):
            run_id = f"n{n}_r{r}"
            solved = rng.random(problems) < 0.5
            for step in range(steps):
                if step:
                    u = rng.random(problems)
                    solved = np.where(solved, u >= p_fall, u < 0.3)
                records += [{"run_id": run_id, "step": step, "problem_id": f"p{j}", "correct": 4 if s else 1, "samples": 4} for j, s in enumerate(solved)]
                results.append({"run_id": run_id, "n": n, "B_p": 4, "step": step, "rollouts": 64 * step, "val_avg@k": solved.mean()})
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(results).to_parquet(path / "results.parquet")
    pd.DataFrame(records).to_parquet(path / "problems.parquet")
    return path


def fit(path, *args):
    result = runner.invoke(app, ["fit", str(path), "--method", "interference", "--out", str(path / "fit"), *args])
    assert result.exit_code == 0, result.output
    return json.loads((path / "fit" / "fit.json").read_text())["interference"], result


def test_fewer_regressions_with_larger_n_is_recovered(tmp_path):
    entry, result = fit(synthetic_sweep(tmp_path / "s", {2: 0.3, 8: 0.1, 32: 0.02}))
    by_n = {v["n"]: v for v in entry["per_value"]}
    for n, p in ((2, 0.3), (8, 0.1), (32, 0.02)):
        assert by_n[n]["regressed"] == pytest.approx(p, abs=0.03)  # solved problems falling, per interval
        low, high = by_n[n]["regressed_interval90"]
        assert low <= by_n[n]["regressed"] <= high
    assert entry["fewer_regressions_with_larger_n"] is True and entry["trend_p_value"] < 0.01
    assert entry["interval90"]["slope_regressed_per_log2_n"][1] < 0
    assert entry["compute_upto"] == 64 * 7 and len(entry["per_run"]) == 12
    assert "fewer regressions" in result.output
    for suffix in (".png", ".svg"):
        assert (tmp_path / "s" / "fit" / f"interference{suffix}").stat().st_size > 1000
    assert "## interference" in (tmp_path / "s" / "fit" / "report.md").read_text()


def test_no_trend_is_called_rarely_when_n_does_not_matter(tmp_path):
    """With the same regression rate at every n, a trend is called (permutation p < 0.1) in few of
    10 synthetic sweeps (at the test's level, about 1)."""
    from isoflop_cli.fit.data import FitSpec, load
    from isoflop_cli.fit.interference import interference_method, load_problems

    called = 0
    for seed in range(10):
        path = synthetic_sweep(tmp_path / f"s{seed}", {2: 0.1, 8: 0.1, 32: 0.1}, runs=6, seed=seed)
        df, _ = load([path])
        entry = interference_method(df, FitSpec(bootstrap=50), load_problems([path])).entry
        called += entry["fewer_regressions_with_larger_n"] is not None
    assert called <= 2


def test_missing_per_problem_records_exit_2(tmp_path):
    path = synthetic_sweep(tmp_path / "s", {2: 0.1, 8: 0.1})
    (path / "problems.parquet").unlink()
    result = runner.invoke(app, ["fit", str(path), "--method", "interference"])
    assert result.exit_code == 2 and "no problems.parquet" in result.output
