"""`isoflop calibrate`: easy and hard sets cut by the base model's pass rate, merged from slices.
End to end (a Ray job, a rerun that samples nothing twice, a sweep on the set it wrote):
tests/test_lookup.py."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli import calibrate, config
from isoflop_cli.cli import app
from isoflop_cli.store import SweepDir, atomic_write

SUMS = [(a, b) for a in range(10) for b in range(30)]  # 300 sums the embedded model was warm-started on


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    path = tmp_path_factory.mktemp("sums") / "sums.parquet"
    pd.DataFrame(
        [
            {
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"ground_truth": str(a + b)[::-1]},
                "data_source": "sums",
                "extra_info": {"index": i},
            }
            for i, (a, b) in enumerate(SUMS)
        ]
    ).to_parquet(path)
    return path


def test_slices_cover_every_row_once():
    assert calibrate.slices(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert calibrate.slices(8, 8) == [(0, 8)]


def test_merge_cuts_bands_from_the_files_own_rows(tmp_path, sums):
    """Slices with known pass rates: easy and hard hold exactly the source rows in their bands
    (bounds included), in the source's schema; one slice unfinished is left out and counted."""
    overrides = [
        "task=dataset",
        f"task.train={sums}",
        "task.max_new_tokens=6",
        "task.max_prompt_tokens=8",
        "calibrate.shard=100",
        "eval.problems=4",
        "grid.n=[2]",
        "grid.B_p=[2]",
        "grid.budgets=[16]",
    ]
    cfg = config.load(None, overrides)
    dest = SweepDir(tmp_path / "cal")
    manifest = calibrate.prepare(cfg, dest)
    assert [c.rows for c in manifest.cells.values()] == [[0, 100], [100, 200], [200, 300]]
    rates = {i: (i % 17) / 16 for i in range(300)}  # every count of 16 samples, 0 to 16
    for rid, cell in list(manifest.cells.items())[:2]:
        start, stop = cell.rows
        part = pd.DataFrame(
            [
                {
                    "problem_id": i,
                    "prompt": f"{SUMS[i][0]}+{SUMS[i][1]}=",
                    "answer": "x",
                    "pass_rate": rates[i],
                    "samples": 16,
                    "mean_response_tokens": 3.0,
                }
                for i in range(start, stop)
            ]
        )
        files = dest.run(rid)
        files.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(files.dir / calibrate.RESULT, part.to_parquet(index=False))
        files.finish([{"step": 0, "problems": len(part)}])
    summary = calibrate.merge(cfg, dest, None, overrides)
    assert summary["calibrated"] == 200 and summary["left_out"] == 100
    source = pd.read_parquet(sums)
    for band, (low, high) in (("easy", (0.3, 0.6)), ("hard", (0.0, 0.0625))):
        got = pd.read_parquet(tmp_path / "cal" / f"{band}.parquet")
        want = [i for i in range(200) if low <= rates[i] <= high]
        assert [int(r["index"]) for r in got["extra_info"]] == want  # the file's own rows, verl schema kept
        entry = next(b for b in summary["bands"] if b["name"] == band)
        assert entry["problems"] == len(want) and entry["mean_response_tokens"] == 3.0
        assert (
            list(got.columns) == [*source.columns, "calibrated_response_tokens"]
            and (got["calibrated_response_tokens"] == 3.0).all()
        )
    assert (tmp_path / "cal" / "calibration.png").exists() and (tmp_path / "cal" / "calibration.svg").exists()
    # plan predicts a sweep on a calibrated set at the measured response length (3 tokens, not 6)
    from isoflop_cli.grid import calibrated_scale, step_flops

    on_easy = [
        *overrides,
        f"task.train={tmp_path / 'cal' / 'easy.parquet'}",
        "task.val_fraction=0.5",
        "eval.problems=2",
    ]
    scale = calibrated_scale(config.load(None, on_easy))
    assert scale == pytest.approx(
        sum(step_flops(config.load(None, [*on_easy, "task.max_new_tokens=3"])))
        / sum(step_flops(config.load(None, on_easy)))
    )
    assert 0 < scale < 1 and calibrate_scale_is_none(overrides)
    assert json.loads((tmp_path / "cal" / "summary.json").read_text())["calibrated"] == 200
    # every count of 16 equally often: far beyond one shared rate, and the table says so
    assert summary["spread"]["p_value"] < 1e-6 and summary["spread"]["difficulty_sd"] > 0.25
    from isoflop_cli.report import calibration_table

    assert "problems differ beyond sampling" in calibration_table(summary).caption


def calibrate_scale_is_none(overrides) -> bool:
    from isoflop_cli.grid import calibrated_scale

    return calibrated_scale(config.load(None, overrides)) is None  # an uncalibrated file: no scale


