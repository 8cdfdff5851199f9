"""Methods `frontier` and `fixed-batch`: per-axis sigmoids, their upper envelope, and axis*(C).

The first seed's workflow. Each run's record-breaking points (the bucketized metric rising above
every earlier point of the run) trace its best-so-far curve without the noise of the dips; for
every axis value a bounded monotone sigmoid of the metric against log10 C is fitted through them;
the upper envelope across axis values is the frontier, and the axis value on it is axis*(C).
log2 axis*(C) is then fitted by a sigmoid of log10 C, whose upper plateau is where it saturates.
`fixed-batch` runs the same analysis within each batch size B = B_p * n: which split wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.fit.curves import CurveFit, fit_sigmoid, sigmoid
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.fit.frontier import compute_grid

BUCKET = 0.01  # metric resolution of a record: a rise smaller than a bucket is noise, not a record
MIN_POINTS = 5  # record-breaking points an axis value needs for its 4-parameter sigmoid
LAW = ["lower", "upper", "midpoint", "slope"]


def record_points(df: pd.DataFrame, metric: str, compute: str, bucket: float = BUCKET) -> pd.DataFrame:
    """Each run's record-breaking eval points at compute > 0: those whose bucket beats every earlier
    point, the base model's evaluation at compute 0 included (a run that starts below its base
    breaks no record until it passes it). The compute-0 point itself is not returned: the curves
    are fitted in log compute."""
    d = df.sort_values([RUN, compute], kind="stable")
    level = np.floor(np.round(d[metric].to_numpy(float) / bucket, 9))
    best_before = pd.Series(level, index=d.index).groupby(d[RUN]).cummax().groupby(d[RUN]).shift()
    record = best_before.isna().to_numpy() | (level > best_before.to_numpy())
    return d[record & (d[compute].to_numpy(float) > 0)]


@dataclass
class AxisCurve:
    """The record points of one axis value, indexed into the run counts of a bootstrap replicate."""

    value: float
    x: np.ndarray  # log10 compute
    y: np.ndarray
    run: np.ndarray
    span: tuple[float, float]  # log10 compute range of all its eval points: the curve is not extrapolated

    def fit(self, counts: np.ndarray | None = None, start: dict | None = None) -> CurveFit:
        w = None if counts is None else counts[self.run]
        return fit_sigmoid(self.x, self.y, w, levels=(0.0, 1.0), increasing=True, start=start)


def fit_axis_curves(df: pd.DataFrame, spec: FitSpec, runs: pd.Index, method: str) -> list[AxisCurve]:
    """One AxisCurve per axis value with enough record points; the others are dropped with a warning."""
    lo, hi = df[spec.metric].min(), df[spec.metric].max()
    if lo < 0 or hi > 1:
        raise ConfigError(f"{method}: the sigmoid is bounded to [0, 1]; {spec.metric} ranges {lo:.3g}..{hi:.3g}")
    positive = df[df[spec.compute] > 0]
    records = record_points(df, spec.metric, spec.compute)
    out, dropped = [], []
    for value, g in records.groupby(spec.axis):
        x = np.log10(g[spec.compute].to_numpy(float))
        if len(g) < MIN_POINTS or np.unique(x).size < 3:
            dropped.append(f"{spec.axis}={plain(value)} ({len(g)} points)")
            continue
        span = np.log10(positive.loc[positive[spec.axis] == value, spec.compute].agg(["min", "max"]).to_numpy(float))
        out.append(AxisCurve(float(value), x, g[spec.metric].to_numpy(float), runs.get_indexer(g[RUN]), (span[0], span[1])))
    if dropped:
        warn(f"{method}: too few record-breaking points (need {MIN_POINTS} at 3 computes) for {', '.join(dropped)}; left out of the frontier")
    return out


def envelope(curves: list[AxisCurve], fits: list[CurveFit], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper envelope of the fitted curves on log10 C `grid` (each within its own span): value, axis*."""
    values = np.full((len(curves), grid.size), -np.inf)
    for i, (c, f) in enumerate(zip(curves, fits)):
        inside = (grid >= c.span[0] - 1e-9) & (grid <= c.span[1] + 1e-9)
        values[i, inside] = sigmoid(grid[inside], **f.params)
    best = values.argmax(0)
    top = values[best, np.arange(grid.size)]
    star = np.array([c.value for c in curves])[best]
    return np.where(np.isfinite(top), top, np.nan), np.where(np.isfinite(top), star, np.nan)


