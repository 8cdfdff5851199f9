"""What a crash, a torn file, a changed grid, a full disk or a hostile input may not do: lose or
double finished work, hide a failure behind 'running', or end in a traceback."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli import config, grid, report
from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import FAILED, FINISHED, RUNNING, CellState, Failure, Manifest, RunFiles, SweepDir, write_json
from isoflop_cli.sweep import check_same_grid, prepare

runner = CliRunner()
ROWS = [
    {"step": s, "rollouts": 8 * s, "flops_total": 1e9 * s, "val_avg@k": v} for s, v in ((0, 0.2), (2, 0.3), (4, 0.4))
]


def one_error_line(result, needle: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], result.output


def sealed_sweep(tmp_path: Path) -> SweepDir:
    sweep = SweepDir(tmp_path)
    sweep.write_manifest(Manifest(cells={"a": CellState(columns={"n": 4, "B_p": 2}, M=4)}))
    files = sweep.run("a")
    files.dir.mkdir(parents=True)
    for row in ROWS:
        files.append_metrics(row)
    files.finish(files.read_metrics(), step=4, M=4)
    return sweep


@pytest.mark.parametrize("damage", ["torn", "cut", "emptied", "deleted"])
def test_a_finished_run_whose_records_were_damaged_is_repaired_not_shortened(tmp_path, damage):
    sweep = sealed_sweep(tmp_path)
    files = sweep.run("a")
    text = files.metrics.read_text()
    if damage == "torn":
        files.metrics.write_text(text[:-20])  # the last eval point, the largest budget, torn mid-line
    elif damage == "cut":
        files.metrics.write_text("".join(text.splitlines(keepends=True)[:2]))
    elif damage == "emptied":
        files.metrics.write_text("")
    else:
        files.metrics.unlink()
    assert files.read_metrics() != ROWS
    df = sweep.collect()
    assert df["step"].tolist() == [0, 2, 4] and df["val_avg@k"].tolist() == [0.2, 0.3, 0.4]
    assert files.metrics.read_text() == text  # repaired on disk too


def test_a_run_marked_finished_without_whole_records_is_not_finished(tmp_path):
    """A status file of an older isoflop (no sealed copy): a torn tail means the run is redone."""
    files = RunFiles(tmp_path / "run")
    files.dir.mkdir()
    for row in ROWS:
        files.append_metrics(row)
    files.set_status(FINISHED)
    assert files.finished_rows() == ROWS
    files.metrics.write_text(files.metrics.read_text()[:-5])
    assert files.finished_rows() is None and not files.finished()


def test_status_tells_killed_failed_and_stopped_runs_apart_from_running(tmp_path):
    sweep = SweepDir(tmp_path)
    ids = {"killed": "k1", "failed": "f1", "stopped": "s1", "running": "r1", "crashed": "c1"}
    cells = {rid: CellState(columns={"n": 2, "B_p": 2}, M=4, attempts=2) for rid in ids.values()}
    cells["f1"].state, cells["f1"].error = (
        FAILED,
        "job isoflop-f1-2 ended FAILED: Job entrypoint command failed with exit code -9",
    )
    cells["s1"].state = "stopped"
    cells["c1"].state = FAILED
    sweep.write_manifest(Manifest(cells=cells))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for rid in cells:  # each run's own status says running, as a killed run leaves it
        files = sweep.run(rid)
        files.dir.mkdir(parents=True)
        files.set_status(RUNNING, step=1, pid=os.getpid() if rid in ("r1", "c1") else dead.pid)
    sweep.run("c1").log.write_text(
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    return func(*args, **kwargs)\n'
        "torch.OutOfMemoryError: CUDA out of memory\n"
    )
    states = {name: report.run_state(sweep, rid, cells[rid]) for name, rid in ids.items()}
    assert states["killed"][0] == "killed" and str(dead.pid) in states["killed"][1]
    assert states["failed"] == (FAILED, cells["f1"].error)
    assert states["stopped"][0] == "stopped"
    assert states["running"] == (RUNNING, "")
    assert states["crashed"] == (FAILED, "torch.OutOfMemoryError: CUDA out of memory")  # not the traceback's last frame
    result = runner.invoke(app, ["status", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    host = socket.gethostname()  # the node each failed or killed run ran on
    assert f"killed k1 on {host}" in result.output and f"failed c1 on {host}: torch.OutOfMemoryError" in result.output
    assert (
        "runs: 1 running, 2 failed, 1 killed, 1 stopped" in result.output and result.output.count("running") == 2
    )  # that line, one row
    assert all(
        line.split("│")[3].strip() == "2" for line in result.output.splitlines() if line.startswith("│")
    )  # attempts


def test_status_on_a_malformed_manifest_cell_is_one_line(tmp_path):
    manifest = SweepDir(tmp_path).manifest_file
    write_json(manifest, {"cells": {"a": {"columns": {}}}})
    one_error_line(runner.invoke(app, ["status", str(tmp_path)]), "cell 'a' is malformed")
    write_json(manifest, {"cells": {"a": [1, 2]}})
    one_error_line(runner.invoke(app, ["status", str(tmp_path)]), "cell 'a' is malformed")


def test_a_changed_grid_is_refused_or_merged_never_narrowed(tmp_path):
    args = ["grid.budgets=[32]", "grid.B_p=[2]", "eval.problems=8"]
    cfg = config.load(None, [*args, "grid.n=[2,4]"])
    cells = grid.expand(cfg)
    sweep = SweepDir(tmp_path / cfg.name)
    prepare(sweep, cfg, cells)
    for cell in cells:  # the earlier sweep finished
        sweep.run(cell.run_id).finish(ROWS, step=4, M=4)
    before = sweep.collect()
    result = runner.invoke(app, ["sweep", *args, "grid.n=[4,8]", "--root", str(tmp_path)])
    one_error_line(result, "holds a different grid: 1 of its 2 cells are not in this one")
    assert "--extend" in result.output
    assert set(json.loads(sweep.manifest_file.read_text())["cells"]) == {c.run_id for c in cells}  # untouched
    new_cfg = config.load(None, [*args, "grid.n=[4,8]"])
    new_cells = grid.expand(new_cfg)
    with pytest.raises(ConfigError):
        check_same_grid(sweep, new_cells, extend=False)
    check_same_grid(sweep, new_cells, extend=True)
    prepare(sweep, new_cfg, new_cells)
    merged = sweep.manifest().cells
    assert set(merged) == {c.run_id for c in cells + new_cells} and len(merged) == 3
    assert all(merged[c.run_id].state == "pending" for c in new_cells if c.run_id not in {d.run_id for d in cells})
    after = sweep.collect()
    assert len(after) == len(before) and set(after["run_id"]) == set(
        before["run_id"]
    )  # every finished run stays collectable


def test_a_manifest_that_cannot_be_read_is_refused_never_written_over(tmp_path):
    """A torn manifest.json was once taken for an empty one: a sweep of another grid then wrote its
    own cell over it and the finished runs fell out of results.parquet. Every command that reads it
    refuses in one line naming it, and nothing in the dir changes."""
    args = ["grid.budgets=[32]", "grid.B_p=[2]", "eval.problems=8", "--root", str(tmp_path)]
    cfg = config.load(None, ["grid.budgets=[32]", "grid.B_p=[2]", "eval.problems=8", "grid.n=[2]"])
    cells = grid.expand(cfg)
    sweep = SweepDir(tmp_path / cfg.name)
    prepare(sweep, cfg, cells)
    sweep.run(cells[0].run_id).finish(ROWS, step=4, M=4)
    sweep.collect()
    torn = sweep.manifest_file.read_text()[:-60]
    sweep.manifest_file.write_text(torn)
    before = {p: p.read_bytes() for p in sweep.path.rglob("*") if p.is_file()}
    for command in (
        ["sweep", *args, "grid.n=[4]"],
        ["sweep", *args, "grid.n=[4]", "--extend"],
        ["sweep", *args, "grid.n=[2]"],
        ["plan", *args, "grid.n=[2]"],
        ["status", str(sweep.path)],
        ["logs", str(sweep.path), cells[0].run_id],
    ):
        one_error_line(runner.invoke(app, command), f"{sweep.manifest_file} is not a well-formed sweep manifest")
        assert {p: p.read_bytes() for p in sweep.path.rglob("*") if p.is_file()} == before, command


def test_sweep_refuses_before_creating_anything(tmp_path):
    one_error_line(
        runner.invoke(app, ["sweep", "cluster.gpus_per_run=1", "--root", str(tmp_path / "new")]), "gpus_per_run"
    )
    assert not (tmp_path / "new").exists()
    (tmp_path / "default").write_text("a file where the sweep dir goes")
    one_error_line(runner.invoke(app, ["sweep", "--root", str(tmp_path)]), "default")


@pytest.mark.parametrize(
    "change, args, needle",
    [
        (lambda df: df.assign(rollouts=0), ["fit", "{r}"], "no row has a positive rollouts"),
        (lambda df: df, ["fit", "{r}", "{r}"], "give each input once"),
        (lambda df: df, ["fit", "{r}", "{copy}"], "is in both"),
        (
            lambda df: df.assign(flops_total=0.0),
            ["race-pilot", "--from-results", "{r}"],
            "no row has a positive flops_total",
        ),
        (
            lambda df: df.assign(flops_total=["x"] + [str(v) for v in df.flops_total[1:]]),
            ["race-pilot", "--from-results", "{r}"],
            "flops_total in row 0 is not a number ('x')",
        ),
        (lambda df: df, ["race-pilot", "--from-results", "{r}", "--bootstrap", "0"], "--bootstrap must be >= 1"),
    ],
)
def test_results_that_cannot_be_fitted_are_one_line(tmp_path, change, args, needle):
    rows = [
        {
            "run_id": f"r{n}",
            "n": n,
            "reward": "sparse",
            "rho": 0.7,
            "step": s,
            "rollouts": 8 * s,
            "flops_total": 1e9 * s,
            "val_avg@k": 0.1 * s,
        }
        for n in (2, 4)
        for s in range(4)
    ]
    df = change(pd.DataFrame(rows))
    path, copy = tmp_path / "r.parquet", tmp_path / "copy.parquet"
    df.to_parquet(path)
    df.assign(extra=1).to_parquet(copy)
    one_error_line(runner.invoke(app, [a.format(r=path, copy=copy) for a in args]), needle)


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem that fills up: a tmpfs of 18 MiB, room for one checkpoint of the embedded
    model with its optimizer state (12 MiB) but not for the next one beside it (needs root, as CI
    and this machine have)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=18m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.slow
def test_a_full_disk_is_one_line_leaves_no_partial_files_and_a_rerun_resumes(small_disk, tmp_path):
    run_dir = small_disk / "run"
    cmd = [
        sys.executable,
        "-m",
        "isoflop_cli",
        "run",
        "n=4",
        "B_p=2",
        "grid.budgets=[32]",
        "grid.eval_points=2",
        "eval.problems=8",
        "eval.samples=4",
        "checkpoint.every=1",
        "--run-dir",
        str(run_dir),
    ]
    full = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert full.returncode == 1, full.stderr
    assert "Traceback" not in full.stderr and full.stderr.strip().splitlines()[-1].startswith("error: disk full at ")
    assert f"disk full at {run_dir / 'checkpoint'}" in full.stderr
    assert not RunFiles(run_dir).finished()  # its status says failed, or running where even that could not be written
    (run_dir / "job.log").write_text(full.stdout + full.stderr)  # as the dispatcher saves a job's log
    assert RunFiles(run_dir).failure_reason().startswith("disk full at")
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoint",
        "job.log",
        "lease.json",
        "metrics.jsonl",
        "problems.jsonl",
        "status.json",
    ]  # the last save, no partial one
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)  # space freed
    rerun = runner.invoke(app, cmd[3:])  # in this process: the full disk's exit was the process's to show
    assert rerun.exit_code == 0, rerun.output
    assert "resumed from the checkpoint at step 1" in rerun.stdout  # the last complete save
    assert RunFiles(run_dir).finished_rows()[-1]["rollouts"] == 32
    shutil.rmtree(run_dir)
    with open(small_disk / "filler", "wb") as filler, pytest.raises(OSError):
        while True:
            filler.write(b"\0" * 2**20)
            filler.flush()
    sweep = runner.invoke(
        app, ["sweep", "--root", str(small_disk / "out")]
    )  # a sweep on a full disk: before any compute
    one_error_line(sweep, "No space left on device")


def test_a_rerun_keeps_each_cells_attempts_and_their_reasons(tmp_path):
    cfg = config.load(None, ["grid.budgets=[32]", "grid.B_p=[2]", "grid.n=[2]", "eval.problems=8"])
    cells = grid.expand(cfg)
    sweep = SweepDir(tmp_path / cfg.name)
    prepare(sweep, cfg, cells)
    manifest = sweep.manifest()
    failure = Failure(attempt=1, reason="job ended FAILED: exit code -9", at=1.0)
    cell = manifest.cells[cells[0].run_id]
    cell.attempts, cell.submission_id, cell.failures = 2, "isoflop-x-2", [failure]
    sweep.write_manifest(manifest)
    prepare(sweep, cfg, cells)
    cell = sweep.manifest().cells[cells[0].run_id]
    assert (cell.attempts, cell.submission_id, cell.failures) == (2, "isoflop-x-2", [failure])


def test_a_link_in_a_sweeps_tree_is_refused_before_compute_and_nothing_is_written_through_it(tmp_path):
    """Once: a run dir that was a link had the sweep write config, metrics, status and log into its
    target. Variant: runs/ itself is the link (and a state file of a real run dir, for the writers)."""
    from test_head import TINY

    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    (out / "default").mkdir(parents=True)
    (out / "default" / "runs").symlink_to(elsewhere, target_is_directory=True)
    result = runner.invoke(app, ["sweep", "--root", str(out), *TINY, "grid.budgets=[16]"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert (
        result.exit_code == 2
        and len(errors) == 1
        and f"{out / 'default' / 'runs'} is a symbolic link where" in errors[0]
    ), result.output
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in (out / "default").iterdir()) == ["runs"]
    sweep = SweepDir(out / "default")
    files = sweep.run("a")
    for write in (
        lambda: files.set_status(RUNNING),
        lambda: files.append_metrics({"step": 0}),
        lambda: files.write_config("x: 1\n"),
    ):
        with pytest.raises(ConfigError, match="is a symbolic link where"):
            write()
    assert list(elsewhere.iterdir()) == []
    (out / "default" / "runs").unlink()
    files.set_status(RUNNING)
    precious = tmp_path / "precious.jsonl"
    precious.write_text("precious\n")
    files.metrics.symlink_to(precious)
    with pytest.raises(ConfigError, match=r"metrics\.jsonl is a symbolic link"):
        sweep.check_tree()
    with pytest.raises(ConfigError, match=r"metrics\.jsonl is a symbolic link"):
        files.append_metrics({"step": 0})
    assert precious.read_text() == "precious\n"


def test_a_run_dir_holding_another_cells_records_is_refused_and_left_as_it_is(tmp_path):
    """Once: another sweep's run dir copied under this run id was collected as this cell's curve.
    Variant: run dirs swapped between two cells of one sweep, and a finished run of the same
    trajectory under another run id (another budget); a run continued from a smaller budget keeps
    the earlier run's paused record (same fingerprint) and is read."""
    sweep = SweepDir(tmp_path)
    cells = {
        rid: CellState(columns={"n": n, "B_p": 2}, M=4, fingerprint=fp)
        for rid, n, fp in (("a", 2, "f-two"), ("b", 4, "f-four"), ("c", 2, "f-two"))
    }
    sweep.write_manifest(Manifest(cells=cells))
    for rid in ("a", "b"):
        files = sweep.run(rid)
        for row in ROWS:
            files.append_metrics(row)
        files.finish(files.read_metrics(), step=4, M=4)
    assert all(row["fingerprint"] == "f-two" for row in sweep.run("a").read_metrics())
    runs = tmp_path / "runs"
    runs.joinpath("a").rename(runs / "x")
    runs.joinpath("b").rename(runs / "a")
    runs.joinpath("x").rename(runs / "b")
    before = (runs / "a" / "status.json").read_bytes()
    with pytest.raises(ConfigError) as refused:
        sweep.collect()
    assert str(refused.value).startswith(
        "run a: "
    ) and "another configuration (fingerprint f-four, this cell's f-two)" in str(refused.value)
    assert (runs / "a" / "status.json").read_bytes() == before and not sweep.results_file.exists()
    shutil.copytree(
        runs / "b", runs / "c"
    )  # run b's directory holds a's records (f-two) again: c has a's fingerprint, not its run id
    with pytest.raises(ConfigError, match=r"run c: .* is the finished record of run a, not this run's"):
        sweep.run("c").finished_rows()
    sweep.run("c").set_status("paused", step=2)
    status = json.loads((runs / "c" / "status.json").read_text())
    assert (status["run_id"], status["fingerprint"]) == ("c", "f-two")
    with open(runs / "c" / "status.json", "w") as f:
        json.dump({**status, "run_id": "a"}, f)  # the earlier run's paused record, as a continuation takes its dir over
    assert sweep.run("c").status().state == "paused" and len(sweep.run("c").read_metrics()) == 3
