"""What the eval points say about a fitted frontier: the metric's noise, the best measured up to
each budget, which fitted values go beyond the data (extrapolated), and which axis values are tied.

"Measured" has one meaning wherever it is shown (fit.json's axis_star rows, the frontier tables of
the terminal and report.md): at budget C, the best eval point at or below C, as the empirical
frontier reads it; nothing after C is known at C. A fitted value between two eval points
interpolates them, so it is judged against what was measured by the next eval point
(`measured_next`: `measured` read at the first eval point at or after C): above that by more than
the noise it is extrapolated.

A fitted curve is a summary of eval points, not more: where it stands above everything its runs
measured by more than the noise, it says what the data did not, and is marked extrapolated; where
several curves are within the noise of the top, the data do not tell them apart, and axis*(C) is
the set of them (a tie), not a switch from one to another.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoflop_cli.fit.data import RUN, FitSpec, warn
from isoflop_cli.fit.frontier import best_at
from isoflop_cli.fit.noise import Noise
from isoflop_cli.fit.schedule import noise

# runs the noise is read from (evenly spread): its pooled residual is settled long before, and
# each costs ~0.15 s
NOISE_RUNS = 64
# curves within this many sd of one eval point's noise of the top are tied: two evaluations of one
# model differ by more only ~16% of the time (sd sqrt(2))
TIE_SD = 2.0


def metric_noise(df: pd.DataFrame, spec: FitSpec, method: str, model: Noise) -> float:
    """One sd of an eval point's noise: the larger of the pooled residual of each run's best
    monotone sigmoid through its raw eval points (`schedule.noise` in the fit's own family; the
    adaptive rule reads its noise about its sigmoids and ramps; from up to NOISE_RUNS runs) and the
    variance model's sd (`model.sd`: between seeds, else the evaluation's binomial). The residual
    holds a run's wobble between eval points and the evaluation noise that differs between them; it
    misses what all of a run's points share (its seed's luck; the evaluation streams, which are the
    same at every eval point), which the model holds. 0 with a warning when neither can be read
    (then any excess is an extrapolation and only exact equality a tie)."""
    runs = df[RUN].unique()
    pick = (
        runs[np.unique(np.linspace(0, runs.size - 1, min(runs.size, NOISE_RUNS)).round().astype(int))]
        if runs.size
        else runs
    )
    sigmas = [
        s
        for s in (noise(df[df[RUN].isin(pick)], spec.metric, spec.compute, RUN, shapes=("sigmoid",)), model.sd)
        if s is not None
    ]
    if not sigmas:
        warn(
            f"{method}: too few eval points to read the metric's noise, and no "
            "variance recorded; extrapolation and ties are judged with zero noise"
        )
        return 0.0
    return max(sigmas)


def measured(compute: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """For each budget C in grid, the best of `values` measured at or below C. NaN where nothing is."""
    return best_at(compute, values, grid)[0]


def measured_next(compute: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """For each budget C in grid, `measured` at the first eval point at or after C (the last one
    beyond it): what a rising curve between eval points may reach without saying more than its
    runs had measured by the next one. NaN where nothing is measured."""
    points = np.unique(np.asarray(compute, float))
    if points.size == 0:
        return np.full(np.size(grid), np.nan)
    upto = points[np.minimum(np.searchsorted(points, np.asarray(grid, float) * (1 - 1e-9)), points.size - 1)]
    return measured(compute, values, upto)


def extrapolated(value: np.ndarray, seen: np.ndarray, sigma: float) -> np.ndarray:
    """Fitted values above `seen` (`measured_next`: the best measured by the next eval point) by more than the noise."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(value) & ~(value <= np.nan_to_num(seen, nan=-np.inf) + sigma)


def tied(values: np.ndarray, sigma: float) -> np.ndarray:
    """(curves, grid) -> which curves are within TIE_SD sigma of the top at each budget (-inf:
    a curve not run that far)."""
    top = values.max(0)
    return np.isfinite(values) & (values >= top - TIE_SD * sigma)


def label(members: list) -> str:
    """axis* as it is written: one value as itself, a tie as `2, 4, 8 (tied)`, and `none` where no
    value run is within the noise of the optimum (the surface's, off the values run)."""
    members = sorted(members)
    if not members:
        return "none"
    return f"{members[0]:g}" if len(members) == 1 else ", ".join(f"{m:g}" for m in members) + " (tied)"
