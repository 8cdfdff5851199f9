"""The runs as they are, before any fit: per axis value the mean curve over its runs with the spread
between seeds (curves.png), and isoFLOP slices, the metric against the axis at a few fixed budgets
(slices.png). `isoflop fit` draws both wherever the results have the curve columns, whichever
methods ran: they are what every fit summarises, and what a reader checks a fit against.

A run is read between its own eval points linearly in log2 C and never beyond them; where the runs
of an axis value share their eval points (a sweep's budgets) that is the eval points themselves.
The base model (compute 0) is drawn one doubling left of the smallest compute.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoflop_cli.fit.data import RUN, FitSpec, plain
from isoflop_cli.fit.noise import cells

SLICES = 4  # fixed budgets the slices are drawn at, spread evenly in log C over those two or more axis values reach


def rows(df: pd.DataFrame, spec: FitSpec) -> pd.DataFrame | None:
    """The eval points the figures read (metric, axis and compute finite numbers, axis > 0: it is
    drawn in log2), with `_cell` (runs alike in all but the seed, noise.cells) and `_x` (log2 compute;
    the base one doubling left of the smallest); None without the columns or the points. Rows left
    out are not warned of again: the trend test, read from the same columns, has said so."""
    columns = [spec.metric, spec.axis, spec.compute]
    if not set(columns) <= set(df.columns):
        return None
    numbers = df[columns].apply(pd.to_numeric, errors="coerce")
    keep = (
        np.isfinite(numbers.to_numpy(float)).all(1)
        & (numbers[spec.axis] > 0).to_numpy()
        & (numbers[spec.compute] >= 0).to_numpy()
    )
    d = df[keep].assign(**{c: numbers.loc[keep, c] for c in columns})
    positive = d.loc[d[spec.compute] > 0, spec.compute]
    if positive.empty:
        return None
    floor = np.log2(positive.min()) - 1
    x = np.log2(d[spec.compute].to_numpy(float).clip(min=2.0**floor))
    return d.assign(_cell=cells(d).to_numpy(), _x=x)


def at(d: pd.DataFrame, spec: FitSpec, x: np.ndarray) -> pd.DataFrame:
    """Each run's metric at log2 computes `x` within its own eval points (RUN, axis, _cell, _x, value):
    linear in log2 C between them, the mean where one compute repeats."""
    parts = []
    for run, g in d.groupby(RUN, sort=False):
        mean = g.groupby("_x")[spec.metric].mean()
        inside = x[(x >= mean.index[0] - 1e-9) & (x <= mean.index[-1] + 1e-9)]
        parts.append(
            pd.DataFrame(
                {
                    RUN: run,
                    spec.axis: g[spec.axis].iloc[0],
                    "_cell": g["_cell"].iloc[0],
                    "_x": inside,
                    "value": np.interp(inside, mean.index.to_numpy(), mean.to_numpy()),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def mean_curves(d: pd.DataFrame, spec: FitSpec) -> pd.DataFrame:
    """Per axis value and eval compute of its runs: `compute` (where it is drawn), `mean` over its
    runs, `runs`, and `sd` between seeds: pooled over its cells with two or more runs there (NaN
    where none has: no band)."""
    values = pd.concat([at(g, spec, np.unique(g["_x"])) for _, g in d.groupby(spec.axis)], ignore_index=True)
    keys = [spec.axis, "_x"]
    spread = (values["value"] - values.groupby([*keys, "_cell"])["value"].transform("mean")) ** 2
    t = (
        values.assign(ss=spread)
        .groupby(keys)
        .agg(mean=("value", "mean"), runs=("value", "size"), ss=("ss", "sum"), cells=("_cell", "nunique"))
    )
    dof = t["runs"] - t["cells"]
    t["sd"] = np.sqrt(t["ss"] / dof.where(dof > 0))
    return t.reset_index().assign(compute=lambda f: np.exp2(f["_x"]))[[spec.axis, "compute", "mean", "runs", "sd"]]


def slice_budgets(d: pd.DataFrame, spec: FitSpec) -> np.ndarray:
    """Up to SLICES log2 computes, spread evenly over the positive eval computes that runs of two or
    more axis values reach (each within its own eval points)."""
    spans = d[d[spec.compute] > 0].groupby(RUN).agg(value=(spec.axis, "first"), lo=("_x", "min"), hi=("_x", "max"))
    candidates = np.unique(d.loc[d[spec.compute] > 0, "_x"])
    reached = np.array(
        [spans.loc[(spans["lo"] <= x + 1e-9) & (spans["hi"] >= x - 1e-9), "value"].nunique() for x in candidates]
    )
    shared = candidates[reached >= 2]
    return (
        shared[np.unique(np.linspace(0, shared.size - 1, min(SLICES, shared.size)).round().astype(int))]
        if shared.size
        else shared
    )


def slice_points(d: pd.DataFrame, spec: FitSpec) -> pd.DataFrame:
    """Each run's value at each of slice_budgets (RUN, axis, compute, value)."""
    budgets = slice_budgets(d, spec)
    if not budgets.size:
        return pd.DataFrame(columns=[RUN, spec.axis, "compute", "value"])
    points = at(d, spec, budgets)
    return points.assign(compute=np.exp2(points["_x"]))[[RUN, spec.axis, "compute", "value"]]


def markdown(spec: FitSpec, curves: pd.DataFrame, points: pd.DataFrame, names: dict[str, list[str]]) -> list[str]:
    """report.md's section on the runs: each figure with one line on what it shows."""
    band = (
        "±1 sd between seeds where a cell (runs alike in all but the seed) has two or more"
        if curves["sd"].notna().any()
        else "no band: no cell has two seeds"
    )
    budgets = ", ".join(f"{plain(c):,.4g}" for c in sorted(points["compute"].unique()))
    out = [
        "## the runs",
        "",
        *[f"![curves]({n})" for n in names["curves"] if n.endswith(".png")],
        "",
        f"{spec.metric} against {spec.compute} per {spec.axis}: the mean over "
        f"its runs at each eval point (the base model leftmost), shaded {band}.",
        "",
    ]
    if names.get("slices"):
        out += [
            *[f"![slices]({n})" for n in names["slices"] if n.endswith(".png")],
            "",
            f"isoFLOP slices: {spec.metric} against log2 {spec.axis} at fixed {spec.compute} "
            f"({budgets}): each run's value there (points) and the mean per {spec.axis} (line).",
            "",
        ]
    return out
