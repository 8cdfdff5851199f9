"""Figures agree with the report: axis*(C) draws a tied budget as the set the report names and
carries the trend test's verdict; the runs' mean curves (with the spread between seeds) and their
slices at fixed budgets come with every fit; and "measured" is one number, the best eval point at
or below C, in fit.json, report.md and the terminal's frontier table."""

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from test_frontier_honest import EARLY, sweep
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.fit import plots, study
from isoflop_cli.fit.allocation import frontier_method
from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.trend import Trend, n_star_trend

pytestmark = pytest.mark.filterwarnings("ignore::isoflop_cli.fit.data.FitWarning")  # ties and no-law notes


def test_axis_star_draws_every_tied_value_and_the_verdict():
    """Four cells with one truth: the report says n* is tied; the figure marks every member of each
    budget's tie set (before: one step through the top curve's value) and says the trend test's
    call, its p and the budgets tied in its title."""
    same = {n: (11.0, 0.90) for n in (2, 4, 8, 16)}
    df = sweep(same, runs=2, seed=1, log2c=np.arange(7, 15.01, 1.0))
    spec = FitSpec(bootstrap=0)
    result, answer = frontier_method(df, spec), n_star_trend(df, spec)
    entry, star = result.entry, result.frames["axis_star"]
    assert entry["budgets_tied"] > 0  # the premise: a tied sweep

    fig = plots.axis_star_figure(result, spec, answer)
    drawn = {
        (round(c, 6), v)
        for coll in fig.axes[0].collections
        if isinstance(coll, PathCollection)
        for c, v in coll.get_offsets()
    }
    members = {(round(r.compute, 6), float(v)) for r in star.itertuples() for v in r.axis_star_set}
    assert drawn == members and len(members) > len(star)  # every member, not one value per budget
    marks = plots.star_marks(star)
    assert marks["tied"].sum() == sum(len(s) for s in star["axis_star_set"] if len(s) > 1)
    title = fig.axes[0].get_title()
    assert f"trend test: {answer.call} (p = {answer.p_value:.2g})" in title
    assert f"n* tied at {entry['budgets_tied']} of {entry['budgets']} budgets" in title


def replicated(seeds: int) -> pd.DataFrame:
    """n in {2, 4, 8}, `seeds` runs a cell, eval points at 128..4,096 rollouts and the base: a
    rising curve per n, seed offsets of known size (-0.02, +0.02 with two seeds)."""
    frames = []
    for n in (2, 4, 8):
        for s in range(seeds):
            c = 2.0 ** np.arange(7, 13)
            y = 0.3 + 0.05 * np.log2(c / 64) * (1 + n / 16) / 2 + 0.04 * (s - (seeds - 1) / 2)
            frames.append(
                pd.DataFrame(
                    {
                        "run_id": f"n{n}_s{s}",
                        "n": n,
                        "B_p": 8,
                        "seed": s,
                        "step": np.arange(7),
                        "rollouts": np.r_[0, c],
                        "val_avg@k": np.r_[0.3, y],
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def test_mean_curves_band_is_the_sd_between_seeds():
    """At each eval point the mean over a cell's seeds and their sd (two seeds 0.04 apart: sd
    0.04 / sqrt 2); one seed per cell: no band."""
    df = replicated(seeds=2).assign(**{RUN: lambda d: d["run_id"]})
    curves = study.mean_curves(study.rows(df, FitSpec()), FitSpec())
    trained = curves[curves["compute"] > 100]
    assert trained["sd"].to_numpy() == pytest.approx(0.04 / np.sqrt(2))
    assert (trained["runs"] == 2).all() and curves["compute"].min() == 64  # the base one doubling left of 128
    lone = replicated(seeds=1).assign(**{RUN: lambda d: d["run_id"]})
    assert study.mean_curves(study.rows(lone, FitSpec()), FitSpec())["sd"].isna().all()


def test_curves_and_slices_come_with_any_method(tmp_path):
    """Asked for scalerl alone, the fit still draws the runs: curves and slices written, listed,
    and in report.md with their line; the slices at four budgets, a point per run."""
    replicated(seeds=2).to_csv(tmp_path / "r.csv", index=False)
    result = CliRunner().invoke(
        app,
        ["fit", str(tmp_path / "r.csv"), "--method", "scalerl", "--bootstrap", "8", "--out", str(tmp_path / "fit")],
        terminal_width=400,
    )
    assert result.exit_code == 0, result.output
    for name in ("curves", "slices"):
        for ext in ("png", "svg"):
            assert (tmp_path / "fit" / f"{name}.{ext}").stat().st_size > 1000 and f"{name}.{ext}" in result.output
    report = (tmp_path / "fit" / "report.md").read_text()
    assert "![curves](curves.png)" in report and "![slices](slices.png)" in report and "±1 sd between seeds" in report
    df = replicated(seeds=2).assign(**{RUN: lambda d: d["run_id"]})
    points = study.slice_points(study.rows(df, FitSpec()), FitSpec())
    assert points["compute"].nunique() == 4 and len(points) == 4 * 6


def test_measured_is_the_best_at_or_below_c_everywhere(tmp_path):
    """The frontier's `measured` at each budget is the best eval point at or below it, read by hand
    from the input, and the same number in fit.json, report.md and the terminal table; at budgets
    between eval points it is below what the next eval point measured (the number `measured`
    showed before, and what extrapolation is still judged against)."""
    df = sweep({n: EARLY[n] for n in (2, 4, 8)}, runs=2, seed=0, log2c=np.arange(7, 15.01, 1.0))
    df.rename(columns={RUN: "run_id"}).to_csv(tmp_path / "r.csv", index=False)
    result = CliRunner().invoke(
        app,
        ["fit", str(tmp_path / "r.csv"), "--method", "frontier", "--bootstrap", "0", "--out", str(tmp_path / "fit")],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "fit" / "fit.json").read_text())["frontier"]["axis_star"]
    report = (tmp_path / "fit" / "report.md").read_text()
    table = {
        cells[0]: cells[2]
        for line in result.output.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip("│").split("│")]]
    }
    shown, below_next = 0, 0
    for r in rows:
        by_hand = df.loc[df["rollouts"] <= r["compute"] * (1 + 1e-9), "val_avg@k"].max()
        assert r["measured"] == pytest.approx(by_hand)
        assert f"| {r['compute']:.4g} | {r['value']:.4f} | {by_hand:.4f} |" in report
        if f"{r['compute']:,.4g}" in table:
            assert table[f"{r['compute']:,.4g}"] == f"{by_hand:.3f}"
            shown += 1
        below_next += r["measured"] < r["measured_next"]
    assert shown >= 10 and below_next > 0


def test_the_verdict_says_what_the_data_show_where_no_move_is_called():
    why = "the best n reads 2 then 8, but what it may be overlaps: {2, 4} at 1,024, {4, 8} at 16,384"
    answer = Trend("none", 2.0, [0.0, 2.0], 0.036, "test", why=why)
    assert plots.verdict({"budgets_tied": 3, "budgets": 5}, answer, "n").splitlines() == [
        "trend test: none (p = 0.036); n* tied at 3 of 5 budgets",
        why,
    ]
    assert plots.verdict({}, Trend("rises", 2.0, [1.0, 3.0], 0.001, "test"), "n") == "trend test: rises (p = 0.001)"
