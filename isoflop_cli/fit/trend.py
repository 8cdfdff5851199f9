"""Does the best axis value (n*) grow with compute? One pre-specified test, with runs as the unit.

The question a sweep exists for is about the *direction* of axis*(C), not about where one noisy
point estimate of it lands at each budget. Where axis* sits at the top of the metric as a function of
x = log2(axis), the metric's slope in x is zero; if axis* moves as compute grows, that slope moves
off zero at the optimum, in the direction axis* goes:

    d x*/d log C = - (d^2 y / dx dlogC) / (d^2 y / dx^2)    (the denominator < 0 at a maximum)

so the sign of the interaction d^2 y / dx dlogC *at x** is the sign of axis*'s drift. The test reads it
from two numbers per run, both taken from the run's own curve at common budgets C_1..C_K (the range
every run covers, each run interpolated in log2 C):

- its level L = the mean of its metric over the budgets (where it stands), and
- its gain G = the least-squares slope of its metric in log2 C (how much it gains per doubling of
  compute). The gain is a within-run contrast: what a run's seed does to its whole curve cancels,
  and its points are paired.

Both are fitted on x and x^2 (with an intercept per stratum: runs alike in every designed column but
the axis, e.g. B_p), by least squares over runs. x* is the top of the levels' quadratic within the
grid, and the effect T is the slope of the gains' quadratic at x*. Its variance is the delta method's
over both fits (x* is estimated too), with the residual covariance of (L, G) read from seed replicates
(runs of one cell) where there are any, else from the fits' residuals; T / se is read against
Student's t with those degrees of freedom. The call is made at p < ALPHA (two-sided); the interval
reported is the 90% one.

Why not the obvious alternatives: the interaction of the *linear* slope in x with log C also moves
when one n is best at every budget and its peak only sharpens with compute (the grid's values left
of the peak and right of it gain differently), and the argmax of cell means at each budget is a noisy
step whose trend has no calibrated null. Measured on synthetic sweeps whose truth is not this model
(tests/test_fit_trend.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.noise import SEED

ALPHA = 0.05  # the call's two-sided level: a trend is called when p < ALPHA
BUDGETS = 6  # common budgets each run is read at (log-spaced over the range every run covers)
METHOD = (
    "levels and per-doubling gains of each run at common budgets; quadratic in log2 of the axis (a stratum "
    "intercept per designed column); slope of the gains at the levels' optimum; delta-method t test, runs as the unit"
)


@dataclass(frozen=True)
class Trend:
    """fit.json's `n_star_trend`: the answer (`call`), how big (`effect`: the change, per doubling of
    the axis at axis*, of the metric's gain per doubling of compute), how sure (`interval90`,
    `p_value`), and what it was read from. `why` says why there is no answer where none could be read."""

    call: str  # "rises" | "falls" | "none"
    effect: float | None
    interval90: list[float] | None
    p_value: float | None
    method: str
    axis_at_optimum: float | None = None  # axis* of the levels (where the slope is read)
    drift: float | None = None  # doublings of axis* per doubling of compute (point estimate; interior optimum only)
    runs: int = 0
    cells: int = 0
    dof: int = 0
    budgets: list[float] | None = None
    why: str | None = None

    def entry(self) -> dict:
        return asdict(self)

    def lines(self, axis: str) -> list[str]:
        """The report's first three lines: the question, the answer, how sure."""
        question = f"Does the best {axis} ({axis}*) grow with compute?"
        if self.effect is None:
            return [question, f"Answer: cannot tell: {self.why}.", "How sure: no test was made."]
        answer = {
            "rises": f"yes: {axis}* rises with compute",
            "falls": f"no: {axis}* falls with compute",
            "none": f"not shown: {self.why}"
            if self.why
            else f"not shown: no trend of {axis}* with compute at the {ALPHA:g} level",
        }[self.call]
        drift = (
            f"; {axis}* moves about {self.drift:+.2f} doublings per doubling of compute"
            if self.drift is not None
            else ""
        )
        lo, hi = self.interval90
        return [
            question,
            f"Answer: {answer} (at {axis} ~ {self.axis_at_optimum:.3g}{drift}).",
            f"How sure: p = {self.p_value:.3g}; effect {self.effect:+.4g} (90% interval {lo:+.4g} to {hi:+.4g}) from "
            f"{self.runs} runs in {self.cells} cells, {self.dof} dof.",
        ]


