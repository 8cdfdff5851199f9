import pandas as pd
import pytest

from isoflop_cli.fit.frontier import axis_curves, best_below, frontier


def table():
    # Two runs: n=2 improves early then stalls; n=8 starts slower and ends higher.
    rows = [(2, 0, 0.30), (2, 100, 0.50), (2, 400, 0.55), (8, 0, 0.30), (8, 100, 0.40), (8, 400, 0.70)]
    return pd.DataFrame(rows, columns=["n", "rollouts", "val_avg@k"])


def test_best_below_hand_computed():
    out = best_below(table(), "val_avg@k", "rollouts", [50, 100, 399, 400], axis="n")
    assert out["value"].tolist() == [0.30, 0.50, 0.50, 0.70]
    assert out["axis_star"].tolist()[1:] == [2, 2, 8]


def test_frontier_grid_and_monotone():
    front = frontier(table(), points=5)
    assert front["compute"].iloc[0] == pytest.approx(100) and front["compute"].iloc[-1] == pytest.approx(400)
    assert front["value"].is_monotonic_increasing
    assert front["axis_star"].iloc[-1] == 8


def test_axis_curves_per_n():
    curves = axis_curves(table(), points=3)
    assert curves[curves.n == 2]["value"].tolist() == [0.50, 0.50, 0.55]
    assert curves[curves.n == 8]["value"].tolist() == [0.40, 0.40, 0.70]
