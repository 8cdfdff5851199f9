"""Methods `frontier` and `fixed-batch` recover their own model: per-n sigmoids and a rising, then
saturating n*(C)."""

import numpy as np
import pandas as pd
import pytest

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit.allocation import envelope, fit_law, fixed_batch_method, frontier_method
from isoflop_cli.fit.curves import CurveFit, sigmoid
from isoflop_cli.fit.data import RUN, FitSpec, FitWarning

LOG_C = np.linspace(2, 9, 29)  # eval points from 1e2 to 1e9 rollouts


def truth(k: int) -> dict:
    """n = 2^k: later and higher curves for larger n up to n = 64, lower ones beyond, so n*(C) saturates at 64."""
    return {
        "lower": 0.1,
        "upper": 0.5 + 0.05 * min(k, 6) - 0.04 * max(k - 6, 0),
        "midpoint": 2.5 + 0.5 * k,
        "slope": 1.5,
    }


def sweep(ks=range(1, 9), b_ps=(4, 8), seeds=2, noise=0.005, seed=0, split_of=None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for k in ks:
        for b_p in [split_of // 2**k] if split_of else b_ps:
            for s in range(seeds):
                y = sigmoid(LOG_C, **truth(k)) + rng.normal(0, noise, LOG_C.size)
                frames.append(
                    pd.DataFrame(
                        {
                            RUN: f"n{2**k}_bp{b_p}_s{s}",
                            "n": 2**k,
                            "B_p": b_p,
                            "rollouts": np.r_[0, 10**LOG_C],
                            "val_avg@k": np.r_[0.1, y],
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


def true_axis_star(ks, grid):
    class Span:
        def __init__(self, k):
            self.value, self.span = 2.0**k, (LOG_C[0], LOG_C[-1])

    return envelope([Span(k) for k in ks], [CurveFit(truth(k), True, 0.0) for k in ks], grid)[1]


@pytest.fixture(scope="module")
def fitted():
    return frontier_method(sweep(), FitSpec(bootstrap=20, seed=1))


def test_per_n_sigmoids_recovered(fitted):
    for k in range(1, 9):
        p = fitted.entry["curves"][f"n={2**k}"]["params"]
        t = truth(k)
        # record points are the upward excursions of the noise: upper sits about one noise sigma high
        assert p["upper"] == pytest.approx(t["upper"], abs=0.02)
        assert p["midpoint"] == pytest.approx(t["midpoint"], abs=0.15)
        assert p["slope"] == pytest.approx(t["slope"], rel=0.2)


def test_axis_star_rises_then_saturates_at_64(fitted):
    entry = fitted.entry
    grid = np.log10(fitted.frames["frontier"]["compute"].to_numpy())
    star = fitted.frames["frontier"]["axis_star"].to_numpy()
    assert np.mean(star == true_axis_star(range(1, 9), grid)) >= 0.85
    reference = fit_law(
        grid, true_axis_star(range(1, 9), grid), (1.0, 8.0)
    ).params  # the law of the noise-free envelope
    assert entry["converged"]
    assert entry["params"]["lower"] == pytest.approx(reference["lower"], abs=0.3)
    assert entry["params"]["upper"] == pytest.approx(6.0, abs=0.3)  # log2 64
    assert entry["params"]["midpoint"] == pytest.approx(reference["midpoint"], abs=0.25)
    sat = entry["saturation"]
    assert sat["within_data"] and 45 <= sat["axis_star"] <= 90 and sat["compute"] < 1e9
    lo, hi = entry["interval90"]["upper"]
    assert lo <= entry["params"]["upper"] <= hi


def test_frontier_csv_contract(fitted):
    front = fitted.frames["frontier"]
    assert list(front.columns) == ["compute", "value", "axis_star"]
    assert front["value"].is_monotonic_increasing and set(front["axis_star"]) <= {2**k for k in range(1, 9)}
    rows = fitted.entry["axis_star"]
    assert all(r["low"] <= r["median"] <= r["high"] for r in rows)


def test_bootstrap_is_seeded():
    df = sweep(ks=range(1, 5), seeds=1)
    a, b = (frontier_method(df, FitSpec(bootstrap=8, seed=5)).entry["interval90"] for _ in range(2))
    assert a == b


def test_single_axis_value_warns_and_reports_no_law():
    with pytest.warns(FitWarning, match="at every budget"):
        result = frontier_method(sweep(ks=[3]), FitSpec(bootstrap=0))
    assert result.entry["converged"] is False and result.entry["params"] == {}
    assert set(result.frames["frontier"]["axis_star"]) == {8}


@pytest.mark.filterwarnings("ignore:frontier. n.*at every budget")  # asserted below; pytest.warns re-emits it
@pytest.mark.filterwarnings("ignore:frontier. too few eval points to read the metric's noise")
def test_too_few_points_is_an_error_and_short_values_are_dropped_with_a_warning():
    df = sweep(ks=[2, 3])
    sparse = df[(df["n"] == 4) | (df["rollouts"] <= 10**2.25)]  # n=8 keeps two computes
    with pytest.warns(FitWarning, match="n=8") as caught:
        result = frontier_method(sparse, FitSpec(bootstrap=0))
    assert any("at every budget" in str(w.message) for w in caught)  # one curve left: n* = 4 throughout
    assert list(result.entry["curves"]) == ["n=4"]
    with pytest.raises(ConfigError, match="eval points at 3 computes"), pytest.warns(FitWarning, match="n=4"):
        frontier_method(df[df["rollouts"] <= 10**2.25], FitSpec(bootstrap=0))


def test_metric_outside_unit_interval_is_an_error():
    df = sweep(ks=[2, 3]).assign(**{"val_avg@k": lambda d: d["val_avg@k"] * 10})
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        frontier_method(df, FitSpec(bootstrap=0))


def test_fixed_batch_picks_the_winning_split():
    B = 512
    df = sweep(ks=range(1, 9), seeds=2, split_of=B)
    result = fixed_batch_method(df, FitSpec(bootstrap=10))
    best = result.frames["fixed_batch"]
    assert set(best["B"]) == {B}
    grid = np.log10(best["compute"].to_numpy())
    assert np.mean(best["axis_star"].to_numpy() == true_axis_star(range(1, 9), grid)) >= 0.85
    assert (best["B_p"] * best["axis_star"] == B).all()
    assert result.entry["params"][f"upper@B={B}"] == pytest.approx(6.0, abs=0.3)
    with pytest.raises(ConfigError, match="two or more splits"):
        fixed_batch_method(sweep(ks=[2], b_ps=(4,)), FitSpec(bootstrap=0))


def test_a_law_from_two_axis_values_is_flagged_and_its_saturation_not_claimed(tmp_path):
    """Two n values: the law of n*(C) is a step pinned at its bounds, with intervals of zero width.
    Each is a warning beside the result (terminal, report.md, fit.json) and the fit is not reliable."""
    import json

    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    sweep(ks=(2, 3)).drop(columns=[RUN]).assign(
        run_id=lambda d: d["n"].astype(str) + "_" + d.index.map(lambda i: str(i // 30))
    ).to_csv(tmp_path / "r.csv", index=False)
    result = CliRunner().invoke(
        app, ["fit", str(tmp_path / "r.csv"), "--bootstrap", "20", "--out", str(tmp_path / "fit")], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    entry = json.loads((tmp_path / "fit" / "fit.json").read_text())["frontier"]
    assert entry["reliable"] is False and entry["converged"] is True
    text = " ".join(entry["warnings"])
    assert "read from 2 n value(s)" in text and "zero width" in text and "at the fit's bounds" in text
    assert "saturates at" not in result.output and "NOT reliable" in result.output
    assert result.output.index("warning:") > result.output.index("frontier: estimate")  # beside the result, after it
    report = (tmp_path / "fit" / "report.md").read_text()
    assert "Reliable: no." in report and "needs at least 3" in report and "saturates at" not in report


def test_a_healthy_law_is_reliable_and_notes_the_grid_edge(fitted):
    from isoflop_cli.fit.methods import doubts

    notes = doubts("frontier", fitted.entry, FitSpec(bootstrap=20, seed=1))
    assert all(not grave for _, grave in notes)
    assert notes[0][0] == (
        "frontier: lower at the fit's bounds: n* at the smallest budgets "
        "is the grid's smallest n; the optimum may lie below the grid"
    )
    # where two curves cross they are tied within the noise: a note, and there n* is a set
    assert (
        len(notes) == 2
        and "n* is tied" in notes[1][0]
        and fitted.entry["budgets_tied"] >= 1
        and fitted.entry["budgets_extrapolated"] == 0
    )


def test_most_resamples_at_a_bound_is_flagged():
    """A parameter the data fit places but most resamples pin at a bound: its interval is the bound's."""
    from isoflop_cli.fit.methods import doubts

    entry = {
        "params": {"lower": 2.0, "upper": 5.0, "midpoint": 3.0, "slope": 4.0},
        "at_bound": [],
        "interval90": {"slope": [2.0, 100.0]},
        "bootstrap": {"at_bound_share": {"lower": 0.9, "upper": 0.1, "midpoint": 0.0, "slope": 0.7}},
    }
    [(message, grave)] = doubts("frontier", entry, FitSpec(bootstrap=20))
    assert grave and "most bootstrap resamples pin slope (70%)" in message and "lower" not in message


def test_an_interval_of_zero_width_to_rounding_is_flagged():
    """Resamples that all land on one value give an interval whose ends differ in the last bits
    (fuzzed: coef [9.849155306759302, 9.849155306759307]): zero width all the same. A narrow one
    that is measured is not flagged, whatever the parameter's scale."""
    from isoflop_cli.fit.methods import doubts

    entry = {
        "params": {"coef": 9.85, "exponent": 0.3, "tiny": 2e-13},
        "at_bound": [],
        "interval90": {
            "coef": [9.849155306759302, 9.849155306759307],
            "exponent": [0.29, 0.31],
            "tiny": [1e-13, 3e-13],
        },
    }
    [(message, grave)] = doubts("isoflop-slices", entry, FitSpec(bootstrap=20))
    assert grave and "the 90% interval of coef has zero width" in message
