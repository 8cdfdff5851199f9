"""`isoflop race-pilot`: regimes from synthetic results with a known answer (via --from-results), the
statistics behind them, the pilot's derivation and cost cap, and bad input (one line, exit 2)."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.race import analysis
from isoflop_cli.race.pilot import MIN_STEPS, Level, PilotSpec, derive, expand, levels
from isoflop_cli.race.recommend import keeping_rho, sweep_overrides

runner = CliRunner()
RHO = {1: 0.77, 2: 0.885, 4: 0.935}  # rho of algo.epochs 1, 2, 4 on the embedded model, roughly
BUDGET = 1e11
SLOPE = 0.6  # target change per doubling of rho, at the largest budget


def results(
    shape: str, seed: int = 0, noise: float = 0.01, rewards=("sparse",), prm_gain: float = 0.0, reps: int = 2
) -> pd.DataFrame:
    """Pilot-shaped results: epochs 1/2/4 x `reps` runs per reward, eval points at 0, B/4, B/2, B FLOPs
    (a little past each, as FLOP-budget runs stop). The target's dependence on log2 rho grows with
    compute: `rising`, `falling` or `flat`; a run-level random effect plus noise per eval point.
    The PRM spends reward FLOPs (its rho is lower) and adds `prm_gain` at the largest budget."""
    rng = np.random.default_rng(seed)
    rows = []
    for reward in rewards:
        for epochs, rho in RHO.items():
            for rep in range(reps):
                run_rho = rho * (0.9 if reward == "prm" else 1.0)
                run_effect = rng.normal(0, noise / 2)
                for step, c in enumerate([0.0, BUDGET / 4, BUDGET / 2, BUDGET]):
                    growth = np.log2(c / (BUDGET / 8)) / 3 if c else 0.0
                    sign = {"rising": 1, "falling": -1, "flat": 0}[shape]
                    y = 0.3 + 0.05 * growth + sign * SLOPE * (np.log2(run_rho) + 0.2) * growth
                    y += (prm_gain * growth if reward == "prm" else 0.0) + (
                        (run_effect + rng.normal(0, noise)) if c else 0.0
                    )
                    rows.append(
                        {
                            "run_id": f"{reward}_e{epochs}_r{rep}",
                            "reward": reward,
                            "algo.epochs": epochs,
                            "n": 4 * (rep + 1),
                            "step": step,
                            "rho": run_rho if c else np.nan,
                            "flops_total": c * (1 + 0.03 * rng.random()),
                            "flops_reward": 0.1 * c if reward == "prm" else 0.0,
                            "val_avg@k": y,
                            "val_native": y,
                        }
                    )
    return pd.DataFrame(rows)


def race(df: pd.DataFrame, tmp_path, *args: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "results.parquet"
    df.to_parquet(path)
    result = runner.invoke(app, ["race-pilot", "--from-results", str(path), "--out", str(tmp_path / "race"), *args])
    assert result.exit_code == 0, result.output
    return json.loads((tmp_path / "race" / "regime.json").read_text()), result


@pytest.mark.parametrize(
    "shape, regime", [("rising", "update-heavy"), ("falling", "search-heavy"), ("flat", "undetermined")]
)
def test_known_rho_regimes_via_from_results(shape, regime, tmp_path):
    report, result = race(results(shape), tmp_path)
    [entry] = report["regimes"]
    assert entry["regime"] == regime and entry["reward"] == "sparse" and entry["target"] == "native"
    if regime != "undetermined":
        assert entry["curve"] != "constant"
        low, high = entry["interval90"]
        assert (low > 0) if regime == "update-heavy" else (high < 0)
        assert np.sign(entry["effect"]) == (1 if regime == "update-heavy" else -1)
        assert (
            report["loo_same_regime_rate"] == 1.0 and report["same_regime_rate"] is None
        )  # no full-scale results given
    assert report["pilot_share"] is None
    assert report["pilot_flops"] == pytest.approx(results(shape).groupby("run_id")["flops_total"].max().sum())
    assert "does not guarantee a held-out gain" in (tmp_path / "race" / "race.md").read_text()
    assert (tmp_path / "race" / "race.png").stat().st_size > 1000
    assert regime in result.output


def test_flat_noise_is_undetermined_not_a_regime():
    """Over many noise draws with no effect, a regime is named rarely (the decision needs the LOO
    noise check and the interval; the interval alone would fire about 10% of the time)."""
    named = sum(
        analysis.decide(analysis.collect(results("flat", seed=s), "val_avg@k", None), "native", 100, s)[0]["regime"]
        != "undetermined"
        for s in range(30)
    )
    assert named <= 2


def test_prm_better_than_sparse_at_equal_compute_is_reward_heavy(tmp_path):
    report, _ = race(results("flat", rewards=("sparse", "prm"), prm_gain=0.08), tmp_path)
    by_reward = {e["reward"]: e for e in report["regimes"]}
    prm = by_reward["prm"]
    assert prm["regime"] == "reward-heavy" and prm["basis"] == "reward" and prm["model_based"]
    assert prm["interval90"][0] > 0 and prm["effect"] > 0.05
    assert by_reward["sparse"]["regime"] == "undetermined"
    assert report["recommendation"]["reward"] == "prm"


def test_prm_no_better_is_not_reward_heavy(tmp_path):
    report, _ = race(results("flat", rewards=("sparse", "prm"), seed=3), tmp_path)
    prm = next(e for e in report["regimes"] if e["reward"] == "prm")
    assert prm["regime"] == "undetermined" and not prm["reward_gap"]["beats_rule_based"]
    assert report["recommendation"]["reward"] == "sparse"


def test_rho_that_moves_within_a_run_does_not_make_an_interior_regime_without_its_optimum(tmp_path):
    """rho is recorded per eval point and moves a little within a run, so the slices cover different
    rho ranges. "Interior" was read against their union and the optimum inside their intersection:
    a rising target came out interior with no optimum, recommended "around the optimum rho 0.00"."""
    df = results("rising")
    df["rho"] *= np.where(df["step"] == 3, 1.05, 1.0)
    report, result = race(df, tmp_path, "--bootstrap", "50")
    [entry] = report["regimes"]
    assert entry["regime"] == "update-heavy" and entry["optimum_rho"] is None, entry
    assert "rho 0.00" not in result.output
    # Fewer resamples than an interval is read from: refused, not "too few runs".
    path = tmp_path / "results.parquet"
    few = runner.invoke(
        app, ["race-pilot", "--from-results", str(path), "--out", str(tmp_path / "few"), "--bootstrap", "9"]
    )
    assert few.exit_code == 2 and "--bootstrap must be >= 10, got 9" in few.output


def test_regime_json_contract(tmp_path):
    report, _ = race(results("rising"), tmp_path, "--bootstrap", "50")
    assert {
        "regimes",
        "same_regime_rate",
        "loo_same_regime_rate",
        "pilot_flops",
        "pilot_share",
        "recommendation",
    } <= set(report)
    for entry in report["regimes"]:
        assert {"reward", "target", "regime", "curve", "effect", "interval90"} <= set(entry)
        assert entry["regime"] in ("search-heavy", "update-heavy", "reward-heavy", "interior", "undetermined")
        assert {"optimum_rho", "optimum_interval90"} <= set(entry)
        assert entry["curve"] in ("constant", "log-linear", "quadratic")
    rec = report["recommendation"]
    assert rec["reward"] == "sparse" and rec["algo.epochs"] == [2, 4, 8]
    assert (
        rec["command"].startswith("isoflop sweep")
        and "algo.epochs:[2,4,8]" in rec["command"]
        and rec["predicted_flops"] > 0
    )


def test_quadratic_wins_on_a_peak():
    """A target that peaks inside the rho range: the quadratic beats the line by LOO."""
    rng = np.random.default_rng(0)
    x = np.repeat(np.log2([0.7, 0.78, 0.86, 0.94]), 3)
    y = 0.4 - 20 * (x - np.log2(0.82)) ** 2 + rng.normal(0, 0.003, x.size)
    errors = {name: analysis.loo_errors(x, y, d) for name, d in analysis.CURVES.items()}
    assert analysis.one_se_choice(errors)[0] == "quadratic"


def test_weighted_fit_matches_duplicated_points():
    x, y = np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 2.5, 2.9, 4.2])
    w = np.array([[2, 1, 0, 1]])
    dup = np.polynomial.polynomial.polyfit(np.repeat(x, w[0]), np.repeat(y, w[0]), 1)
    assert np.allclose(analysis.fit_weighted(x, y, w.astype(float), 1)[0], dup)
    assert np.isnan(analysis.fit_weighted(x, y, np.array([[1.0, 0, 0, 0]]), 1)).all()  # one point cannot pin a line


def test_targets_read_their_columns(tmp_path):
    """native: val_native (the training reward on validation); downstream: a held-out set's pass@1,
    else the verified-answer accuracy; judge: a judge's score."""
    df = results("rising").assign(
        **{"val_avg@k": lambda d: -d["val_native"]}
    )  # verified accuracy falls where the native target rises
    assert race(df, tmp_path / "native")[0]["regimes"][0]["regime"] == "update-heavy"
    report, _ = race(df, tmp_path / "verified", "--target", "downstream")
    assert report["metric"] == "val_avg@k" and report["regimes"][0]["regime"] == "search-heavy"
    report, _ = race(
        df.assign(**{"downstream_gsm_pass@1": df["val_native"]}), tmp_path / "held", "--target", "downstream"
    )
    assert report["metric"] == "downstream_gsm_pass@1" and report["regimes"][0]["regime"] == "update-heavy"
    report, _ = race(df.assign(judge_rm=df["val_native"]), tmp_path / "judge", "--target", "judge")
    assert report["metric"] == "judge_rm" and report["regimes"][0]["regime"] == "update-heavy"


