"""Method `surface`: one model of the metric over (log2 n, log2 B_p, log10 C) with shared parameters.

Chinchilla's third approach fits loss over N and D at once; this fits the metric over the
allocation and the budget at once, so n*(C) is read off one law with a handful of parameters
instead of cell by cell, and can be carried to budgets not yet run. The family:

    y = U - (U - L) * exp(-(C_eff / C0)^a)
    log10 C_eff = log10 C - k_n (log2 n - s_n(C))^2 - k_B (log2 B_p - s_B(C))^2
    s_n(C) = b0_n + b1_n (log10 C - log10 C_ref)   (and s_B likewise)

A run's metric saturates in its compute (a Weibull-type rise from L to U, as RL reward curves do);
a misallocated run spends its compute less effectively, by a factor that grows with the square of
its distance (in doublings) from the optimum, as an isoFLOP slice is near-parabolic in log n at its
top; and the optimum moves linearly in log C. Since y rises with C_eff and C_eff <= C with equality
at log2 n = s_n(C), the optimum at budget C is n*(C) = 2^s_n(C) exactly, for every C, and the
value there is U - (U - L) exp(-(C / C0)^a): an interior optimum that moves with C, read in closed
form. k_n = 0 says n does not matter (then s_n is not placed by the data, and n* is flagged as
not determined).

Points: every run's raw eval points at positive compute, not its running best. The surface is a
model of what a run at (n, B_p) reaches in expectation at C; raw points are unbiased, independent
measurements of it, where the running best carries the maximum of the noise so far (its bias
depends on how often a run was evaluated, not on n or C), and the family is already monotone in C,
so dips are read as the noise they are. The bootstrap resamples whole runs, so points of one run
are not taken for independent evidence. A run that collapses (its metric falls for good) is
outside this family; the `frontier` method, on running bests, is the one for such sweeps. So is a
sweep where n sets the ceiling itself and not only how soon it is reached: U is shared, so every
allocation tends to it (on tests/test_fit_cli.py's grid, whose sigmoids top out higher for larger
n, `--holdout 2` misses the value at the largest budget by 0.07); `--holdout K` is the check.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap, holdout
from isoflop_cli.fit.curves import at_bound
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.fit.evidence import TIE_SD
from isoflop_cli.fit.frontier import compute_grid

MIN_POINTS = 20
MIN_AXIS_VALUES = 3  # a parabola in log2 n needs three values to place its top
K_MAX = 2.0  # log10 C lost per squared doubling away from the optimum: beyond it one doubling costs a hundredfold
SLOPE_MAX = 3.0  # doublings of n* per decade of C


@dataclass(frozen=True)
class Data:
    """The eval points in the model's coordinates, and each point's run for bootstrap counts."""

    z: np.ndarray  # log10 compute
    u: np.ndarray  # (points, axes) log2 of each allocation axis
    y: np.ndarray
    run: np.ndarray
    z_ref: float
    axes: list[str]


@dataclass
class SurfaceFit:
    params: dict[str, float]
    converged: bool
    sse: float
    at_bound: list[str]


def names(axes: list[str]) -> list[str]:
    return ["lower", "upper", "log10_C0", "a"] + [f"{p}_{a}" for a in axes for p in ("k", "b0", "b1")]


def model(theta: np.ndarray, z: np.ndarray, u: np.ndarray, z_ref: float) -> np.ndarray:
    """The metric at log10 C = z and log2 allocation u (points, axes)."""
    lower, upper, m, a = theta[:4]
    k, b0, b1 = theta[4::3], theta[5::3], theta[6::3]
    star = b0 + b1 * (z[:, None] - z_ref)
    return rise(z - ((u - star) ** 2 * k).sum(1), lower, upper, m, a)


def rise(z_eff: np.ndarray, lower: float, upper: float, log10_C0: float, a: float) -> np.ndarray:
    """The metric at effective compute log10 C_eff = z_eff: U - (U - L) exp(-(C_eff / C0)^a)."""
    return upper - (upper - lower) * np.exp(-np.power(10.0, np.clip(a * (z_eff - log10_C0), -30, 30)))


def optimum(params: dict[str, float], axes: list[str], z: np.ndarray, z_ref: float) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per axis its optimum 2^s(C) on log10 C = z, and the value there (C_eff = C)."""
    stars = {a: np.exp2(params[f"b0_{a}"] + params[f"b1_{a}"] * (z - z_ref)) for a in axes}
    return stars, rise(z, *(params[k] for k in ("lower", "upper", "log10_C0", "a")))