def none(why: str, **known) -> Trend:
    return Trend("none", None, None, None, METHOD, why=why, **known)


def n_star_trend(df: pd.DataFrame, spec: FitSpec) -> Trend:
    """The test on a sweep's eval points (one row per eval point; RUN keys runs)."""
    rows = df[np.isfinite(df[spec.compute].to_numpy(float)) & (df[spec.compute].to_numpy(float) > 0)]
    runs = run_table(rows, spec)
    if runs[spec.axis].nunique() < 2:
        return none(f"one {spec.axis} value", runs=len(runs))
    budgets = common_budgets(rows.groupby(RUN)[spec.compute].min().max(), rows.groupby(RUN)[spec.compute].max().min())
    if budgets is None:
        return none("the runs share less than one doubling of compute", runs=len(runs))
    curves = dict(tuple(rows.groupby(RUN, sort=False)))
    y = np.stack([_at(curves[r], spec, budgets) for r in runs.index])  # (runs, budgets)
    return test(
        np.log2(runs[spec.axis].to_numpy(float)), runs["_stratum"].to_numpy(), runs["_cell"].to_numpy(), y, budgets
    )


def test(x: np.ndarray, stratum: np.ndarray, cell: np.ndarray, y: np.ndarray, budgets: np.ndarray) -> Trend:
    """The test on runs' curves at common budgets: x (runs,) = log2 axis, y (runs, budgets) the metric.
    `plan`'s power analysis calls it on simulated curves: what it predicts is this test's call rate."""
    z = np.log2(budgets)
    w = (z - z.mean()) / ((z - z.mean()) ** 2).sum()
    return read(x, stratum, cell, y.mean(1), y @ w, [float(b) for b in budgets])  # levels, gains: (runs,)


def read(
    x: np.ndarray, stratum: np.ndarray, cell: np.ndarray, levels: np.ndarray, gains: np.ndarray, budgets: list[float]
) -> Trend:
    """The test on per-run (x = log2 axis, stratum, cell, level, gain): see the module docstring."""
    values = np.unique(x)
    quadratic = values.size >= 3
    centre = x.mean()
    u = x - centre
    strata = np.unique(stratum)
    X = np.column_stack(
        [(stratum == s).astype(float) for s in strata] + [u] + ([u**2] if quadratic else [])
    )  # (runs, p)
    Y = np.column_stack([levels, gains])  # (runs, 2)
    known = dict(runs=int(x.size), cells=int(np.unique(cell).size), budgets=budgets)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return none(f"the {'strata and axis values' if strata.size > 1 else 'axis values'} do not separate", **known)
    A = np.linalg.inv(X.T @ X)
    beta = A @ X.T @ Y  # (p, 2)
    cov, dof = _residual_cov(Y, X, beta, cell)
    if dof < 1:
        return none("no degrees of freedom left for the noise (more seeds or axis values needed)", **known)
    k = strata.size  # the axis terms' rows in beta
    b1, b2 = beta[k, 0], (beta[k + 1, 0] if quadratic else 0.0)
    g1, g2 = beta[k, 1], (beta[k + 1, 1] if quadratic else 0.0)
    ulo, uhi = values.min() - centre, values.max() - centre
    interior = quadratic and b2 < 0 and ulo < -b1 / (2 * b2) < uhi
    ustar = -b1 / (2 * b2) if interior else max((ulo, uhi), key=lambda v: b1 * v + b2 * v * v)
    effect = g1 + 2 * g2 * ustar
    # The delta method: T = g1 + 2 g2 u*(b1, b2); u* moves with the levels' fit only where it is interior.
    grad_g = np.array([1.0, 2 * ustar])[: 2 if quadratic else 1]
    grad_b = 2 * g2 * np.array([-1 / (2 * b2), b1 / (2 * b2**2)]) if interior else np.zeros(2 if quadratic else 1)
    terms = slice(k, k + (2 if quadratic else 1))
    Ab = A[terms, terms]
    var = cov[1, 1] * grad_g @ Ab @ grad_g + 2 * cov[0, 1] * grad_g @ Ab @ grad_b + cov[0, 0] * grad_b @ Ab @ grad_b
    se = float(np.sqrt(max(var, 0.0)))
    if se == 0.0:
        return none("the runs' gains have no spread to test against", dof=dof, **known)
    t = effect / se
    p = float(2 * stats.t.sf(abs(t), dof))
    half = float(stats.t.ppf(0.95, dof) * se)
    direction = "rises" if effect > 0 else "falls"
    # At an edge of the grid the optimum can only be seen to move inwards: the gains pushing it
    # outwards say it stays at the edge (or lies beyond it), not that it moves within the grid.
    outward = not interior and (ustar == ulo) == (direction == "falls")
    call = direction if p < ALPHA and not outward else "none"
    why = (
        (
            f"the optimum is the grid's {'smallest' if ustar == ulo else 'largest'} value and the gains push it "
            "further out: "
            "it may lie beyond the grid (extend it to see)"
        )
        if p < ALPHA and outward
        else None
    )
    drift = float(-effect / (2 * b2)) if interior else None
    return Trend(
        call,
        float(effect),
        [float(effect - half), float(effect + half)],
        p,
        METHOD,
        axis_at_optimum=float(2 ** (ustar + centre)),
        drift=drift,
        dof=dof,
        why=why,
        **known,
    )