def one_error_line(result, needle: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], result.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--target", "vibes"], "--target 'vibes'"),
        (["--target", "judge"], "judge_*"),
        (["--metric", "val_median@k"], "val_median@k"),
    ],
)
def test_bad_target_exits_2(args, needle, tmp_path):
    path = tmp_path / "r.parquet"
    results("flat").to_parquet(path)
    one_error_line(runner.invoke(app, ["race-pilot", "--from-results", str(path), *args]), needle)


@pytest.mark.slow  # each refusal plans the pilot first: ~7 s
def test_bad_input_before_any_compute(tmp_path):
    one_error_line(runner.invoke(app, ["race-pilot", "--from-results", str(tmp_path / "nope.parquet")]), "nope.parquet")
    one_error_line(runner.invoke(app, ["race-pilot", "--root", str(tmp_path), "--target", "judge"]), "eval.judges")
    one_error_line(
        runner.invoke(app, ["race-pilot", "--root", str(tmp_path), "--metric", "judge_score"]), "judge_score"
    )
    one_error_line(runner.invoke(app, ["race-pilot", "--root", str(tmp_path), "--updates", "1"]), "--updates")
    one_error_line(runner.invoke(app, ["race-pilot", "--root", str(tmp_path), "--updates", "1.5,2"]), "--updates")
    one_error_line(
        runner.invoke(app, ["race-pilot", "--root", str(tmp_path), "--seed", "-1"]), "--seed must be >= 0, got -1"
    )  # else found after the pilot's compute
    assert not any(tmp_path.iterdir())
    path = tmp_path / "r.parquet"
    results("flat").drop(columns=["rho"]).to_parquet(path)
    one_error_line(runner.invoke(app, ["race-pilot", "--from-results", str(path)]), "rho")
    # Found by fuzzing: a traceback (an infinite target), or an error that named the budgets, not the value.
    for corrupt, needle in (
        (
            lambda d: d.assign(val_native=d["val_native"].where(d["step"] != 2, np.inf)),
            "val_native in row 2 is not finite (inf)",
        ),
        (lambda d: d.assign(rho=-d["rho"]), "rho in row 1 is -"),
        (lambda d: d.assign(rho=np.nan), "rho has no value"),
        (lambda d: d.assign(run_id=None), "run_id is empty in row 0"),
        (lambda d: d.assign(reward=d["reward"].where(d.index != 5, None)), "reward is empty in row 5"),
    ):  # a reward named "nan"
        corrupt(results("flat")).to_parquet(path)
        one_error_line(runner.invoke(app, ["race-pilot", "--from-results", str(path)]), needle)


