"""The adaptive schedule's rule: which cells of a sweep still run past a budget.

A full IsoFLOP grid runs every cell to the largest budget, but after the first budgets many cells
are far below the frontier and will stay there. With `grid.schedule=adaptive` every cell runs to
the smallest budget; at each budget b that follows, a cell goes on only while it can still reach
the frontier at some budget still to come:

    there is a later budget b' with   up_r(b') >= max over cells of low_c(b')

- up_r(b') is the most the cell's curve can be at b', low_c(b') the least another cell's can:
  profile bounds of a monotone sigmoid through each cell's eval points, at `margin` standard
  deviations of the metric's noise (`fit/band.py`). The sigmoid is the model `fit` fits; a monotone
  curve is how the frontier reads a run (its best so far).
- No cell gains more per doubling of compute than RISE_FACTOR times the largest gain per doubling
  any cell's best fit shows within its points' range (`SigmoidBand.rise`). A cell that has not
  started to rise (large n, which the seed study finds wins at large budgets) stays in the race
  while such a rise could still take it to the frontier, and a cell that never learns stops once
  none could.
- sigma, the noise, is the pooled residual of the cells' sigmoid fits; until there are MIN_DOF
  degrees of freedom to read it from, no cell is stopped (early budgets cost little).

Looking to every later budget, not only the next, keeps the slow starters; comparing with the
frontier's lower end there, not only now, stops the cells that are still rising but can only
trail (scripts/bench_replay.py measures both). A stopped cell is paused at its checkpoint, not
deleted: a later full sweep, or one with larger budgets (`continuation`), continues it. The same
function decides in the sweep (`dispatch.py`) and in `isoflop replay`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from isoflop_cli.config.schema import DEFAULT_MARGIN
from isoflop_cli.fit.band import SigmoidBand

RISE_FACTOR = 2.0  # no cell gains more per doubling than this many times the largest gain fitted so far
MIN_DOF = 8  # residual degrees of freedom the noise is read from before any cell is stopped
MIN_POINTS = 3  # eval points past the base a cell needs before it can be stopped
TIE = 1e-9  # a cell whose bound equals the frontier's (an exact fit of flat points) goes on
TOLERANCE = 1.1  # a FLOP-budget run stops at the first step whose ledger reaches a budget: a little above it


@dataclass(frozen=True)
class Decision:
    """One cell at one budget: its best so far, and at the later budget `at` where it comes closest
    to the frontier, the most it could reach there and the least the frontier will be; whether it goes on."""

    run: str
    budget: float
    best: float
    reach: float
    frontier: float
    at: float
    go: bool


def decide(points: pd.DataFrame, budget: float, budgets: list[float], margin: float = DEFAULT_MARGIN,
           metric: str = "val_avg@k", compute: str = "rollouts", run: str = "run_id") -> list[Decision]:
    """Which runs continue past `budget` towards the later of the sweep's `budgets`; `points` holds
    the eval points each run had when it reached `budget` (with its step-0 base evaluation)."""
    later = sorted(b for b in budgets if b > budget * (1 + 1e-9))
    best = points.groupby(run, sort=False)[metric].max()
    bands = _bands(points, math.log2(max(budgets)), metric, compute, run)
    sigma = _noise(bands.values())
    if not later or sigma is None:  # the last budget, or too few points to read the noise: no cell is stopped
        return [Decision(str(r), float(budget), float(v), math.inf, math.nan, float(max(budgets)), True) for r, v in best.items()]
    cap = RISE_FACTOR * max(b.rise for b in bands.values())
    slack = (margin * sigma) ** 2
    x = np.log2(later)
    lows = np.array([b.extreme(x, slack, upper=False, rise_max=cap) for b in bands.values()])
    frontier = np.max(np.where(np.isfinite(lows), lows, -np.inf), axis=0)  # a bound that failed counts for nothing
    out = []
    for r, value in best.items():
        reach = bands[r].extreme(x, slack, upper=True, rise_max=cap) if r in bands else np.full(len(x), np.inf)  # too few points: no bound
        reach = np.where(np.isfinite(reach), reach, np.inf)  # a bound that failed stops nothing
        i = int(np.argmax(reach - frontier))
        # Only a cell shown to fall short is stopped (a tie, or a bound that failed, goes on).
        go = not reach[i] < frontier[i] - TIE
        out.append(Decision(str(r), float(budget), float(value), float(reach[i]), float(frontier[i]), float(later[i]), go))
    return out


def _bands(points: pd.DataFrame, x_max: float, metric: str, compute: str, run: str) -> dict[str, SigmoidBand]:
    """A SigmoidBand per run with MIN_POINTS eval points past its base."""
    out = {}
    for r, g in points.groupby(run, sort=False):
        later = g[g[compute] > 0]
        if len(later) >= MIN_POINTS:
            base = g.loc[g[compute] == 0, metric]
            out[r] = SigmoidBand(np.log2(later[compute].to_numpy(float)), later[metric].to_numpy(float),
                                 float(base.iloc[0]) if len(base) else None, x_max)
    return out


def noise(points: pd.DataFrame, metric: str = "val_avg@k", compute: str = "rollouts", run: str = "run_id") -> float | None:
    """The metric's noise (one sd) the rule reads from these eval points; None if too few."""
    return _noise(_bands(points, math.log2(points[compute].max()), metric, compute, run).values())


def _noise(bands) -> float | None:
    """One standard deviation of the metric's noise: the pooled residual of the runs' best sigmoid
    fits (4 parameters each), from runs with points to spare; None below MIN_DOF degrees of freedom."""
    spare = [b for b in bands if b.points > 4]
    dof = sum(b.points - 4 for b in spare)
    return math.sqrt(sum(b.sse for b in spare) / dof) if dof >= MIN_DOF else None


def stage_of(compute: np.ndarray, stages: list[float]) -> np.ndarray:
    """Index of the first stage budget each compute value falls under (len(stages) above the last)."""
    return np.searchsorted(np.asarray(stages, float) * TOLERANCE, np.asarray(compute, float), side="left")
