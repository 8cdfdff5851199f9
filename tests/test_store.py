import os
import subprocess
import sys

import pytest

from isoflop_cli import store
from isoflop_cli.store import FINISHED, RUNNING, CellState, Manifest, RunFiles, SweepDir, atomic_write, read_json


def test_atomic_write_and_torn_metrics(tmp_path):
    atomic_write(tmp_path / "a" / "x.json", '{"a": 1}')
    assert read_json(tmp_path / "a" / "x.json") == {"a": 1}
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["x.json"]
    run = RunFiles(tmp_path / "run")
    run.dir.mkdir()
    run.append_metrics({"step": 0})
    with open(run.metrics, "a") as f:
        f.write('{"step": 1, "val')  # a kill mid-line
    assert run.read_metrics() == [{"step": 0}]
    run.reset_metrics()
    assert run.read_metrics() == []


def test_collect_only_finished_runs(tmp_path):
    sweep = SweepDir(tmp_path)
    sweep.write_manifest(
        Manifest(cells={"a": CellState(columns={"n": 2, "B_p": 4}), "b": CellState(columns={"n": 8, "B_p": 4})})
    )
    for rid, state in (("a", FINISHED), ("b", "running")):
        files = sweep.run(rid)
        files.dir.mkdir(parents=True)
        files.append_metrics({"step": 0, "rollouts": 0})
        files.append_metrics({"step": 1, "rollouts": 8})
        files.set_status(state)
    df = sweep.collect()
    assert df["run_id"].tolist() == ["a", "a"] and df["n"].tolist() == [2, 2]
    assert list(df.columns[:3]) == ["run_id", "n", "B_p"]
    assert (tmp_path / "results.parquet").exists()


def test_retry_decisions():
    from isoflop_cli.dispatch import should_retry

    assert should_retry(1, 3, -9, "job ended FAILED: killed", [])  # a killed process: once more
    assert not should_retry(3, 3, -9, "killed", [])  # no attempts left
    assert not should_retry(1, 3, 2, "error: task.train x does not exist", [])  # a user error stays one
    assert not should_retry(2, 3, 1, "ValueError: boom", ["ValueError: boom"])  # the same error twice is deterministic
    assert not should_retry(1, 1, -9, "killed", [])  # cluster.max_attempts=1: never


def test_a_reattached_job_that_fails_is_retried(tmp_path):
    """A job a killed CLI left running, reattached by the rerun, then lost (its node died) is retried
    like a job of this dispatch: resubmitted once, the sweep ends with the run finished."""
    from types import SimpleNamespace

    from isoflop_cli import config, dispatch

    sweep = SweepDir(tmp_path)
    sweep.write_manifest(Manifest(cells={"a": CellState(state="submitted", submission_id="isoflop-a-1", attempts=1)}))
    asked: dict[str, int] = {}

    class Cluster:  # Ray's job client where node loss ended the reattached job; the new attempt finishes the run
        def get_job_status(self, sid):
            asked[sid] = asked.get(sid, 0) + 1
            if sid == "isoflop-a-1":
                return SimpleNamespace(value="RUNNING" if asked[sid] == 1 else "FAILED")
            sweep.run("a").finish([{"step": 0, "rollouts": 0}], step=0, M=0)
            return SimpleNamespace(value="SUCCEEDED")

        def get_job_info(self, sid):
            return SimpleNamespace(driver_exit_code=None, message="the node running the job died")

        def get_job_logs(self, sid):
            return ""

        def submit_job(self, submission_id, **_):
            return submission_id

    cluster = config.load().cluster
    cluster.poll_s = 0.01
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dispatch, "RETRY_WAIT_S", (0.01, 0.01))
        states = dispatch.Dispatcher(sweep, cluster, "http://127.0.0.1:1", client=Cluster()).run()
    assert states == {"a": FINISHED}
    cell = sweep.manifest().cells["a"]
    assert cell.attempts == 2 and cell.submission_id.startswith("isoflop-a-2-") and len(cell.failures) == 1


def test_sweeps_of_the_same_cells_in_two_dirs_submit_distinct_jobs(tmp_path):
    """A run id is its cell's content, so two sweep dirs can hold the same run: their jobs on one
    cluster must not share a submission id (the second would take the first's job for its own)."""
    from isoflop_cli import config, dispatch

    class Cluster:
        def submit_job(self, submission_id, **_):
            return submission_id

    ids = set()
    for name in ("one", "two"):
        sweep = SweepDir(tmp_path / name)
        dispatcher = dispatch.Dispatcher(sweep, config.load().cluster, "http://127.0.0.1:1", client=Cluster())
        ids.add(dispatcher._submit("n2_bp2_s0_abcdef12", CellState()))
    assert len(ids) == 2 and all(i.startswith("isoflop-n2_bp2_s0_abcdef12-1-") for i in ids)