@pytest.mark.slow  # plans the pilot: ~7 s
def test_pilot_above_the_cap_is_refused_with_exit_2(tmp_path):
    """A full sweep of one tiny cell: the least useful pilot costs many times that, so it is refused."""
    result = runner.invoke(
        app, ["race-pilot", "--root", str(tmp_path), "grid.n=[2]", "grid.B_p=[2]", "grid.budgets=[16]"]
    )
    one_error_line(result, "above the cap of 25%")
    assert "--force" in result.output
    assert not any(tmp_path.iterdir())
    forced = runner.invoke(
        app,
        [
            "race-pilot",
            "--root",
            str(tmp_path),
            "--force",
            "--dry-run",
            "grid.n=[2]",
            "grid.B_p=[2]",
            "grid.budgets=[16]",
        ],
    )
    assert forced.exit_code == 0, forced.output


@pytest.mark.slow  # plans two 16-cell pilots: ~10 s
def test_pilot_derivation_on_the_embedded_default():
    pilot = derive(None, ["task=arith-steps", "+grid.axes={reward:[sparse,prm]}"], PilotSpec())
    feasible = [c for c in pilot.cells if c.feasible]
    assert pilot.levels == [Level(16, u) for u in (0.0625, 0.25, 1, 4)] and pilot.rewards == [
        "sparse",
        "prm",
    ]
    assert (
        len(feasible) == len(pilot.cells) == 16 and len({c.run_id for c in feasible}) == 16
    )  # 4 levels x 2 seeds x 2 rewards
    assert {(c.axes["n"], c.axes["algo.epochs"]) for c in feasible} == {(lv.n, lv.updates) for lv in pilot.levels}
    assert all(c.plan.column == "flops_total" and c.plan.limit == max(pilot.budgets) for c in feasible)
    assert 0 < pilot.share <= 0.25 and len(pilot.budgets) in (1, 2, 3)
    assert pilot.steps(min(pilot.budgets))[0] >= MIN_STEPS  # every cell's slope past the warm-up, at the plan's bound
    assert pilot.share <= 0.101 or any("above the 10% target" in note for note in pilot.notes)
    assert pilot.cfg.name == "default-pilot"
    for reward in pilot.rewards:
        rho = [
            np.mean(
                [
                    c.plan.predicted_flops["rho"]
                    for c in feasible
                    if c.axes["algo.epochs"] == lv.updates and c.axes["reward"] == reward
                ]
            )
            for lv in pilot.levels
        ]
        assert rho == sorted(rho)  # more updates per batch of the same rollouts: rho rises
    again = derive(None, ["task=arith-steps", "+grid.axes={reward:[sparse,prm]}"], PilotSpec())
    assert [c.run_id for c in again.cells] == [c.run_id for c in pilot.cells]  # same command, same pilot: it resumes
    # The default sweep's pilot meets its 10% target: one budget, 8 steps of its costliest cell at the plan's bound.
    default = derive(None, [], PilotSpec())
    assert 0.09 <= default.share <= 0.101 and default.steps(min(default.budgets))[0] >= MIN_STEPS
    # Its levels span the rho where the seed study's optima lie (0.45 and 0.72), inside, not at an end.
    rho = sorted({round(c.plan.predicted_flops["rho"], 2) for c in default.cells if c.feasible})
    assert rho == [0.3, 0.51, 0.78, 0.94]


