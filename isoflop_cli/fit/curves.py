"""Functional forms and their least-squares fitters: sigmoid, ScaleRL curve, parabola, power law.

Every fitter takes optional weights (a bootstrap replicate is a weight per run, bootstrap.py, so a
weighted fit is a fit on the runs it drew) and returns a `CurveFit` that says whether the optimiser converged
and which parameters ended on a bound, so that a bad fit is never reported as a good one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special

SLOPE_MAX = 100.0  # per decade of compute: steeper than this is a step, and says so via at_bound


@dataclass
class CurveFit:
    params: dict[str, float]
    converged: bool
    sse: float
    at_bound: list[str] = field(default_factory=list)


def sigmoid(x: np.ndarray, lower: float, upper: float, midpoint: float, slope: float) -> np.ndarray:
    """lower + (upper - lower) / (1 + exp(-slope * (x - midpoint)))."""
    return lower + (upper - lower) * special.expit(slope * (np.asarray(x, float) - midpoint))


def fit_sigmoid(
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None = None,
    levels: tuple[float, float] = (0.0, 1.0),
    increasing: bool = True,
    start: dict[str, float] | None = None,
) -> CurveFit:
    """Bounded sigmoid fit: plateaus inside `levels`, slope >= 0, midpoint within a decade of the data.

    `increasing` forces lower <= upper (a monotone rise) by fitting lower = lo + frac * (upper - lo)
    with frac in [0, 1]; otherwise either plateau may be the higher one. `start` warm-starts a
    bootstrap refit from the full-data estimate instead of a handful of data-driven starts.
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    sw = np.sqrt(np.ones_like(y) if w is None else np.asarray(w, float))
    lo, hi = levels
    mid_lo, mid_hi = x.min() - 1.0, x.max() + 1.0

    def natural(p: np.ndarray) -> tuple[float, float, float, float]:
        if increasing:
            upper, frac, mid, k = p
            return lo + frac * (upper - lo), upper, mid, k
        return tuple(p)

    def residuals(p: np.ndarray) -> np.ndarray:
        return sw * (sigmoid(x, *natural(p)) - y)

    def jacobian(p: np.ndarray) -> np.ndarray:
        lower, upper, mid, k = natural(p)
        s = special.expit(k * (x - mid))
        ds = (upper - lower) * s * (1 - s)
        cols = [p[1] * (1 - s) + s, (upper - lo) * (1 - s)] if increasing else [1 - s, s]
        return sw[:, None] * np.column_stack([*cols, -k * ds, (x - mid) * ds])

    if increasing:
        bounds = ([lo, 0.0, mid_lo, 0.0], [hi, 1.0, mid_hi, SLOPE_MAX])
    else:
        bounds = ([lo, lo, mid_lo, 0.0], [hi, hi, mid_hi, SLOPE_MAX])
    best = None
    for p0 in _sigmoid_starts(x, y, levels, increasing, start):
        p0 = np.clip(p0, np.add(bounds[0], 1e-9), np.subtract(bounds[1], 1e-9))
        res = optimize.least_squares(residuals, p0, jac=jacobian, bounds=bounds, method="trf", x_scale="jac")
        if best is None or res.cost < best.cost:
            best = res
    lower, upper, mid, k = natural(best.x)
    params = {"lower": float(lower), "upper": float(upper), "midpoint": float(mid), "slope": float(k)}
    edges = {"lower": (lo, hi), "upper": (lo, hi), "midpoint": (mid_lo, mid_hi), "slope": (0.0, SLOPE_MAX)}
    return CurveFit(params, bool(best.success), float(2 * best.cost), at_bound(params, edges))


def _sigmoid_starts(
    x: np.ndarray, y: np.ndarray, levels: tuple[float, float], increasing: bool, start: dict | None
) -> list[np.ndarray]:
    lo, hi = levels
    if start is not None:
        lower, upper = start["lower"], start["upper"]
        mids, slopes = [start["midpoint"]], [max(start["slope"], 1e-3)]
    else:
        lower, upper = np.clip(np.quantile(y, [0.05, 0.95]), lo, hi)
        mids, slopes = np.quantile(x, [0.25, 0.5, 0.75]), [1.0, 5.0]
    out = []
    for mid in mids:
        for k in slopes:
            if increasing:
                frac = (lower - lo) / (upper - lo) if upper > lo else 0.5
                out.append(np.array([upper, np.clip(frac, 0.0, 1.0), mid, k]))
            else:
                out.append(np.array([lower, upper, mid, k]))
    return out


