"""Files read back are checked, not trusted by their shape: a run's status and lease, the sweep
dir's lock, the local head's record and temp dir, a checkpoint, and the data files a run reads.
Each test is the case that once lost or rewrote work, and one variant."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from isoflop_cli import report, store
from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import FINISHED, KILLED, RUNNING, CellState, RunFiles, SweepDir, write_json

sys.path.insert(0, str(Path(__file__).parent))
from test_guarantees import ROWS, one_error_line, sealed_sweep

runner = CliRunner()


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"state": "finished", "rows": []}', "sealed rows [] are not eval points"),  # once: emptied the intact metrics
        ("[1, 2]", "not a JSON object"),  # once: a traceback in status and sweep
        ('{"state": "finished", "rows": [{"step": 0}]}', "contradicts"),  # sealed rows the metrics file disagrees with
        ('{"version": 9, "state": "finished"}', "newer isoflop"),
    ],
)
def test_a_status_file_that_does_not_fit_is_refused_and_nothing_changes(tmp_path, text, why):
    sweep = sealed_sweep(tmp_path)
    files = sweep.run("a")
    files.status_file.write_text(text)
    before = snapshot(tmp_path)
    one_error_line(runner.invoke(app, ["status", str(tmp_path)]), "status.json")
    with pytest.raises(ConfigError, match=re.escape(why)):
        sweep.collect()
    assert snapshot(tmp_path) == before


def test_a_status_file_of_an_older_isoflop_still_reads(tmp_path):
    """No version, no pid start time: read as it was written."""
    sweep = sealed_sweep(tmp_path)
    files = sweep.run("a")
    status = json.loads(files.status_file.read_text())
    assert status.pop("version") == store.STATUS_VERSION
    files.status_file.write_text(json.dumps(status))
    assert files.finished_rows() == ROWS and files.status().M == 4


def test_a_run_whose_pid_another_process_took_is_killed_not_running(tmp_path):
    sweep = SweepDir(tmp_path)
    cell = CellState(columns={"n": 2, "B_p": 2}, M=4)
    files = sweep.run("r")
    files.dir.mkdir(parents=True)
    files.set_status(RUNNING, step=1, pid=os.getpid())  # a live pid, its start time recorded as it is
    assert report.run_state(sweep, "r", cell)[0] == RUNNING
    status = json.loads(files.status_file.read_text())
    write_json(
        files.status_file, {**status, "pid_started": status["pid_started"] + 1}
    )  # the run's process started at another time
    assert files.process_gone() and report.run_state(sweep, "r", cell)[0] == KILLED


def test_a_lease_that_does_not_fit_stops_the_attempt_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(store.time, "sleep", lambda s: None)
    files = RunFiles(tmp_path / "run").take_lease()
    files.lease.write_text("[1, 2]")  # once: an AttributeError traceback at the run's next write
    with pytest.raises(store.LeaseLost, match=r"lease\.json is not a readable lease"):
        files.append_metrics({"step": 1})
    write_json(files.lease, {"holder": files.holder, "since": 1.0})  # a lease of an older isoflop (no version)
    files.append_metrics({"step": 1})
    assert files.read_metrics() == [{"step": 1}]


@pytest.mark.parametrize("sealed", [True, False])
def test_isoflop_run_on_a_finished_run_dir_leaves_it_as_it_is(tmp_path, sealed):
    """Once: `isoflop run --out` a finished run's dir took the lease, marked it running and emptied
    its metrics. Variant: a run finished by an older isoflop (no sealed copy)."""
    files = sealed_sweep(tmp_path).run("a")
    if not sealed:
        files.set_status(FINISHED, step=4, M=4)
    before = snapshot(files.dir)
    result = runner.invoke(app, ["run", "n=4", "B_p=2", "--run-dir", str(files.dir)])
    assert result.exit_code == 0 and "holds a finished run: nothing to do" in result.output, result.output
    assert snapshot(files.dir) == before and not files.lease.exists()


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_and_nothing_changes(tmp_path, kind):
    """Once: a `.lock` link had the file it points to emptied; a `.lock` directory was a traceback."""
    from test_head import TINY

    sweep_dir, target = tmp_path / "default", tmp_path / "precious.txt"
    sweep_dir.mkdir()
    target.write_text("precious\n")
    if kind == "symlink":
        (sweep_dir / ".lock").symlink_to(target)
    else:
        (sweep_dir / ".lock").mkdir()
    result = runner.invoke(app, ["sweep", "--root", str(tmp_path), *TINY, "grid.budgets=[16]"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]  # after the plan on stdout
    assert result.exit_code == 2 and errors == [result.output.strip().splitlines()[-1]], result.output
    assert (
        ".lock is a symbolic link where"
        if kind == "symlink"
        else ".lock is a directory where the sweep dir's lock file belongs"
    ) in errors[0]
    assert target.read_text() == "precious\n" and sorted(p.name for p in sweep_dir.iterdir()) == [".lock"]


def test_a_copied_head_record_leaves_the_original_heads_temp_dir_and_process_alone(tmp_path):
    """Once: `cp -r` of a sweep dir while its head ran, and a sweep on the copy removed the running
    head's temp dir. Variant: the dir's own head, dead, has its temp dir removed."""
    import tempfile

    from isoflop_cli import head

    original, copy = tmp_path / "a", tmp_path / "b"
    original.mkdir()
    temp_dir = tempfile.mkdtemp(prefix="isoflop-ray-", dir=tmp_path)
    info = original.absolute() / head.HEAD_FILE
    write_json(Path(temp_dir) / head.TEMP_MARKER, {"info": str(info), "nonce": "n1"})
    live = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"]
    )  # stands for the original's head (not ours to stop)
    try:
        write_json(
            info, {"address": "http://127.0.0.1:1", "pid": live.pid, "temp_dir": temp_dir, "nonce": "n1", "version": 1}
        )
        shutil.copytree(original, copy)
        assert head._attach(copy.absolute() / head.HEAD_FILE) is None
        assert Path(temp_dir, head.TEMP_MARKER).exists() and live.poll() is None
    finally:
        live.kill()
        live.wait()
    assert head._attach(info) is None and not Path(temp_dir).exists()  # its own head is gone: its temp dir with it


def test_a_head_record_that_does_not_fit_is_refused_naming_the_file(tmp_path):
    from isoflop_cli import head

    info = tmp_path / head.HEAD_FILE
    for text in ("[1, 2]", '{"pid": "12", "address": "http://127.0.0.1:1"}'):
        info.write_text(text)
        with pytest.raises(ConfigError, match=r"ray-head\.json is not a readable Ray head record"):
            head._attach(info)
        assert info.read_text() == text


def write_sums(path: Path, shift: int) -> None:
    """300 problems 'a+b=' (the embedded model's alphabet); `shift` changes every answer, not the row count."""
    import pandas as pd

    pd.DataFrame(
        [
            {
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"ground_truth": str(a + b + shift)[::-1]},
            }
            for a in range(10)
            for b in range(30)
        ]
    ).to_parquet(path)


