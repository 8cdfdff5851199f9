"""The n* trend test (fit/trend.py) on synthetic sweeps whose truth is not its model.

The truth is a saturating curve per n, not a quadratic in log2 n: a run at compute C stands at
y0 + (U(n) - y0) * (1 - exp(-C / tau(n))), where U is the ceiling n reaches and tau the compute it
takes (the lookup study's mechanism: a larger n reaches a higher ceiling more slowly). A run's seed
scales its tau by exp(N(0, 0.15^2)) and shifts its whole curve by N(0, 0.02^2); each eval point adds
N(0, 0.015^2) (the issue's seed and eval sds). The grid is the lookup study's: n in 2..16, eval
budgets 1,024..16,384 rollouts.

- rising: U and tau grow with n, so n* climbs from 2 at the smallest budget to 16 at the largest;
- null, n irrelevant: one curve for every n;
- null, one n best everywhere: U peaks at n = 4 with a kinked (not quadratic) profile and tau is
  shared, so the peak only sharpens as compute grows; n* = 4 at every budget;
- null, the grid's smallest n best everywhere, the others falling further behind as compute grows
  (a linear interaction of log2 n with log C would call that "falls").
"""

import numpy as np
import pandas as pd
import pytest

from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.trend import n_star_trend

NS = (2, 4, 8, 16)
BUDGETS = 1024 * 2.0 ** np.arange(5)
Y0 = 0.30


def sweep(
    ceiling: dict[int, float],
    tau: dict[int, float],
    seeds: int,
    rng: np.random.Generator,
    seed_sd: float = 0.02,
    eval_sd: float = 0.015,
    budgets: np.ndarray = BUDGETS,
) -> pd.DataFrame:
    frames = []
    for n in NS:
        for s in range(seeds):
            t = tau[n] * np.exp(rng.normal(0, 0.15))
            y = (
                Y0
                + (ceiling[n] - Y0) * (1 - np.exp(-budgets / t))
                + rng.normal(0, seed_sd)
                + rng.normal(0, eval_sd, budgets.size)
            )
            frames.append(
                pd.DataFrame(
                    {
                        RUN: f"n{n}s{s}",
                        "run_id": f"n{n}s{s}",
                        "n": n,
                        "B_p": 16,
                        "seed": s,
                        "lr": 1e-4 * np.sqrt(n * 16),
                        "rollouts": budgets,
                        "val_avg@k": y,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


RISING = ({n: 0.60 + 0.015 * k for k, n in enumerate(NS)}, {n: 1200.0 * 1.3**k for k, n in enumerate(NS)})
IRRELEVANT = ({n: 0.65 for n in NS}, {n: 3000.0 for n in NS})
ONE_BEST = ({2: 0.60, 4: 0.66, 8: 0.62, 16: 0.60}, {n: 3000.0 for n in NS})
EDGE_BEST = (
    {2: 0.66, 4: 0.63, 8: 0.61, 16: 0.60},
    {n: 3000.0 for n in NS},
)  # n* = 2, the grid's smallest, and the gaps widen


def true_n_star(truth) -> list[int]:
    ceiling, tau = truth
    return [max(NS, key=lambda n: ceiling[n] - (ceiling[n] - Y0) * np.exp(-c / tau[n])) for c in BUDGETS]


def calls(truth, seeds: int, grids: int, start: int = 0) -> dict[str, int]:
    out = {"rises": 0, "falls": 0, "none": 0}
    for g in range(start, start + grids):
        out[n_star_trend(sweep(*truth, seeds, np.random.default_rng(g)), FitSpec()).call] += 1
    return out


def test_the_truths_are_what_they_say():
    assert true_n_star(RISING) == [2, 2, 4, 16, 16]
    assert true_n_star(ONE_BEST) == [4] * 5 and true_n_star(EDGE_BEST) == [2] * 5


def test_rising_n_star_is_called():
    """Power on the rising truth (measured: 155 of 200 grids with 8 seeds a cell, 121 of 200 with 4):
    the slope is read at n*, near the grid's lower edge here, where a quadratic's slope is least
    certain; `plan` sizes a sweep for it (test_power.py). No grid calls "falls"."""
    got = calls(RISING, seeds=8, grids=200)
    assert got["rises"] >= 150 and got["falls"] == 0, got
    got = calls(RISING, seeds=4, grids=200)
    assert got["rises"] >= 110 and got["falls"] == 0, got


@pytest.mark.parametrize(
    "truth", [IRRELEVANT, ONE_BEST, EDGE_BEST], ids=["n-irrelevant", "one-n-best", "best-at-the-edge"]
)
def test_null_grids_rarely_call_a_trend(truth):
    """False calls (either direction) in at most 10% of 300 grids, with 4 seeds and with 2."""
    for seeds in (4, 2):
        got = calls(truth, seeds=seeds, grids=300)
        assert got["rises"] + got["falls"] <= 30, (seeds, got)
