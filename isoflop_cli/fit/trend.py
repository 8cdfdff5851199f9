"""Does the best axis value (n*) grow with compute? One pre-specified test, with runs as the unit.

The question is about where the best value stands at the first and at the last budget every run
covers, and the best of a few noisy cells is a set, not a point. So the test reads, at each of those
two budgets, a confidence set for the best axis value, and calls:

- `rises` where the set at the last budget lies wholly above the set at the first (every member of
  the first below every member of the last); `falls`, the mirror image;
- `none` otherwise, with the reading the data give (`why`): every value tied at the last budget (the
  sweep ran past where the axis matters), the two sets overlapping, or the best values not moving.

Each run is read at the two budgets from its eval points (linear in log2 C between neighbours: its
values there, not a line through the run). At each budget the metric is fitted as an effect per axis
value plus an intercept per stratum (runs alike in every designed column but the axis and the seed,
e.g. B_p); its noise is the pooled variance between the seeds of each cell at that budget (its own
figure at each budget: runs spread as they train), else the fit's residuals. A value belongs to the
set unless some other value beats it by more than the one-sided Bonferroni bound over the other
K - 1 values at level ALPHA (multiple comparisons with the best): each set holds the true best with
probability at least 1 - ALPHA, both at once with at least 1 - 2 ALPHA. Where n* does not rise, a
"rises" needs one of the two sets to miss the true best, so it is made in at most 2 ALPHA of sweeps
whatever the curves' shapes; a set misses the best only where a rival beats it by the Bonferroni
bound over all K - 1 others, so on sweeps it is far rarer (docs/fitting.md). The reported p is the
smallest per-budget level at which the sets separate; the call is made where it is below ALPHA.

`effect` is how many doublings of the axis the best value moves (the point estimates: the highest
mean at each budget), `interval90` the move's range over the two sets (lowest of the last minus
highest of the first, highest minus lowest), which holds the true move with probability at least
0.9. A move within one half of the grid (4 -> 8 on 4..64) is a move like any other; a tie at the
top budget is said, not read as a move. What it checks on is docs/fitting.md's table: sweeps
simulated from how GRPO learns (fit/bank.py), never from the test's own model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.noise import SEED

ALPHA = 0.05  # each budget's set for the best value holds it with 1 - ALPHA; a call is made where p < ALPHA
READINGS = ("tied at the last budget", "tied at the first budget", "same best", "sets overlap")
METHOD = (
    "each run's metric at the first and the last budget every run covers; at each, a confidence set for the best "
    "axis value (an effect per value and an intercept per stratum, the seeds' pooled noise at that budget, "
    "one-sided Bonferroni comparisons with the best at level 0.05); a move called where the two sets separate"
)


@dataclass(frozen=True)
class Trend:
    """fit.json's `n_star_trend`: the answer (`call`), how big (`effect`: doublings of the axis the best
    value moves between the first and the last common budget), how sure (`interval90`, the move's range
    over the two sets; `p_value`, the smallest level that makes the call), and what it was read from:
    `best` (the highest mean at each budget), `best_sets` (each budget's confidence set for the best),
    `sd` (the noise between seeds at each budget). Where no move is called, `reading` says what the data
    show (READINGS) and `why` says it in words; `why` alone, why no test could be made."""

    call: str  # "rises" | "falls" | "none"
    effect: float | None
    interval90: list[float] | None
    p_value: float | None  # the smaller of the two directions' p; the call is made where it is below ALPHA
    method: str
    best: list[float] | None = None  # [first, last] budget: the axis value of the highest mean
    best_sets: list[list[float]] | None = None  # [first, last]: the values the best may be (level 1 - ALPHA each)
    sd: list[float] | None = None  # [first, last]: one run's sd about its cell's mean
    reading: str | None = None  # one of READINGS where a test was made and no move is called
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
            "none": f"not shown: {self.why}",
        }[self.call]
        (first, last), (lo, hi) = self.best_sets, (_budget(self.budgets[0]), _budget(self.budgets[-1]))
        move_lo, move_hi = self.interval90
        return [
            question,
            f"Answer: {answer}; {axis}* is {_members(first)} at {lo} and {_members(last)} at {hi} "
            f"(the best mean: {axis} = {self.best[0]:g}, then {self.best[1]:g}).",
            f"How sure: p = {self.p_value:.3g}; {axis}* moves {self.effect:+g} doublings "
            f"(90% range {move_lo:+g} to {move_hi:+g}); the sd between seeds is {self.sd[0]:.3g} at {lo} "
            f"and {self.sd[1]:.3g} at {hi}; {self.runs} runs in {self.cells} cells, {self.dof} dof.",
        ]


def _budget(value: float) -> str:
    return f"{value:,.0f}" if value < 1e6 else f"{value:.3g}"


def _members(values: list[float]) -> str:
    return f"{values[0]:g}" if len(values) == 1 else "{" + ", ".join(f"{v:g}" for v in values) + "}"


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
    y = np.stack([at(curves[r], spec, budgets) for r in runs.index])  # (runs, 2)
    return test(
        np.log2(runs[spec.axis].to_numpy(float)),
        runs["_stratum"].to_numpy(),
        runs["_cell"].to_numpy(),
        y,
        budgets,
        spec.axis,
    )


def test(
    x: np.ndarray, stratum: np.ndarray, cell: np.ndarray, y: np.ndarray, budgets: np.ndarray, axis: str = "n"
) -> Trend:
    """The test on per-run x (runs,) = log2 axis, its stratum and cell, and y (runs, budgets) the metric
    at common budgets, of which the first and the last are read. `plan`'s power analysis calls it on
    simulated curves: what it predicts is this test's call rate."""
    levels = np.unique(x)
    known = dict(runs=int(x.size), cells=int(np.unique(cell).size), budgets=[float(budgets[0]), float(budgets[-1])])
    strata = np.unique(stratum)
    X = np.column_stack(
        [(stratum == s).astype(float) for s in strata] + [(x == v).astype(float) for v in levels[1:]]
    )  # (runs, strata + levels - 1)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return none(f"the strata and {axis} values do not separate", **known)
    A = np.linalg.inv(X.T @ X)
    reads = [_best_set(X, A, levels, strata.size, cell, y[:, i]) for i in (0, -1)]
    if any(r is None for r in reads):
        return none("no degrees of freedom left for the noise (more seeds or axis values needed)", **known)
    (exclude1, means1, sd1, dof), (exclude2, means2, sd2, _) = reads
    if not (sd1 > 0 and sd2 > 0):
        return none("the runs have no spread to test against", dof=dof, **known)
    # The smallest per-budget level at which the sets separate, over every split of the sorted values.
    splits = range(1, levels.size)
    p_rise = min(max(exclude1[m:].max(), exclude2[:m].max()) for m in splits)
    p_fall = min(max(exclude1[:m].max(), exclude2[m:].max()) for m in splits)
    p = min(p_rise, p_fall)
    best = [float(levels[np.argmax(means1)]), float(levels[np.argmax(means2)])]
    sets = [levels[exclude1 >= ALPHA], levels[exclude2 >= ALPHA]]
    call = ("rises" if p_rise <= p_fall else "falls") if p < ALPHA else "none"
    reading, why = (None, None) if call != "none" else _reading(axis, levels, sets, best, known["budgets"])
    return Trend(
        call,
        best[1] - best[0],
        [float(sets[1].min() - sets[0].max()), float(sets[1].max() - sets[0].min())],
        p,
        METHOD,
        best=[float(2**b) for b in best],
        best_sets=[[float(2**v) for v in s] for s in sets],
        sd=[sd1, sd2],
        reading=reading,
        dof=dof,
        why=why,
        **known,
    )


def _best_set(
    X: np.ndarray, A: np.ndarray, levels: np.ndarray, k: int, cell: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float, int] | None:
    """At one budget, from the design X (runs, k strata + K - 1 values) and A = (X'X)^-1: each axis
    value's exclusion p (the smallest level at which some other value beats it by the one-sided
    Bonferroni bound over the K - 1 others), the values' means (stratum effects out), one run's sd about
    its cell's mean and its dof; None without dof for the noise."""
    beta = A @ X.T @ v
    cells, index = np.unique(cell, return_inverse=True)
    dof = v.size - cells.size
    if dof >= 2:  # pure error between the seeds of each cell
        dev = v - (np.bincount(index, v) / np.bincount(index))[index]
    else:
        dev, dof = v - X @ beta, v.size - X.shape[1]
    if dof < 1:
        return None
    var = float(dev @ dev) / dof
    K = levels.size
    # Each value's effect against the first, and the contrasts' covariance (the first's effect is 0).
    means = np.concatenate([[0.0], beta[k:]])
    cov = np.zeros((K, K))
    cov[1:, 1:] = A[k:, k:] * var
    diff = means[None, :] - means[:, None]  # [a, b]: b's mean above a's
    se = np.sqrt(np.maximum(np.diag(cov)[:, None] + np.diag(cov)[None, :] - 2 * cov, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, diff / se, np.sign(diff) * np.inf)
    t[np.eye(K, dtype=bool)] = -np.inf
    exclude = np.minimum(1.0, (K - 1) * stats.t.sf(t.max(1), dof))  # (K,)
    return exclude, means, float(np.sqrt(var)), int(dof)


def _reading(
    axis: str, levels: np.ndarray, sets: list[np.ndarray], best: list[float], budgets: list[float]
) -> tuple[str, str]:
    """What the data show where no move is called: one of READINGS, and in words."""
    show = lambda s: _members([float(2**v) for v in s])  # noqa: E731
    tied_last, tied_first, same, overlap = READINGS
    if sets[1].size == levels.size:
        return tied_last, (
            f"every {axis} is within the noise of the best at the last budget ({_budget(budgets[1])}): the sweep ran "
            f"past where {axis} matters, or {axis} does not matter here"
        )
    if sets[0].size == levels.size:
        return tied_first, f"every {axis} is within the noise of the best at the first budget ({_budget(budgets[0])})"
    if best[0] == best[1]:
        return same, f"{axis} = {2 ** best[0]:g} is best at both budgets"
    return overlap, (
        f"the best {axis} reads {2 ** best[0]:g} then {2 ** best[1]:g}, but what it may be overlaps: "
        f"{show(sets[0])} at {_budget(budgets[0])}, {show(sets[1])} at {_budget(budgets[1])} (more seeds narrow both)"
    )


def common_budgets(lo: float, hi: float) -> np.ndarray | None:
    """The first and the last budget every run covers: `lo` (the latest first eval point of any run) and
    `hi` (the earliest last one). None where that is less than one doubling."""
    return np.array([lo, hi], float) if hi >= 2 * lo else None


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


def at(run: pd.DataFrame, spec: FitSpec, budgets: np.ndarray) -> np.ndarray:
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