DATASET = [
    "task=dataset",
    "task.max_new_tokens=6",
    "task.max_prompt_tokens=8",
    "eval.problems=4",
    "grid.n=[2]",
    "grid.B_p=[2]",
    "grid.budgets=[16]",
]


def test_a_data_file_changed_in_place_is_a_new_run_and_a_new_calibration(tmp_path):
    """Once: a file rewritten with other content (same rows) kept its run ids, so a resumed run went
    on with the new data, and `calibrate` kept the old pass rates and cut the new file's rows by them.
    Variant: the same bytes rewritten (a new mtime) keep every id."""
    from isoflop_cli import calibrate, config, grid
    from isoflop_cli.config import identity

    data, held_out = tmp_path / "sums.parquet", tmp_path / "held_out.parquet"
    write_sums(data, 0)
    write_sums(held_out, 0)
    overrides = [*DATASET, f"task.train={data}", f"+eval.sets={{other:{held_out}}}", "calibrate.shard=100"]

    def ids():
        cfg = config.load(None, overrides)
        return [c.run_id for c in grid.expand(cfg)], identity.trajectory(cfg, "rollouts", 1e-3)

    dest = SweepDir(tmp_path / "cal")
    before = ids()
    slices = calibrate.prepare(config.load(None, overrides), dest).cells
    first = next(iter(slices))
    dest.run(first).finish([{"step": 0, "problems": 100}])
    write_sums(data, 0)  # the same bytes again
    assert ids() == before and list(calibrate.prepare(config.load(None, overrides), dest).cells) == list(slices)
    assert dest.run(first).finished()
    for path in (data, held_out):
        write_sums(path, 1)  # the same rows, other answers
        after = ids()
        assert after[0] != before[0] and after[1] != before[1]
        before = after
    now = calibrate.prepare(config.load(None, overrides), dest).cells
    assert [c.rows for c in now.values()] == [c.rows for c in slices.values()] and not set(now) & set(slices)
    assert calibrate.finished_slices(dest) == 0


