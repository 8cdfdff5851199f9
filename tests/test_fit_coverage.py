"""The coverage table (`fit/coverage.py`): means per axis value and budget by hand, eval points of
FLOP-budget runs matched across runs, and what a fit writes from it."""

import json

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.fit.coverage import coverage, summary
from isoflop_cli.fit.data import RUN, FitSpec


def run_rows(run: str, n: int, computes, best, worst, zero) -> pd.DataFrame:
    return pd.DataFrame(
        {
            RUN: run,
            "run_id": run,
            "n": n,
            "B_p": 8,
            "rollouts": computes,
            "val_avg@k": np.add(best, worst) / 2,
            "val_best@k": best,
            "val_worst@k": worst,
            "zero_var_frac": zero,
            "step": range(len(computes)),
        }
    )


def sweep() -> pd.DataFrame:
    """n = 2 sharpens (worst@k rises, best@k flat); n = 16 covers (best@k rises, worst@k flat), as
    two seeds whose values differ by a known amount; zero_var_frac empty at the base point."""
    c = [0, 256, 512, 1024]
    return pd.concat(
        [
            run_rows("a", 2, c, [0.9, 0.9, 0.9, 0.9], [0.2, 0.4, 0.6, 0.8], [np.nan, 0.5, 0.6, 0.7]),
            run_rows("b", 16, c, [0.5, 0.6, 0.7, 0.8], [0.1, 0.1, 0.1, 0.1], [np.nan, 0.3, 0.2, 0.1]),
            run_rows("c", 16, c, [0.5, 0.7, 0.9, 1.0], [0.1, 0.1, 0.1, 0.1], [np.nan, 0.1, 0.1, 0.1]),
        ],
        ignore_index=True,
    )


def test_means_per_value_and_budget_and_the_changes_by_hand():
    spec = FitSpec()
    table = coverage(sweep(), spec)
    last16 = table[(table.n == 16) & (table.rollouts == 1024)].iloc[0]
    assert last16.runs == 2 and last16["val_best@k"] == 0.9 and last16["zero_var_frac"] == 0.1
    rows = {r["n"]: r for r in summary(table, spec).to_dict("records")}
    assert np.isclose(rows[2]["d_worst@k"], 0.6) and np.isclose(rows[2]["d_best@k"], 0)  # sharpening
    assert np.isclose(rows[16]["d_best@k"], 0.4) and np.isclose(rows[16]["d_worst@k"], 0)  # coverage
    assert rows[2]["zero_var_first"] == 0.5 and rows[2]["zero_var_last"] == 0.7  # the base point has run no step
    assert np.isclose(rows[16]["zero_var_first"], 0.2)


def test_flop_budget_eval_points_a_step_apart_are_one_budget():
    """Runs to a FLOP budget stop at the first step past each eval point: within a few percent of it,
    on either run's own side. They are read as one budget, not two half-empty ones."""
    df = sweep().assign(flops_total=lambda d: d["rollouts"] * 1e6 * np.where(d[RUN] == "b", 1.04, 1.0))
    table = coverage(df, FitSpec(compute="flops_total"))
    assert sorted(table[table.n == 16]["runs"]) == [2, 2, 2, 2]


def test_without_the_columns_there_is_no_table():
    assert coverage(sweep().drop(columns="zero_var_frac"), FitSpec()) is None


def test_fit_writes_the_table_its_plot_and_a_report_section(tmp_path):
    sweep().drop(columns=RUN).to_csv(tmp_path / "results.csv", index=False)
    result = CliRunner().invoke(
        app, ["fit", str(tmp_path / "results.csv"), "--out", str(tmp_path / "fit"), "--bootstrap", "0"]
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "fit"
    assert {"coverage.csv", "coverage.png", "coverage.svg"} <= {p.name for p in out.iterdir()}
    entry = json.loads((out / "fit.json").read_text())["coverage"]
    assert [round(r["d_best@k"], 6) for r in entry["per_value"]] == [0.0, 0.4]
    assert (
        "## coverage and sharpening" in (out / "report.md").read_text()
        and "coverage and sharpening per n" in result.output
    )
