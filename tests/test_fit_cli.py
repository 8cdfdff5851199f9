"""`isoflop fit` end to end on small synthetic results: every output file, several inputs, and the
robustness cases (one error line and exit 2, or a warning and a fit)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.fit.curves import sigmoid

runner = CliRunner()
CHINCHILLA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "chinchilla_svg_extracted.csv"
SWEEP_METHODS = ["frontier", "fixed-batch", "scalerl", "isoflop-slices"]


def results(seed=0) -> pd.DataFrame:
    """n in 2..32 x B_p in {4, 8}: later, higher sigmoids for larger n; 17 eval points to 1e8 rollouts."""
    rng = np.random.default_rng(seed)
    log_c = np.linspace(2, 8, 16)
    frames = []
    for k in range(1, 6):
        for b_p in (4, 8):
            y = sigmoid(log_c, 0.1, 0.5 + 0.06 * k - 0.01 * (b_p == 8), 2.5 + 0.7 * k, 1.5) + rng.normal(
                0, 0.005, log_c.size
            )
            frames.append(
                pd.DataFrame(
                    {
                        "run_id": f"n{2**k}_bp{b_p}",
                        "n": 2**k,
                        "B_p": b_p,
                        "seed": 0,
                        "step": np.arange(17),
                        "rollouts": np.r_[0, 10**log_c],
                        "val_avg@k": np.r_[0.1, y],
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def invoke(*args):
    return runner.invoke(app, ["fit", *map(str, args)])


def one_error_line(result, needle):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], result.output


@pytest.fixture(scope="module")
def sweep_fit(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("sweep")
    results().to_parquet(sweep / "results.parquet")
    methods = [a for m in SWEEP_METHODS for a in ("--method", m)]
    result = invoke(sweep, *methods, "--holdout-frac", 0.2, "--bootstrap", 8, "--seed", 3)
    assert result.exit_code == 0, result.output
    return sweep / "fit", result


def test_writes_every_output(sweep_fit):
    out, result = sweep_fit
    fit = json.loads((out / "fit.json").read_text())
    assert list(fit) == ["n_star_trend", *SWEEP_METHODS] and fit["n_star_trend"]["call"] in ("rises", "falls", "none")
    for entry in (fit[m] for m in SWEEP_METHODS):
        assert {"params", "interval90", "converged", "metric", "axis", "compute", "compute_unit", "input"} <= set(entry)
        assert entry["input"]["sha256"] and entry["compute_unit"] == "rollouts"
    assert list(fit["frontier"]["params"]) == ["lower", "upper", "midpoint", "slope"]
    assert set(fit["frontier"]["interval90"]) == {"lower", "upper", "midpoint", "slope"}
    assert list(fit["scalerl"]["params"]) == ["R0", "A", "C_mid", "B", "holdout_error"]
    assert {"coef", "exponent"} <= set(fit["isoflop-slices"]["params"])
    front = pd.read_csv(out / "frontier.csv")
    assert list(front.columns) == ["compute", "value", "axis_star"] and front["value"].is_monotonic_increasing
    for name in ("frontier", "axis_star", "fixed_batch", "scalerl", "isoflop_slices"):
        for ext in ("png", "svg"):
            assert (out / f"{name}.{ext}").stat().st_size > 1000
    report = (out / "report.md").read_text()
    question, answer, sure = report.splitlines()[:3]  # the sweep's question first, its answer, how sure
    assert (
        question == "Does the best n (n*) grow with compute?"
        and answer.startswith("Answer: ")
        and sure.startswith("How sure: ")
    )
    assert question in result.output
    assert "![frontier](frontier.png)" in report and "## isoflop-slices" in report and "90% interval" in report
    assert "n* 90%" in result.output and "frontier:" in result.output


def test_seeded_and_reproducible(sweep_fit, tmp_path):
    out, _ = sweep_fit
    results().to_parquet(tmp_path / "results.parquet")
    assert invoke(tmp_path, "--method", "frontier", "--bootstrap", 8, "--seed", 3).exit_code == 0
    again = json.loads((tmp_path / "fit" / "fit.json").read_text())["frontier"]
    assert again["interval90"] == json.loads((out / "fit.json").read_text())["frontier"]["interval90"]


def test_several_inputs_are_concatenated(tmp_path):
    results().to_parquet(tmp_path / "a.parquet")
    results(seed=1).assign(run_id=lambda d: "b-" + d["run_id"]).to_csv(tmp_path / "b.csv", index=False)
    result = invoke(tmp_path / "a.parquet", tmp_path / "b.csv", "--bootstrap", 0, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    fit = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert list(fit) == ["n_star_trend", "frontier"] and fit["frontier"]["input"]["runs"] == 20
    # A run id is a hash of what the run computes: the same id in two inputs is one run given twice.
    results(seed=1).to_csv(tmp_path / "c.csv", index=False)
    twice = invoke(tmp_path / "a.parquet", tmp_path / "c.csv", "--bootstrap", 0, "--out", tmp_path / "out")
    assert twice.exit_code == 2 and "is in both" in twice.output


def test_the_frontier_reads_the_same_whatever_the_compute_s_unit(tmp_path):
    """Compute scaled by 1e70 (any unit of FLOPs): the same n* and values at the same grid points,
    and the report's frontier table is written (it matched its rows to the axis* rows on the
    absolute compute, which at 1e80 never matched)."""
    tables = []
    for scale in (1, 1e70):
        out = tmp_path / f"x{scale:g}"
        results().assign(rollouts=lambda d, scale=scale: d["rollouts"] * scale).to_csv(tmp_path / "r.csv", index=False)
        result = invoke(tmp_path / "r.csv", "--bootstrap", 0, "--out", out)
        assert result.exit_code == 0, result.output
        front = pd.read_csv(out / "frontier.csv")
        tables.append(front.assign(compute=front["compute"] / scale))
        assert "| rollouts | val_avg@k | measured | n* | note |" in (out / "report.md").read_text()
    pd.testing.assert_frame_equal(*tables, rtol=1e-9)


def test_nan_metric_warns_and_fits(tmp_path):
    df = results()
    df.loc[df.index[::7], "val_avg@k"] = np.nan
    df.to_csv(tmp_path / "r.csv", index=False)
    result = invoke(tmp_path / "r.csv", "--bootstrap", 0)
    assert result.exit_code == 0, result.output
    assert "warning:" in result.output and "NaN" in result.output
    assert any("dropped" in w for w in json.loads((tmp_path / "fit" / "fit.json").read_text())["frontier"]["warnings"])


def test_too_few_points_default_falls_back_to_the_empirical_frontier(tmp_path):
    results()[lambda d: d["step"] <= 2].to_csv(tmp_path / "r.csv", index=False)
    result = invoke(tmp_path / "r.csv", "--bootstrap", 0)
    assert result.exit_code == 0 and "not fitted" in result.output, result.output
    assert list(pd.read_csv(tmp_path / "fit" / "frontier.csv").columns) == ["compute", "value", "axis_star"]
    assert list(json.loads((tmp_path / "fit" / "fit.json").read_text())) == [
        "n_star_trend"
    ]  # the question is asked of any curves


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--metric", "val_pass@1"], "val_pass@1"),
        (["--method", "frontier", "--axis", "lr"], "lr"),
        (["--method", "magic"], "unknown method magic"),
        (["--method", "parametric"], "--size-col"),
        (["--size-col", "N", "--tokens-col", "D", "--compute-col", "C"], "not both"),
        (["--method", "scalerl", "--holdout-frac", "1.5"], "holdout"),
        (["--method", "fixed-batch", "--axis", "seed"], "n or B_p"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--drop-early", "-1", "--method", "scalerl"], "--drop-early must be in [0, 1)"),
        (
            ["--holdout-frac", "0.2"],
            "--holdout-frac and --drop-early are scalerl's",
        ),  # read by no default method: was ignored
    ],
)
def test_bad_options_and_columns_exit_2(tmp_path, args, needle):
    results().to_csv(tmp_path / "r.csv", index=False)
    one_error_line(invoke(tmp_path / "r.csv", "--bootstrap", 0, *args), needle)


def test_a_csv_named_in_capitals_reads_as_csv(tmp_path):
    results().to_csv(tmp_path / "R.CSV", index=False)
    result = invoke(tmp_path / "R.CSV", "--bootstrap", 0)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "corrupt, needle",
    [
        (lambda d: d.assign(**{"val_avg@k": np.inf}), "column val_avg@k has no finite numeric values"),
        (lambda d: d.assign(n=d["n"].where(d["n"] != 2, 0)), "frontier: n must be positive, got 0 in run n2_bp4"),
        (
            lambda d: d.assign(rollouts=d["rollouts"].where(d["n"] != 4, -d["rollouts"] - 1)),
            "frontier: rollouts must be >= 0, got -1 in run n4_bp4",
        ),
        (lambda d: d.assign(run_id=None), "r.csv: run_id is empty in row 0"),
        (lambda d: pd.concat([d, d.iloc[:3]]), "r.csv: run n2_bp4 has step 0 twice"),
        (
            lambda d: d.assign(n=d["n"].where(d["step"] <= 8, d["n"] * 2)),
            "frontier: run n16_bp4 has n 16, 32: a run's n is one value",
        ),
    ],
    ids=["inf metric", "zero axis", "negative compute", "no run id", "a row twice", "n changes within a run"],
)
def test_values_no_fit_can_read_exit_2_naming_them(tmp_path, corrupt, needle):
    """Found by fuzzing `fit`: each of these was a traceback deep in a fit, or (a row twice, negative
    compute, an n that changes within a run) a fit that counted them: the run split into two curves,
    the noise read from the seam."""
    corrupt(results()).to_csv(tmp_path / "r.csv", index=False)
    one_error_line(invoke(tmp_path / "r.csv", "--bootstrap", 0), needle)


def test_too_few_points_for_an_asked_method_exit_2(tmp_path):
    results()[lambda d: d["step"] <= 2].to_csv(tmp_path / "r.csv", index=False)
    result = invoke(tmp_path / "r.csv", "--method", "frontier", "--bootstrap", 0)
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("error: frontier: no n value"), (
        result.output
    )


def test_unreadable_input_exit_2(tmp_path):
    (tmp_path / "r.csv").write_text("")
    one_error_line(invoke(tmp_path / "r.csv"), "cannot read")
    one_error_line(invoke(tmp_path), "results.parquet")


@pytest.mark.slow  # ~6 s of fits
def test_parametric_on_the_chinchilla_csv(tmp_path):
    if not CHINCHILLA.exists():
        pytest.skip(f"shared data not found at {CHINCHILLA}")
    pd.read_csv(CHINCHILLA).sort_values("loss").iloc[:-5].to_csv(
        tmp_path / "c.csv", index=False
    )  # the README's 240 runs
    result = invoke(
        tmp_path / "c.csv",
        "--size-col",
        "Model Size",
        "--compute-col",
        "Training FLOP",
        "--metric",
        "loss",
        "--bootstrap",
        0,
    )
    assert result.exit_code == 0, result.output
    fit = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert list(fit) == ["parametric"] and fit["parametric"]["params"]["E"] == pytest.approx(1.817, rel=0.01)
    assert not (tmp_path / "fit" / "frontier.csv").exists() and (tmp_path / "fit" / "parametric.png").exists()
    assert "N_opt ~ C^a" in result.output
