"""Method `isoflop-slices` (Chinchilla approach 2): a parabola per budget, its optimum against compute.

Every run is read at each budget (the eval points there); for each budget a parabola of the metric
against log2(axis value), through the values near the best one (`near_best`), gives the best axis
value, which is only trusted when it lies inside the values tried (an optimum on the edge is a
bound, not an estimate) and when the slice's curvature is told from its noise (`curved`: points
with no optimum, say of a metric that does not depend on the axis, bend one way or the other by
chance, and the vertex would be read as one). The optima are then fitted
against compute by a power law axis* = coef * C^exponent, and by the sigmoid of the frontier law
where they saturate; the lower AIC is `preferred`. Works for any positive numeric axis: n, B_p,
model size, rho. Metrics named like a loss are minimised, all others maximised.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.fit.allocation import LAW, saturation
from isoflop_cli.fit.curves import CurveFit, fit_power_law, fit_sigmoid
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, warn

POWER = ["coef", "exponent"]
GAP = 0.01  # computes within 2.3% (0.01 decades) of each other are one budget
WINDOW = 2.0  # log2 units: each parabola sees the values within a factor 4 of the best one (near_best)
CURVATURE_P = 0.99  # one-sided: on a metric flat in the axis, 1% of slices bend the right way past it by chance


def budgets(compute: np.ndarray) -> np.ndarray:
    """Budget index per eval point: sorted log10 computes split where they jump by more than GAP."""
    log_c = np.log10(compute)
    order = np.argsort(log_c)
    ids = np.empty(log_c.size, dtype=np.int64)
    ids[order] = np.concatenate([[0], np.cumsum(np.diff(log_c[order]) > GAP)])
    return ids


def optima(
    x: np.ndarray, y: np.ndarray, budget: np.ndarray, w: np.ndarray, minimise: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted parabola y = c2 x^2 + c1 x + c0 per budget for each weight row of `w` (replicates, points).

    Solved from the 3x3 normal equations of every (replicate, budget) at once. Returns vertices
    (replicates, budgets) and coefficients (replicates, budgets, 3); a vertex is NaN where a slice's
    equations are singular or it is not an optimum (a minimum of an accuracy, a maximum of a loss).
    """
    feats = np.column_stack([x**2, x, np.ones_like(x)])
    outer = (feats[:, :, None] * feats[:, None, :]).reshape(len(x), 9)
    rhs = feats * y[:, None]
    nb = budget.max() + 1
    normal = np.zeros((w.shape[0], nb, 9))
    vec = np.zeros((w.shape[0], nb, 3))
    for b in range(nb):
        idx = budget == b
        normal[:, b] = w[:, idx] @ outer[idx]
        vec[:, b] = w[:, idx] @ rhs[idx]
    normal = normal.reshape(w.shape[0], nb, 3, 3)
    ok = np.abs(np.linalg.det(normal)) > 1e-12
    normal[~ok] = np.eye(3)
    coef = np.where(ok[..., None], np.linalg.solve(normal, vec[..., None])[..., 0], np.nan)
    c2, c1 = coef[..., 0], coef[..., 1]
    right_way = c2 > 0 if minimise else c2 < 0
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(right_way, -c1 / (2 * c2), np.nan)
    return vertex, coef


def near_best(x: np.ndarray, y: np.ndarray, budget: np.ndarray, minimise: bool) -> np.ndarray:
    """The points each budget's parabola is fitted to: the axis values within WINDOW (log2) of the
    value whose mean metric is best there, and at least the 3 nearest it. A metric is a parabola in
    log2(axis) only near its optimum; fitted across a wide range, an asymmetric peak moves the
    vertex by an amount that depends on where the peak sits among the values tried, which shifts as
    compute grows and bends the law (tests/test_fit_slices.py: the exponent 0.445 [0.444, 0.446]
    for a true 0.5 with every value of 2..1024 in each parabola)."""
    keep = np.zeros(x.size, dtype=bool)
    means = pd.DataFrame({"b": budget, "x": x, "y": y}).groupby(["b", "x"])["y"].mean()
    for b, m in means.groupby(level="b"):
        values = m.index.get_level_values("x").to_numpy()
        best = values[np.argmin(m.to_numpy()) if minimise else np.argmax(m.to_numpy())]
        order = np.argsort(np.abs(values - best), kind="stable")
        chosen = values[order[: max(3, int((np.abs(values - best) <= WINDOW).sum()))]]
        keep |= (budget == b) & np.isin(x, chosen)
    return keep