def bounds(d: Data) -> tuple[np.ndarray, np.ndarray]:
    """The box the fit may search, each edge a statement the data cannot overrule (so a parameter
    at one is reported, not believed): plateaus within [0, 1]; C0 within 3 decades of the budgets
    run; a rise no flatter than a = 0.05 nor steeper than 5; a penalty k from none to K_MAX; an
    optimum within 3 doublings of the values run at log10 C_ref, moving at most SLOPE_MAX doublings
    per decade."""
    lo, hi = [0.0, 0.0, d.z.min() - 3, 0.05], [1.0, 1.0, d.z.max() + 3, 5.0]
    for j in range(len(d.axes)):
        lo += [0.0, d.u[:, j].min() - 3, -SLOPE_MAX]
        hi += [K_MAX, d.u[:, j].max() + 3, SLOPE_MAX]
    return np.array(lo), np.array(hi)


def starts(d: Data) -> list[np.ndarray]:
    """A small grid: the optimum low, mid or high in the axis's values and still or rising, a mild
    or a sharp penalty, the rise early or late; a second axis starts mild, at its median, still."""
    lower, upper = np.quantile(d.y, [0.02, 0.98])
    rest = [v for j in range(1, len(d.axes)) for v in (0.05, float(np.median(d.u[:, j])), 0.0)]
    return [np.array([lower, upper, m, 1.0, k, b0, b1, *rest])
            for m, k, b0, b1 in itertools.product(np.quantile(d.z, [0.5, 0.9]), [0.05, 0.5], np.quantile(d.u[:, 0], [0.1, 0.5, 0.9]), [0.0, 0.5])]


