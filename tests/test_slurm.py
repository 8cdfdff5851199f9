"""cluster.launcher=slurm through submitit: against a real single-node SLURM on this machine
(`scripts/local_slurm.py`: munged, MariaDB, slurmdbd, slurmctld and slurmd on 127.0.0.1; skipped,
saying why, where Debian's packages or root are missing), and through submitit's own local
executor (the same submitit calls as on SLURM, with real processes)."""

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from conftest import may_thaw, run_isoflop
from omegaconf import OmegaConf
from test_head import wait_for
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.config.schema import ClusterConfig

pytest.importorskip("submitit")


def client(tmp_path):
    from isoflop_cli.slurm import SlurmClient

    cluster = OmegaConf.structured(ClusterConfig)
    cluster.slurm.executor = "local"
    return SlurmClient(cluster, tmp_path)


def wait(c, sid, timeout=60):
    deadline = time.time() + timeout
    while (state := c.get_job_status(sid).value) in ("PENDING", "RUNNING") and time.time() < deadline:
        time.sleep(0.2)
    return state


def test_a_jobs_state_log_exit_code_and_cancel_read_as_the_dispatcher_reads_ray_jobs(tmp_path):
    c = client(tmp_path)
    ok = c.submit_job("echo hello from $GREETING", "job-ok", runtime_env={"env_vars": {"GREETING": "the node"}})
    user_error = c.submit_job("echo bad config >&2; exit 2", "job-exit-2")
    long = c.submit_job("exec sleep 600", "job-long")
    assert wait(c, ok) == "SUCCEEDED" and "hello from the node" in c.get_job_logs(ok)
    assert c.get_job_info(ok).driver_exit_code == 0
    assert wait(c, user_error) == "FAILED" and "bad config" in c.get_job_logs(user_error)
    assert c.get_job_info(user_error).driver_exit_code == 2  # the dispatcher does not retry exit 2
    assert c.get_job_status(long).value == "RUNNING"
    c.stop_job(
        long
    )  # a stop ends the job's command, also where this suite runs with SIGINT ignored (a background shell)
    assert wait(c, long, timeout=120) == "STOPPED"
    assert json.loads((tmp_path / "job-ok.json").read_text())["executor"] == "local"


def test_without_sbatch_slurm_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch there
    result = CliRunner().invoke(
        app,
        ["sweep", "--root", str(tmp_path), "cluster.launcher=slurm", "grid.n=[2]", "grid.B_p=[2]", "grid.budgets=[16]"],
    )
    assert result.exit_code == 2 and "cluster.launcher=slurm needs SLURM's sbatch on PATH" in result.output