def _residual_cov(Y: np.ndarray, X: np.ndarray, beta: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, int]:
    """The covariance of a run's (level, gain) about its expectation, and its degrees of freedom: pure
    error between the seeds of each cell where cells are replicated (it holds no lack of fit of the
    quadratic), else the fit's residuals."""
    cells, index = np.unique(cell, return_inverse=True)
    dof = Y.shape[0] - cells.size
    if dof >= 2:
        means = np.stack([Y[index == i].mean(0) for i in range(cells.size)])
        dev = Y - means[index]
    else:
        dev, dof = Y - X @ beta, Y.shape[0] - X.shape[1]
    return (dev.T @ dev) / max(dof, 1), int(dof)


def common_budgets(lo: float, hi: float) -> np.ndarray | None:
    """BUDGETS log-spaced budgets from `lo` (the latest first eval point of any run) to `hi` (the
    earliest last one): the range every run covers. None where that is less than one doubling."""
    return np.geomspace(lo, hi, BUDGETS) if hi >= 2 * lo else None


def weights(points: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """(budgets, points): the matrix that reads values at `points` (increasing, covering `budgets`)
    at `budgets`, linear in log2 C between neighbours; `plan`'s simulations apply one to many curves."""
    z, zb = np.log2(points), np.log2(budgets)
    right = np.clip(np.searchsorted(z, zb), 1, z.size - 1)
    frac = (zb - z[right - 1]) / (z[right] - z[right - 1])
    out = np.zeros((zb.size, z.size))
    out[np.arange(zb.size), right - 1] = 1 - frac
    out[np.arange(zb.size), right] = frac
    return out


def _at(run: pd.DataFrame, spec: FitSpec, budgets: np.ndarray) -> np.ndarray:
    """A run's metric at `budgets` (`weights`; a repeated compute: the mean of its values)."""
    compute, metric = run[spec.compute].to_numpy(float), run[spec.metric].to_numpy(float)
    points, where = np.unique(compute, return_inverse=True)
    return weights(points, budgets) @ (np.bincount(where, metric) / np.bincount(where))


def run_table(df: pd.DataFrame, spec: FitSpec) -> pd.DataFrame:
    """One row per run (index RUN): its axis value, its cell (runs alike in every designed column but
    the seed) and its stratum (alike in every designed column but the seed and the axis).

    Designed columns are those constant within every run, less those the others determine (lr
    follows the batch n * B_p, and M the budget and batch: as strata they would split every axis
    value into a stratum of its own). The most varied column is dropped first."""
    drop = {SEED, "run_id", RUN, spec.metric, spec.compute}
    first = df.groupby(RUN, sort=False).first()
    constant = (
        df.drop(columns=[c for c in drop if c in df.columns])
        .groupby(df[RUN], sort=False)
        .nunique(dropna=False)
        .le(1)
        .all()
    )
    keys = [c for c in constant.index[constant] if c != spec.axis and first[c].nunique(dropna=False) > 1]
    for column in sorted(keys, key=lambda c: -first[c].nunique(dropna=False)):
        rest = [spec.axis] + [c for c in keys if c != column]
        if first.groupby(rest, dropna=False)[column].nunique(dropna=False).max() <= 1:
            keys.remove(column)
    out = pd.DataFrame({spec.axis: first[spec.axis].astype(float)}, index=first.index)
    out["_stratum"] = first.groupby(keys, dropna=False, sort=False).ngroup().to_numpy() if keys else 0
    out["_cell"] = first.groupby([spec.axis] + keys, dropna=False, sort=False).ngroup().to_numpy()
    return out