def fit(d: Data, w: np.ndarray | None = None, start: np.ndarray | None = None) -> tuple[SurfaceFit, np.ndarray]:
    """Weighted least squares from each start (or from `start` alone); the lowest cost wins."""
    sw = np.sqrt(np.ones(d.y.size) if w is None else np.asarray(w, float))
    lo, hi = bounds(d)
    best = None
    for p0 in [start] if start is not None else starts(d):
        p0 = np.clip(p0, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
        res = optimize.least_squares(lambda p: sw * (model(p, d.z, d.u, d.z_ref) - d.y), p0, bounds=(lo, hi), method="trf", x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    params = dict(zip(names(d.axes), map(float, best.x)))
    edges = dict(zip(names(d.axes), zip(lo, hi)))
    return SurfaceFit(params, bool(best.success), float(2 * best.cost), at_bound(params, edges)), best.x


def prepare(df: pd.DataFrame, spec: FitSpec, runs: pd.Index, note: bool = True) -> Data:
    """Positive-compute eval points of `df` in log coordinates; the allocation axes those with
    three values or more (`note`: say which were left out; the holdout's fit does not repeat it)."""
    d = df[df[spec.compute] > 0]
    lo, hi = d[spec.metric].min(), d[spec.metric].max()
    if lo < 0 or hi > 1:
        raise ConfigError(f"surface: the model is bounded to [0, 1]; {spec.metric} ranges {lo:.3g}..{hi:.3g}")
    axes = [a for a in holdout.cells(d, spec) if d[a].nunique() >= MIN_AXIS_VALUES]
    few = [a for a in holdout.cells(d, spec) if a != spec.axis and 1 < d[a].nunique() < MIN_AXIS_VALUES]
    if few and note:
        warn(f"surface: {few[0]} has {d[few[0]].nunique()} values, too few to place its optimum ({MIN_AXIS_VALUES} needed): "
             f"left out of the model, its cells pooled")
    if spec.axis not in axes or len(d) < MIN_POINTS or (d[axes].to_numpy(float) <= 0).any():
        raise ConfigError(f"surface: needs {MIN_POINTS} eval points at {MIN_AXIS_VALUES} or more positive values of {spec.axis} "
                          f"(have {len(d)} points, {d[spec.axis].nunique()} values)")
    z = np.log10(d[spec.compute].to_numpy(float))
    return Data(z, np.log2(d[axes].to_numpy(float)), d[spec.metric].to_numpy(float), runs.get_indexer(d[RUN]),
                float((z.min() + z.max()) / 2), axes)


def surface_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """The surface's parameters, n*(C), B_p*(C) and the value at the optimum on a grid of C over the
    data with bootstrap intervals, and with `--holdout K` its predictions at the K largest budgets."""
    runs = pd.Index(df[RUN].unique())
    d = prepare(df, spec, runs)
    best, x = fit(d)
    grid = np.log10(compute_grid(df[df[spec.compute] > 0], spec.compute, spec.points))
    strata = df.drop_duplicates(RUN).set_index(RUN).loc[runs, spec.axis].to_numpy()
    draws, curves = [], []
    for counts in bootstrap.run_counts(spec.bootstrap, strata, spec.seed):
        refit, _ = fit(d, counts[d.run], x)
        if refit.converged:
            draws.append({**refit.params, "_at_bound": refit.at_bound})
            stars, value = optimum(refit.params, d.axes, grid, d.z_ref)
            curves.append(np.vstack([*stars.values(), value]))
    median, interval = bootstrap.summarise(draws, names(d.axes))
    sigma = float(np.sqrt(best.sse / max(1, d.y.size - x.size)))
    rows = _optimum_rows(best, d, grid, np.array(curves), df, sigma)
    determined = _determined(best, rows, d, spec)
    entry = {"params": best.params, "median": median, "interval90": interval, "converged": best.converged, "at_bound": best.at_bound,
             "sse": best.sse, "noise_sd": sigma, "tie_within": TIE_SD * sigma, "points": int(d.y.size), "runs": int(runs.size),
             "axes": d.axes, "log10_C_ref": d.z_ref, "axis_star_determined": determined, "optimum": rows,
             "bootstrap": {"resamples": spec.bootstrap, "converged": len(draws),
                           "at_bound_share": {k: sum(k in dr["_at_bound"] for dr in draws) / len(draws) for k in names(d.axes)} if draws else {}}}
    if not best.converged:
        warn("surface: least squares did not converge")
    if spec.holdout:
        entry["holdout"] = surface_holdout(df, spec, runs)
    frame = pd.DataFrame({"compute": 10**d.z, "value": d.y, **{a: np.exp2(d.u[:, j]) for j, a in enumerate(d.axes)},
                          "fit": model(x, d.z, d.u, d.z_ref)})
    return MethodResult(entry, {"surface": frame, "optimum": pd.DataFrame(rows)})


def surface_holdout(df: pd.DataFrame, spec: FitSpec, runs: pd.Index) -> dict:
    """The surface fitted below the K largest budgets, scored at them (holdout.py)."""
    train, held = holdout.split(df, spec, spec.holdout, "surface")
    d = prepare(train, spec, runs, note=False)
    law, _ = fit(d)

    def predict(computes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        stars, value = optimum(law.params, d.axes, np.log10(computes), d.z_ref)
        return stars[spec.axis], value

    out = holdout.entry(spec.holdout, train, spec, holdout.score(df, spec, held, predict))
    out.update(params=law.params, converged=law.converged, at_bound=law.at_bound)
    return out


def _optimum_rows(best: SurfaceFit, d: Data, grid: np.ndarray, curves: np.ndarray, df: pd.DataFrame, sigma: float) -> list[dict]:
    """Per budget of the grid: each axis's optimum and the value there, with bootstrap median and
    5%-95% (`<axis>_star_low` ...), whether the optimum lies within the values run, and
    `<axis>_star_set`: the values run whose surface value (the other axes at their optimum) is
    within TIE_SD sd of the fit's residual noise of the optimum's, the frontier's rule for a tie:
    the data do not tell them apart."""
    stars, value = optimum(best.params, d.axes, grid, d.z_ref)
    cols = [*(f"{a}_star" for a in d.axes), "value"]
    estimates = np.vstack([*stars.values(), value])
    band = np.quantile(curves, [0.5, 0.05, 0.95], axis=0) if curves.size else None
    rows = []
    for i, z in enumerate(grid):
        row = {"compute": float(10**z)}
        for j, col in enumerate(cols):
            row[col] = float(estimates[j, i])
            if band is not None:
                row.update({f"{col}_median": float(band[0, j, i]), f"{col}_low": float(band[1, j, i]), f"{col}_high": float(band[2, j, i])})
        for j, a in enumerate(d.axes):
            row[f"{a}_star_within_grid"] = bool(df[a].min() <= row[f"{a}_star"] <= df[a].max())
            run = np.unique(d.u[:, j])
            off = np.log2(stars[a][i]) - run
            y = rise(z - best.params[f"k_{a}"] * off**2, *(best.params[k] for k in ("lower", "upper", "log10_C0", "a")))
            row[f"{a}_star_set"] = [plain(v) for v in np.exp2(run[y >= value[i] - TIE_SD * sigma])]
        rows.append(row)
    return rows


def _determined(best: SurfaceFit, rows: list[dict], d: Data, spec: FitSpec) -> bool:
    """Whether the data place axis*: not when its penalty k is pinned at 0 (the axis does not
    matter to the fit), nor when every value run is tied with the optimum at the largest budget,
    nor when axis*'s 90% interval at the largest budget spans every value run."""
    axis = spec.axis
    if f"k_{axis}" in best.at_bound and best.params[f"k_{axis}"] < K_MAX / 2:
        warn(f"surface: k_{axis} is pinned at 0: {axis} does not matter to the fit, so {axis}*(C) is not determined")
        return False
    top = rows[-1]
    if len(top[f"{axis}_star_set"]) == np.unique(d.u[:, 0]).size:
        warn(f"surface: at the largest budget every {axis} run is within {TIE_SD:g} sd of the noise of the optimum: "
             f"{axis} does not matter there as far as the data tell, so {axis}*(C) is not determined")
        return False
    lo, hi = top.get(f"{axis}_star_low"), top.get(f"{axis}_star_high")
    values = np.exp2(d.u[:, 0])
    if lo is not None and lo <= values.min() and hi >= values.max():
        warn(f"surface: {axis}*'s 90% interval at the largest budget ({lo:.3g}..{hi:.3g}) spans every {axis} run "
             f"({plain(values.min())}..{plain(values.max())}): {axis}*(C) is not determined")
        return False
    return True