def test_several_models_are_validated_leave_one_model_out():
    small, large = (
        results("rising", seed=1).assign(model="tiny-arith-s"),
        results("rising", seed=2).assign(model="tiny-arith"),
    )
    large["run_id"] = "l_" + large["run_id"]
    data = analysis.collect(pd.concat([small, large]), "val_avg@k", None)
    assert data.points["slice"].nunique() == 6  # 3 budgets x 2 models
    entries = analysis.decide(data, "native", 100)
    check = analysis.validate(data, "native", entries, 50)
    assert [e["regime"] for e in entries] == ["update-heavy"]
    assert {next(iter(s["left_out"])) for s in check["subsets"]} == {"budget", "model"} and len(check["subsets"]) == 5
    assert check["loo_same_regime_rate"] == 1.0


def test_budgets_read_at_equal_compute():
    """Budgets inferred from a file are the largest compute every run reaches, halved; each run is
    read there, between its eval points."""
    df = results("flat")
    data = analysis.collect(df, "val_avg@k", None, count=2)
    top = df.groupby("run_id")["flops_total"].max().min()
    assert data.budgets == pytest.approx([top / 2, top])
    assert len(data.points) == 2 * df["run_id"].nunique()
    run = pd.DataFrame({"flops_total": [0.0, 1e9, 4e9], "rho": [np.nan, 0.8, 0.8], "m": [0.1, 0.2, 0.4]})
    assert analysis.read_at(run, 2e9, "m")[0] == pytest.approx(0.3)  # halfway in log compute
    assert analysis.read_at(run, 1e10, "m") is None  # beyond the run