def test_one_attempt_writes_a_run_dir_and_waits_only_where_the_last_may_still_run(tmp_path, monkeypatch):
    """take_lease: a newer attempt takes the run dir over; the older one's writes are refused from
    then on, and the newer waits LEASE_GRACE_S only where the older may still run (marked running,
    and alive here or on another host)."""
    slept = []
    monkeypatch.setattr(store.time, "sleep", slept.append)
    files = RunFiles(tmp_path / "run")
    first = files.take_lease()
    assert slept == []  # a fresh run dir
    first.set_status(RUNNING, pid=os.getpid())
    second = files.take_lease()
    assert slept == [store.LEASE_GRACE_S]  # the first is alive on this host
    for write in (
        lambda f: f.append_metrics({"step": 1}),
        lambda f: f.set_status(RUNNING),
        lambda f: f.finish([{"step": 1}]),
        lambda f: f.keep_metrics(0),
        lambda f: f.reset_metrics(),
        lambda f: f.append_problems(1, []),
    ):
        with pytest.raises(store.LeaseLost, match="another attempt"):
            write(first)
    assert not files.metrics.exists() and files.status().state == RUNNING
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    second.set_status(RUNNING, pid=gone.pid)  # killed: its process is gone from this host
    third = files.take_lease()
    assert len(slept) == 1
    store.write_json(files.status_file, {"state": RUNNING, "host": "elsewhere", "pid": 1})  # a node the sweep lost
    files.take_lease()
    assert len(slept) == 2
    with pytest.raises(store.LeaseLost):
        third.append_metrics({"step": 2})
    files.set_status(FINISHED)  # the sweep's side holds no lease and is never refused


def test_every_output_file_replaces_a_link_at_its_path_instead_of_writing_through_it(tmp_path):
    """Once: fit's frontier.png and the replay and race plots overwrote a link's target. Variant:
    the SVG of a figure, and a results file, each a link to a file that must stay as it was."""
    import matplotlib.pyplot as plt

    from isoflop_cli.fit.plots import save

    precious = tmp_path / "precious"
    precious.write_text("precious\n")
    for name in ("race.svg", "results.parquet"):
        (tmp_path / name).symlink_to(precious)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    written = save(fig, tmp_path / "race")
    atomic_write(tmp_path / "results.parquet", b"PAR1")
    assert precious.read_text() == "precious\n"
    for path in (*written, tmp_path / "results.parquet"):
        assert path.is_file() and not path.is_symlink()
    assert (tmp_path / "race.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o000])
def test_files_and_dirs_follow_the_umask_and_are_never_world_writable(tmp_path, umask):
    """Once: under umask 000 the sweep dir, runs/ and each run dir were 0777, and results made by
    mkstemp were 0600 whatever the umask (teammates could not read them). Umask 022 gives 0644 files
    and 0755 dirs; umask 027 0640 and 0750; umask 000 leaves out o+w only."""
    previous = os.umask(umask)
    try:
        sweep = SweepDir(tmp_path / "out" / "sweep")
        sweep.write_manifest(Manifest(cells={"a": CellState(columns={"n": 2, "B_p": 4})}))
        files = sweep.run("a")
        files.append_metrics({"step": 0, "rollouts": 0})
        files.set_status(FINISHED)
        sweep.collect()
    finally:
        os.umask(previous)
    made = [
        tmp_path / "out",
        sweep.path,
        sweep.path / "runs",
        files.dir,
        sweep.manifest_file,
        sweep.results_file,
        files.metrics,
        files.status_file,
    ]
    modes = {p.name: p.stat().st_mode & 0o777 for p in made}
    want = {True: 0o777 & ~umask & ~0o002, False: 0o666 & ~umask & ~0o002}
    assert modes == {p.name: want[p.is_dir()] for p in made}


# --- file-system errors on a sweep's state: one line naming the path and what failed (issue 46) -----

from pathlib import Path  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from isoflop_cli.cli import app  # noqa: E402
from isoflop_cli.errors import ConfigError  # noqa: E402

ROWS = [{"step": s, "rollouts": 8 * s, "flops_total": 1e9 * s, "val_avg@k": 0.1 * s} for s in (0, 2, 4)]


def _sealed(tmp_path) -> SweepDir:
    sweep = SweepDir(tmp_path / "sweep")
    sweep.write_manifest(Manifest(cells={"a": CellState(columns={"n": 4, "B_p": 2}, M=4)}))
    files = sweep.run("a")
    files.finish(ROWS, step=4, M=4)
    files.write_log("the job's log\n")
    return sweep


def _denied(monkeypatch, where: Path, error=PermissionError) -> None:
    """Reading `where` fails as a file the user may not read does (root reads any mode, so the
    refusal is injected rather than made with chmod)."""
    read_text = Path.read_text

    def refuse(self, *args, **kwargs):
        if self == where:
            raise error(
                13 if error is PermissionError else 36, os.strerror(13 if error is PermissionError else 36), str(self)
            )
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refuse)


