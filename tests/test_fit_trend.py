"""The n* trend test (fit/trend.py) on sweeps simulated from how GRPO learns (fit/bank.py), never
from the test's own model; and its arithmetic by hand.

The bank's truths come from one mechanism (per-problem pass rates, mixed-group signal, the learning
rate scaled with sqrt(B), interference falling with n, seeds that change learning speed, paired
evaluation) under other settings. Each is checked to be what its name says from its expected
curves, then the test's call rate is measured on its sweeps: nulls (n irrelevant, a fixed best with
the others catching up, every n tied near the ceiling, a best at the grid's edge) at most 5% of grids
in either direction; rising truths at the seeds `plan` recommends in tests/test_power.py.
docs/fitting.md's table is scripts/trend_calibration.py's, 300 grids a truth.
"""

import numpy as np
import pytest
from scipy import stats

from isoflop_cli.fit import trend
from isoflop_cli.fit.bank import BANK
from isoflop_cli.fit.data import FitSpec
from isoflop_cli.fit.trend import n_star_trend, weights

NULLS = [name for name, t in BANK.items() if t.kind == "null"]


@pytest.mark.parametrize("name", list(BANK))
def test_the_truths_are_what_they_say(name):
    """A rise's n* set at the first budget lies wholly below its set at the last; a null's best (the
    strict highest expected value) does not move up; a saturated truth ties most n at the end."""
    truth = BANK[name]
    first, last = truth.n_star()[0], truth.n_star()[-1]
    best = [truth.ns[i] for i in truth.expected.argmax(0)]
    if truth.kind == "rise":
        assert max(first) < min(last), (first, last)
    elif truth.kind == "null":
        assert best[-1] <= best[0], best
    else:
        assert len(last) >= len(truth.ns) - 1, last


def test_the_call_by_hand():
    """Two n values, two seeds each: each budget's noise is the seeds' pure error (4 deviations of
    0.01 over 2 dof), a difference of two cell means has se sqrt(2e-4), and with one rival the
    Bonferroni bound is the t test's own p."""
    x, cell, stratum = np.log2([2.0, 2.0, 4.0, 4.0]), np.array([0, 0, 1, 1]), np.zeros(4, int)
    first = [0.50, 0.52, 0.40, 0.42]  # n = 2 ahead by 0.10
    last = [0.61, 0.59, 0.71, 0.69]  # n = 4 ahead by 0.10
    got = trend.test(x, stratum, cell, np.column_stack([first, last]), np.array([1024.0, 4096.0]))
    p = stats.t.sf(0.10 / np.sqrt(2e-4), 2)
    assert got.call == "rises" and got.p_value == pytest.approx(p) and got.dof == 2
    assert got.best == [2.0, 4.0] and got.best_sets == [[2.0], [4.0]]
    assert got.effect == 1.0 and got.interval90 == [1.0, 1.0] and got.sd == pytest.approx([np.sqrt(2e-4)] * 2)

    # Four n values, n = 2 best at both budgets while 8 and 16 catch up: no move, and the reading says so.
    x4, cell4, stratum4 = np.log2(np.repeat([2.0, 4.0, 8.0, 16.0], 2)), np.repeat(np.arange(4), 2), np.zeros(8, int)
    first4 = np.array([0.50, 0.52, 0.40, 0.42, 0.35, 0.37, 0.30, 0.32])
    last4 = np.array([0.81, 0.79, 0.51, 0.49, 0.79, 0.77, 0.80, 0.78])
    budgets = np.array([1024.0, 4096.0])
    held = trend.test(x4, stratum4, cell4, np.column_stack([first4, last4]), budgets)
    assert held.call == "none" and held.best == [2.0, 2.0] and held.why == "n = 2 is best at both budgets"
    # n = 16 ahead of n = 2 by 0.03 at the last budget (t = 2.1): with three rivals n = 2 is not excluded
    # (3 * p = 0.15), so the sets overlap and nothing is called; a point estimate would have called it.
    last4[:2] = [0.77, 0.75]
    tie = trend.test(x4, stratum4, cell4, np.column_stack([first4, last4]), budgets)
    assert tie.call == "none" and tie.best == [2.0, 16.0] and 2.0 in tie.best_sets[1] and "overlaps" in tie.why
    # n = 2 far behind at the last budget: the sets separate, {2} then {8, 16}. p is the smallest level
    # at which some split does: between 4 and 8 it needs n = 8 and 16 out at the first budget (8 is 0.15
    # behind n = 2: t = 10.6, three rivals, 4 dof) and n = 2 and 4 out at the last (0.2 and 0.29 behind).
    last4[:2] = [0.60, 0.58]
    moved = trend.test(x4, stratum4, cell4, np.column_stack([first4, last4]), budgets)
    assert moved.call == "rises" and moved.best_sets == [[2.0], [8.0, 16.0]]
    assert moved.p_value == pytest.approx(3 * stats.t.sf(0.15 / np.sqrt(2e-4), 4))
    assert moved.interval90 == [2.0, 3.0] and moved.effect == 3.0


def test_every_n_tied_at_the_last_budget_is_said():
    """Where n does not matter (the bank's null: every cell learns alike), the reading says every n is
    within the noise of the best at the last budget, not a bare 'not shown'."""
    got = BANK["null-n-irrelevant"].trends(4, 20, np.random.default_rng(3))
    said = [t.why for t in got if t.call == "none"]
    assert (
        len(said) == 20 and sum(w.startswith("every n is within the noise of the best at the last") for w in said) >= 15
    )


def test_results_rows_read_as_the_arrays_are():
    """fit's path (results rows -> runs -> readings at the common budgets) gives the array test's
    answer on the same sweep."""
    truth = BANK["rise-interior-last"]
    values = truth.sweep(3, 1, np.random.default_rng(5))[0]  # (ns, seeds, points)
    ends = np.array([truth.budgets[0], truth.budgets[-1]])
    y = (values @ weights(truth.points, ends).T).reshape(-1, 2)  # (runs, 2), runs in (n, seed) order
    direct = trend.test(np.repeat(np.log2(truth.ns), 3), np.zeros(18, int), np.repeat(np.arange(6), 3), y, ends)
    framed = n_star_trend(truth.frame(values), FitSpec())
    assert (framed.call, framed.best_sets, framed.dof) == (direct.call, direct.best_sets, direct.dof)
    assert framed.p_value == pytest.approx(direct.p_value)


@pytest.mark.parametrize("name", NULLS)
def test_null_truths_rarely_call_a_move(name):
    """False calls (either direction) in at most 5% of 100 grids at 4 seeds a cell and at 8."""
    truth = BANK[name]
    for seeds in (4, 8):
        got = truth.trends(seeds, 100, np.random.default_rng(seeds))
        assert sum(t.call != "none" for t in got) <= 5, (seeds, [t.call for t in got if t.call != "none"])