INTERIOR_RHO = [0.2, 0.3, 0.45, 0.6, 0.72, 0.85, 0.95]  # allocation levels spanning both sides of both optima


def interior_results(optima: dict[str, float], seed: int = 0, noise: float = 0.005, reps: int = 2) -> pd.DataFrame:
    """The second seed study's finding: the target peaks inside the rho range, at 0.72 for a
    rule-based reward and 0.45 for a PRM (whose peak is lower, so it is not reward-heavy). Quadratic
    in log2 rho, not in the log-odds the analysis fits in. Shaped as an earlier pilot's results:
    algo.epochs levels 1/8 to 8, n a replicate."""
    rng = np.random.default_rng(seed)
    rows = []
    for reward, best in optima.items():
        for level, rho in enumerate(INTERIOR_RHO, 1):
            for rep in range(reps):
                for step, c in enumerate([0.0, BUDGET / 4, BUDGET / 2, BUDGET]):
                    growth = np.log2(c / (BUDGET / 8)) / 3 if c else 0.0
                    peak = 0.5 if reward == "sparse" else 0.4
                    y = (
                        0.3
                        + (peak - 0.3 - 0.2 * (np.log2(rho) - np.log2(best)) ** 2) * growth
                        + (rng.normal(0, noise) if c else 0.0)
                    )
                    rows.append(
                        {
                            "run_id": f"{reward}_l{level}_r{rep}",
                            "reward": reward,
                            "algo.epochs": 2.0 ** (level - 4),
                            "n": 4 * (rep + 1),
                            "step": step,
                            "rho": rho if c else np.nan,
                            "flops_total": c * (1 + 0.03 * rng.random()),
                            "flops_reward": 0.1 * c if reward == "prm" else 0.0,
                            "val_native": y,
                            "val_avg@k": y,
                        }
                    )
    return pd.DataFrame(rows)


def test_interior_optima_are_read_as_interior(tmp_path):
    report, result = race(interior_results({"sparse": 0.72, "prm": 0.45}), tmp_path)
    by_reward = {e["reward"]: e for e in report["regimes"]}
    for reward, best in (("sparse", 0.72), ("prm", 0.45)):
        entry = by_reward[reward]
        assert entry["regime"] == "interior" and entry["curve"] == "quadratic", entry["why"]
        assert (
            abs(analysis.log_odds(entry["optimum_rho"]) - analysis.log_odds(best)) <= 0.45
        )  # half a level: 0.76 and 0.49 here
        assert abs(entry["optimum_rho"] - best) <= 0.05
        low, high = entry["optimum_interval90"]
        assert INTERIOR_RHO[0] < low <= entry["optimum_rho"] <= high < INTERIOR_RHO[-1]
        assert (
            "algo.epochs" in entry["optimum_units"] and "n" not in entry["optimum_units"]
        )  # earlier pilots' n was a replicate, not a lever
    rec = report["recommendation"]
    assert (
        rec["reward"] == "sparse"
        and rec["regime"] == "interior"
        and rec["optimum_rho"] == by_reward["sparse"]["optimum_rho"]
    )
    assert min(rec["rho_range"]) <= rec["optimum_rho"] <= max(rec["rho_range"]) and len(rec["algo.epochs"]) <= 3
    assert "interior" in result.output and "optimum" in (tmp_path / "race" / "race.md").read_text()


