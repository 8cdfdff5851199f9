"""Bootstrap over runs: resample whole runs with replacement, refit, report medians and 90% intervals.

A replicate is a vector of integer counts per run, so a refit is a weighted fit (identical to a fit
on the duplicated runs, and far cheaper). Resampling within strata (the axis values a grid was
designed with) keeps every designed value in every replicate.
"""

from __future__ import annotations

import warnings

import numpy as np


def run_counts(n_boot: int, strata: np.ndarray, seed: int) -> np.ndarray:
    """(n_boot, runs) counts: each stratum's runs drawn with replacement, as many as it has."""
    rng = np.random.default_rng(seed)
    strata = np.asarray(strata)
    counts = np.zeros((n_boot, strata.size), dtype=np.int64)
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        counts[:, members] = rng.multinomial(members.size, np.full(members.size, 1 / members.size), size=n_boot)
    return counts


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