def curved(x: np.ndarray, y: np.ndarray, budget: np.ndarray, coef: np.ndarray, minimise: bool) -> np.ndarray:
    """Per budget, whether the parabola's curvature c2 bends the right way beyond its noise: its
    t statistic (c2 over its standard error, from the slice's residuals) past the one-sided
    CURVATURE_P quantile, and its depth across the values tried above rounding (a metric constant
    in the axis fits c2 ~ 1e-17). A slice of exactly three points has no residual to test against:
    its curvature is taken as it is, as before the test."""
    feats = np.column_stack([x**2, x, np.ones_like(x)])
    out = np.zeros(coef.shape[0], dtype=bool)
    for b in range(coef.shape[0]):
        idx = budget == b
        c2 = coef[b, 0]
        if not np.isfinite(c2) or (c2 > 0) != minimise:
            continue
        span, scale = np.ptp(x[idx]), max(1.0, float(np.abs(y[idx]).max()))
        if abs(c2) * span**2 / 4 <= 1e-9 * scale:
            continue
        dof = int(idx.sum()) - 3
        if dof < 1:
            out[b] = True
            continue
        resid = y[idx] - feats[idx] @ coef[b]
        cov = np.linalg.pinv(feats[idx].T @ feats[idx]) * (resid @ resid) / dof
        se = float(np.sqrt(max(cov[0, 0], 0.0)))
        out[b] = se == 0 or abs(c2) / se > stats.t.ppf(CURVATURE_P, dof)
    return out


