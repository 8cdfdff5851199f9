"""cluster.launcher=slurm through submitit. No SLURM daemons run on this machine (no sbatch), so
the jobs go through submitit's own local executor: the same submitit calls (submit, state, logs,
cancel, result) as on SLURM, with real processes, and a real sweep through them."""

import json
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.config import ClusterConfig

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
    long = c.submit_job("sleep 60", "job-long")
    assert wait(c, ok) == "SUCCEEDED" and "hello from the node" in c.get_job_logs(ok)
    assert c.get_job_info(ok).driver_exit_code == 0
    assert wait(c, user_error) == "FAILED" and "bad config" in c.get_job_logs(user_error)
    assert c.get_job_info(user_error).driver_exit_code == 2  # the dispatcher does not retry exit 2
    assert c.get_job_status(long).value == "RUNNING"
    c.stop_job(long)
    assert wait(c, long) in ("STOPPED", "FAILED")
    assert json.loads((tmp_path / "job-ok.json").read_text())["executor"] == "local"


def test_without_sbatch_slurm_is_one_error(tmp_path):
    result = CliRunner().invoke(app, ["sweep", "--out", str(tmp_path), "cluster.launcher=slurm", "grid.n=[2]", "grid.B_p=[2]", "grid.budgets=[16]"])
    assert result.exit_code == 2 and "cluster.launcher=slurm needs SLURM's sbatch on PATH" in result.output


@pytest.mark.e2e
def test_a_sweep_through_submitit_jobs(tmp_path):
    """Two cells as submitit jobs: both finish, their logs are in their run dirs, status reads them."""
    args = ["--out", str(tmp_path), "grid.n=[2,4]", "grid.B_p=[2]", "grid.budgets=[16]", "grid.eval_points=1", "eval.problems=8",
            "eval.samples=4", "cluster.launcher=slurm", "cluster.slurm.executor=local"]
    result = subprocess.run([sys.executable, "-m", "isoflop_cli", "sweep", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep = tmp_path / "default"
    cells = json.loads((sweep / "manifest.json").read_text())["cells"]
    assert len(cells) == 2 and all(c["state"] == "finished" and c["attempts"] == 1 for c in cells.values())
    for run_id in cells:
        assert "submitit INFO" in (sweep / "runs" / run_id / "job.log").read_text()
    import pandas as pd

    df = pd.read_parquet(sweep / "results.parquet")
    assert len(df) == 4 and not df.duplicated(["run_id", "step"]).any()
