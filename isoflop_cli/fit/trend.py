"""Does the best axis value (n*) grow with compute? One pre-specified test, with runs as the unit.

The question a sweep exists for is about the *direction* of axis*(C), not about where one noisy point
estimate of it lands at each budget. The test asks it of the grid's middle m (the mean of log2 axis
over the runs: n ~ 5.7 on 2..16): does the optimum cross m, upwards or downwards, between the first
and the last budget every run covers? "rises" needs all of:

- at the first common budget the metric *falls* with log2 axis across the grid (its least-squares
  slope, one-sided t test at ALPHA), and
- at the last common budget it *rises* (likewise), and
- the best axis value (the highest mean) lies below m at the first budget and above m at the last,
  read from the runs' metric there and from their lines (below) alike.

"falls" is the mirror image. A run is read as the least-squares line of its metric in log2 C over
BUDGETS common budgets (each run interpolated linearly in log2 C between its eval points): its ends,
that line's values at the first and the last budget, average the evaluation's noise over the run's
points, and their difference (what the run gains) is a within-run contrast where the seed's offset
cancels. The slopes are fitted by least squares over runs with an intercept per stratum (runs alike
in every designed column but the axis, e.g. B_p); the noise of a run's two ends (their 2x2
covariance) is read between the seeds of each cell where cells are replicated, else from the fit's
residuals. Both slopes must be significant on their own (an intersection-union test), so the call is
made in at most ALPHA of sweeps, per direction, where the slope does not change sign; the reported
p is the larger of the two one-sided p-values.

Why the slope across the grid and not where the optimum is: the optimum of a few noisy cells is
uncertain, and a test that reads the change of slope *at* an estimated optimum calls a trend
wherever the curves change shape around a fixed best: on synthetic sweeps with one n best at every
budget and the others catching up without passing it, such a test (the gains' quadratic slope at the
levels' optimum, delta method) calls a trend in 98-100% of grids. The best-value condition stops a slope that
turns because the far values catch up (n* fixed off-centre) from being read as a move.

What it cannot see: a move of axis* within one half of the grid (2 -> 4 on 2..16): centre the grid on
where axis* is expected. And the best-value condition is a point estimate: where values on both
sides of the middle tie at the last budget and the slope still turns, it calls "rises" as often as
the tie breaks upwards.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.noise import SEED

ALPHA = 0.05  # each slope's one-sided level; a trend is called when both clear it
BUDGETS = 6  # common budgets each run is read at (log-spaced over the range every run covers)
METHOD = (
    "each run's least-squares line in log2 C over common budgets, read at the first and the last; the metric's "
    "slope in log2 of the axis across the grid at each (a stratum intercept per designed column), one-sided t "
    "tests with runs as the unit, both required (intersection-union), and the best value crossing the grid's middle"
)


@dataclass(frozen=True)
class Trend:
    """fit.json's `n_star_trend`: the answer (`call`), how big (`effect`: how much the metric's slope in
    log2 axis turns between the first and the last common budget), how sure (`interval90` of that turn,
    `p_value` of the call), and what it was read from. `why` says why there is no answer where none
    could be read, or why slopes that turn are not a move of axis*."""

    call: str  # "rises" | "falls" | "none"
    effect: float | None
    interval90: list[float] | None
    p_value: float | None  # the larger of the two slopes' one-sided p, in the direction of `effect`
    method: str
    slopes: list[float] | None = None  # metric per doubling of the axis across the grid: [first, last] budget
    slopes_interval90: list[list[float]] | None = None
    best: list[float] | None = None  # the axis value of the highest mean: [first, last] budget (point estimates)
    middle: float | None = None  # the grid's middle: the axis value axis* must cross
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
            else f"not shown: the metric's slope in {axis} does not change sign at the {ALPHA:g} level",
        }[self.call]
        (first, last), (lo, hi) = self.slopes, (_budget(self.budgets[0]), _budget(self.budgets[-1]))
        turn_lo, turn_hi = self.interval90
        return [
            question,
            f"Answer: {answer}; {axis} = {self.best[0]:g} is best at {lo} and {axis} = {self.best[1]:g} at {hi}, "
            f"the grid's middle is {axis} ~ {self.middle:.3g}.",
            f"How sure: p = {self.p_value:.3g} (the larger one-sided p of the two slopes); per doubling of {axis} "
            f"the metric's slope is {first:+.3g} at {lo} and {last:+.3g} at {hi}, turning by {self.effect:+.3g} "
            f"(90% interval {turn_lo:+.3g} to {turn_hi:+.3g}); {self.runs} runs in {self.cells} cells, {self.dof} dof.",
        ]


def _budget(value: float) -> str:
    return f"{value:,.0f}" if value < 1e6 else f"{value:.3g}"


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
    zc = z - z.mean()
    gains = y @ (zc / (zc @ zc))  # (runs,): each run's least-squares slope in log2 C
    ends = y.mean(1)[:, None] + gains[:, None] * zc[[0, -1]]  # (runs, 2): that line at the first and last budget
    return read(x, stratum, cell, ends, y[:, [0, -1]], [float(b) for b in budgets])


def read(
    x: np.ndarray, stratum: np.ndarray, cell: np.ndarray, ends: np.ndarray, values: np.ndarray, budgets: list[float]
) -> Trend:
    """The test on per-run (x = log2 axis, stratum, cell): `ends` (runs, 2) are each run's line at the
    first and the last budget, `values` (runs, 2) its metric there; the slopes are read from the ends,
    the best value from both: see the module docstring."""
    centre = x.mean()
    strata = np.unique(stratum)
    X = np.column_stack([(stratum == s).astype(float) for s in strata] + [x - centre])  # (runs, strata + 1)
    known = dict(runs=int(x.size), cells=int(np.unique(cell).size), budgets=budgets, middle=float(2**centre))
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return none(f"the {'strata and axis values' if strata.size > 1 else 'axis values'} do not separate", **known)
    A = np.linalg.inv(X.T @ X)
    beta = A @ X.T @ ends  # (strata + 1, 2)
    cov, dof = _residual_cov(ends, X, beta, cell)
    if dof < 1:
        return none("no degrees of freedom left for the noise (more seeds or axis values needed)", **known)
    k = strata.size  # the slope's row in beta
    slopes = beta[k]  # (2,): first, last
    se = np.sqrt(np.diag(cov) * A[k, k])
    turn_se = float(np.sqrt(max(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1], 0.0) * A[k, k]))
    if not (se > 0).all():
        return none("the runs have no spread to test against", dof=dof, **known)
    effect = float(slopes[1] - slopes[0])
    sign = 1.0 if effect >= 0 else -1.0  # rises: the first slope below zero, the last above
    t = slopes / se
    p = float(max(stats.t.cdf(sign * t[0], dof), stats.t.sf(sign * t[1], dof)))
    q = float(stats.t.ppf(0.95, dof))
    best = [_best(x, stratum, values[:, i]) for i in (0, 1)]
    lines = [_best(x, stratum, ends[:, i]) for i in (0, 1)]
    crosses = all(sign * (b[0] - centre) < 0 < sign * (b[1] - centre) for b in (best, lines))
    direction = "rises" if sign > 0 else "falls"
    call = direction if p < ALPHA and crosses else "none"
    why = (
        "the slope changes sign, but the best value does not cross the grid's middle"
        if p < ALPHA and not crosses
        else None
    )
    return Trend(
        call,
        effect,
        [effect - q * turn_se, effect + q * turn_se],
        p,
        METHOD,
        slopes=[float(s) for s in slopes],
        slopes_interval90=[[float(s - q * e), float(s + q * e)] for s, e in zip(slopes, se)],
        best=[float(2**b) for b in best],
        dof=dof,
        why=why,
        **known,
    )


def _best(x: np.ndarray, stratum: np.ndarray, values: np.ndarray) -> float:
    """The log2 axis value of the highest mean of `values`, each stratum's mean taken out first."""
    index = np.unique(stratum, return_inverse=True)[1]
    adjusted = values - (np.bincount(index, values) / np.bincount(index))[index]
    axis, where = np.unique(x, return_inverse=True)
    return float(axis[np.argmax(np.bincount(where, adjusted) / np.bincount(where))])


def _residual_cov(Y: np.ndarray, X: np.ndarray, beta: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, int]:
    """The covariance of a run's two ends about their expectation, and its degrees of freedom: pure
    error between the seeds of each cell where cells are replicated (it holds no lack of fit of the
    line in log2 axis), else the fit's residuals."""
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