def slices_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Per-budget optima with bootstrap bands, and the power law (and sigmoid) of the optimum against C."""
    df = df[df[spec.compute] > 0]  # its axis positive: `data.signs`
    minimise = "loss" in spec.metric.lower()
    budget = budgets(df[spec.compute].to_numpy(float))
    x = np.log2(df[spec.axis].to_numpy(float))
    spread = pd.Series(x).groupby(budget).nunique().to_numpy()
    keep = spread[budget] >= 3
    if not keep.any():
        raise ConfigError(f"isoflop-slices: no budget has runs at 3 or more values of {spec.axis} (a parabola needs 3)")
    df, x, budget = df[keep], x[keep], np.unique(budget[keep], return_inverse=True)[1]
    levels = (float(x.min()), float(x.max()))  # the values tried, for the sigmoid's plateaus
    near = near_best(x, df[spec.metric].to_numpy(float), budget, minimise)
    df, x, budget = df[near], x[near], budget[near]
    y = df[spec.metric].to_numpy(float)
    compute = pd.Series(df[spec.compute].to_numpy(float)).groupby(budget).median().to_numpy()
    lo, hi = pd.Series(x).groupby(budget).min().to_numpy(), pd.Series(x).groupby(budget).max().to_numpy()
    runs = pd.Index(df[RUN].unique())
    run = runs.get_indexer(df[RUN])

    vertex, coef = optima(x, y, budget, np.ones((1, x.size)), minimise)
    bent = curved(x, y, budget, coef[0], minimise)
    if not bent.all():
        flat = ", ".join(f"{c:.3g}" for c in compute[~bent])
        warn(
            f"isoflop-slices: at budget(s) {flat} the parabola's curvature is within the noise of its points "
            f"({CURVATURE_P:.0%} one-sided): no optimum of {spec.axis} is told there; left out of the law"
        )
    vertex[0, ~bent] = np.nan
    interior = np.isfinite(vertex[0]) & (vertex[0] >= lo) & (vertex[0] <= hi)
    if not (interior | ~bent).all():
        edge = ", ".join(f"{c:.3g}" for c in compute[~interior & bent])
        warn(
            f"isoflop-slices: at budget(s) {edge} the best {spec.axis} is on the edge "
            "of the values tried (or the slice has no optimum); left out of the law"
        )
    if interior.sum() < 2:
        fix = (
            f"widen the {spec.axis} range"
            if bent.sum() >= 2
            else (
                f"at {(~bent).sum()} of {bent.size} budgets the metric does not bend "
                f"with {spec.axis} beyond its noise: it may not depend on {spec.axis}"
            )
        )
        raise ConfigError(f"isoflop-slices: fewer than 2 budgets have an interior optimum of {spec.axis}; {fix}")
    power, sig = _laws(compute[interior], vertex[0, interior], levels)

    strata = df.drop_duplicates(RUN).set_index(RUN).loc[runs, spec.axis].to_numpy()
    weights = bootstrap.run_weights(spec.bootstrap, strata, spec.seed)
    boot = (
        optima(x, y, budget, weights[:, run].astype(float), minimise)[0]
        if spec.bootstrap
        else np.empty((0, compute.size))
    )
    boot = np.where((boot >= lo) & (boot <= hi), boot, np.nan)
    draws = []
    for v in boot:
        ok = interior & np.isfinite(v)
        if ok.sum() >= 2:
            p, s = _laws(compute[ok], v[ok], levels, sig.params if sig else None)
            draws.append({**p.params, **(s.params if s is not None and s.converged else {})})
    band = bootstrap.band(np.exp2(boot), discrete=False) if len(boot) else None
    return MethodResult(
        _entry(power, sig, draws, compute, vertex[0], coef[0, :, 0], interior, band, levels),
        {
            "slices": _frame(df, spec, budget, compute, x),
            "optima": _optima_frame(compute, vertex[0], coef[0], interior, band),
        },
    )


def _laws(
    compute: np.ndarray, vertex: np.ndarray, levels: tuple[float, float], start: dict | None = None
) -> tuple[CurveFit, CurveFit | None]:
    power = fit_power_law(compute, np.exp2(vertex))
    sig = (
        fit_sigmoid(np.log10(compute), vertex, levels=levels, increasing=False, start=start)
        if compute.size >= 5
        else None
    )
    return power, sig


def _aic(sse: float, m: int, k: int) -> float:
    return m * np.log(max(sse, 1e-300) / m) + 2 * k


def _entry(
    power: CurveFit, sig: CurveFit | None, draws: list[dict], compute, vertex, curvature, interior, band, levels
) -> dict:
    median, interval = bootstrap.summarise(draws, POWER)
    m = int(interior.sum())
    entry = {
        "params": power.params,
        "interval90": interval,
        "median": median,
        "converged": power.converged,
        "law": "axis* = coef * C^exponent",
        "preferred": "power law",
        "sigmoid": None,
        "bootstrap": {"resamples": len(draws)},
    }
    if sig is not None:
        s_median, s_interval = bootstrap.summarise(draws, LAW)
        sat = saturation(sig, np.log10(compute))
        entry["sigmoid"] = {
            "params": sig.params,
            "interval90": s_interval,
            "median": s_median,
            "converged": sig.converged,
            "at_bound": sig.at_bound,
            "saturation": sat,
            "levels_log2": list(levels),
        }
        power_sse_log2 = power.sse / np.log(2) ** 2
        if sig.converged and _aic(sig.sse, m, 4) < _aic(power_sse_log2, m, 2) and sat["within_data"]:
            entry["preferred"] = "sigmoid"
    entry["budgets"] = [
        {
            "compute": float(c),
            "optimum": float(2**v) if np.isfinite(v) else None,
            "interior": bool(i),
            "curvature": float(k),
            **(
                {"median": float(band[0, j]), "low": float(band[1, j]), "high": float(band[2, j])}
                if band is not None and np.isfinite(band[0, j])
                else {}
            ),
        }
        for j, (c, v, i, k) in enumerate(zip(compute, vertex, interior, curvature))
    ]
    return entry


def _frame(df: pd.DataFrame, spec: FitSpec, budget: np.ndarray, compute: np.ndarray, x: np.ndarray) -> pd.DataFrame:
    """Mean metric per budget and axis value, for the slice plot."""
    d = pd.DataFrame({"budget": compute[budget], "x": x, "value": df[spec.metric].to_numpy(float)})
    return d.groupby(["budget", "x"], as_index=False)["value"].mean().assign(axis_value=lambda t: np.exp2(t["x"]))


def _optima_frame(compute, vertex, coef, interior, band) -> pd.DataFrame:
    """Per budget: the optimum, whether it is interior, its band and the parabola (c2, c1, c0 in log2 axis)."""
    out = pd.DataFrame(
        {
            "compute": compute,
            "optimum": np.exp2(vertex),
            "interior": interior,
            "c2": coef[:, 0],
            "c1": coef[:, 1],
            "c0": coef[:, 2],
        }
    )
    if band is not None:
        out = out.assign(median=band[0], low=band[1], high=band[2])
    return out