def fit_law(grid: np.ndarray, star: np.ndarray, levels: tuple[float, float], start: dict | None = None) -> CurveFit | None:
    """Sigmoid of log2 axis* against log10 C; None when axis* is one value everywhere (no law)."""
    ok = np.isfinite(star)
    if np.unique(star[ok]).size < 2:
        return None
    return fit_sigmoid(grid[ok], np.log2(star[ok]), levels=levels, increasing=False, start=start)


def saturation(law: CurveFit, grid: np.ndarray) -> dict:
    """Where log2 axis* has covered 90% of its rise: the compute beyond which axis* stops moving."""
    p = law.params
    log_c = p["midpoint"] + np.log(9) / p["slope"] if p["slope"] > 0 else np.inf
    return {"compute": float(10**log_c), "axis_star": float(2 ** p["upper"]), "within_data": bool(log_c <= grid.max())}


def analyse(df: pd.DataFrame, spec: FitSpec, method: str) -> dict | None:
    """Curves, envelope, axis*(C) and its law on one subset of runs, with bootstrap intervals."""
    runs = pd.Index(df[RUN].unique())
    curves = fit_axis_curves(df, spec, runs, method)
    if not curves:
        return None
    grid = np.log10(compute_grid(df, spec.compute, spec.points))
    fits = [c.fit() for c in curves]
    # A sigmoid the optimiser did not settle would put a guess on the frontier: leave it out.
    failed = [f"{spec.axis}={plain(c.value)}" for c, f in zip(curves, fits) if not f.converged]
    if failed:
        warn(f"{method}: the sigmoid for {', '.join(failed)} did not converge; left out of the frontier")
        curves, fits = [c for c, f in zip(curves, fits) if f.converged], [f for f in fits if f.converged]
    if not curves:
        return None
    value, star = envelope(curves, fits, grid)
    levels = (np.log2(min(c.value for c in curves)), np.log2(max(c.value for c in curves)))
    law = fit_law(grid, star, levels)
    strata = df.drop_duplicates(RUN).set_index(RUN).loc[runs, spec.axis].to_numpy()
    draws, stars = [], []
    for counts in bootstrap.run_counts(spec.bootstrap, strata, spec.seed):
        refits = [c.fit(counts, f.params) for c, f in zip(curves, fits)]
        _, s = envelope(curves, refits, grid)
        stars.append(s)
        draw = {f"{c.value}/{k}": v for c, f in zip(curves, refits) if f.converged for k, v in f.params.items()}
        relaw = fit_law(grid, s, levels, law.params if law else None)
        if relaw is not None and relaw.converged:
            draw.update(relaw.params, _law_at_bound=relaw.at_bound)
        draws.append(draw)
    return {"curves": curves, "fits": fits, "grid": grid, "value": value, "star": star, "law": law, "draws": draws,
            "star_band": bootstrap.band(np.array(stars), discrete=True) if stars else None}


def frontier_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Method `frontier`: the law of log2 axis*(C) and its saturation, per-axis curves, axis*(C) band."""
    a = analyse(df, spec, "frontier")
    if a is None:
        raise ConfigError(f"frontier: no {spec.axis} value has a fitted sigmoid ({MIN_POINTS} record-breaking points at 3 computes, and a converged fit)")
    entry = _law_entry(a, spec.axis, "frontier")
    entry["curves"] = _curve_entries(a, spec.axis)
    entry["axis_star"] = _axis_star_rows(a)
    entry["bucket"] = BUCKET
    frames = {"frontier": _frontier_frame(a, df[spec.axis]), "curves": _curve_frame(a), "rows": df,
              "records": record_points(df, spec.metric, spec.compute), "axis_star": pd.DataFrame(entry["axis_star"])}
    return MethodResult(entry, frames)


def fixed_batch_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Method `fixed-batch`: within each B = B_p * n that has several splits, the winning split per budget."""
    if spec.axis not in ("n", "B_p"):
        raise ConfigError(f"fixed-batch: --axis must be n or B_p (the split of B = B_p * n), not {spec.axis}")
    other = "B_p" if spec.axis == "n" else "n"
    batch = df["n"] * df["B_p"]
    splits = df.groupby(batch)[spec.axis].nunique()
    batches = splits.index[splits >= 2]
    if batches.empty:
        raise ConfigError("fixed-batch: no batch size B = B_p * n is run with two or more splits")
    params, interval, median, per_batch, converged, rows = {}, {}, {}, {}, True, []
    for B in batches:
        label = f"fixed-batch B={plain(B)}"
        a = analyse(df[batch == B], spec, label)
        if a is None:
            continue
        e = _law_entry(a, spec.axis, label)
        for store, key in ((params, "params"), (interval, "interval90"), (median, "median")):
            store.update({f"{name}@B={plain(B)}": v for name, v in e[key].items()})
        converged &= e["converged"] or not e["params"]  # a batch whose winner never changes has no law to converge
        best = _axis_star_rows(a)
        for r in best:
            r[other] = float(B / r["axis_star"])
            rows.append({"B": plain(B), **r})
        per_batch[str(plain(B))] = {**e, "best": best}
    if not per_batch:
        raise ConfigError(f"fixed-batch: no batch size has two splits with {MIN_POINTS} record-breaking points each")
    entry = {"params": params, "interval90": interval, "median": median, "converged": converged, "batches": per_batch}
    return MethodResult(entry, {"fixed_batch": pd.DataFrame(rows)})


