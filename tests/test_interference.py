"""`isoflop fit --method interference`: a problem regresses only when a binomial test on its counts
says so; silent on null sweeps where every problem's true pass rate only rises and small n takes
more steps; known regression rates recovered at equal compute and at equal steps."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.interference import changes, interference_method

runner = CliRunner()
ROLLOUTS = np.r_[0, 256 * 2.0 ** np.arange(8)]  # eval points: the base, then 256 .. 32,768 rollouts
SAMPLES = 8


def test_regressed_and_rose_by_hand():
    counts = {
        "drop": [8, 8, 8, 0, 0, 0],
        "noise": [4, 3, 5, 3, 4, 3],
        "rise": [0, 1, 0, 7, 8, 8],
        "blip": [6, 6, 0, 6, 6, 6],
    }
    rows = [
        {RUN: "r", "step": s, "problem_id": p, "correct": c[s], "samples": SAMPLES}
        for p, c in counts.items()
        for s in range(6)
    ]
    got = changes(pd.DataFrame(rows)).set_index("problem_id")
    assert got.loc["drop", "regressed"] and not got.loc["drop", "rose"]
    # 24 of 24 before step 3 and 0 of 24 from it: one-sided Fisher p = 1 / C(48, 24), times the 15 (start, split) pairs
    assert got.loc["drop", "p_drop"] == pytest.approx(15 / 32247603683100.0, rel=1e-6)
    assert not got.loc["noise", ["regressed", "rose"]].any()
    assert got.loc["rise", "rose"] and not got.loc["rise", "regressed"]
    assert not got.loc["blip", "regressed"]  # one bad eval point, then back: not a regression that lasts
    assert (got["evals"] == 6).all()


def sweep(
    fall: dict[int, float] | None = None,
    ns=(2, 4, 8, 16),
    b_ps=(8, 16),
    runs: int = 1,
    problems: int = 200,
    seed: int = 0,
    drop_step: float = 100,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(results, problems) as `fit` reads them. Null (fall None): each problem's true pass rate rises
    with steps from its own base, never falls; a run of n takes 1 / (B_p n) steps per rollout, so at
    equal compute small n is further along. Otherwise every problem sits at 0.8 and exactly
    fall[n] of them drop to 0.2 from step `drop_step` on."""
    rng = np.random.default_rng(seed)
    base, tau = rng.uniform(0.05, 0.95, problems), rng.uniform(100, 1000, problems)
    results, records = [], []
    for n in ns:
        for b_p in b_ps:
            for r in range(runs):
                run_id = f"n{n}_bp{b_p}_r{r}"
                steps = ROLLOUTS / (b_p * n)
                if fall is None:
                    rate = base + (1 - base) * (1 - np.exp(-steps[:, None] / tau))
                else:
                    drops = np.arange(problems) < round(fall[n] * problems)
                    rate = np.where(drops & (steps[:, None] >= drop_step), 0.2, 0.8)
                correct = rng.binomial(SAMPLES, rate)  # (eval points, problems)
                records.append(
                    pd.DataFrame(
                        {
                            RUN: run_id,
                            "step": np.repeat(steps, problems),
                            "problem_id": np.tile(np.arange(problems), len(steps)),
                            "correct": correct.ravel(),
                            "samples": SAMPLES,
                        }
                    )
                )
                results.append(
                    pd.DataFrame(
                        {
                            RUN: run_id,
                            "n": n,
                            "B_p": b_p,
                            "step": steps,
                            "rollouts": ROLLOUTS,
                            "val_avg@k": correct.mean(1) / SAMPLES,
                        }
                    )
                )
    return pd.concat(results, ignore_index=True), pd.concat(records, ignore_index=True)


def test_silent_on_null_sweeps():
    """40 sweeps where no problem's true pass rate ever falls: a trend in n (permutation p < 0.1) is
    called at equal compute, at equal steps, or by both, in at most 4 (measured: 1, 1 and 0 of 40;
    the earlier rule, crossing a pass rate of 0.5, called "more regressions with larger n" in 40 of
    40 of these)."""
    calls = {"compute": 0, "steps": 0, "either": 0}
    for seed in range(40):
        results, problems = sweep(seed=seed)
        entry = interference_method(results, FitSpec(bootstrap=0), problems).entry
        at_compute, at_steps = entry["trend_p_value"] < 0.1, entry["equal_steps"]["trend_p_value"] < 0.1
        calls["compute"] += at_compute
        calls["steps"] += at_steps
        calls["either"] += entry["fewer_regressions_with_larger_n"] is not None
    assert calls["compute"] <= 4 and calls["steps"] <= 4 and calls["either"] <= 4, calls


def test_known_regression_rates_are_recovered():
    """0.3 of n = 2's problems and 0.1 of n = 8's truly drop from 0.8 to 0.2 (at step 100, inside both
    windows): recovered within 0.03 at equal compute and at equal steps, and the trend is called."""
    results, problems = sweep({2: 0.3, 8: 0.1}, ns=(2, 8), b_ps=(8,), runs=4)
    entry = interference_method(results, FitSpec(bootstrap=50), problems).entry
    for per_value in (entry["per_value"], entry["equal_steps"]["per_value"]):
        got = {v["n"]: v["regressed"] for v in per_value}
        assert got[2] == pytest.approx(0.3, abs=0.03) and got[8] == pytest.approx(0.1, abs=0.03)
    assert (
        entry["fewer_regressions_with_larger_n"] is True
        and entry["trend_p_value"] < 0.1
        and entry["equal_steps"]["trend_p_value"] < 0.1
    )
    assert entry["interval90"]["slope_regressed_per_log2_n"][1] < 0 and entry["permuted_within"] == "B_p"
    assert entry["compute_upto"] == 32768 and entry["equal_steps"]["steps_upto"] == 32768 / 64


def test_cli_writes_the_method_and_refuses_without_records(tmp_path):
    results, problems = sweep({2: 0.3, 8: 0.1}, ns=(2, 8), b_ps=(8,), runs=2)
    path = tmp_path / "s"
    path.mkdir()
    results.rename(columns={RUN: "run_id"}).to_parquet(path / "results.parquet")
    problems.rename(columns={RUN: "run_id"}).to_parquet(path / "problems.parquet")
    result = runner.invoke(
        app,
        ["fit", str(path), "--method", "interference", "--bootstrap", "20", "--out", str(path / "fit")],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    entry = json.loads((path / "fit" / "fit.json").read_text())["interference"]
    assert {"per_value", "per_run", "equal_steps", "problem_test", "training_problems"} <= set(entry)
    assert "equal steps" in result.output and "regressed" in result.output
    for suffix in (".png", ".svg"):
        assert (path / "fit" / f"interference{suffix}").stat().st_size > 1000
    assert "## interference" in (path / "fit" / "report.md").read_text()
    (path / "problems.parquet").unlink()
    result = runner.invoke(app, ["fit", str(path), "--method", "interference"])
    assert result.exit_code == 2 and "no problems.parquet" in result.output
    # Records that are not records: one line naming the file, not pyarrow's or pandas' traceback.
    problems.rename(columns={RUN: "run_id"}).drop(columns=["correct"]).to_parquet(path / "problems.parquet")
    result = runner.invoke(app, ["fit", str(path), "--method", "interference"])
    assert result.exit_code == 2 and "problems.parquet: no column correct" in result.output, result.output
    (path / "problems.parquet").write_bytes(b"junk!")
    result = runner.invoke(app, ["fit", str(path), "--method", "interference"])
    assert result.exit_code == 2 and "problems.parquet: cannot read per-problem records" in result.output, result.output
