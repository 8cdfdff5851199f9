"""The building blocks of `isoflop fit` against hand-computed values."""

import numpy as np
import pandas as pd
import pytest
from scipy import optimize

from isoflop_cli.fit import bootstrap, evidence
from isoflop_cli.fit.allocation import envelope, running_best
from isoflop_cli.fit.curves import CurveFit, fit_power_law, fit_sigmoid, scalerl, sigmoid
from isoflop_cli.fit.data import RUN
from isoflop_cli.fit.parametric import exponents, objective
from isoflop_cli.fit.slices import budgets, optima


def test_sigmoid_and_scalerl_at_their_midpoints():
    assert sigmoid(2.0, 0.2, 0.8, 2.0, 3.0) == pytest.approx(0.5)
    assert sigmoid(2.0 + np.log(3) / 3.0, 0.0, 1.0, 2.0, 3.0) == pytest.approx(0.75)  # expit(ln 3) = 3/4
    assert scalerl(1e5, R0=0.2, A=0.6, C_mid=1e5, B=0.7) == pytest.approx(0.4)
    assert scalerl(1e6, R0=0.2, A=0.6, C_mid=1e5, B=1.0) == pytest.approx(0.2 + 0.4 / 1.1)


def test_running_best_hand_computed():
    # a: base 0.30, then 0.305, 0.32, 0.31, 0.35 -> running best 0.305, 0.32, 0.32 (the plateau kept), 0.35
    # b: base 0.5, then 0.4, 0.52 -> the base holds until the run passes it
    df = pd.DataFrame({RUN: "a", "rollouts": [0, 10, 20, 30, 40], "m": [0.30, 0.305, 0.32, 0.31, 0.35]})
    other = pd.DataFrame({RUN: "b", "rollouts": [0, 10, 20], "m": [0.5, 0.4, 0.52]})
    best = running_best(pd.concat([other, df]), "m", "rollouts")
    assert best[best[RUN] == "a"]["m"].tolist() == [0.305, 0.32, 0.32, 0.35] and best[best[RUN] == "a"][
        "rollouts"
    ].tolist() == [10, 20, 30, 40]
    assert best[best[RUN] == "b"]["m"].tolist() == [0.5, 0.52]


def test_measured_is_the_best_at_or_below_c_and_a_fit_is_held_to_the_next_eval_point():
    compute, values = np.array([10.0, 20.0, 40.0]), np.array([0.3, 0.5, 0.4])
    grid = np.array([5.0, 10.0, 15.0, 20.0, 30.0, 80.0])
    # measured: nothing after C is known at C (nothing below the first eval point)
    assert np.array_equal(evidence.measured(compute, values, grid), [np.nan, 0.3, 0.3, 0.5, 0.5, 0.5], equal_nan=True)
    # what a value between eval points is held to: what was measured by the next one; beyond the last, all of it
    assert evidence.measured_next(compute, values, grid).tolist() == [0.3, 0.3, 0.5, 0.5, 0.5, 0.5]
    assert evidence.extrapolated(np.array([0.52, 0.6, np.nan]), np.array([0.5, 0.5, 0.5]), 0.05).tolist() == [
        False,
        True,
        False,
    ]
    values = np.array(
        [[0.50, 0.70, -np.inf], [0.48, 0.60, 0.9], [0.30, 0.69, 0.89]]
    )  # three curves at three budgets; -inf: not run there
    assert evidence.tied(values, 0.01).tolist() == [[True, True, False], [True, False, True], [False, True, True]]
    assert evidence.label([16, 2, 4]) == "2, 4, 16 (tied)" and evidence.label([8]) == "8"


def test_sigmoid_fit_is_exact_on_noise_free_points():
    x = np.linspace(2, 7, 30)
    fit = fit_sigmoid(x, sigmoid(x, 0.1, 0.7, 4.5, 1.8))
    assert fit.converged
    assert [fit.params[k] for k in ("lower", "upper", "midpoint", "slope")] == pytest.approx(
        [0.1, 0.7, 4.5, 1.8], rel=1e-5
    )


def test_monotone_sigmoid_on_falling_data_is_flat_not_falling():
    """A rising sigmoid cannot fall (its parametrisation sees to that), so what is tested is where
    the fit lands: the best non-decreasing fit to strictly falling points is the constant at their
    mean, so the curve is flat there, with the constant's error. Unconstrained, the same points are
    fitted falling, far better: the flatness is the constraint's, not a fit that failed to move."""
    x = np.linspace(2, 7, 30)
    y = 0.8 - 0.05 * x
    fit = fit_sigmoid(x, y)
    curve = sigmoid(x, **fit.params)
    assert np.ptp(curve) < 1e-6 and curve.mean() == pytest.approx(y.mean(), abs=1e-6)
    assert fit.sse == pytest.approx(((y - y.mean()) ** 2).sum(), rel=1e-6)
    falling = fit_sigmoid(x, y, increasing=False)
    assert sigmoid(x[0], **falling.params) > sigmoid(x[-1], **falling.params) and falling.sse < 0.01 * fit.sse


