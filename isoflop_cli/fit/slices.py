"""Method `isoflop-slices` (Chinchilla approach 2): a parabola per budget, its optimum against compute.

Every run is read at each budget (the eval points there); for each budget a parabola of the metric
against log2(axis value) gives the best axis value, which is only trusted when it lies inside the
values tried (an optimum on the edge is a bound, not an estimate). The optima are then fitted
against compute by a power law axis* = coef * C^exponent, and by the sigmoid of the frontier law
where they saturate; the lower AIC is `preferred`. Works for any positive numeric axis: n, B_p,
model size, rho. Metrics named like a loss are minimised, all others maximised.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.fit.allocation import LAW, saturation
from isoflop_cli.fit.curves import CurveFit, fit_power_law, fit_sigmoid
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, warn

POWER = ["coef", "exponent"]
GAP = 0.01  # computes within 2.3% (0.01 decades) of each other are one budget


def budgets(compute: np.ndarray) -> np.ndarray:
    """Budget index per eval point: sorted log10 computes split where they jump by more than GAP."""
    log_c = np.log10(compute)
    order = np.argsort(log_c)
    ids = np.empty(log_c.size, dtype=np.int64)
    ids[order] = np.concatenate([[0], np.cumsum(np.diff(log_c[order]) > GAP)])
    return ids


def optima(x: np.ndarray, y: np.ndarray, budget: np.ndarray, w: np.ndarray, minimise: bool) -> tuple[np.ndarray, np.ndarray]:
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


def slices_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Per-budget optima with bootstrap bands, and the power law (and sigmoid) of the optimum against C."""
    df = df[df[spec.compute] > 0]
    if (df[spec.axis] <= 0).any():
        raise ConfigError(f"isoflop-slices: {spec.axis} must be positive (the parabola is in log2 {spec.axis})")
    minimise = "loss" in spec.metric.lower()
    budget = budgets(df[spec.compute].to_numpy(float))
    x = np.log2(df[spec.axis].to_numpy(float))
    spread = pd.Series(x).groupby(budget).nunique().to_numpy()
    keep = spread[budget] >= 3
    if not keep.any():
        raise ConfigError(f"isoflop-slices: no budget has runs at 3 or more values of {spec.axis} (a parabola needs 3)")
    df, x, budget = df[keep], x[keep], np.unique(budget[keep], return_inverse=True)[1]
    y = df[spec.metric].to_numpy(float)
    compute = pd.Series(df[spec.compute].to_numpy(float)).groupby(budget).median().to_numpy()
    lo, hi = pd.Series(x).groupby(budget).min().to_numpy(), pd.Series(x).groupby(budget).max().to_numpy()
    runs = pd.Index(df[RUN].unique())
    run = runs.get_indexer(df[RUN])

    vertex, coef = optima(x, y, budget, np.ones((1, x.size)), minimise)
    interior = np.isfinite(vertex[0]) & (vertex[0] >= lo) & (vertex[0] <= hi)
    if not interior.all():
        edge = ", ".join(f"{c:.3g}" for c in compute[~interior])
        warn(f"isoflop-slices: at budget(s) {edge} the best {spec.axis} is on the edge of the values tried (or the slice has no optimum); left out of the law")
    if interior.sum() < 2:
        raise ConfigError(f"isoflop-slices: fewer than 2 budgets have an interior optimum of {spec.axis}; widen the {spec.axis} range")
    levels = (float(x.min()), float(x.max()))
    power, sig = _laws(compute[interior], vertex[0, interior], levels)

    strata = df.drop_duplicates(RUN).set_index(RUN).loc[runs, spec.axis].to_numpy()
    counts = bootstrap.run_counts(spec.bootstrap, strata, spec.seed)
    boot = optima(x, y, budget, counts[:, run].astype(float), minimise)[0] if spec.bootstrap else np.empty((0, compute.size))
    boot = np.where((boot >= lo) & (boot <= hi), boot, np.nan)
    draws = []
    for v in boot:
        ok = interior & np.isfinite(v)
        if ok.sum() >= 2:
            p, s = _laws(compute[ok], v[ok], levels, sig.params if sig else None)
            draws.append({**p.params, **(s.params if s is not None and s.converged else {})})
    band = bootstrap.band(np.exp2(boot), discrete=False) if len(boot) else None
    return MethodResult(_entry(power, sig, draws, compute, vertex[0], coef[0, :, 0], interior, band, levels),
                        {"slices": _frame(df, spec, budget, compute, x), "optima": _optima_frame(compute, vertex[0], coef[0], interior, band)})


def _laws(compute: np.ndarray, vertex: np.ndarray, levels: tuple[float, float], start: dict | None = None) -> tuple[CurveFit, CurveFit | None]:
    power = fit_power_law(compute, np.exp2(vertex))
    sig = fit_sigmoid(np.log10(compute), vertex, levels=levels, increasing=False, start=start) if compute.size >= 5 else None
    return power, sig


def _aic(sse: float, m: int, k: int) -> float:
    return m * np.log(max(sse, 1e-300) / m) + 2 * k


def _entry(power: CurveFit, sig: CurveFit | None, draws: list[dict], compute, vertex, curvature, interior, band, levels) -> dict:
    median, interval = bootstrap.summarise(draws, POWER)
    m = int(interior.sum())
    entry = {"params": power.params, "interval90": interval, "median": median, "converged": power.converged,
             "law": "axis* = coef * C^exponent", "preferred": "power law", "sigmoid": None,
             "bootstrap": {"resamples": len(draws)}}
    if sig is not None:
        s_median, s_interval = bootstrap.summarise(draws, LAW)
        sat = saturation(sig, np.log10(compute))
        entry["sigmoid"] = {"params": sig.params, "interval90": s_interval, "median": s_median, "converged": sig.converged,
                            "at_bound": sig.at_bound, "saturation": sat, "levels_log2": list(levels)}
        power_sse_log2 = power.sse / np.log(2) ** 2
        if sig.converged and _aic(sig.sse, m, 4) < _aic(power_sse_log2, m, 2) and sat["within_data"]:
            entry["preferred"] = "sigmoid"
    entry["budgets"] = [
        {"compute": float(c), "optimum": float(2**v) if np.isfinite(v) else None, "interior": bool(i), "curvature": float(k),
         **({"median": float(band[0, j]), "low": float(band[1, j]), "high": float(band[2, j])} if band is not None and np.isfinite(band[0, j]) else {})}
        for j, (c, v, i, k) in enumerate(zip(compute, vertex, interior, curvature))
    ]
    return entry


def _frame(df: pd.DataFrame, spec: FitSpec, budget: np.ndarray, compute: np.ndarray, x: np.ndarray) -> pd.DataFrame:
    """Mean metric per budget and axis value, for the slice plot."""
    d = pd.DataFrame({"budget": compute[budget], "x": x, "value": df[spec.metric].to_numpy(float)})
    return d.groupby(["budget", "x"], as_index=False)["value"].mean().assign(axis_value=lambda t: np.exp2(t["x"]))


def _optima_frame(compute, vertex, coef, interior, band) -> pd.DataFrame:
    """Per budget: the optimum, whether it is interior, its band and the parabola (c2, c1, c0 in log2 axis)."""
    out = pd.DataFrame({"compute": compute, "optimum": np.exp2(vertex), "interior": interior, "c2": coef[:, 0], "c1": coef[:, 1], "c0": coef[:, 2]})
    if band is not None:
        out = out.assign(median=band[0], low=band[1], high=band[2])
    return out
