"""Bootstrap over runs: resample whole runs with replacement, refit, report medians and 90% intervals.

A replicate is a weight per run, so a refit is a weighted fit (a fit on the drawn runs, and far
cheaper). Resampling within strata (the axis values a grid was designed with) keeps every designed
value in every replicate.

A stratum of m runs is drawn m - 1 times, each draw weighing m / (m - 1): Rao and Wu's rescaled
bootstrap. Drawing m of m makes a stratum mean vary across replicates by (m - 1) / m of its
variance s^2 / m (the replicates see the spread about the sample's own mean, ddof 0), so with the
2-4 seeds a cell of a sweep every interval would be too narrow by sqrt((m - 1) / m), 0.71 at two
seeds; drawing m - 1 gives exactly s^2 / m for a mean, and the weights keep each stratum's share of
a fit as the data has it. A stratum of one run is that run in every replicate.
"""

from __future__ import annotations

import warnings

import numpy as np


def run_weights(n_boot: int, strata: np.ndarray, seed: int) -> np.ndarray:
    """(n_boot, runs) weights: each stratum's m runs drawn m - 1 times with replacement, each draw
    weighing m / (m - 1), so that a replicate's weights sum to the stratum's m as the data's do."""
    rng = np.random.default_rng(seed)
    strata = np.asarray(strata)
    weights = np.zeros((n_boot, strata.size))
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        m = members.size
        if m == 1:
            weights[:, members] = 1.0
            continue
        draws = rng.multinomial(m - 1, np.full(m, 1 / m), size=n_boot)
        weights[:, members] = draws * (m / (m - 1))
    return weights


def summarise(draws: list[dict[str, float]], names: list[str]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Medians and 5%-95% percentile intervals of each named scalar over the converged replicates."""
    median, interval = {}, {}
    for name in names:
        values = np.array([d[name] for d in draws if name in d and np.isfinite(d[name])])
        if values.size:
            median[name] = float(np.median(values))
            interval[name] = [float(v) for v in np.quantile(values, [0.05, 0.95])]
    return median, interval


def band(draws: np.ndarray, discrete: bool) -> np.ndarray:
    """(3, K) median, 5% and 95% of (replicates, K) positive axis values, on a log2 scale, NaNs ignored.

    Discrete draws (axis* is always one of the values run) get quantiles that are draws themselves.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a budget no replicate could read stays NaN
        out = np.nanquantile(np.log2(draws), [0.5, 0.05, 0.95], axis=0, method="inverted_cdf" if discrete else "linear")
    return np.exp2(out)
