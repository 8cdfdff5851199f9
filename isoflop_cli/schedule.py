"""The adaptive schedule's rule: which cells of a sweep still run past a budget.

A full IsoFLOP grid runs every cell to the largest budget, but after the first budgets many cells
are far below the frontier and will stay there. With `grid.schedule=adaptive` every cell runs to
the smallest budget; at each budget b that follows, a cell goes on only while it can still reach
the frontier by the largest budget C_max:

    best_r(b) + rate_r * log2(C_max / b) + margin * sigma  >=  max over cells of best(b)

- best_r(b): the cell's best eval point at compute <= b (its best-so-far, as the frontier reads a run).
- The right side is a lower end of the frontier at every later budget (the frontier never falls).
- rate_r bounds how fast the cell can still rise, per doubling of compute. For a cell that has
  risen and is slowing down (its last doubling's gain below the one before, by more than the
  margin) it is its own last gain: past its midpoint a sigmoid only slows. For every other cell it
  is the largest gain any cell made over its last doubling, so a cell that has not started to rise
  (large n, which the seed study finds wins at large budgets) stays in the race.
- sigma is the metric's noise, read from the second differences of the runs' eval points; until
  there are enough of them no cell is stopped (early budgets cost little).

Looking to C_max, not only to the next budget, is what keeps slow starters: a one-budget look-ahead
stopped the large-n cells of a synthetic grid whose n* rises from 4 to 64 and found n* within 2x at
only 50-70% of budgets (scripts/bench_replay.py). A stopped cell is paused at its checkpoint, not
deleted: a later full sweep, or one with larger budgets (`continuation`), continues it. The same
function decides in the sweep (`dispatch.py`) and in `isoflop replay`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

DEFAULT_MARGIN = 1.5  # in standard deviations of the metric's noise; chosen from replays (README: Adaptive sweeps)


class Schedule(str, enum.Enum):
    full = "full"
    adaptive = "adaptive"


@dataclass(frozen=True)
class Decision:
    """One cell at one budget: its best-so-far, the most it could reach by the largest budget, the
    frontier's lower end it must reach, and whether it continues."""

    run: str
    budget: float
    best: float
    reach: float
    frontier: float
    go: bool


MIN_NOISE_POINTS = 8  # second differences the noise is read from before any cell is stopped
TOLERANCE = 1.1  # a FLOP-budget run stops at the first step whose ledger reaches a budget: a little above it


def decide(points: pd.DataFrame, budget: float, last_budget: float, margin: float = DEFAULT_MARGIN,
           metric: str = "val_avg@k", compute: str = "rollouts", run: str = "run_id") -> list[Decision]:
    """Which runs continue past `budget`; `points` holds the eval points each run had when it
    reached `budget` (the step-0 base evaluation counts as a point)."""
    def best_by(c: float) -> pd.Series:
        return points[points[compute] <= c * TOLERANCE].groupby(run)[metric].max().reindex(runs)

    runs = points[run].unique()
    sigma = noise(points, metric, compute, run)
    if sigma is None:  # too few points to read the noise: no cell is stopped yet (early budgets cost little)
        return [Decision(str(r), float(budget), float(v), math.inf, math.nan, True) for r, v in points.groupby(run)[metric].max().items()]
    margin = margin * sigma
    best, half, quarter = best_by(budget), best_by(budget / 2), best_by(budget / 4)
    base = points.sort_values(compute).groupby(run)[metric].first().reindex(runs)
    rate, before = (best - half).clip(lower=0.0), (half - quarter).clip(lower=0.0)
    fastest = float(rate.max()) if rate.notna().any() else math.inf
    # Past its midpoint a sigmoid only slows: a cell that has risen, and rose less over its last
    # doubling than over the one before, each by more than the noise margin, is bounded by its own rate.
    settled = (best - base > margin) & (rate < before - margin)
    bound = rate.where(settled, fastest).fillna(fastest)
    frontier = float(best.max())
    doublings = math.log2(last_budget / budget)
    out = []
    for r, value, per_doubling in zip(runs, best, bound):
        reach = float(value + per_doubling * doublings + margin)
        out.append(Decision(str(r), float(budget), float(value), reach, frontier, bool(reach >= frontier)))
    return out


def noise(points: pd.DataFrame, metric: str, compute: str, run: str) -> float | None:
    """The eval metric's noise, one standard deviation, from the second differences of each run's
    eval points in compute order: independent noise of sd sigma gives second differences of sd
    sqrt(6) sigma, whose absolute values have their 25% quantile at 0.3186 sqrt(6) sigma. The
    lower quantile reads the noise where curves are nearly straight; the bends of a rising sigmoid
    add large second differences, which the median (tried first) took for noise, 4x too much on a
    grid of noise 0.005."""
    d2 = [np.diff(g.sort_values(compute)[metric].to_numpy(float), 2) for _, g in points[points[compute] > 0].groupby(run)]
    d2 = np.concatenate(d2) if d2 else np.array([])
    return float(np.quantile(np.abs(d2), 0.25) / (0.3186 * math.sqrt(6))) if d2.size >= MIN_NOISE_POINTS else None


def stage_of(compute: np.ndarray, stages: list[float]) -> np.ndarray:
    """Index of the first stage budget each compute value falls under (len(stages) above the last)."""
    return np.searchsorted(np.asarray(stages, float) * TOLERANCE, np.asarray(compute, float), side="left")
