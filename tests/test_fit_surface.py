"""Method `surface` and `--holdout K` on a synthetic grid whose truth is not the surface's family.

Per cell y = 1 - 0.8 (1 + C / c(n))^(-alpha(n)), c(n) = 1e3 n (a larger n starts later) and
alpha(n) = 0.03 (1 + 0.5 log2 n) (and rises faster later), so n*(C) rises with C (about as
C^0.5); each eval point is a binomial mean of 2,000 samples (sd ~0.011).
"""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import methods
from isoflop_cli.fit.data import RUN, FitSpec, FitWarning
from isoflop_cli.fit.surface import surface_method

BUDGETS = 2.0 ** np.arange(8, 22)  # C_max = 2^21; --holdout 2 fits on budgets <= 2^19 = C_max / 4


def truth(n, c):
    return 1 - 0.8 * (1 + c / (1e3 * n)) ** (-0.03 * (1 + 0.5 * np.log2(n)))


def true_optimum(c: float) -> tuple[float, float]:
    """n* (continuous) and the value there, by a dense search in log2 n."""
    n = np.exp2(np.linspace(-3, 12, 3001))
    v = truth(n, c)
    return float(n[v.argmax()]), float(v.max())


def grid(seeds: int = 2, flat: bool = False, seed: int = 0) -> pd.DataFrame:
    """n = 1..128, B_p = 8, `seeds` runs per n, a base eval at 0 and one per budget; `flat`: every
    cell has the truth of n = 4 (n does not matter)."""
    rng = np.random.default_rng(seed)
    frames = []
    for n in 2 ** np.arange(8):
        for s in range(seeds):
            y = rng.binomial(2000, truth(4 if flat else n, BUDGETS)) / 2000
            frames.append(pd.DataFrame({"run_id": f"n{n}s{s}", RUN: f"0:n{n}s{s}", "n": n, "B_p": 8, "step": np.arange(BUDGETS.size + 1),
                                        "rollouts": np.r_[0, BUDGETS], "val_avg@k": np.r_[0.2, y]}))
    return pd.concat(frames, ignore_index=True)


def fitted(df, **spec):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FitWarning)
        entry = surface_method(df, FitSpec(**spec)).entry
    return entry, [str(w.message) for w in caught]


def test_predicts_n_star_and_value_at_the_largest_budget_from_a_quarter_of_it():
    entry, _ = fitted(grid(), bootstrap=0, holdout=2)
    h = entry["holdout"]
    assert h["train_max_compute"] <= BUDGETS[-1] / 4
    top = h["budgets"][-1]
    n_true, v_true = true_optimum(BUDGETS[-1])
    assert top["compute"] == BUDGETS[-1]
    assert 0.5 < top["axis_star_predicted"] / n_true < 2  # measured: 28.5 against 23.6
    assert abs(top["value_predicted"] - v_true) < 0.02  # measured: 0.491 against 0.486
    assert top["axis_star_observed"] in (16, 32)  # the best cell run there


def test_full_fit_finds_the_optimum_it_was_given_with_an_interval():
    entry, notes = fitted(grid(), bootstrap=20)
    top = entry["optimum"][-1]
    n_true, v_true = true_optimum(top["compute"])
    assert entry["converged"] and entry["axis_star_determined"] and not entry["at_bound"], notes
    assert top["n_star_low"] < top["n_star_high"] and 0.7 < top["n_star"] / n_true < 1.4
    assert abs(top["value"] - v_true) < 0.01
    assert 16 in top["n_star_set"] and 1 not in top["n_star_set"]
    rows = entry["optimum"]
    assert rows[-1]["n_star"] > 4 * rows[len(rows) // 2]["n_star"] > 0  # n* rises with C


def test_no_confident_optimum_when_n_does_not_matter():
    entry, notes = fitted(grid(flat=True), bootstrap=20)
    top = entry["optimum"][-1]
    assert not entry["axis_star_determined"]
    assert top["n_star_set"] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert any("not determined" in n for n in notes)


def test_a_parameter_pinned_at_its_bound_is_reported():
    # n = 1 at 0 everywhere: the model reaches it only by a lower plateau at its bound 0 (and a steep penalty)
    df = grid(flat=True)
    df.loc[(df["n"] == 1) & (df["rollouts"] > 0), "val_avg@k"] = 0.0
    entry, _ = fitted(df, bootstrap=0)
    assert "lower" in entry["at_bound"]
    doubts = methods.doubts("surface", entry, FitSpec(bootstrap=0))
    assert any("at the fit's bounds" in message and grave for message, grave in doubts)


def test_holdout_needs_enough_budgets():
    df = grid()
    with pytest.raises(ConfigError, match="--holdout 12 needs at least 15"):
        surface_method(df, FitSpec(bootstrap=0, holdout=12))


def test_cli_surface_and_holdout_for_every_law(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    grid().drop(columns=RUN).to_parquet(sweep / "results.parquet")
    args = ["fit", str(sweep), "--method", "surface", "--method", "frontier", "--method", "scalerl", "--holdout", "2", "--bootstrap", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    fit = json.loads((sweep / "fit" / "fit.json").read_text())
    for method in ("surface", "frontier", "scalerl"):
        h = fit[method]["holdout"]
        assert h["k"] == 2 and [b["compute"] for b in h["budgets"]] == list(BUDGETS[-2:]), method
        assert {"axis_star_predicted", "axis_star_observed", "value_predicted", "value_error"} <= set(h["budgets"][0])
    assert set(fit["surface"]["params"]) == {"lower", "upper", "log10_C0", "a", "k_n", "b0_n", "b1_n"}
    assert {"n_star", "n_star_low", "value", "value_high", "n_star_set"} <= set(fit["surface"]["optimum"][0])
    report = (sweep / "fit" / "report.md").read_text()
    assert "## surface" in report and "Holdout: fitted on eval points below" in report and "![surface](surface.png)" in report
    assert (sweep / "fit" / "surface.svg").exists()
    assert CliRunner().invoke(app, ["fit", str(sweep), "--method", "parametric", "--size-col", "n", "--compute-col", "rollouts", "--holdout", "1"]).exit_code == 2


def test_an_optimum_past_the_values_run_is_said_so_and_ties_nothing(tmp_path):
    """On test_fit_cli's grid (n 2..32) the surface puts n* below 2 at the smallest budgets: those
    rows are flagged outside the values run, their tie set is empty ("none" in the report, nothing
    shaded in the plot), and the fit still writes every output."""
    from test_fit_cli import results

    results().to_parquet(tmp_path / "results.parquet")
    result = CliRunner().invoke(app, ["fit", str(tmp_path), "--method", "surface", "--bootstrap", "4"])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "fit" / "fit.json").read_text())["surface"]["optimum"]
    below = [r for r in rows if r["n_star"] < 2]
    assert below and not any(r["n_star_within_grid"] for r in below) and below[0]["n_star_set"] == []
    assert any(r["n_star_within_grid"] and r["n_star_set"] for r in rows)  # inside the values run it is read as before
    report = (tmp_path / "fit" / "report.md").read_text()
    assert f"| {below[0]['compute']:.4g} | {below[0]['n_star']:.4g} (outside the values run) |" in report and "| none |" in report
    assert (tmp_path / "fit" / "surface.png").stat().st_size > 1000
