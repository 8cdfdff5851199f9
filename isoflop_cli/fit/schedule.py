"""The adaptive schedule's rule: which cells of a sweep still run past a budget.

A full IsoFLOP grid runs every cell to the largest budget, but after the first budgets many cells
are far below the frontier and will stay there. With `grid.schedule=adaptive` every cell runs to
the smallest budget; at each budget b that follows, a cell goes on only while it could still beat
the frontier at some budget still to come:

    there is a later budget b' with   up_r(b') > max over cells of low_c(b') + indifference,

or the cell is the one whose low_c(b') is that maximum at some b' (the frontier's holder).

- low_c(b') is the least a cell's curve can be at b': the profile lower bound of a monotone curve,
  a sigmoid or a ramp (linear in log C between two flats), through its eval points, at `margin`
  standard deviations of the metric's noise (`fit/band.py`). A monotone curve is how the frontier
  reads a run (its best so far); the lower bound is in effect the cell's level now, less the noise,
  whatever shape comes next.
- up_r(b') is the most the cell's curve can be at b': the profile upper bound of the same family,
  with no cap on how fast it rises. Past a cell's last point that allows a step to the ceiling, so
  a cell at its base that learns (a flat start, a linear creep, a late jump) is never stopped for
  its shape; a cell that has risen and levelled off is bounded by the plateau its points show, and
  one climbing steadily by the ramp that carries its climb on. A cell that has left its base at
  fewer than MIN_RISEN points has no bound yet: two points into a climb, one point's noise is
  enough to read a levelling off that is not there (scripts/bench_replay.py's `linear` grids).
- A cell that has shown no learning signal, no group with unequal rewards in any window since its
  base (`zero_var_frac` = 1 at every eval point: GRPO's advantages, and so its gradient, are zero),
  has not moved and is bounded by a flat line through its points. A cell whose points rise despite
  that (another algorithm's critic, say) contradicts the flat line and is bounded as one that learns.
  Results without the column are taken to learn.
- indifference (`grid.indifference`, the metric's units) is what a tie is worth: a cell whose best
  case beats the frontier's worst by no more stops, so cells that can only tie stop costing
  compute; the holder goes on, so a grid of ties keeps one cell.
- sigma, the noise, is the pooled residual of the cells' best fits, or the sweep's variance
  model (`fit/noise.py`: between seed replicates, else the evaluation's recorded binomial variance)
  where that is larger: a run's eval points share its seed's luck and, with paired evaluation,
  their sampling streams, which no residual about its own curve shows. Until the residual has
  MIN_DOF degrees of freedom no cell is stopped (early budgets cost little).

Why the learning signal rather than a cap on the rise: the rule used to cap every cell's gain per
doubling at twice the fastest any cell's fit showed, which stopped cells that never learn but also
a winner that stays flat and then jumps, and the cap comes from other cells, not from the one it
stops. A monotone curve can do anything past its last point; what says a cell cannot is the cell's
own training signal, and `zero_var_frac` records it at every eval point. Sigmoids and ramps stay
the bound's family because their upper bound, uncapped, is only tight once a curve has levelled
off: the stops it makes are of cells whose plateau shows, which no later shape undoes. What this
costs is that a cell which learns but trails is kept until its plateau shows (scripts/bench_replay.py
measures it, on truths that are not sigmoids).

Looking to every later budget, not only the next, keeps the slow starters; comparing with the
frontier's lower end there, not only now, stops the cells that are still rising but can only
trail. A stopped cell is paused at its checkpoint, not deleted: a later full sweep, or one with
larger budgets (`continuation`), continues it. The same function decides in the sweep
(`dispatch.py`) and in `isoflop replay`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from isoflop_cli.config.schema import DEFAULT_INDIFFERENCE, DEFAULT_MARGIN
from isoflop_cli.fit.band import SHAPES, CurveBand
from isoflop_cli.fit.noise import estimate as variance_model

MIN_DOF = 8  # residual degrees of freedom the noise is read from before any cell is stopped
MIN_POINTS = 3  # eval points past the base a cell needs before it can be stopped
MIN_RISEN = (
    3  # eval points above its base (by the margin) a cell that has left its base needs before its climb is bounded
)
TIE = 1e-9  # rounding: an exact fit of flat points bounds a cell at the frontier to within this
TOLERANCE = 1.1  # a FLOP-budget run stops at the first step whose ledger reaches a budget: a little above it
SIGNAL = "zero_var_frac"  # per eval point, the share of the groups since the last one whose rewards were all equal


@dataclass(frozen=True)
class Decision:
    """One cell at one budget: its best so far, and at the later budget `at` where it comes closest
    to the frontier, the most it could reach there and the least the frontier will be; whether it
    has shown a learning signal (a group with unequal rewards), and whether it goes on."""

    run: str
    budget: float
    best: float
    reach: float
    frontier: float
    at: float
    learns: bool
    go: bool


def decide(
    points: pd.DataFrame,
    budget: float,
    budgets: list[float],
    margin: float = DEFAULT_MARGIN,
    indifference: float = DEFAULT_INDIFFERENCE,
    metric: str = "val_avg@k",
    compute: str = "rollouts",
    run: str = "run_id",
) -> list[Decision]:
    """Which runs continue past `budget` towards the later of the sweep's `budgets`; `points` holds
    the eval points each run had when it reached `budget` (with its step-0 base evaluation, and
    SIGNAL where the run recorded it)."""
    later = sorted(b for b in budgets if b > budget * (1 + 1e-9))
    best = points.groupby(run, sort=False)[metric].max()
    learns = _learns(points, compute, run)
    bands = _bands(points, math.log2(max(budgets)), metric, compute, run)
    sigma = _noise(bands.values())
    if sigma is not None:
        sigma = max(sigma, variance_model(points, metric, compute, run).sd or 0.0)
    if not later or sigma is None:  # the last budget, or too few points to read the noise: no cell is stopped
        return [
            Decision(str(r), float(budget), float(v), math.inf, math.nan, float(max(budgets)), bool(learns[r]), True)
            for r, v in best.items()
        ]
    slack = (margin * sigma) ** 2
    x = np.log2(later)
    lows = np.array([b.extreme(x, slack, upper=False) for b in bands.values()])
    lows = np.where(np.isfinite(lows), lows, -np.inf)  # a bound that failed counts for nothing
    frontier = lows.max(axis=0)
    holders = {list(bands)[i] for i in np.argmax(lows, axis=0)}  # the cells whose lower ends make the frontier's
    climbs = _climbing(points, margin * sigma, metric, compute, run)
    out = []
    for r, value in best.items():
        # Too few points, or a climb seen at fewer than MIN_RISEN: no bound.
        reach = _reach(bands[r], x, slack, learns[r]) if r in bands and not climbs[r] else np.full(len(x), np.inf)
        i = int(np.argmax(reach - frontier))
        # A cell goes on while it holds the frontier, or could beat it by more than the indifference.
        go = r in holders or reach[i] > frontier[i] + indifference + TIE
        out.append(
            Decision(
                str(r),
                float(budget),
                float(value),
                float(reach[i]),
                float(frontier[i]),
                float(later[i]),
                bool(learns[r]),
                bool(go),
            )
        )
    return out


def _climbing(points: pd.DataFrame, above: float, metric: str, compute: str, run: str) -> pd.Series:
    """Per run, whether it has just started to climb: it stands more than `above` over its base (its
    step-0 evaluation, else its first point) at some eval points, but at fewer than MIN_RISEN."""
    out = {}
    for r, g in points.groupby(run, sort=False):
        base = g.loc[g[compute] == 0, metric]
        floor = float(base.iloc[0]) if len(base) else float(g[metric].iloc[0])
        risen = int((g.loc[g[compute] > 0, metric] > floor + above).sum())
        out[r] = 0 < risen < MIN_RISEN
    return pd.Series(out, dtype=bool)


def _reach(band: CurveBand, x: np.ndarray, slack: float, learns: bool) -> np.ndarray:
    """The most a cell can be at the computes x: any monotone curve its points allow, a step
    right past its last point included, unless it has shown no learning signal: then it stays where
    its points are (a flat line, unless the points themselves rise)."""
    reach = band.extreme(x, slack, upper=True, rise_max=np.inf if learns else 0.0)
    return np.where(np.isfinite(reach), reach, np.inf)  # a bound that failed stops nothing


def _learns(points: pd.DataFrame, compute: str, run: str) -> pd.Series:
    """Per run, whether it can learn: not all of its groups so far had equal rewards. A run without
    the column (or with it empty) is taken to learn."""
    if SIGNAL not in points:
        return pd.Series(True, index=points[run].unique())
    later = points.loc[points[compute] > 0]
    signal = pd.to_numeric(later[SIGNAL], errors="coerce")  # a base row's is empty
    learned = signal.groupby(later[run], sort=False).agg(lambda s: s.isna().all() or (s < 1).any())
    return learned.reindex(points[run].unique(), fill_value=True).astype(bool)


def _bands(
    points: pd.DataFrame, x_max: float, metric: str, compute: str, run: str, shapes: tuple[str, ...] = SHAPES
) -> dict[str, CurveBand]:
    """A CurveBand per run with MIN_POINTS eval points past its base."""
    out = {}
    for r, g in points.groupby(run, sort=False):
        later = g[g[compute] > 0]
        if len(later) >= MIN_POINTS:
            base = g.loc[g[compute] == 0, metric]
            out[r] = CurveBand(
                np.log2(later[compute].to_numpy(float)),
                later[metric].to_numpy(float),
                float(base.iloc[0]) if len(base) else None,
                x_max,
                shapes,
            )
    return out


def noise(
    points: pd.DataFrame,
    metric: str = "val_avg@k",
    compute: str = "rollouts",
    run: str = "run_id",
    shapes: tuple[str, ...] = SHAPES,
) -> float | None:
    """The metric's noise (one sd): the pooled residual of each run's best curve of `shapes` (the
    rule's own, by default); None if too few points."""
    return _noise(_bands(points, math.log2(points[compute].max()), metric, compute, run, shapes).values())


def _noise(bands) -> float | None:
    """One standard deviation of the metric's noise: the pooled residual of the runs' best
    fits (4 parameters each), from runs with points to spare; None below MIN_DOF degrees of freedom."""
    spare = [b for b in bands if b.points > 4]
    dof = sum(b.points - 4 for b in spare)
    return math.sqrt(sum(b.sse for b in spare) / dof) if dof >= MIN_DOF else None


def stage_of(compute: np.ndarray, stages: list[float]) -> np.ndarray:
    """Index of the first stage budget each compute value falls under (len(stages) above the last)."""
    return np.searchsorted(np.asarray(stages, float) * TOLERANCE, np.asarray(compute, float), side="left")
