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
    sweep.write_manifest(Manifest(cells={"running": CellState(**cell, state="submitted"), "waiting": CellState(**cell, state="pending")}))
    files = sweep.run("running")
    files.dir.mkdir(parents=True)
    files.set_status("running", step=5, M=10, rollouts=40, pid=os.getpid(), started=clock.time() - 10)
    console = Console(width=200, record=True)
    console.print(sweep_table(sweep))
    text = console.export_text()
    assert "runs: 1 running, 1 pending; 4 rollouts/s across the sweep; ~30 s left at that rate" in text