def test_a_data_file_changed_with_its_size_and_mtime_put_back_is_still_a_new_run(tmp_path):
    """A copy tool that keeps times, `touch -r`, a file regenerated at the same length: one answer
    changed, the size the same and the mtime set back. Once the digest cache (path, size, mtime)
    read it as the old file, and the old run would have resumed on other data."""
    import json
    import os

    from isoflop_cli import config, grid
    from isoflop_cli.config import identity

    data = tmp_path / "sums.jsonl"

    def write(answer: str) -> None:
        rows = [
            {"prompt": f"{a}+{b}=", "reward_model": {"ground_truth": str(a + b)[::-1]}}
            for a in range(10)
            for b in range(10)
        ]
        rows[0]["reward_model"]["ground_truth"] = answer
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def ids() -> list[str]:
        return [c.run_id for c in grid.expand(config.load(None, [*DATASET, f"task.train={data}"]))]

    write("0")
    before, digest, stat = ids(), identity.data_digest(str(data)), data.stat()
    write("9")  # one answer, one byte: the same length
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (data.stat().st_size, data.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert identity.data_digest(str(data)) != digest and ids() != before
    assert json.loads((identity.cache_dir() / identity.DIGESTS).read_text())[str(data.resolve())]["sha1"] == (
        identity.data_digest(str(data))
    )


@pytest.mark.parametrize("copy_before", [False, True])
def test_a_checkpoint_missing_a_shard_is_set_aside_and_the_run_starts_over(tmp_path, capsys, copy_before):
    """Once: every attempt failed in dcp.load with a torch traceback, never starting afresh. Variant:
    the whole copy before it (`.old`) is loaded instead."""
    torch = pytest.importorskip("torch")
    from isoflop_cli.recipe import resume
    from isoflop_cli.recipe.distributed import Group

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    files = RunFiles(tmp_path / "run")
    resume.save(files.checkpoint, Group(), "run", model, optimizer, scheduler, {"step": 1})
    first = {k: v.clone() for k, v in model.state_dict().items()}
    shutil.copytree(files.checkpoint, tmp_path / "first")
    with torch.no_grad():
        model.weight.add_(1.0)
    resume.save(files.checkpoint, Group(), "run", model, optimizer, scheduler, {"step": 2})
    if copy_before:
        shutil.copytree(tmp_path / "first", files.checkpoint.with_name("checkpoint.old"))
    shard = next(files.checkpoint.glob("*.distcp"))
    shard.unlink()
    assert files.has_checkpoint() == copy_before
    got = resume.load(files.checkpoint, "run", model, optimizer, scheduler, files=files)
    assert got == ({"step": 1} if copy_before else None)
    line = capsys.readouterr().out.strip()
    assert (
        line
        == f"checkpoint {files.checkpoint} is incomplete ({shard.name} is gone): set aside as checkpoint.incomplete-0"
    )
    assert (
        not files.checkpoint.exists() and (files.dir / "checkpoint.incomplete-0" / resume.STATE).exists()
    )  # renamed, not deleted
    if copy_before:
        assert all(torch.equal(model.state_dict()[k], v) for k, v in first.items())
