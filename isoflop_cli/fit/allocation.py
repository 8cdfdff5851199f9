"""Methods `frontier` and `fixed-batch`: per-axis sigmoids, their upper envelope, and axis*(C).

The first seed's workflow. Each run's running best (the best it has shown at or before each eval
point) traces the curve the frontier reads; for every axis value a bounded monotone sigmoid of the
metric against log10 C is fitted through its runs' running bests, up to its last eval point and no
further; the upper envelope across axis values is the frontier, and the axis value on it is
axis*(C). What the eval points do not support is said beside it (evidence.py): a frontier value
above everything measured by more than the noise is extrapolated, and axis values within the noise
of the top are tied (axis*(C) is then a set). log2 axis*(C) is fitted by a sigmoid of log10 C at
the budgets where one value wins beyond the noise, whose upper plateau is where it saturates. The
noise, and what the bootstrap behind the intervals varies, come from the variance model (noise.py):
seed replicates where the sweep has them, the evaluation's own binomial noise where it has not.
`fixed-batch` runs the same analysis within each batch size B = B_p * n: which split wins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap, evidence, holdout
from isoflop_cli.fit.curves import CurveFit, fit_sigmoid, sigmoid
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.fit.frontier import compute_grid
from isoflop_cli.fit.noise import Noise, Resampling, estimate, resampling

MIN_POINTS = 5  # eval points an axis value needs for its 4-parameter sigmoid
LAW = ["lower", "upper", "midpoint", "slope"]


def running_best(df: pd.DataFrame, metric: str, compute: str) -> pd.DataFrame:
    """Each run's eval points at compute > 0, `metric` replaced by the run's running best: the best
    it has shown at or before that compute, its base evaluation (compute 0) included.

    This is what the frontier is made of (the best eval point with compute <= C: a run stopped at C
    keeps its best checkpoint), so the fitted and the empirical frontier estimate one thing, and a
    plateau stays in the fit. Record-breaking points alone (those that beat every earlier one) end
    at a run's last record, and a sigmoid through them is free to go on rising to its last eval
    point: on the embedded default sweep n = 8's last record was at 8,192 rollouts, and its curve
    read at 32,768 gave 0.996 where the best measured point was 0.970. The running best carries the
    maximum of the noise so far (about one sd above the mean curve on a plateau of a few points);
    so does the empirical frontier, and the curves of every axis value alike."""
    d = df.sort_values([RUN, compute], kind="stable")
    d = d.assign(**{metric: d.groupby(RUN, sort=False)[metric].cummax()})
    return d[d[compute].to_numpy(float) > 0]


@dataclass
class AxisCurve:
    """The running-best points of one axis value, indexed into the run weights of a bootstrap replicate."""

    value: float
    x: np.ndarray  # log10 compute
    y: np.ndarray
    run: np.ndarray
    span: tuple[float, float]  # log10 compute range of all its eval points: the curve is not extrapolated
    rows: pd.Index  # its points' labels in the running bests: where a replicate's redrawn values are read

    def fit(
        self, weights: np.ndarray | None = None, start: dict | None = None, y: np.ndarray | None = None
    ) -> CurveFit:
        """The sigmoid through its points (`y`: other values at them, a replicate's), runs weighted by `weights`."""
        w = None if weights is None else weights[self.run]
        return fit_sigmoid(self.x, self.y if y is None else y, w, levels=(0.0, 1.0), increasing=True, start=start)

    def measured_next(self, grid: np.ndarray) -> np.ndarray:
        """At each log10 C of grid, the best its runs measured by their next eval point (what the curve is held to)."""
        return evidence.measured_next(10**self.x, self.y, 10**grid)


def fit_axis_curves(best: pd.DataFrame, spec: FitSpec, runs: pd.Index, method: str) -> list[AxisCurve]:
    """One AxisCurve per axis value with enough eval points (`best`: the running bests); the others
    are dropped with a warning."""
    lo, hi = best[spec.metric].min(), best[spec.metric].max()
    if lo < 0 or hi > 1:
        raise ConfigError(f"{method}: the sigmoid is bounded to [0, 1]; {spec.metric} ranges {lo:.3g}..{hi:.3g}")
    out, dropped = [], []
    for value, g in best.groupby(spec.axis):
        x = np.log10(g[spec.compute].to_numpy(float))
        if len(g) < MIN_POINTS or np.unique(x).size < 3:
            dropped.append(f"{spec.axis}={plain(value)} ({len(g)} points)")
            continue
        out.append(
            AxisCurve(
                float(value), x, g[spec.metric].to_numpy(float), runs.get_indexer(g[RUN]), (x.min(), x.max()), g.index
            )
        )
    if dropped:
        warn(
            f"{method}: too few eval points (need {MIN_POINTS} at 3 "
            f"computes) for {', '.join(dropped)}; left out of the frontier"
        )
    return out


def curve_values(curves: list[AxisCurve], fits: list[CurveFit], grid: np.ndarray) -> np.ndarray:
    """(curves, grid): each fitted curve on log10 C `grid` within its own span, -inf outside it."""
    values = np.full((len(curves), grid.size), -np.inf)
    for i, (c, f) in enumerate(zip(curves, fits)):
        inside = (grid >= c.span[0] - 1e-9) & (grid <= c.span[1] + 1e-9)
        values[i, inside] = sigmoid(grid[inside], **f.params)
    return values


def envelope(curves: list[AxisCurve], fits: list[CurveFit], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Upper envelope of the fitted curves on log10 C `grid` (each within its own span): value, axis*."""
    values = curve_values(curves, fits, grid)
    best = values.argmax(0)
    top = values[best, np.arange(grid.size)]
    star = np.array([c.value for c in curves])[best]
    return np.where(np.isfinite(top), top, np.nan), np.where(np.isfinite(top), star, np.nan)


def fit_law(
    grid: np.ndarray, star: np.ndarray, levels: tuple[float, float], start: dict | None = None
) -> CurveFit | None:
    """Sigmoid of log2 axis* against log10 C; None when axis* is one value everywhere (no law)."""
    ok = np.isfinite(star)
    if np.unique(star[ok]).size < 2:
        return None
    return fit_sigmoid(grid[ok], np.log2(star[ok]), levels=levels, increasing=False, start=start)


def saturation(law: CurveFit, grid: np.ndarray) -> dict:
    """Where log2 axis* has covered 90% of its rise: the compute beyond which axis* stops moving
    (`within_data`: at or below the largest budget of `grid`, the budgets the law was fitted on)."""
    p = law.params
    log_c = p["midpoint"] + np.log(9) / p["slope"] if p["slope"] > 0 else np.inf
    return {
        "compute": float(10**log_c),
        "axis_star": float(2 ** p["upper"]),
        "within_data": bool(grid.size and log_c <= grid.max()),
    }


def analyse(df: pd.DataFrame, spec: FitSpec, method: str, sigma: float, noise: Noise) -> dict | None:
    """Curves, envelope, axis*(C) and its law on one subset of runs, with bootstrap intervals, and
    what the eval points say of them at noise `sigma` (evidence.py). Each bootstrap replicate
    varies the data as `noise` says (`noise.resampling`): runs resampled within strata, eval
    points redrawn from their evaluation variance.

    A tie is no switch: the law is fitted only when different axis values win beyond the noise at
    some budgets (`resolved`), and only from the first such budget to the last. Ties between them
    are where the winner changes (two curves cross), and the bootstrap reads that uncertainty; ties
    before the first or after the last place nothing, so the law does not reach into them."""
    df = df.reset_index(drop=True)  # unique labels: a replicate's running bests are read by them
    runs = pd.Index(df[RUN].unique())
    best = running_best(df, spec.metric, spec.compute)
    curves = fit_axis_curves(best, spec, runs, method)
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
    ties = evidence.tied(curve_values(curves, fits, grid), sigma)
    resolved = np.isfinite(star) & (ties.sum(0) == 1)
    between = _between(resolved) & np.isfinite(star)
    levels = (np.log2(min(c.value for c in curves)), np.log2(max(c.value for c in curves)))
    law = fit_law(grid[between], star[between], levels) if np.unique(star[resolved]).size > 1 else None
    plan = resampling(df, runs, spec.axis, spec.metric, noise)
    rng = np.random.default_rng([spec.seed, 1])  # the redraws' own stream: run_weights draws from spec.seed
    draws, stars = [], []
    for weights in bootstrap.run_weights(spec.bootstrap, plan.strata, spec.seed):
        ys = _redrawn(df, spec, plan, rng, curves) if plan.redraw_sd.any() else [None] * len(curves)
        refits = [c.fit(weights, f.params, y) for c, f, y in zip(curves, fits, ys)]
        _, s = envelope(curves, refits, grid)
        stars.append(s)
        draw = {f"{c.value}/{k}": v for c, f in zip(curves, refits) if f.converged for k, v in f.params.items()}
        relaw = fit_law(grid[between], s[between], levels, law.params) if law else None
        if relaw is not None and relaw.converged:
            draw.update(relaw.params, _law_at_bound=relaw.at_bound)
        draws.append(draw)
    points = best[spec.compute].to_numpy(float), best[spec.metric].to_numpy(float)
    seen = evidence.measured_next(*points, 10**grid)
    return {
        "curves": curves,
        "fits": fits,
        "grid": grid,
        "value": value,
        "star": star,
        "law": law,
        "draws": draws,
        "star_band": bootstrap.band(np.array(stars), discrete=True) if stars else None,
        "best": best,
        "sigma": sigma,
        "noise": noise,
        "measured": evidence.measured(*points, 10**grid),
        "measured_next": seen,
        "extrapolated": evidence.extrapolated(value, seen, sigma),
        "tied": ties,
        "resolved": resolved,
        "between": between,
    }


def _redrawn(
    df: pd.DataFrame, spec: FitSpec, plan: Resampling, rng: np.random.Generator, curves: list[AxisCurve]
) -> list[np.ndarray]:
    """Each curve's running bests in one replicate: of the eval points redrawn with their evaluation noise."""
    best = running_best(
        df.assign(**{spec.metric: plan.redraw(df[spec.metric].to_numpy(float), rng)}), spec.metric, spec.compute
    )
    return [best.loc[c.rows, spec.metric].to_numpy(float) for c in curves]


def _between(mask: np.ndarray) -> np.ndarray:
    """True from the first True of mask to its last."""
    out = np.zeros_like(mask)
    where = np.flatnonzero(mask)
    if where.size:
        out[where[0] : where[-1] + 1] = True
    return out


def frontier_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Method `frontier`: the law of log2 axis*(C) and its saturation, per-axis curves, axis*(C) band."""
    noise = estimate(df, spec.metric, spec.compute)
    a = analyse(df, spec, "frontier", evidence.metric_noise(df, spec, "frontier", noise), noise)
    if a is None:
        raise ConfigError(
            f"frontier: no {spec.axis} value has a fitted sigmoid "
            f"({MIN_POINTS} eval points at 3 computes, and a converged fit)"
        )
    entry = _law_entry(a, spec.axis, "frontier")
    entry["curves"] = _curve_entries(a, spec.axis)
    entry["axis_star"] = _axis_star_rows(a)
    if spec.holdout:
        entry["holdout"] = frontier_holdout(df, spec, a["sigma"], noise)
    frames = {
        "frontier": _frontier_frame(a, df[spec.axis]),
        "curves": _curve_frame(a),
        "rows": df,
        "running_best": a["best"],
        "axis_star": pd.DataFrame(entry["axis_star"]),
    }
    return MethodResult(entry, frames)


def frontier_holdout(df: pd.DataFrame, spec: FitSpec, sigma: float, noise: Noise) -> dict:
    """`--holdout K` (holdout.py): the frontier fitted below the K largest budgets, without
    bootstrap. At a held-out budget axis* is the law's (2^sigmoid of log10 C) where one was
    fitted, else the axis* of the largest budget fitted; the value is the upper envelope of the
    per-axis sigmoids carried past their last eval point, as a law is. They are fitted to running
    bests, so the value predicted is a running best's, read against a cell mean."""
    train, held = holdout.split(df, spec, spec.holdout, "frontier")
    a = analyse(train, replace(spec, bootstrap=0), "frontier holdout", sigma, noise)
    if a is None:
        raise ConfigError(f"frontier: --holdout {spec.holdout} leaves no {spec.axis} value with a fitted sigmoid")
    last = a["star"][np.isfinite(a["star"])][-1]

    def predict(computes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.log10(computes)
        star = np.exp2(sigmoid(x, **a["law"].params)) if a["law"] is not None else np.full(x.size, last)
        return star, np.max([sigmoid(x, **f.params) for f in a["fits"]], axis=0)

    out = holdout.entry(spec.holdout, train, spec, holdout.score(df, spec, held, predict))
    out["law"] = a["law"].params if a["law"] is not None else None
    return out


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
    noise = estimate(df, spec.metric, spec.compute)
    sigma = evidence.metric_noise(df, spec, "fixed-batch", noise)
    for B in batches:
        label = f"fixed-batch B={plain(B)}"
        a = analyse(df[batch == B], spec, label, sigma, noise)
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
        raise ConfigError(f"fixed-batch: no batch size has two splits with {MIN_POINTS} eval points each")
    entry = {
        "params": params,
        "interval90": interval,
        "median": median,
        "converged": converged,
        "batches": per_batch,
        "noise": noise.entry(),
    }
    return MethodResult(entry, {"fixed_batch": pd.DataFrame(rows)})


def _law_entry(a: dict, axis: str, method: str) -> dict:
    law: CurveFit | None = a["law"]
    median, interval = bootstrap.summarise(a["draws"], LAW)
    on_grid = np.isfinite(a["star"])
    honest = {
        "noise_sd": a["sigma"],
        "tie_within": evidence.TIE_SD * a["sigma"],
        "budgets": int(on_grid.sum()),
        "budgets_tied": int((on_grid & ~a["resolved"]).sum()),
        "budgets_extrapolated": int(a["extrapolated"].sum()),
        "noise": a["noise"].entry(),
    }
    if law is None:
        only = np.unique(a["star"][a["resolved"]])
        where = "at every budget" + (
            f" where one {axis} wins beyond the noise (tied at {honest['budgets_tied']})"
            if honest["budgets_tied"]
            else ""
        )
        note = (
            f"{axis}* is {plain(only[0])} {where}" if only.size else f"{axis}* is tied within the noise at every budget"
        )
        warn(f"{method}: {note}: no law of {axis}* against compute to fit")
        return {"params": {}, "interval90": {}, "median": {}, "converged": False, "note": note, **honest}
    entry = {
        "params": law.params,
        "interval90": interval,
        "median": median,
        "converged": law.converged,
        "at_bound": law.at_bound,
        "saturation": saturation(law, a["grid"][a["between"]]),
        "bootstrap": {
            "resamples": len(a["draws"]),
            "converged": sum(all(k in d for k in LAW) for d in a["draws"]),
            "at_bound_share": _bound_shares(a["draws"]),
        },
        **honest,
    }
    if not law.converged:
        warn(f"{method}: the sigmoid of log2 {axis}* against log10 compute did not converge")
    return entry


def _bound_shares(draws: list[dict]) -> dict[str, float]:
    """Per law parameter, the share of converged resamples whose fit pinned it at a bound."""
    fitted = [d for d in draws if "_law_at_bound" in d]
    return {k: sum(k in d["_law_at_bound"] for d in fitted) / len(fitted) for k in LAW} if fitted else {}


def _curve_entries(a: dict, axis: str) -> dict:
    """Per curve its parameters with their bootstrap summary, and how far it stands above what its
    own runs had measured by their next eval point (`above_measured`, the most over the budgets it
    spans; `extrapolated` when that is more than the noise)."""
    out = {}
    for c, f in zip(a["curves"], a["fits"]):
        names = [f"{c.value}/{k}" for k in LAW]
        median, interval = bootstrap.summarise(a["draws"], names)
        x = a["grid"][(a["grid"] >= c.span[0] - 1e-9) & (a["grid"] <= c.span[1] + 1e-9)]
        above = float(np.max(sigmoid(x, **f.params) - c.measured_next(x), initial=-np.inf))
        out[f"{axis}={plain(c.value)}"] = {
            "params": f.params,
            "converged": f.converged,
            "at_bound": f.at_bound,
            "points": int(c.x.size),
            "median": {k.split("/")[1]: v for k, v in median.items()},
            "interval90": {k.split("/")[1]: v for k, v in interval.items()},
            "above_measured": above,
            "extrapolated": bool(above > a["sigma"]),
        }
    return out


def _axis_star_rows(a: dict) -> list[dict]:
    """Per budget: axis* (the top curve's value), the frontier value, `measured` (the best eval point at
    or below C) and `measured_next` (the best by the next eval point, what the value is held to), whether
    the value is extrapolated, and `axis_star_set`: every axis value tied with the top (one when
    resolved); the bootstrap's 90% interval (low, high) widened to the tie set where that is wider: a
    value within the noise of the top is not one the data exclude, whichever value the resamples favour."""
    band = a["star_band"]
    values = np.array([c.value for c in a["curves"]])
    rows = []
    for i, (x, s) in enumerate(zip(a["grid"], a["star"])):
        if np.isfinite(s):
            row = {
                "compute": float(10**x),
                "axis_star": float(s),
                "axis_star_set": [plain(v) for v in sorted(values[a["tied"][:, i]])],
                "value": float(a["value"][i]),
                "measured": float(a["measured"][i]),
                "measured_next": float(a["measured_next"][i]),
                "extrapolated": bool(a["extrapolated"][i]),
            }
            if band is not None:
                tie = row["axis_star_set"]
                row.update(
                    median=float(band[0, i]), low=float(min(band[1, i], tie[0])), high=float(max(band[2, i], tie[-1]))
                )
            rows.append(row)
    return rows


def _frontier_frame(a: dict, axis_values: pd.Series) -> pd.DataFrame:
    ok = np.isfinite(a["star"])
    star = a["star"][ok]
    if pd.api.types.is_integer_dtype(axis_values) or np.all(star == np.round(star)):
        star = star.astype(np.int64)
    return pd.DataFrame({"compute": 10 ** a["grid"][ok], "value": a["value"][ok], "axis_star": star})


def _curve_frame(a: dict) -> pd.DataFrame:
    """80 points of each curve over its span; `extrapolated` where it stands above its runs' best by
    the next eval point by more than the noise."""
    parts = []
    for c, f in zip(a["curves"], a["fits"]):
        x = np.linspace(c.span[0], c.span[1], 80)
        y = sigmoid(x, **f.params)
        parts.append(
            pd.DataFrame(
                {
                    "axis_value": c.value,
                    "compute": 10**x,
                    "value": y,
                    "extrapolated": evidence.extrapolated(y, c.measured_next(x), a["sigma"]),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)