def test_monotone_targets_have_no_optimum(tmp_path):
    report, _ = race(results("rising"), tmp_path)
    [entry] = report["regimes"]
    assert entry["regime"] == "update-heavy" and entry["optimum_rho"] is None and entry["optimum_interval90"] is None


def test_validate_with_full_scale_results(tmp_path):
    """same_regime_rate: the pilot's call against the call on full-scale results (null without them)."""
    full = tmp_path / "full.parquet"
    results("rising", seed=7).to_parquet(full)
    agree, _ = race(results("rising"), tmp_path / "agree", "--validate-with", str(full))
    assert agree["same_regime_rate"] == 1.0 and agree["validation"]["full_scale"]["full_regimes"] == {
        "sparse": "update-heavy"
    }
    results("falling", seed=7).to_parquet(full)
    disagree, _ = race(results("rising"), tmp_path / "disagree", "--validate-with", str(full))
    assert (
        disagree["same_regime_rate"] == 0.0
        and "against full-scale results: 0%" in (tmp_path / "disagree" / "race" / "race.md").read_text()
    )
    bad = runner.invoke(
        app, ["race-pilot", "--from-results", str(full), "--validate-with", str(tmp_path / "nope.parquet")]
    )
    assert bad.exit_code == 2 and "nope.parquet" in bad.output


# ---------------------------------------------------------------------------------------------
# The pilot's levels: update shares at one n


def test_levels_are_update_shares_at_one_n():
    """Every level samples N (the sweep's largest n, at least 2) and only its updates move; N is a
    multiple of every fraction's denominator, so each learns from whole completions."""
    assert levels([1, 2, 4, 8], [2, 4, 8, 16]) == [Level(16, u) for u in (1, 2, 4, 8)]
    assert levels([1, 2], [1]) == [Level(2, 1), Level(2, 2)]  # two completions a group for its advantage
    assert levels([0.0625, 0.25, 1, 4], [2, 4, 8, 16]) == [Level(16, u) for u in (0.0625, 0.25, 1, 4)]
    assert levels([0.25, 0.5], [6]) == [Level(8, 0.25), Level(8, 0.5)]  # 1/4 of 6 is no whole completion
    assert [lv.n for lv in levels([1 / 3, 1], [4])] == [6, 6]
    PilotSpec(updates=[0.25, 0.5, 1]).check()
    for bad in ([0.25, 1.5], [1, 1], [2], [0, 1], [-1, 2]):
        with pytest.raises(ConfigError, match="--updates"):
            PilotSpec(updates=bad).check()


def test_levels_at_n_2_are_distinct_runs_with_distinct_rho():
    """A sweep of n = 2 alone gets four levels at n = 2, each a run of its own, with rho rising with
    the updates, about one step in log-odds per doubling (the learning FLOPs double, the search stays)."""
    lv = levels([1, 2, 4, 8], [2])
    _, cells = expand(
        None,
        [
            f"grid.n=[{lv[0].n}]",
            "grid.B_p=[2]",
            "grid.budget.unit=flops",
            "grid.budgets=[1e11]",
            "+grid.axes={algo.epochs:[1,2,4,8]}",
        ],
    )
    assert [(c.axes["n"], c.axes["algo.epochs"]) for c in cells] == [(2, 1), (2, 2), (2, 4), (2, 8)]
    assert len({c.run_id for c in cells}) == 4
    rho = [c.plan.predicted_flops["rho"] for c in cells]
    assert rho == sorted(rho) and len(set(np.round(rho, 3))) == 4
    gaps = np.diff([analysis.log_odds(r) for r in rho])
    assert gaps.max() / gaps.min() < 1.5  # evenly spread where the analysis fits


# The default pilot's levels: (n, updates, rho) from its plan on the embedded model.
PILOT_LEVELS = [(16, 0.0625, 0.295), (16, 0.25, 0.512), (16, 1, 0.781), (16, 4, 0.939)]


def asymmetric(x: np.ndarray, best: float, tau: float = 1.0) -> np.ndarray:
    """A peak at `best` that is not quadratic in x: a gain saturating with x less a linear cost,
    steep below the peak and shallow above it."""
    return -tau * np.exp(-(x - best) / tau) - (x - best) + tau


