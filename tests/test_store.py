from isoflop_cli.store import FINISHED, RunFiles, SweepDir, atomic_write, read_json


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
    sweep.write_manifest({"cells": {
        "a": {"columns": {"n": 2, "B_p": 4}},
        "b": {"columns": {"n": 8, "B_p": 4}},
    }})
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
