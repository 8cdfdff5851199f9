"""Write a fit to disk: fit.json, frontier.csv, the plots (PNG and SVG) and report.md.

The runs' own figures (study.py: mean curves with the spread between seeds, slices at fixed
budgets) are drawn for every fit whose results have the curve columns, whichever methods ran.

frontier.csv keeps its contract (compute, value, axis_star on a log grid of C): the fitted envelope
when method `frontier` was fitted, the empirical best-so-far otherwise (fit.json and report.md say
which).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from isoflop_cli.fit import coverage, plots, study
from isoflop_cli.fit.data import FitSpec, MethodResult, usable
from isoflop_cli.fit.frontier import frontier as empirical_frontier
from isoflop_cli.fit.report import markdown
from isoflop_cli.fit.trend import Trend
from isoflop_cli.store import atomic_write

PLOTS = {
    "fixed-batch": lambda r, spec, out: plots.fixed_batch_plot(r, spec, out / "fixed_batch"),
    "scalerl": lambda r, spec, out: plots.scalerl_plot(r, spec, out / "scalerl"),
    "isoflop-slices": lambda r, spec, out: plots.slices_plot(r, spec, out / "isoflop_slices"),
    "parametric": lambda r, spec, out: plots.parametric_plot(r, out / "parametric"),
    "surface": lambda r, spec, out: plots.surface_plot(r, spec, out / "surface"),
    "interference": lambda r, spec, out: plots.interference_plot(r, spec, out / "interference"),
}


def frontier_frame(
    df: pd.DataFrame, spec: FitSpec, results: dict[str, MethodResult]
) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(rows, frontier): the fitted envelope, else the empirical frontier; None without frontier columns."""
    if "frontier" in results:
        return results["frontier"].frames["rows"], results["frontier"].frames["frontier"]
    if not {spec.metric, spec.axis, spec.compute} <= set(df.columns):
        return None
    rows = usable(df, [spec.metric, spec.axis, spec.compute], "frontier")
    return rows, empirical_frontier(rows, spec.metric, spec.axis, spec.compute, spec.points)


def write(
    df: pd.DataFrame,
    info: dict,
    spec: FitSpec,
    results: dict[str, MethodResult],
    out: Path,
    cover: pd.DataFrame | None = None,
    answer: Trend | None = None,
) -> tuple[list[Path], pd.DataFrame | None]:
    """Every output file of a fit (with `cover`, the coverage table: coverage.csv, its plot and its
    report section; with `answer`, the trend test: fit.json's `n_star_trend` and report.md's first
    lines); returns the paths written and the frontier table."""
    written: list[Path] = []
    names: dict[str, list[str]] = {}
    rows, front = frontier_frame(df, spec, results) or (None, None)
    if front is not None:
        atomic_write(out / "frontier.csv", front.to_csv(index=False))
        paths = plots.frontier_plot(rows, front, spec, out / "frontier", results.get("frontier"))
        names["frontier.csv"] = [p.name for p in paths]
        written += [out / "frontier.csv", *paths]
    draw = {
        **PLOTS,
        "frontier": lambda r, spec, out: plots.axis_star_plot(r, spec, out / "axis_star", answer),
    }  # with the verdict
    for method, result in results.items():
        paths = draw[method](result, spec, out)
        names[method] = [p.name for p in paths]
        written += paths
    entries = {m: {**r.entry, "input": info} for m, r in results.items()}
    if "frontier" in entries:
        entries["frontier"]["frontier_csv"] = "fitted envelope"
    document = ({"n_star_trend": answer.entry()} if answer else {}) | entries
    paths, section = runs_figures(df, spec, out)
    written += paths
    if cover is not None:
        atomic_write(out / "coverage.csv", cover.to_csv(index=False))
        paths = plots.coverage_plot(cover, spec, out / "coverage")
        written += [out / "coverage.csv", *paths]
        document["coverage"] = coverage.entry(cover, spec)
        section += coverage.markdown(cover, spec, [p.name for p in paths])
    atomic_write(out / "fit.json", json.dumps(jsonable(document), indent=1) + "\n")
    atomic_write(
        out / "report.md",
        markdown(entries, spec, info, names, front, section, answer.lines(spec.axis) if answer else []),
    )
    return [out / "fit.json", *written, out / "report.md"], front


def runs_figures(df: pd.DataFrame, spec: FitSpec, out: Path) -> tuple[list[Path], list[str]]:
    """curves.png/.svg and slices.png/.svg (study.py) and their report section; nothing without the
    curve columns (slices: nothing where no budget is reached by two axis values)."""
    d = study.rows(df, spec)
    if d is None:
        return [], []
    curves, points = study.mean_curves(d, spec), study.slice_points(d, spec)
    paths = plots.curves_plot(curves, spec, out / "curves")
    names = {"curves": [p.name for p in paths]}
    if not points.empty:
        names["slices"] = [p.name for p in plots.budget_slices_plot(points, spec, out / "slices")]
        paths += [out / n for n in names["slices"]]
    return paths, study.markdown(spec, curves, points, names)


def jsonable(obj: Any) -> Any:
    """Plain JSON: numpy scalars as Python numbers, NaN and infinities as null."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