def pilot_results(
    truth, seed: int = 0, noise: float = 0.005, rewards=("sparse",), reward_share: float = 0.0
) -> pd.DataFrame:
    """Results shaped as the default pilot's: its four levels x two seeds per reward, eval points at
    0, B/4, B/2 and B. The target moves by `truth(x)` x its growth with compute, x the log-odds of
    rho; a `prm` spends `reward_share` of its FLOPs on rewards (its rho is that much lower)."""
    rng = np.random.default_rng(seed)
    rows = []
    for reward in rewards:
        share = reward_share if reward == "prm" else 0.0
        for n, updates, rho_nr in PILOT_LEVELS:
            rho = rho_nr * (1 - share)
            for rep in range(2):
                run_effect = rng.normal(0, noise / 2)
                for step, c in enumerate([0.0, BUDGET / 4, BUDGET / 2, BUDGET]):
                    growth = np.log2(c / (BUDGET / 8)) / 3 if c else 0.0
                    y = (
                        0.3
                        + 0.05 * growth
                        + truth(analysis.log_odds(rho)) * growth
                        + ((run_effect + rng.normal(0, noise)) if c else 0.0)
                    )
                    rows.append(
                        {
                            "run_id": f"{reward}_n{n}_u{updates}_s{rep}",
                            "reward": reward,
                            "algo.epochs": updates,
                            "n": n,
                            "seed": rep,
                            "step": step,
                            "rho": rho if c else np.nan,
                            "flops_total": c * (1 + 0.03 * rng.random()),
                            "flops_reward": share * c,
                            "val_avg@k": y,
                            "val_native": y,
                        }
                    )
    return pd.DataFrame(rows)


def test_an_asymmetric_peak_is_found_in_rho_without_reward_and_in_the_levers_units():
    """Known truth not quadratic in the fitted coordinate: a peak halfway between the levels of 1/4
    and 1 update per batch (x = 0.95: rho 0.66, updates 0.5). Tolerance: half a level's spacing in x
    (0.45 here), a factor 1.4 in updates; n is the pilot's one N, so no optimum is read in it."""
    x = [analysis.log_odds(r) for _, _, r in PILOT_LEVELS]
    best = (x[1] + x[2]) / 2
    data = analysis.collect(pilot_results(lambda v: 0.05 * asymmetric(v, best)), "val_native", None)
    [entry] = analysis.decide(data, "native", 200)
    assert entry["regime"] == "interior", entry["why"]
    assert entry["measured_peak"]["measured"] and entry["measured_peak"]["level"] in (0.25, 1)
    assert abs(analysis.log_odds(entry["optimum_rho"]) - best) <= 0.45
    units = entry["optimum_units"]
    assert units["rho_no_reward"]["value"] == pytest.approx(
        entry["optimum_rho"], abs=1e-9
    )  # a rule-based reward spends no reward FLOPs
    assert 0.5 / 1.4 <= units["algo.epochs"]["value"] <= 0.5 * 1.4 and "n" not in units
    low, high = units["algo.epochs"]["interval90"]
    assert 0.0625 < low <= units["algo.epochs"]["value"] <= high < 4


def test_a_rise_that_stays_flat_is_not_interior():
    """Truth: the target rises from the lowest level to the second and stays flat beyond (a plateau
    the quadratic bends through, its vertex between measured levels). Over 20 noise draws "interior"
    is called at most once: no level inside beats the highest one."""
    x = [analysis.log_odds(r) for _, _, r in PILOT_LEVELS]
    plateau = lambda v: 0.04 * np.minimum(1.0, (v - x[0]) / (x[1] - x[0]))  # noqa: E731
    entries = [
        analysis.decide(analysis.collect(pilot_results(plateau, seed=s), "val_native", None), "native", 100, s)[0]
        for s in range(20)
    ]
    assert sum(e["regime"] == "interior" for e in entries) <= 1, [e["regime"] for e in entries]
    assert all(e["optimum_rho"] is None for e in entries if e["regime"] != "interior")


