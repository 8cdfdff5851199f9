"""`cluster.launcher=slurm`: each run a SLURM job, submitted with submitit.

`SlurmClient` answers the calls the dispatcher makes of Ray's `JobSubmissionClient` (submit,
status, logs, stop, info), so the sweep's dispatch, resume, retries, status and run dir layout are
the same on SLURM as on Ray. A job runs the run's command (the entrypoint the dispatcher builds)
in a shell on its node; its exit code is the job's result, so a user error (exit 2) is not
retried. SLURM requeues a preempted job (`cluster.slurm.requeue`) and the run resumes from its
checkpoint, as after any other interruption.

Each submission's SLURM job id is kept in `<sweep>/slurm/<submission id>.json`, so a new CLI
reattaches to jobs a killed one left (through `sacct`). `cluster.slurm.executor=local` runs the
same submitit calls as local processes (submitit's own local executor): for machines without
SLURM and for tests; local jobs do not outlive the CLI's knowledge of them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# SLURM (sacct) and submitit-local states, as the dispatcher's Ray job states.
RUNNING_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED", "STAGE_OUT"}
PENDING_STATES = {"PENDING", "UNKNOWN", "READY"}
STOPPED_STATES = {"CANCELLED", "INTERRUPTED"}


@dataclass(frozen=True)
class Status:
    value: str  # PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED: as Ray's JobStatus values


@dataclass(frozen=True)
class Info:
    driver_exit_code: int | None
    message: str | None


def run_command(entrypoint: str, env: dict[str, str]) -> int:
    """The job's body on its node: the run's command in a shell, its output in the job's log."""
    return subprocess.run(["bash", "-c", entrypoint], env={**os.environ, **env}, check=False).returncode


class SlurmClient:
    def __init__(self, cluster, folder: Path):
        self.cluster, self.folder = cluster, folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.jobs: dict = {}  # submission id -> submitit job

    def submit_job(self, entrypoint: str, submission_id: str, entrypoint_num_cpus: float = 1, entrypoint_num_gpus: float = 0,
                   runtime_env: dict | None = None) -> str:
        import submitit

        s = self.cluster.slurm
        executor = submitit.AutoExecutor(folder=self.folder / submission_id, cluster=None if s.executor == "slurm" else "local")
        params = {"timeout_min": s.time_min, "cpus_per_task": max(1, int(entrypoint_num_cpus)), "name": submission_id}
        if entrypoint_num_gpus:
            params["gpus_per_node"] = int(entrypoint_num_gpus)
        if s.executor == "slurm":
            params["slurm_additional_parameters"] = {"requeue": True} if s.requeue else {}
            if s.partition:
                params["slurm_partition"] = s.partition
        executor.update_parameters(**params)
        job = executor.submit(run_command, entrypoint, (runtime_env or {}).get("env_vars", {}))
        self.jobs[submission_id] = job
        (self.folder / f"{submission_id}.json").write_text(json.dumps({"job_id": job.job_id, "executor": s.executor}))
        return submission_id

    def get_job_status(self, submission_id: str) -> Status:
        job = self._job(submission_id)
        state = job.state.upper().split()[0] if job.state else "UNKNOWN"
        if state in RUNNING_STATES:
            return Status("RUNNING")
        if state in PENDING_STATES and (not job.paths.result_pickle.exists() or (state == "PENDING" and self.cluster.slurm.executor == "slurm")):
            return Status("PENDING")  # SLURM's PENDING stands: a requeued job waits to run again, whatever its first run left
        if state in STOPPED_STATES:
            return Status("STOPPED")
        code = self._exit_code(job)
        return Status("SUCCEEDED" if code == 0 else "FAILED")

    def get_job_logs(self, submission_id: str) -> str:
        job = self._job(submission_id)
        return (job.stdout() or "") + (job.stderr() or "")

    def stop_job(self, submission_id: str) -> bool:
        self._job(submission_id).cancel(check=False)
        return True

    def get_job_info(self, submission_id: str) -> Info:
        job = self._job(submission_id)
        code = self._exit_code(job)
        return Info(code, None if code in (0, None) else f"the run's command exited {code} ({job.state})")

    def _job(self, submission_id: str):
        """The submitit job of a submission: this CLI's own, or (SLURM) one a killed CLI left."""
        if submission_id in self.jobs:
            return self.jobs[submission_id]
        record = self.folder / f"{submission_id}.json"
        if not record.exists():
            raise RuntimeError(f"no SLURM job for {submission_id}")
        saved = json.loads(record.read_text())
        if saved["executor"] != "slurm":
            raise RuntimeError(f"the local job of {submission_id} ended with the CLI that started it")
        import submitit

        self.jobs[submission_id] = job = submitit.SlurmJob(folder=self.folder / submission_id, job_id=saved["job_id"])
        return job

    @staticmethod
    def _exit_code(job) -> int | None:
        """The run's command's exit code, from the job's result (None: the job died before it)."""
        if not job.paths.result_pickle.exists():
            return None
        try:
            return int(job.result())
        except Exception:  # noqa: BLE001 - the job itself failed (killed, out of memory, time limit)
            return None