def at_bound(params: dict[str, float], edges: dict[str, tuple[float, float]]) -> list[str]:
    """Parameters pinned to an edge of their box: a plateau at 0 or 1, a flat or step-like slope."""
    tol = {name: 1e-6 * max(1.0, abs(b - a)) for name, (a, b) in edges.items()}
    return [name for name, (a, b) in edges.items() if min(abs(params[name] - a), abs(params[name] - b)) < tol[name]]


def scalerl(c: np.ndarray, R0: float, A: float, C_mid: float, B: float) -> np.ndarray:
    """ScaleRL's compute-performance curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)."""
    return R0 + (A - R0) * special.expit(-B * np.log(C_mid / np.asarray(c, float)))


def fit_scalerl(
    c: np.ndarray, y: np.ndarray, w: np.ndarray, R0: float, start: dict[str, float] | None = None
) -> CurveFit:
    """ScaleRL's procedure: a grid over A and C_mid, B fitted by least squares for each pair, the
    pair with the lowest residual wins; then A, C_mid and B are polished jointly from the winner.

    R0 is held at the base model's value. `start` skips the grid (bootstrap refits).
    """
    c, y, w = (np.asarray(v, float) for v in (c, y, w))
    top = max(1.0, float(y.max()))
    lc_lo, lc_hi = np.log(c.min()) - np.log(100.0), np.log(c.max()) + np.log(100.0)
    if start is None:
        A, log_cm, B = _scalerl_grid(c, y, w, R0, top, lc_lo, lc_hi)
    else:
        A, log_cm, B = start["A"], np.log(start["C_mid"]), start["B"]
    sw = np.sqrt(w)

    def residuals(p: np.ndarray) -> np.ndarray:
        return sw * (scalerl(c, R0, p[0], np.exp(p[1]), p[2]) - y)

    bounds = ([R0, lc_lo, 1e-3], [top, lc_hi, 20.0])
    p0 = np.clip([A, log_cm, B], np.add(bounds[0], 1e-9), np.subtract(bounds[1], 1e-9))
    res = optimize.least_squares(residuals, p0, bounds=bounds, method="trf", x_scale="jac")
    params = {"R0": float(R0), "A": float(res.x[0]), "C_mid": float(np.exp(res.x[1])), "B": float(res.x[2])}
    # C_mid's bounds in log C, where it is fitted (in C the tolerance would scale with the largest compute).
    edges = {"A": (R0, top), "C_mid": (lc_lo, lc_hi), "B": (1e-3, 20.0)}
    return CurveFit(
        params, bool(res.success), float(2 * res.cost), at_bound({**params, "C_mid": float(res.x[1])}, edges)
    )


def _scalerl_grid(c, y, w, R0: float, top: float, lc_lo: float, lc_hi: float) -> tuple[float, float, float]:
    """Vectorised: every (A, C_mid) pair at once, B by Gauss-Newton on log B from a coarse B grid."""
    A = np.linspace(R0 + 1e-3 * (top - R0), top, 60)[:, None, None]
    log_cm = np.linspace(lc_lo, lc_hi, 60)[None, :, None]
    ell = log_cm - np.log(c)[None, None, :]  # log(C_mid / C)
    coarse = np.geomspace(0.05, 10.0, 12)
    sse = np.stack([(w * (R0 + (A - R0) * special.expit(-b * ell) - y) ** 2).sum(-1) for b in coarse])
    log_b = np.log(coarse)[sse.argmin(0)][..., None]
    for _ in range(8):  # Gauss-Newton on log B for all pairs at once
        b = np.exp(log_b)
        s = special.expit(-b * ell)
        r = R0 + (A - R0) * s - y
        j = -(A - R0) * s * (1 - s) * ell * b
        step = (w * j * r).sum(-1, keepdims=True) / np.maximum((w * j * j).sum(-1, keepdims=True), 1e-300)
        log_b = np.clip(log_b - step, np.log(1e-3), np.log(20.0))
    b = np.exp(log_b)
    sse = (w * (R0 + (A - R0) * special.expit(-b * ell) - y) ** 2).sum(-1)
    i, j = np.unravel_index(np.nanargmin(sse), sse.shape)
    return float(A[i, 0, 0]), float(log_cm[0, j, 0]), float(b[i, j, 0])


def fit_power_law(c: np.ndarray, y: np.ndarray) -> CurveFit:
    """y = coef * C^exponent by least squares in log-log space."""
    exponent, log_coef = np.polyfit(np.log(c), np.log(y), 1)
    sse = float(((np.log(y) - (log_coef + exponent * np.log(c))) ** 2).sum())
    return CurveFit({"coef": float(np.exp(log_coef)), "exponent": float(exponent)}, True, sse)
