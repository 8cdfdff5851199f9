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
    sweep.write_manifest(Manifest(cells={"a": CellState(columns={"n": 2, "B_p": 4}), "b": CellState(columns={"n": 8, "B_p": 4})}))
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
    for write in (lambda f: f.append_metrics({"step": 1}), lambda f: f.set_status(RUNNING), lambda f: f.finish([{"step": 1}]),
                  lambda f: f.keep_metrics(0), lambda f: f.reset_metrics(), lambda f: f.append_problems(1, [])):
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


@pytest.mark.parametrize("umask", [0o027, 0o000])
def test_files_and_dirs_follow_the_umask_and_are_never_world_writable(tmp_path, umask):
    """Once: under umask 000 the sweep dir, runs/ and each run dir were 0777, and results made by
    mkstemp were 0600 whatever the umask (teammates could not read them). Variant: umask 027 gives
    0640 files and 0750 dirs; umask 000 leaves out o+w only."""
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
    made = [tmp_path / "out", sweep.path, sweep.path / "runs", files.dir, sweep.manifest_file, sweep.results_file, files.metrics, files.status_file]
    modes = {p.name: p.stat().st_mode & 0o777 for p in made}
    want = {True: 0o777 & ~umask & ~0o002, False: 0o666 & ~umask & ~0o002}
    assert modes == {p.name: want[p.is_dir()] for p in made}
