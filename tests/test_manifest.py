"""The manifest's schema (`store.Manifest`): what earlier isoflops wrote is read, a rewrite keeps
every key it had, and a manifest that cannot be read is refused naming the file.

tests/manifests/ holds manifests written by isoflop before the manifest had a version (version 0),
by its own code: an adaptive sweep with infeasible cells and cells it stopped, the larger full
sweep that continued them, a sweep whose runs failed and were retried (a simulated cluster), and a
calibration."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from isoflop_cli import calibrate, report
from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import (
    FAILED,
    FINISHED,
    MANIFEST_VERSION,
    PAUSED,
    CellState,
    Failure,
    Infeasible,
    Manifest,
    SweepDir,
    SweepSchedule,
)

MANIFESTS = Path(__file__).parent / "manifests"
OLD = sorted(p.name for p in MANIFESTS.glob("v0-*.json"))


def sweep_with(tmp_path: Path, manifest: dict | str) -> SweepDir:
    sweep = SweepDir(tmp_path / "default")
    sweep.path.mkdir(parents=True)
    sweep.manifest_file.write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return sweep


@pytest.mark.parametrize("name", OLD)
def test_an_old_manifest_is_read_and_rewritten_with_every_key_it_had(tmp_path, name):
    old = json.loads((MANIFESTS / name).read_text())
    sweep = sweep_with(tmp_path, old)
    manifest = sweep.manifest()
    assert set(manifest.cells) == set(old["cells"])
    sweep.write_manifest(manifest)
    new = json.loads(sweep.manifest_file.read_text())
    assert new["version"] == MANIFEST_VERSION
    left_out = {
        "cells",
        "rows",
        "schedule",
    }  # rows: a calibration's row count, which its slices cover (calibrate.total_rows)
    assert {k: new[k] for k in old if k not in left_out} == {k: v for k, v in old.items() if k not in left_out}
    assert {k: new["schedule"][k] for k in old.get("schedule", {})} == old.get(
        "schedule", {}
    )  # an adaptive one gains its indifference
    for run_id, cell in old["cells"].items():  # each key as it was; a key added holds its default (attempts 0)
        assert {k: new["cells"][run_id][k] for k in cell} == cell
    assert sweep.manifest() == manifest


def test_what_old_manifests_say_is_read_as_they_said_it(tmp_path):
    adaptive = sweep_with(tmp_path / "a", (MANIFESTS / "v0-adaptive.json").read_text()).manifest()
    assert adaptive.schedule == SweepSchedule(
        name="adaptive",
        budgets=[64.0, 128.0, 256.0],
        margin=2.5,
        column="rollouts",
        metric="val_avg@k",
        indifference=0.0,
    )  # written before the indifference: its rule ran without one
    stopped = [cell for cell in adaptive.cells.values() if cell.stopped_at is not None]
    assert stopped and all(c.state == PAUSED and c.why.startswith(f"stopped at {c.stopped_at:g}") for c in stopped)
    assert [(i.axes["n"], i.reason) for i in adaptive.infeasible] == [
        (256, "budget 256 rollouts allows M = 0 steps of B = 512, below grid.min_steps = 1")
    ] * 2

    continued = sweep_with(tmp_path / "c", (MANIFESTS / "v0-continued.json").read_text()).manifest()
    assert sorted(c.continues for c in continued.cells.values() if c.continues) == sorted(
        adaptive.cells
    )  # n=256 runs anew
    assert all(c.state == FINISHED and c.attempts >= 1 and c.submission_id for c in continued.cells.values())

    failed_dir = sweep_with(tmp_path / "f", (MANIFESTS / "v0-failed.json").read_text())
    failed = failed_dir.manifest()
    bad, good = failed.cells.values()
    assert (bad.state, bad.error, bad.attempts) == (FAILED, "ValueError: boom", 2)
    assert [(f.attempt, f.reason) for f in bad.failures] == [(1, "ValueError: boom"), (2, "ValueError: boom")]
    assert (
        good.state == FINISHED
        and isinstance(good.failures[0], Failure)
        and good.failures[0].reason.endswith("the node running the job died")
    )
    assert (
        bad.M == 8
        and bad.eval_steps == [0, 1, 2, 4, 8]
        and len(bad.step_flops) == 3
        and bad.columns["model"] == "tiny-arith"
    )
    assert report.run_state(failed_dir, next(iter(failed.cells)), bad) == (FAILED, "ValueError: boom")
    result = CliRunner().invoke(app, ["status", str(failed_dir.path)], terminal_width=200)
    assert result.exit_code == 0 and "failed n2_bp2_s0_fa35ec0c: ValueError: boom" in result.output, result.output
    assert (
        "0/2 finished" in result.output and "1 missing" in result.output
    )  # the finished cell's run dir is not there: not taken on the manifest's word

    cal = sweep_with(tmp_path / "cal", (MANIFESTS / "v0-calibration.json").read_text()).manifest()
    assert cal.kind == "calibration" and calibrate.total_rows(cal) == 300
    assert [c.rows for c in cal.cells.values()] == [[0, 120], [120, 240], [240, 300]]
    assert [c.state for c in cal.cells.values()] == [FINISHED, "submitted", "pending"]


def test_a_manifest_from_before_flop_budgets_reads_as_a_full_schedule_without_step_flops(tmp_path):
    """Before FLOP budgets a manifest had no schedule and its cells no step_flops: the sweep is full,
    and its finished runs do not scale the FLOP predictions."""
    old = json.loads((MANIFESTS / "v0-failed.json").read_text())
    del old["schedule"]
    for cell in old["cells"].values():
        del cell["step_flops"]
    sweep = sweep_with(tmp_path, old)
    manifest = sweep.manifest()
    assert manifest.schedule == SweepSchedule() and all(c.step_flops is None for c in manifest.cells.values())
    good = next(rid for rid, c in manifest.cells.items() if c.state == FINISHED)
    sweep.run(good).dir.mkdir(parents=True)
    sweep.run(good).finish([{"step": 0, "flops_total": 0.0}, {"step": 4, "flops_total": 1e9}])
    assert sweep.flops_scale() == {}


def test_a_manifest_reads_back_as_it_was_written(tmp_path):
    manifest = Manifest(
        name="x",
        schedule=SweepSchedule(
            name="adaptive", budgets=[1.0, 2.0], margin=2.0, column="rollouts", metric="val_avg@k", indifference=0.02
        ),
        cells={
            "a": CellState(
                M=3,
                axes={"n": 2, "algo.kl_coef": [0.0, 0.1]},
                columns={"n": 2},
                eval_steps=[0, 3],
                step_flops=[1.0, 2.0, 0.0],
                state=PAUSED,
                submission_id="s",
                attempts=2,
                failures=[Failure(attempt=1, reason="r", at=5.0)],
                error="e",
                continues="b",
                stopped_at=1.0,
                why="w",
            ),
            "b": CellState(M=1),
        },
        infeasible=[Infeasible(axes={"n": 64}, reason="too big")],
    )
    sweep = SweepDir(tmp_path)
    sweep.write_manifest(manifest)
    assert sweep.manifest() == manifest
    assert json.loads(sweep.manifest_file.read_text())["cells"]["b"] == {
        "M": 1,
        "state": "pending",
        "attempts": 0,
    }  # what is not set is left out


@pytest.mark.parametrize(
    "text, why",
    [
        ("TORN", "column"),  # cut mid-write by an older isoflop, or by hand: where the JSON ends
        ("", "Expecting value"),
        ("[1, 2]", "not a JSON object"),
        ('{"name": "default"}', "no cells object"),
        ('{"cells": [1]}', "cells is [1]"),
        ('{"version": 2, "cells": {}}', "version 2, written by a newer isoflop"),
        ('{"cells": {"a": {"M": true}}}', "cell 'a' is malformed (it needs an integer M)"),
        ('{"cells": {"a": {"M": 4, "state": "done"}}}', "cell 'a' is malformed (state 'done' is none of"),
        ('{"cells": {"a": {"M": 4, "attempts": "2"}}}', "cell 'a' is malformed (attempts is \"2\")"),
        ('{"cells": {"a": {"M": 4, "failures": [{"attempt": 1}]}}}', "cell 'a' is malformed (reason is missing)"),
        (
            '{"kind": "calibration", "cells": {"rows-0-9": {"state": "pending"}}}',
            "cell 'rows-0-9' is malformed (it needs rows [start, stop])",
        ),
        ('{"cells": {}, "schedule": {"name": "adaptive"}}', "schedule adaptive needs budgets"),
        ('{"cells": {}, "infeasible": [{"axes": {}}]}', "reason is missing"),
    ],
)
def test_a_manifest_that_does_not_fit_its_schema_is_refused_naming_the_file(tmp_path, text, why):
    if text == "TORN":
        text = (MANIFESTS / "v0-failed.json").read_text()[:500]
    sweep = sweep_with(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        sweep.manifest()
    assert str(e.value).startswith(f"{sweep.manifest_file} is not a well-formed sweep manifest (") and why in str(
        e.value
    ), str(e.value)
    assert "\n" not in str(e.value)


def test_a_manifest_that_cannot_be_opened_is_refused_too(tmp_path):
    sweep = SweepDir(tmp_path)
    sweep.manifest_file.mkdir()
    with pytest.raises(
        ConfigError, match=r"cannot read .*manifest\.json: it is a directory where a file belongs: move it aside"
    ):
        sweep.manifest()
    assert SweepDir(tmp_path / "new").manifest() == Manifest()  # none yet: a new sweep dir


def test_status_looks_at_each_runs_dir_not_only_at_the_manifest(tmp_path):
    """Once: a deleted run dir, or a file in its place, still showed 'finished'. Variant: a finished
    cell whose status.json alone is gone, a running cell whose dir is a file, a paused cell
    whose dir is gone; a pending cell (nothing run yet) stays pending, a failed one failed."""
    from isoflop_cli.store import MISSING, PENDING, RUNNING

    sweep = SweepDir(tmp_path)
    states = {
        "sealed": FINISHED,
        "unsealed": FINISHED,
        "running": RUNNING,
        "paused": PAUSED,
        "pending": PENDING,
        "failed": FAILED,
    }
    sweep.write_manifest(
        Manifest(cells={rid: CellState(columns={"n": 2, "B_p": 2}, M=2, state=state) for rid, state in states.items()})
    )
    for rid in ("sealed", "unsealed"):
        sweep.run(rid).finish([{"step": 0, "rollouts": 0}, {"step": 2, "rollouts": 8}], step=2, M=2)
    sweep.run("unsealed").status_file.unlink()
    (tmp_path / "runs" / "running").write_text("not a run\n")
    shown = {rid: report.run_state(sweep, rid, cell) for rid, cell in sweep.manifest().cells.items()}
    assert {rid: state for rid, (state, _) in shown.items()} == {
        "sealed": FINISHED,
        "unsealed": MISSING,
        "running": MISSING,
        "paused": MISSING,
        "pending": PENDING,
        "failed": FAILED,
    }
    assert "runs/running is not a directory" in shown["running"][1] and "runs/paused is gone" in shown["paused"][1]
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 0 and "1/6 finished" in result.output and "3 missing" in result.output, result.output