def _law_entry(a: dict, axis: str, method: str) -> dict:
    law: CurveFit | None = a["law"]
    median, interval = bootstrap.summarise(a["draws"], LAW)
    if law is None:
        only = np.unique(a["star"][np.isfinite(a["star"])])
        warn(f"{method}: {axis}*(C) = {plain(only[0])} at every budget: no law of {axis}* against compute to fit")
        return {"params": {}, "interval90": {}, "median": {}, "converged": False, "note": f"{axis}* is {plain(only[0])} at every budget"}
    entry = {"params": law.params, "interval90": interval, "median": median, "converged": law.converged,
             "at_bound": law.at_bound, "saturation": saturation(law, a["grid"]),
             "bootstrap": {"resamples": len(a["draws"]), "converged": sum(all(k in d for k in LAW) for d in a["draws"]),
                           "at_bound_share": _bound_shares(a["draws"])}}
    if not law.converged:
        warn(f"{method}: the sigmoid of log2 {axis}* against log10 compute did not converge")
    return entry


def _bound_shares(draws: list[dict]) -> dict[str, float]:
    """Per law parameter, the share of converged resamples whose fit pinned it at a bound."""
    fitted = [d for d in draws if "_law_at_bound" in d]
    return {k: sum(k in d["_law_at_bound"] for d in fitted) / len(fitted) for k in LAW} if fitted else {}


def _curve_entries(a: dict, axis: str) -> dict:
    out = {}
    for c, f in zip(a["curves"], a["fits"]):
        names = [f"{c.value}/{k}" for k in LAW]
        median, interval = bootstrap.summarise(a["draws"], names)
        out[f"{axis}={plain(c.value)}"] = {"params": f.params, "converged": f.converged, "at_bound": f.at_bound, "points": int(c.x.size),
                                           "median": {k.split("/")[1]: v for k, v in median.items()},
                                           "interval90": {k.split("/")[1]: v for k, v in interval.items()}}
    return out


def _axis_star_rows(a: dict) -> list[dict]:
    band = a["star_band"]
    rows = []
    for i, (x, s) in enumerate(zip(a["grid"], a["star"])):
        if np.isfinite(s):
            row = {"compute": float(10**x), "axis_star": float(s)}
            if band is not None:
                row.update(median=float(band[0, i]), low=float(band[1, i]), high=float(band[2, i]))
            rows.append(row)
    return rows


def _frontier_frame(a: dict, axis_values: pd.Series) -> pd.DataFrame:
    ok = np.isfinite(a["star"])
    star = a["star"][ok]
    if pd.api.types.is_integer_dtype(axis_values) or np.all(star == np.round(star)):
        star = star.astype(np.int64)
    return pd.DataFrame({"compute": 10 ** a["grid"][ok], "value": a["value"][ok], "axis_star": star})


def _curve_frame(a: dict) -> pd.DataFrame:
    parts = []
    for c, f in zip(a["curves"], a["fits"]):
        x = np.linspace(c.span[0], c.span[1], 80)
        parts.append(pd.DataFrame({"axis_value": c.value, "compute": 10**x, "value": sigmoid(x, **f.params)}))
    return pd.concat(parts, ignore_index=True)