def test_bad_calibration_input_exits_2(tmp_path, sums):
    for args, needle in (
        (["task.digits=[1,2]"], "use task=dataset"),
        (
            [
                "task=dataset",
                f"task.train={sums}",
                "task.max_new_tokens=6",
                "task.max_prompt_tokens=8",
                "eval.problems=4",
                "calibrate.easy=[0.6,0.3]",
            ],
            "calibrate.easy",
        ),
        (
            [
                "task=dataset",
                f"task.train={sums}",
                "task.max_new_tokens=6",
                "task.max_prompt_tokens=8",
                "eval.problems=4",
                "calibrate.samples=0",
            ],
            "calibrate.samples",
        ),
    ):
        result = CliRunner().invoke(app, ["calibrate", "--root", str(tmp_path / "out"), *args])
        assert result.exit_code == 2 and needle in result.output, result.output
    assert not (tmp_path / "out").exists()


def _rates(true: np.ndarray, samples: int, rng: np.random.Generator) -> tuple[pd.Series, pd.Series]:
    """Pass rates of problems whose true rates are `true`, each from `samples` draws."""
    return pd.Series(rng.binomial(samples, true) / samples), pd.Series(np.full(len(true), samples))


def test_one_shared_rate_reads_as_sampling_noise_at_the_tests_level():
    """Null: every problem at 0.1, 16 samples (the 1/16 and 2/16 'bands' fill by chance). Over 200
    calibrations one shared rate is rejected at 5% about 5% of the time, and the sd of the true
    rates reads near 0."""
    rng = np.random.default_rng(0)
    runs = [calibrate.spread(*_rates(np.full(500, 0.1), 16, rng)) for _ in range(200)]
    assert sum(s.p_value < 0.05 for s in runs) / len(runs) <= 0.10
    assert np.median([s.difficulty_sd for s in runs]) < 0.02
    assert sum(s.shared for s in runs) >= 195


def test_the_embedded_probes_histogram_is_one_shared_rate():
    """The counts a 2-digit-sum probe of the embedded family gave (1024 problems, 16 samples: 187 at
    0, 347 at 1, ...), which Binomial(16, 0.1) predicts to within a few per bin."""
    counts = {0: 187, 1: 347, 2: 281, 3: 133, 4: 56, 5: 18, 6: 2}
    rates = pd.Series([k / 16 for k, c in counts.items() for _ in range(c)])
    s = calibrate.spread(rates, pd.Series(np.full(len(rates), 16)))
    assert s.shared and s.mean == pytest.approx(0.0997, abs=1e-4) and s.difficulty_sd < 0.02


def test_problems_of_different_difficulty_are_told_apart_and_their_spread_measured():
    """Truth not of the method's own form: true rates from Beta(0.5, 2) (sd 0.2138) and from a
    two-point mix (half at 0.02, half at 0.5: sd 0.24), 2,000 problems of 16 samples; and 8
    samples of one problem never vary (nothing to test)."""
    rng = np.random.default_rng(1)
    beta = calibrate.spread(*_rates(rng.beta(0.5, 2.0, 2000), 16, rng))
    assert beta.p_value < 1e-6 and not beta.shared and beta.difficulty_sd == pytest.approx(0.2138, abs=0.015)
    mix = calibrate.spread(*_rates(np.repeat([0.02, 0.5], 1000), 16, rng))
    assert mix.p_value < 1e-6 and mix.difficulty_sd == pytest.approx(0.24, abs=0.015)
    flat = calibrate.spread(pd.Series([0.0] * 50), pd.Series([8] * 50))
    assert flat.shared and flat.dispersion is None and flat.difficulty_sd == 0


def test_calibrate_checks_only_the_settings_it_uses(tmp_path, sums):
    """Issue 46: calibrate refused on eval.problems (above the validation split), a sweep's setting
    it never reads. Variant: a validation split that holds every row (task.val_fraction) and a held-out
    set that does not exist; the refusal that remains is calibrate's own (calibrate.samples)."""
    base = [
        "calibrate",
        "--root",
        str(tmp_path / "out"),
        "task=dataset",
        f"task.train={sums}",
        "task.max_new_tokens=6",
        "task.max_prompt_tokens=8",
        "calibrate.samples=0",
    ]
    for unused in (
        ["eval.problems=100000"],
        ["task.val_fraction=0.999", "eval.problems=300"],
        [f"+eval.sets={{gone:{tmp_path / 'gone.parquet'}}}"],
    ):
        result = CliRunner().invoke(app, [*base, *unused])
        assert result.exit_code == 2 and "calibrate.samples" in result.output, (unused, result.output)
    sweep = CliRunner().invoke(app, ["plan", *base[3:], "eval.problems=100000"])
    assert sweep.exit_code == 2 and "eval.problems" in sweep.output, sweep.output
