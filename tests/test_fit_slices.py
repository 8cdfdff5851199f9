"""Method `isoflop-slices` recovers a power law of the optimum, and prefers the sigmoid when the
optimum saturates."""

import numpy as np
import pandas as pd
import pytest

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit.curves import sigmoid
from isoflop_cli.fit.data import RUN, FitSpec, FitWarning
from isoflop_cli.fit.slices import slices_method

C = np.geomspace(1e3, 1e7, 9)


def runs(log2_optimum, seeds=3, noise=0.01, seed=2, metric="val_avg@k", sign=1) -> pd.DataFrame:
    """metric = a rising baseline minus 0.02 (log2 n - log2 n*(C))^2, plus noise; n = 2..1024."""
    rng = np.random.default_rng(seed)
    frames = []
    for k in range(1, 11):
        for s in range(seeds):
            y = 0.3 + 0.05 * np.log10(C) - 0.02 * (k - log2_optimum(C)) ** 2 + rng.normal(0, noise, C.size)
            frames.append(pd.DataFrame({RUN: f"n{2**k}_s{s}", "n": 2**k, "rollouts": C, metric: sign * y}))
    return pd.concat(frames, ignore_index=True)


def test_power_law_recovered():
    with pytest.warns(FitWarning, match="1e\\+03"):  # there n* = 1.6 lies below the n tried (2..1024)
        entry = slices_method(runs(lambda c: np.log2(0.05 * c**0.5)), FitSpec(bootstrap=40)).entry
    assert entry["converged"] and entry["preferred"] == "power law"
    assert entry["params"]["exponent"] == pytest.approx(0.5, abs=0.02)
    assert entry["params"]["coef"] == pytest.approx(0.05, rel=0.15)
    lo, hi = entry["interval90"]["exponent"]
    assert lo < 0.5 < hi
    assert [b["interior"] for b in entry["budgets"]] == [False] + [True] * 8
    assert entry["budgets"][4]["optimum"] == pytest.approx(0.05 * 1e5**0.5, rel=0.1)


def test_saturating_optimum_prefers_the_sigmoid():
    entry = slices_method(runs(lambda c: sigmoid(np.log10(c), 2, 7, 5, 2.5)), FitSpec(bootstrap=20)).entry
    s = entry["sigmoid"]
    assert entry["preferred"] == "sigmoid" and s["saturation"]["within_data"]
    assert s["params"]["upper"] == pytest.approx(7, abs=0.2)
    assert s["params"]["midpoint"] == pytest.approx(5, abs=0.2)


@pytest.mark.filterwarnings("ignore::isoflop_cli.fit.data.FitWarning")
def test_a_loss_is_minimised():
    entry = slices_method(runs(lambda c: np.log2(0.05 * c**0.5), metric="val_loss", sign=-1), FitSpec(metric="val_loss", bootstrap=0)).entry
    assert entry["params"]["exponent"] == pytest.approx(0.5, abs=0.02)


def test_needs_three_axis_values_and_interior_optima():
    df = runs(lambda c: np.log2(0.05 * c**0.5))
    with pytest.raises(ConfigError, match="3 or more values"):
        slices_method(df[df["n"] <= 4], FitSpec(bootstrap=0))
    with pytest.raises(ConfigError, match="interior optimum"), pytest.warns(FitWarning):
        slices_method(df[(df["n"] <= 16) & (df["rollouts"] > 3e5)], FitSpec(bootstrap=0))  # there n* > 16