@pytest.mark.e2e
def test_a_sweep_through_submitit_jobs(tmp_path):
    """Two cells as submitit jobs: both finish, their logs are in their run dirs, status reads them."""
    args = [
        "--root",
        str(tmp_path),
        "grid.n=[2,4]",
        "grid.B_p=[2]",
        "grid.budgets=[16]",
        "grid.eval_points=1",
        "eval.problems=8",
        "eval.samples=4",
        "cluster.launcher=slurm",
        "cluster.slurm.executor=local",
    ]
    result = run_isoflop("sweep", *args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = tmp_path / "default"
    cells = json.loads((sweep / "manifest.json").read_text())["cells"]
    assert len(cells) == 2 and all(c["state"] == "finished" and c["attempts"] == 1 for c in cells.values())
    for run_id in cells:
        assert "submitit INFO" in (sweep / "runs" / run_id / "job.log").read_text()
    df = pd.read_parquet(sweep / "results.parquet")
    assert len(df) == 4 and not df.duplicated(["run_id", "step"]).any()


SLURM = Path(__file__).resolve().parent.parent / "scripts" / "local_slurm.py"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real SLURM, started for these tests and stopped after them (every daemon by its PID)."""
    path = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(
        [sys.executable, str(SLURM), "start", str(path)], capture_output=True, text=True, timeout=180
    )
    if "not installed" in started.stderr:
        pytest.skip(started.stderr.strip())
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        pids = json.loads((path / "slurm.json").read_text())["pids"]
        listening = {
            c.laddr.ip
            for pid in pids
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}, f"a SLURM daemon listens beyond loopback: {listening}"
        yield {**os.environ, "SLURM_CONF": started.stdout.strip()}
    finally:
        subprocess.run([sys.executable, str(SLURM), "stop", str(path)], timeout=120)
        pids = json.loads((path / "slurm.json").read_text())["pids"]
        assert not [
            pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]


@pytest.mark.e2e
def test_a_real_slurm_runs_the_preflight_and_a_sweep_that_survives_a_killed_run_and_a_preemption(slurm, tmp_path):
    """First the preflight (`check_the_preflight`, in a root of its own: once a test of its own, it
    shares this SLURM, which then starts once, not on each worker that drew one of two tests). Then
    two cells as one array job on a real SLURM, each hit once it has a checkpoint. One run's process
    is SIGKILLed: sacct reports the job's end and the sweep submits it again. The other's job is
    requeued by SLURM (a preemption): the sweep waits for SLURM to run it again, or (where it reads
    the requeue's end first) submits it once more. Both runs resume from their checkpoints, and
    every eval point is there once. The requeued run is frozen (SIGSTOP) from before the requeue
    until SLURM's signal has reached it: the requeue lands mid-run however short the run."""
    check_the_preflight(slurm, tmp_path / "preflight")
    tmp_path = tmp_path / "sweep"
    args = [
        "--root",
        str(tmp_path),
        "cluster=slurm",
        "cluster.cpus_per_run=1",
        "cluster.gpus_per_run=0",
        f"cluster.python={sys.executable}",
        # 1,024 rollouts: 512 and 256 steps, the kill lands within a poll of the first checkpoint (step 16); the
        # requeue on a frozen run (at 1,024, unfrozen, a run could end between the checkpoint and the requeue).
        "cluster.poll_s=1",
        "grid.n=[2]",
        "grid.B_p=[2,4]",
        "grid.budgets=[1024]",
        "grid.eval_points=3",
        "eval.problems=16",
        "eval.samples=4",
        "checkpoint.every=16",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "isoflop_cli", "sweep", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=slurm,
    )
    sweep = tmp_path / "default"
    deadline = time.monotonic() + 300
    killed = requeued = None
    while killed is None or requeued is None:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "isoflop_cli" in cmd and "run" in cmd and str(sweep) in " ".join(cmd):
                run_id = Path(cmd[cmd.index("--run-dir") + 1]).name
                if not (sweep / "runs" / run_id / "checkpoint").exists() or run_id in (killed, requeued):
                    continue
                if killed is None:
                    killed = run_id
                    p.kill()
                else:
                    requeued = run_id
                    sid = json.loads((sweep / "manifest.json").read_text())["cells"][run_id]["submission_id"]
                    job = json.loads((sweep / "slurm" / f"{sid}.json").read_text())["job_id"]
                    p.suspend()  # held mid-run until SLURM's requeue has signalled it
                    try:
                        subprocess.run(["scontrol", "requeue", job], check=True, env=slurm)
                        wait_for(lambda p=p: may_thaw(p), 120, "SLURM's requeue signal")
                    finally:
                        with contextlib.suppress(psutil.NoSuchProcess):
                            p.resume()
                    while (
                        subprocess.run(
                            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, env=slurm
                        ).stdout.strip()
                        != "PENDING"
                    ):
                        time.sleep(0.2)
                    subprocess.run(
                        ["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, env=slurm
                    )  # SLURM holds a requeued job ~2 min
        time.sleep(0.3)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:] + err
    cells = json.loads((sweep / "manifest.json").read_text())["cells"]
    assert all(c["state"] == "finished" for c in cells.values())
    assert cells[killed]["attempts"] == 2 and "exited -9" in cells[killed]["failures"][0]["reason"], cells[killed]
    # The requeue's end (SIGTERM: exit -15) can reach the sweep before SLURM shows the job pending
    # again (3 of 5 runs here, array task or not in squeue): the sweep then resubmits the run once,
    # and the lease makes the newer attempt the run's. Either way the run resumes from its
    # checkpoint, and no eval point is lost or doubled (below). Not yet met: waiting for SLURM alone.
    waited = "failures" not in cells[requeued]
    assert cells[requeued]["attempts"] == (1 if waited else 2), cells[requeued]
    assert waited or "exited -15" in cells[requeued]["failures"][0]["reason"], cells[requeued]["failures"]
    for run_id in (killed, requeued):
        assert "resumed from the checkpoint at step" in (sweep / "runs" / run_id / "job.log").read_text()
    # One SLURM job per attempt, kept for reattaching: the first two as one array job, the retry alone;
    # before them, the preflight's probe.
    jobs = {f.stem: json.loads(f.read_text())["job_id"] for f in (sweep / "slurm").glob("*.json")}
    assert sum("preflight" in name for name in jobs) == 1
    jobs = {name: job for name, job in jobs.items() if "preflight" not in name}
    first = [job for name, job in jobs.items() if name.startswith(tuple(f"isoflop-{rid}-1-" for rid in cells))]
    assert (
        len(jobs) == 3 + (not waited)
        and len({j.split("_")[0] for j in first}) == 1
        and sorted(j.split("_")[1] for j in first) == ["0", "1"]
    ), jobs
    accounted = subprocess.run(
        ["sacct", "-n", "-X", "-o", "JobID%20,State"], capture_output=True, text=True, env=slurm
    ).stdout.split()
    assert set(jobs.values()) <= set(accounted), accounted
    df = pd.read_parquet(sweep / "results.parquet")
    assert not df.duplicated(["run_id", "step"]).any() and len(df) == sum(len(c["eval_steps"]) for c in cells.values())


def check_the_preflight(slurm, tmp_path):
    """`isoflop doctor` sends its probe as a SLURM job and checks the node SLURM gives it; a run's
    request SLURM cannot place (more CPUs than any node, GPUs it has none of) stops the sweep in its
    preflight, one line per problem, exit 2, before any run's job is submitted."""

    def isoflop(command, *overrides):
        return run_isoflop(
            command,
            "--root",
            str(tmp_path),
            "cluster=slurm",
            f"cluster.python={sys.executable}",
            "cluster.cpus_per_run=1",
            "cluster.gpus_per_run=0",
            *overrides,
            timeout=300,
            env=slurm,
        )

    ok = isoflop("doctor")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "sweep dir shared, run files readable" in ok.stdout and "ready: a run asks for 1 CPU and 0 GPU" in ok.stdout
    bad = isoflop(
        "sweep", "grid.n=[2]", "grid.B_p=[2]", "grid.budgets=[16]", "cluster.cpus_per_run=64", "cluster.gpus_per_run=2"
    )
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert (
        "preflight found 1 problem(s) before any run started" in bad.stderr
        and "SLURM would never start a run's job (64 CPUs, 2 GPUs)" in bad.stderr
    )
    sweep = tmp_path / "default"
    assert all(c["state"] == "pending" for c in json.loads((sweep / "manifest.json").read_text())["cells"].values())
    assert all("preflight" in f.name for f in (sweep / "slurm").glob("*.json"))  # the probes only