def _one_line(result, needle: str) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], (
        result.output
    )
    return lines[0]


@pytest.mark.parametrize(
    "state_file, command", [("status.json", "status"), ("job.log", "logs"), ("metrics.jsonl", "status")]
)
def test_a_state_file_that_cannot_be_read_is_one_line_saying_so_not_a_damaged_record(
    tmp_path, monkeypatch, state_file, command
):
    """Issue 46: a permissions error on status.json advised "move it aside (the run is then
    redone)", throwing a finished run away; an unreadable job.log or metrics.jsonl was a traceback.
    Variants: each file under the command that reads it, read denied; the files are left as they are."""
    sweep = _sealed(tmp_path)
    files = sweep.run("a")
    if state_file == "metrics.jsonl":  # status reads a running run's metrics
        files.set_status(RUNNING, step=2)
    before = {p: p.read_bytes() for p in sweep.path.rglob("*") if p.is_file()}
    _denied(monkeypatch, files.dir / state_file)
    line = _one_line(
        CliRunner().invoke(app, [command, str(sweep.path), *(["a"] if command == "logs" else [])]),
        f"cannot read {files.dir / state_file}: permission denied: fix its permissions",
    )
    assert "move it aside" not in line and "redone" not in line
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in sweep.path.rglob("*") if p.is_file()} == before


def test_state_files_that_cannot_be_written_or_named_are_one_line_naming_them(tmp_path, monkeypatch):
    """Issue 46: a directory in place of results.parquet, an immutable results.parquet and an
    --root past the file-name limit were tracebacks (exit 1). Variants through the one writer and
    readers: problems.parquet a directory, a rename refused as an immutable file refuses it (EPERM),
    a sweep dir whose name is too long under `status` and under the store's own writes."""
    sweep = _sealed(tmp_path)
    (sweep.path / "problems.parquet").mkdir()
    with pytest.raises(
        ConfigError, match=r"cannot write .*problems.parquet: it is a directory where a file belongs: move it aside"
    ):
        sweep.collect()
    (sweep.path / "problems.parquet").rmdir()
    replace = os.replace

    def immutable(src, dst, *args, **kwargs):
        if str(dst).endswith(store.RESULTS):
            raise PermissionError(1, os.strerror(1), dst)
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", immutable)
    with pytest.raises(
        ConfigError,
        match=r"cannot write .*results.parquet: operation not permitted: it may be immutable \(lsattr; chattr -i\)",
    ):
        sweep.collect()
    monkeypatch.undo()
    assert [p.name for p in sweep.path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    too_long = tmp_path / ("x" * 300)
    _one_line(
        CliRunner().invoke(app, ["status", str(too_long)]), f"cannot read {too_long}: a name in its path is too long"
    )
    with pytest.raises(ConfigError, match="a name in its path is too long for the file system: use a shorter --root"):
        SweepDir(too_long).write_manifest(Manifest())
    with pytest.raises(ConfigError, match=r"cannot read .*manifest\.json: a name in its path is too long"):
        _denied(monkeypatch, sweep.manifest_file, OSError)
        sweep.manifest()


def test_a_sweep_refuses_state_it_could_not_write_before_any_compute(tmp_path, monkeypatch):
    """Issue 46: results.parquet a directory, or a read-only (immutable) run dir, was found only
    when the sweep wrote there, after its compute. Variants: sweep.yaml a directory; a run dir that
    is not writable (os.access says so for root too where it is immutable)."""
    sweep = _sealed(tmp_path)
    sweep.config_file.mkdir()
    with pytest.raises(ConfigError, match=r"cannot write .*sweep.yaml: it is a directory where a file belongs"):
        sweep.check_tree()
    sweep.config_file.rmdir()
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode, **kw: Path(path) != sweep.run("a").dir and access(path, mode, **kw)
    )
    with pytest.raises(ConfigError, match=r"cannot write .*runs/a: permission denied: .*chattr -i"):
        sweep.check_tree()
