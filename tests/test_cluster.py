"""A sweep through a multi-node Ray cluster on loopback, as through any remote cluster's
`cluster.address`: `scripts/local_cluster.py` brings up a head (no CPUs) and two worker nodes as
separate `ray start` processes with token auth; one worker declares two GPUs. A worker lost while a
run trains on it costs that run a retry from its checkpoint, not the run."""

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from test_head import tokenless_answers

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "local_cluster.py"
ENV = {**os.environ, "RAY_AUTH_MODE": "token"}  # the user's environment says the cluster uses token auth
CELL = ["grid.n=[2]", "grid.eval_points=3", "eval.problems=16", "eval.samples=4", "checkpoint.every=8"]
# 512 rollouts: 32 or 64 steps a run, checkpoints every 8, each kill lands at least 16 steps short of the end;
# that it landed mid-run is asserted (a retry, a resume from the checkpoint).
BUDGET = "grid.budgets=[512]"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


WORKERS = ["--worker", "1:2", "--worker", "1:0"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster's state (cluster.json, and its "dir"); a test that restarts it updates it in place."""
    path = tmp_path_factory.mktemp("cluster")
    state = {"dir": path}
    try:
        state.update(start_cluster(path))
        procs = _tree([state["head_pid"], *(w["pid"] for w in state["workers"])])
        listening = {c.laddr.ip for p in procs for c in _connections(p) if c.status == psutil.CONN_LISTEN}
        assert listening and all(_loopback(ip) for ip in listening), (
            f"a cluster process listens beyond loopback: {listening}"
        )
        assert not tokenless_answers(procs), tokenless_answers(procs)  # the workers' agents export no metrics either
        yield state
    finally:
        started = [state["head_pid"], *(w["pid"] for w in state["workers"])] if "head_pid" in state else []
        subprocess.run([sys.executable, str(SCRIPT), "stop", str(path)], timeout=120)
        left = [pid for pid in started if group_alive(pid)]
        assert not left, f"cluster processes left after stop: {left}"


def start_cluster(path: Path) -> dict:
    started = subprocess.run(
        [sys.executable, str(SCRIPT), "start", str(path), *WORKERS], capture_output=True, text=True, timeout=300
    )
    assert started.returncode == 0, started.stdout + started.stderr
    return json.loads((path / "cluster.json").read_text())


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def _tree(pids: list[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return procs


def _connections(p: psutil.Process) -> list:
    try:
        return p.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def sweep(out: Path, address: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "isoflop_cli", "sweep", "--root", str(out), f"cluster.address={address}", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def run_on(worker_pid: int) -> str | None:
    """The run id of the `isoflop run` process that worker node started, if one trains there now."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "isoflop_cli" in cmd and "run" in cmd:
            try:
                if worker_pid in {a.pid for a in p.parents()}:
                    return Path(cmd[cmd.index("--run-dir") + 1]).name
            except psutil.NoSuchProcess:
                pass
    return None


def running_run(sweep_dir: Path) -> int | None:
    """The PID of a run of the sweep past its first checkpoint and still training, if there is one."""
    for status in (sweep_dir / "runs").glob("*/status.json"):
        state = json.loads(status.read_text())
        if state["state"] == "running" and (status.parent / "checkpoint").exists() and psutil.pid_exists(state["pid"]):
            return state["pid"]
    return None


def test_a_worker_lost_mid_run_and_a_killed_cli_cost_a_retry_from_the_checkpoint(cluster, tmp_path):
    """Two cells, one per worker; the GPU-less worker is SIGKILLed (raylet and agents; the run on
    it ends with them) once its run has a checkpoint, and the CLI with it. Rerun, the sweep
    reattaches to the run still going on the other worker and submits the lost one again, which
    resumes from its checkpoint; past its next checkpoint that run's process is SIGKILLed, and the
    sweep submits it a third time on its own. Every cell finishes, no (run_id, step) row is lost or
    repeated, and the twice-resumed run's metrics equal an uninterrupted run's."""
    lost = cluster["workers"][1]["pid"]
    overrides = [*CELL, "grid.B_p=[4,8]", BUDGET]
    proc = sweep(tmp_path, cluster["address"], *overrides)
    sweep_dir = tmp_path / "default"
    deadline = time.monotonic() + 300
    victim = None
    while victim is None or not (sweep_dir / "runs" / victim / "checkpoint").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        victim = run_on(lost)
        time.sleep(0.5)
    os.killpg(lost, signal.SIGKILL)
    proc.kill()
    proc.communicate()
    status = sweep_dir / "runs" / victim / "status.json"
    first = json.loads(status.read_text())["pid"]
    rerun = sweep(tmp_path, cluster["address"], *overrides)
    while not (
        (now := json.loads(status.read_text()))["state"] == "running" and now["pid"] != first and now["step"] > 16
    ):
        assert rerun.poll() is None and time.monotonic() < deadline + 300, rerun.communicate()
        time.sleep(0.2)
    os.kill(now["pid"], signal.SIGKILL)  # the resumed run's process, past its checkpoint at step 16
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out[-3000:] + err
    cells = json.loads((sweep_dir / "manifest.json").read_text())["cells"]
    assert all(c["state"] == "finished" for c in cells.values())
    assert cells[victim]["attempts"] == 3 and "exit code -9" in cells[victim]["failures"][-1]["reason"], cells[victim]
    other = next(rid for rid in cells if rid != victim)
    assert cells[other]["attempts"] == 1, (
        "the run on the live worker was reattached (or had finished), never submitted again"
    )
    assert "resumed from the checkpoint at step" in (sweep_dir / "runs" / victim / "job.log").read_text()
    shown = subprocess.run(
        [sys.executable, "-m", "isoflop_cli", "status", str(sweep_dir)], capture_output=True, text=True
    ).stdout
    assert f"after {len(cells[victim]['failures'])} failed attempt(s)" in " ".join(shown.split()), shown
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert not df.duplicated(["run_id", "step"]).any()
    assert len(df) == sum(len(c["eval_steps"]) for c in cells.values())

    b_p = int(df.loc[df.run_id == victim, "B_p"].iloc[0])
    alone = tmp_path / "alone"
    # With the one thread a job of cluster.cpus_per_run=1 has: the same float reductions.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "isoflop_cli",
            "run",
            *CELL[1:],
            "n=2",
            f"B_p={b_p}",
            BUDGET,
            "--run-dir",
            str(alone),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    timing = ("wall_s", "reward_cpu_s")
    expected = [
        {k: v for k, v in r.items() if k not in timing and not k.startswith("time_")}
        for r in map(json.loads, (alone / "metrics.jsonl").read_text().splitlines())
    ]
    got = [
        {k: v for k, v in r.items() if k not in timing and not k.startswith("time_")}
        for r in map(json.loads, (sweep_dir / "runs" / victim / "metrics.jsonl").read_text().splitlines())
    ]
    assert got == expected


def test_a_run_asking_for_a_gpu_lands_on_the_gpu_worker_and_a_head_restarted_mid_run_costs_a_resume(cluster, tmp_path):
    """The run asks for a GPU (cluster.gpus_per_run=1): Ray places it, each attempt, on the worker
    that declares GPUs and gives it one (CUDA_VISIBLE_DEVICES); with no CUDA here it trains on the
    CPU. (Once a test of its own: it shares this sweep, on the same cluster, for one sweep less.)
    The head is SIGKILLed while the run trains on that worker, and the workers and the run with it:
    without GCS fault tolerance a worker and its jobs exit once its head is gone (within a minute;
    here at once), so the head comes back as a new cluster (restarted by the script, at a new
    address). The sweep says the head is lost in one line (exit 1) and marks the run stopped; rerun
    against the restarted cluster, the run resumes from its checkpoint and finishes, every eval
    point once."""
    overrides = [*CELL, "grid.B_p=[8]", BUDGET, "cluster.gpus_per_run=1"]
    proc = sweep(tmp_path, cluster["address"], *overrides)
    sweep_dir = tmp_path / "default"
    deadline = time.monotonic() + 300
    while not (run := running_run(sweep_dir)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    for pid in [cluster["head_pid"], *(w["pid"] for w in cluster["workers"])]:
        if group_alive(pid):  # a worker an earlier test lost is gone already
            os.killpg(pid, signal.SIGKILL)
    os.kill(run, signal.SIGKILL)  # the job runs in a process group of its own
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out[-3000:] + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: lost the Ray head at {cluster['address']}"), err
    (run_id,) = json.loads((sweep_dir / "manifest.json").read_text())["cells"]
    assert json.loads((sweep_dir / "manifest.json").read_text())["cells"][run_id]["state"] == "stopped"

    subprocess.run([sys.executable, str(SCRIPT), "stop", str(cluster["dir"])], timeout=120, check=True)
    cluster.update(start_cluster(cluster["dir"]))
    rerun = sweep(tmp_path, cluster["address"], *overrides)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, out[-3000:] + err
    cell = json.loads((sweep_dir / "manifest.json").read_text())["cells"][run_id]
    # Two: the lost head's and the rerun's. (The lost-worker test above ran the same cell on this
    # cluster: a sweep dir tags its jobs, so this sweep never takes that job for its own.)
    assert cell["state"] == "finished" and cell["attempts"] == 2, cell
    assert "resumed from the checkpoint at step" in (sweep_dir / "runs" / run_id / "job.log").read_text()
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert not df.duplicated(["run_id", "step"]).any() and len(df) == len(cell["eval_steps"])
    log = (sweep_dir / "runs" / run_id / "job.log").read_text()
    devices = [line for line in log.splitlines() if line.startswith("device ")]
    assert devices, log[-3000:]
    for line in devices:
        assert line.startswith("device cpu on ") and line.split("CUDA_VISIBLE_DEVICES=")[1] in ("0", "1"), line