def test_envelope_takes_the_higher_curve_within_its_span():
    class C:  # the two attributes envelope reads
        def __init__(self, value, span):
            self.value, self.span = value, span

    low_early = CurveFit({"lower": 0.2, "upper": 0.5, "midpoint": 2.0, "slope": 2.0}, True, 0.0)
    high_late = CurveFit({"lower": 0.0, "upper": 0.9, "midpoint": 5.0, "slope": 2.0}, True, 0.0)
    grid = np.array([1.0, 6.0, 8.0, 9.0])
    value, star = envelope([C(2, (1, 9)), C(8, (1, 8))], [low_early, high_late], grid)
    assert star.tolist() == [2, 8, 8, 2]  # at 9 only n=2 was run
    assert value[1] == pytest.approx(0.9 / (1 + np.exp(-2.0))) and value[3] == pytest.approx(
        sigmoid(9.0, **low_early.params)
    )


def test_parabola_vertices_per_budget_and_replicate():
    x = np.tile(np.arange(1.0, 6.0), 2)
    budget = np.repeat([0, 1], 5)
    y = np.where(budget == 0, 1 - (x - 3) ** 2, 2 - 0.5 * (x - 2.5) ** 2)
    w = np.ones((2, x.size))
    w[1, [0, 9]] = 0  # a replicate without two points: still exact
    vertex, coef = optima(x, y, budget, w, minimise=False)
    assert vertex == pytest.approx(np.array([[3.0, 2.5], [3.0, 2.5]]))
    assert coef[0, 1] == pytest.approx([-0.5, 2.5, -1.125])
    assert np.isnan(optima(x, -y, budget, w[:1], minimise=False)[0]).all()  # a minimum is no optimum of an accuracy


def test_budgets_merge_nearly_equal_computes():
    assert budgets(np.array([100.0, 101.0, 1000.0, 100.5, 990.0, 5000.0])).tolist() == [0, 0, 1, 0, 1, 2]


def test_power_law_exact():
    c = np.geomspace(1e3, 1e7, 6)
    fit = fit_power_law(c, 0.05 * c**0.5)
    assert fit.params == pytest.approx({"coef": 0.05, "exponent": 0.5})


def test_parametric_gradient_and_exponents():
    rng = np.random.default_rng(0)
    log_n, log_d = rng.uniform(18, 23, 50), rng.uniform(21, 26, 50)
    log_l = np.log(1.8 + 400 * np.exp(-0.34 * log_n) + 2000 * np.exp(-0.37 * log_d)) + rng.normal(0, 0.02, 50)
    w = rng.integers(0, 3, 50).astype(float)
    theta = np.array([6.0, 7.5, 0.6, 0.33, 0.38])
    numeric = optimize.approx_fprime(theta, lambda t: objective(t, log_n, log_d, log_l, w)[0], 1e-7)
    assert objective(theta, log_n, log_d, log_l, w)[1] == pytest.approx(numeric, rel=1e-3, abs=1e-8)
    assert exponents({"alpha": 0.3, "beta": 0.3}) == {"a": 0.5, "b": 0.5}
    assert exponents({"alpha": 0.34, "beta": 0.28})["a"] == pytest.approx(0.28 / 0.62)


def test_bootstrap_weights_are_stratified_seeded_and_unbiased_for_a_mean():
    strata = np.array([0, 0, 0, 1, 1, 2])
    weights = bootstrap.run_weights(4000, strata, seed=3)
    # each stratum keeps its share (its run count) in every replicate, drawn m - 1 times at m / (m - 1)
    assert np.allclose(weights[:, :3].sum(1), 3) and np.allclose(weights[:, 3:5].sum(1), 2)
    assert (weights[:, 5] == 1).all()
    assert set(np.unique(weights[:, :3] * 2 / 3)) <= {0.0, 1.0, 2.0}
    assert (weights == bootstrap.run_weights(4000, strata, seed=3)).all()
    # a stratum mean's variance over replicates is s^2 / m, the variance of the mean (ddof 1), where
    # drawing m of m would give (m - 1) / m of it; m = 2 by hand: the mean is x1 or x2, variance (x1 - x2)^2 / 4
    x = np.array([0.3, 0.5, 1.0, 2.0, 6.0, 9.0])
    means = weights[:, :3] @ x[:3] / 3
    assert means.var() == pytest.approx(x[:3].var(ddof=1) / 3, rel=0.06)
    pair = weights[:, 3:5] @ x[3:5] / 2
    assert set(np.round(pair, 12)) == {2.0, 6.0} and pair.var() == pytest.approx((2.0 - 6.0) ** 2 / 4, rel=0.06)
    median, interval = bootstrap.summarise([{"p": float(v)} for v in range(101)], ["p"])
    assert median["p"] == 50 and interval["p"] == pytest.approx([5, 95])
