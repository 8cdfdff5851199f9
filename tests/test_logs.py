"""`isoflop logs`: a run's job log from its run dir, whole, or followed while the sweep copies it in."""

import threading
import time

from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.dispatch import sweep_lock
from isoflop_cli.store import CellState, Manifest, SweepDir

RUN = "n2_bp2_s0_0123abcd"


def one_run_sweep(tmp_path, state: str):
    sweep = SweepDir(tmp_path / "default")
    sweep.path.mkdir(parents=True)
    sweep.write_manifest(Manifest(cells={RUN: CellState(M=4, state=state)}))
    sweep.run(RUN).dir.mkdir(parents=True)
    return sweep


def test_logs_prints_a_runs_log_and_names_an_unknown_run(tmp_path):
    sweep = one_run_sweep(tmp_path, "finished")
    empty = CliRunner().invoke(app, ["logs", str(sweep.path), RUN])
    assert empty.exit_code == 0 and "no log yet" in empty.output
    sweep.run(RUN).log.write_text("line 1\nline 2\n")
    result = CliRunner().invoke(app, ["logs", str(sweep.path), RUN])
    assert result.exit_code == 0 and result.output == "line 1\nline 2\n"
    bad = CliRunner().invoke(app, ["logs", str(sweep.path), "nope"])
    assert bad.exit_code == 2 and "no run 'nope'" in bad.output


def test_logs_follow_prints_the_log_as_it_grows_until_the_sweep_is_done_with_the_run(tmp_path):
    """What the sweep writes while the job runs (the whole log each time), a retry's new log, and
    the end when the manifest says the cell is finished."""
    sweep = one_run_sweep(tmp_path, "submitted")
    log = sweep.run(RUN).log

    watching = threading.Event()

    def sweep_side():
        with sweep_lock(sweep.path):  # a sweep watching the dir, as `isoflop sweep` holds it
            watching.set()
            for text in ("step 1\n", "step 1\nstep 2\n", "attempt 2\n"):
                time.sleep(1.0)
                log.write_text(text)
            time.sleep(1.0)
            sweep.write_manifest(Manifest(cells={RUN: CellState(M=4, state="finished")}))

    writer = threading.Thread(target=sweep_side)
    writer.start()
    watching.wait(timeout=60)  # the sweep holds its dir before `logs` looks (under load the thread starts late)
    result = CliRunner().invoke(app, ["logs", str(sweep.path), RUN, "--follow"])
    writer.join()
    assert result.exit_code == 0, result.output
    assert result.output == f"step 1\nstep 2\n--- {RUN}: a new attempt's log ---\nattempt 2\n"


def test_logs_follow_stops_when_no_sweep_is_watching(tmp_path):
    """A cell left `submitted` by a killed sweep gets no more log: --follow prints what is there and
    says so instead of waiting forever."""
    sweep = one_run_sweep(tmp_path, "submitted")
    sweep.run(RUN).log.write_text("step 1\n")
    result = CliRunner().invoke(app, ["logs", str(sweep.path), RUN, "--follow"])
    assert result.exit_code == 0 and result.output.startswith("step 1\n") and "no sweep is watching" in result.output


def test_status_shows_runs_per_state_the_sweeps_rollouts_per_second_and_the_time_left(tmp_path):
    """One run 10 s in at 40 of its 80 rollouts (4/s), one pending with 80 to go: 120 rollouts left
    at 4/s is ~30 s."""
    import os
    import time as clock

    from rich.console import Console

    from isoflop_cli.report import sweep_table

    sweep = SweepDir(tmp_path / "default")
    sweep.path.mkdir(parents=True)
    cell = {"M": 10, "columns": {"n": 2, "B_p": 4}}
    sweep.write_manifest(
        Manifest(cells={"running": CellState(**cell, state="submitted"), "waiting": CellState(**cell, state="pending")})
    )
    files = sweep.run("running")
    files.dir.mkdir(parents=True)
    files.set_status("running", step=5, M=10, rollouts=40, pid=os.getpid(), started=clock.time() - 10)
    console = Console(width=200, record=True)
    console.print(sweep_table(sweep))
    text = console.export_text()
    assert "runs: 1 running, 1 pending; 4 rollouts/s across the sweep; ~30 s left at that rate" in text


def test_a_sweep_logged_to_a_file_prints_a_line_per_event_and_a_summary(tmp_path, monkeypatch, capsys):
    """Where stdout is no terminal, the sweep's view prints what happened between polls, one line
    each (a run started, an eval point with its metric, finished, failed with its reason, retrying),
    and the runs per state at the start, every minute and at the end."""
    import os

    from isoflop_cli import cli
    from isoflop_cli.store import Failure

    sweep = SweepDir(tmp_path / "default")
    sweep.path.mkdir(parents=True)
    a, b = "n2_bp2_s0_aaaaaaaa", "n4_bp2_s0_bbbbbbbb"
    manifest = Manifest(
        cells={a: CellState(M=4, state="submitted", attempts=1), b: CellState(M=4, state="submitted", attempts=1)}
    )
    sweep.write_manifest(manifest)
    for rid in (a, b):
        sweep.run(rid).dir.mkdir(parents=True)
    dispatcher = type("D", (), {"sweep": sweep, "on_poll": None})()
    clock = [0.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    assert not cli.console.is_terminal and isinstance(cli._view(), cli.LogLines)

    with cli.LogLines().watching(dispatcher):
        start = capsys.readouterr().out
        sweep.run(a).set_status("running", pid=os.getpid(), step=0)
        dispatcher.on_poll()
        sweep.run(a).append_metrics({"step": 2, "rollouts": 8, "val_avg@k": 0.625})
        dispatcher.on_poll()
        manifest.cells[b].state = "retrying"
        manifest.cells[b].failures.append(Failure(attempt=1, reason="the node died", at=0.0))
        sweep.write_manifest(manifest)
        clock[0] = 61.0
        dispatcher.on_poll()
        sweep.run(a).finish(
            [{"step": 2, "rollouts": 8, "val_avg@k": 0.625}, {"step": 4, "rollouts": 16, "val_avg@k": 0.75}],
            step=4,
            M=4,
        )
        manifest.cells[b].state, manifest.cells[b].error = "failed", "ValueError: bad row 3"
        sweep.write_manifest(manifest)
    lines = [line.split(" ", 1)[1] for line in capsys.readouterr().out.splitlines()]  # each stamped HH:MM:SS
    assert start.split(" ", 1)[1].strip() == "runs: 2 submitted"
    assert lines == [
        f"{a} running (attempt 1)",
        f"{a} eval point 1: val_avg@k 0.625 at 8 rollouts (step 2)",
        f"{b} retrying: attempt 1 failed (the node died); resubmitting, it resumes from its checkpoint",
        "runs: 1 running, 1 retrying",
        f"{a} eval point 2: val_avg@k 0.750 at 16 rollouts (step 4)",
        f"{a} finished",
        f"{b} failed: ValueError: bad row 3",
        "runs: 1 failed, 1 finished",
    ]
