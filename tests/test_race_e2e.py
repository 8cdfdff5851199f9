"""`isoflop race-pilot` end to end on the embedded default: derive the pilot, run it through a real
Ray head (the suite's shared one; real torch training), write a valid regime.json; a rerun resumes
and repeats nothing. One small pilot: the default's three cheapest levels at 3% of the full sweep
(six runs, one budget). The default pilot's derivation (its levels, budgets, steps and predicted rho)
is test_race.py's test_pilot_derivation_on_the_embedded_default, the analysis on recorded results
its --from-results tests."""

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_isoflop

from isoflop_cli.race.pilot import MIN_STEPS

pytestmark = pytest.mark.e2e

SMALL_EVAL = ["eval.problems=32", "eval.samples=4"]  # the embedded default sweep, with a cheaper evaluation
PILOT = ["--updates", "0.0625,0.25,1", "--share", "0.03"]  # n 16 learning from 1, 4 and 16 of each group
REGIMES = {"search-heavy", "update-heavy", "reward-heavy", "interior", "undetermined"}


def finished_metrics(sweep_dir: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (sweep_dir / "runs").glob("*/metrics.jsonl")}


def test_pilot_on_the_embedded_default_writes_a_valid_regime(tmp_path, ray_address):
    result = run_isoflop("race-pilot", "--root", str(tmp_path), *PILOT, *SMALL_EVAL, f"cluster.address={ray_address}")
    assert result.returncode == 0, result.stdout + result.stderr

    sweep_dir = tmp_path / "default-pilot"
    report = json.loads((sweep_dir / "race" / "regime.json").read_text())
    [entry] = report["regimes"]
    assert entry["reward"] == "sparse" and entry["target"] == "native" and entry["metric"] == "val_native"
    assert entry["regime"] in REGIMES and entry["curve"] in ("constant", "log-linear", "quadratic")
    assert entry["effect"] is not None and entry["interval90"][0] <= entry["interval90"][1]
    assert report["same_regime_rate"] is None  # no full-scale results given
    assert report["loo_same_regime_rate"] is None or 0 <= report["loo_same_regime_rate"] <= 1
    assert (
        0 < report["pilot_share"] < 0.25 and report["pilot_share_planned"] <= 0.031
    )  # 6 cells, 11 to 38 steps each at the plan's bound: 3.0%

    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert report["pilot_flops"] == pytest.approx(df.groupby("run_id")["flops_total"].max().sum())
    # every level at n = 16: one lever, the share of each group learned from
    assert set(zip(df["n"], df["algo.epochs"])) == {(16, 0.0625), (16, 0.25), (16, 1)} and df["run_id"].nunique() == 6
    last = df[df["step"] > 0].groupby("algo.epochs")["rho"].mean()
    assert last[0.0625] < last[0.25] < last[1]  # more learning per sampled token: rho rises in the real ledger
    assert df.groupby("run_id")["step"].max().min() >= MIN_STEPS  # every run measured past its warm-up
    rec = report["recommendation"]
    assert rec["reward"] == "sparse" and rec["command"].startswith("isoflop sweep") and rec["predicted_flops"] > 0
    assert "does not guarantee a held-out gain" in (sweep_dir / "race" / "race.md").read_text()
    assert (sweep_dir / "race" / "race.png").stat().st_size > 1000

    before = finished_metrics(sweep_dir)
    again = run_isoflop("race-pilot", "--root", str(tmp_path), *PILOT, *SMALL_EVAL, f"cluster.address={ray_address}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert finished_metrics(sweep_dir) == before  # resumed: every run was finished, none ran again
    assert json.loads((sweep_dir / "race" / "regime.json").read_text())["regimes"][0]["regime"] == entry["regime"]