def test_the_optimum_without_reward_flops_undoes_the_reward_share():
    """A PRM spending 20% of its FLOPs on rewards: the same peak in rho without them, lower in rho.
    rho without reward is read linearly in x between the two levels around the peak (1/4 and 1
    update, 1.8 apart in x), so it is rho / 0.8 to within 2% (measured: 1.2%)."""
    x_nr = [analysis.log_odds(r) for _, _, r in PILOT_LEVELS]
    best_nr = (x_nr[1] + x_nr[2]) / 2
    to_nr = lambda v: analysis.log_odds(analysis.rho_of(v) / 0.8)  # noqa: E731
    data = analysis.collect(
        pilot_results(lambda v: 0.05 * asymmetric(np.vectorize(to_nr)(v), best_nr), rewards=("prm",), reward_share=0.2),
        "val_native",
        None,
    )
    [entry] = analysis.decide(data, "native", 200)
    assert entry["regime"] == "interior", entry["why"]
    rho_nr = entry["optimum_units"]["rho_no_reward"]["value"]
    assert rho_nr == pytest.approx(entry["optimum_rho"] / 0.8, rel=0.02)
    assert abs(analysis.log_odds(rho_nr) - best_nr) <= 0.45


def test_a_flat_truth_on_the_pilots_levels_claims_no_optimum():
    """Null: over 30 noise draws on the pilot's levels with no effect of rho, no interior optimum,
    and a regime named at most twice."""
    entries = [
        analysis.decide(
            analysis.collect(pilot_results(lambda v: 0.0 * v, seed=s), "val_native", None), "native", 100, s
        )[0]
        for s in range(30)
    ]
    assert not any(e["regime"] == "interior" for e in entries)
    assert sum(e["regime"] != "undetermined" for e in entries) <= 2


def test_undetermined_on_both_sides_is_not_agreement(tmp_path):
    assert analysis.agreement([("undetermined", "undetermined")]) == (None, 1)
    assert analysis.agreement(
        [("update-heavy", "update-heavy"), ("undetermined", "undetermined"), ("undetermined", "search-heavy")]
    ) == (0.5, 1)
    full = tmp_path / "full.parquet"
    results("flat", seed=7).to_parquet(full)
    report, _ = race(results("flat"), tmp_path / "flat", "--validate-with", str(full))
    assert report["regimes"][0]["regime"] == "undetermined" and report["validation"]["full_scale"]["full_regimes"] == {
        "sparse": "undetermined"
    }
    assert report["same_regime_rate"] is None and report["loo_same_regime_rate"] is None  # was 100% for both
    assert "no regime to agree on" in (tmp_path / "flat" / "race" / "race.md").read_text()


def test_a_recommendation_keeps_the_pilots_rho_at_every_n():
    """A level is a share of a group, and its planned rho moves with n (1/16 of a group: rho 0.30 at
    n = 16, 0.44 at 8, 0.58 at 4, 0.69 at 2, where a share of 2 or 4 is rounded up to one completion;
    1/4: 0.51, 0.54, 0.58, 0.69): the n whose rho is within RHO_SPREAD in log-odds of the largest n's
    at every recommended level are kept, the others left out of the sweep's grid.n."""
    args = ["grid.n=[2,4,8,16]", "grid.B_p=[2]", "grid.budget.unit=flops", "grid.budgets=[1e11]"]
    sweep = sweep_overrides(None, args, "sparse", [0.0625, 0.25])
    _, cells = expand(None, sweep)
    kept, off, rho = keeping_rho(cells, [0.0625, 0.25])
    assert (kept, off) == ([16], [2, 4, 8]) and rho["0.0625"]["16"] < rho["0.0625"]["8"] < rho["0.0625"]["2"]
    _, cells = expand(None, sweep_overrides(None, args, "sparse", [0.25, 1]))
    assert keeping_rho(cells, [0.25, 1])[:2] == ([4, 8, 16], [2])
    narrowed = sweep_overrides(None, args, "sparse", [0.25, 1], [4, 8, 16])
    assert "grid.n=[4,8,16]" in narrowed and "grid.n=[2,4,8,16]" not in narrowed
    assert any(o.startswith("++grid.axes=") and "algo.epochs:[0.25,1]" in o for o in narrowed)
