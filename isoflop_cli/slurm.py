"""`cluster.launcher=slurm`: each run a SLURM job (the runs one poll submits as one array job),
submitted with submitit.

`SlurmLauncher` is the `launchers.Launcher` entry; its `SlurmClient` answers the `launchers.Jobs`
calls (Ray's `JobSubmissionClient`'s: submit, status, logs, stop, info), so the sweep's dispatch,
resume, retries, status and run dir layout are the same on SLURM as on Ray. A job runs the run's
command (the entrypoint the dispatcher builds) in a shell on its node; its exit code is the job's
result, so a user error (exit 2) is not retried. SLURM requeues a preempted job
(`cluster.slurm.requeue`) and the run resumes from its checkpoint, as after any other interruption.

Each submission's SLURM job id is kept in `<sweep>/slurm/<submission id>.json`, so a new CLI
reattaches to jobs a killed one left (through `sacct`). `cluster.slurm.executor=local` runs the
same submitit calls as local processes (submitit's own local executor): for machines without
SLURM and for tests; local jobs do not outlive the CLI's knowledge of them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from isoflop_cli.errors import ConfigError, SlurmRefused

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


def _stop_local(pid: int, grace_s: float = 10.0) -> None:
    """Stop a local job as Ray stops one: SIGTERM to everything it runs, SIGKILL to what outlives the
    grace. submitit's own cancel sends SIGINT to the job's controller only, which a CLI started from
    a background shell (`nohup isoflop sweep ... &`, CI) passes on as ignored: the run went on to its
    end. `pid` is the controller's (submitit's local job id)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    for p in psutil.wait_procs(procs, timeout=grace_s)[1]:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    """sbatch's refusal as one SlurmRefused line. submitit also prints sbatch's stderr before it
    raises: that goes into the message only (it holds the same lines), not onto the terminal."""
    from submitit.core.utils import FailedJobError

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    except FailedJobError as e:
        why = " ".join(str(e).split())
        raise SlurmRefused(
            f"SLURM refused the runs' jobs: {why} (see cluster.cpus_per_run, cluster.gpus_per_run, cluster.slurm.*)"
        ) from None


class SlurmClient:
    def __init__(self, cluster, folder: Path):
        self.cluster, self.folder = cluster, folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.jobs: dict = {}  # submission id -> submitit job
        self.stopped: set[str] = (
            set()
        )  # submissions this client stopped: STOPPED once they end, as Ray says of a stopped job
        self._array: tuple | None = None  # inside batch(): (its executor, its folder, [(submission id, job)])

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The jobs submitted inside go to SLURM as one array job (one sbatch; a scheduler's job
        limits count it once), each still its run's own job for state, logs and cancel."""
        folder = self.folder / f"array-{time.time_ns()}"
        self._array = (None, folder, [])
        try:
            yield
            executor, _, submitted = self._array
            if executor is None:
                return
            with _refused(), executor.batch():
                jobs = [(sid, executor.submit(run_command, entrypoint, env)) for sid, (entrypoint, env) in submitted]
        finally:
            self._array = None
        for sid, job in jobs:
            self._record(sid, job, folder)

    def submit_job(
        self,
        entrypoint: str,
        submission_id: str,
        entrypoint_num_cpus: float = 1,
        entrypoint_num_gpus: float = 0,
        runtime_env: dict | None = None,
    ) -> str:
        env = (runtime_env or {}).get("env_vars", {})
        if self._array is not None:  # submitted when the batch ends
            executor, folder, submitted = self._array
            if executor is None:
                executor = self._executor(
                    folder, "isoflop-" + self.folder.parent.name, entrypoint_num_cpus, entrypoint_num_gpus
                )
                self._array = (executor, folder, submitted)
            submitted.append((submission_id, (entrypoint, env)))
            return submission_id
        folder = self.folder / submission_id
        with _refused():
            job = self._executor(folder, submission_id, entrypoint_num_cpus, entrypoint_num_gpus).submit(
                run_command, entrypoint, env
            )
        self._record(submission_id, job, folder)
        return submission_id

    def _executor(self, folder: Path, name: str, cpus: float, gpus: float):
        import submitit

        s = self.cluster.slurm
        executor = submitit.AutoExecutor(folder=folder, cluster=None if s.executor == "slurm" else "local")
        params = {"timeout_min": s.time_min, "cpus_per_task": max(1, int(cpus)), "name": name}
        if gpus:
            params["gpus_per_node"] = int(gpus)
        if s.executor == "slurm":
            params["slurm_additional_parameters"] = {"requeue": True} if s.requeue else {}
            if s.partition:
                params["slurm_partition"] = s.partition
        executor.update_parameters(**params)
        return executor

    def refusal(self, cpus: float, gpus: float) -> str | None:
        """Why SLURM would never start a job of this size (its partition, time limit, CPUs and GPUs
        as the runs' jobs ask), None if it would: `sbatch --test-only` checks the request against
        the nodes without submitting anything. submitit's local executor runs anything."""
        s = self.cluster.slurm
        if s.executor != "slurm":
            return None
        args = ["sbatch", "--test-only", f"--cpus-per-task={max(1, int(cpus))}", f"--time={s.time_min}", "--wrap=true"]
        args += [f"--gpus-per-node={int(gpus)}"] if gpus else []
        args += [f"--partition={s.partition}"] if s.partition else []
        answer = subprocess.run(args, capture_output=True, text=True, timeout=60)
        return None if answer.returncode == 0 else " ".join(answer.stderr.replace("sbatch: error:", " ").split())

    def _record(self, submission_id: str, job, folder: Path) -> None:
        self.jobs[submission_id] = job
        record = {"job_id": job.job_id, "executor": self.cluster.slurm.executor, "folder": str(folder)}
        (self.folder / f"{submission_id}.json").write_text(json.dumps(record))

    def get_job_status(self, submission_id: str) -> Status:
        job = self._job(submission_id)
        state = job.state.upper().split()[0] if job.state else "UNKNOWN"
        if state in RUNNING_STATES:
            return Status("RUNNING")
        if state in PENDING_STATES and (
            not job.paths.result_pickle.exists() or (state == "PENDING" and self.cluster.slurm.executor == "slurm")
        ):
            return Status(
                "PENDING"
            )  # SLURM's PENDING stands: a requeued job waits to run again, whatever its first run left
        if state in STOPPED_STATES or submission_id in self.stopped:
            # submitit's local executor cancels with SIGINT, and a job that ends meanwhile ends with
            # its own code; a stopped job reads STOPPED however it ended.
            return Status("STOPPED")
        code = self._exit_code(job)
        return Status("SUCCEEDED" if code == 0 else "FAILED")

    def get_job_logs(self, submission_id: str) -> str:
        job = self._job(submission_id)
        return (job.stdout() or "") + (job.stderr() or "")

    def stop_job(self, submission_id: str) -> bool:
        job = self._job(submission_id)
        if self.cluster.slurm.executor == "slurm":
            job.cancel(check=False)
        else:
            _stop_local(int(job.job_id))
        self.stopped.add(submission_id)
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

        folder = saved.get("folder", self.folder / submission_id)  # older records: a folder per submission
        self.jobs[submission_id] = job = submitit.SlurmJob(folder=folder, job_id=saved["job_id"])
        return job

    @staticmethod
    def _exit_code(job) -> int | None:
        """The run's command's exit code, from the job's result (None: the job died before it)."""
        if not job.paths.result_pickle.exists():
            return None
        try:
            return int(job.result())
        except Exception:
            return None


class SlurmLauncher:
    """`cluster.launcher=slurm` (launchers.py): each run a SLURM job through submitit, its state in
    the sweep dir's `slurm/` (a new CLI reattaches to the jobs a killed one left)."""

    places_probe = True  # SLURM places the probe: it checks the node it lands on

    def __init__(self, cluster):
        self.cluster = cluster

    @property
    def _sbatch(self) -> bool:
        return self.cluster.slurm.executor == "slurm"

    def check(self) -> None:
        if self._sbatch and shutil.which("sbatch") is None:
            raise ConfigError(
                "cluster.launcher=slurm needs SLURM's sbatch on PATH here "
                "(cluster.slurm.executor=local runs the same jobs as local processes)"
            )

    def capacity(self, cells: int) -> int:
        """SLURM queues every job; submitit's local executor runs what this machine's CPUs hold."""
        return (
            cells
            if self._sbatch
            else max(1, int((self.cluster.local_cpus or os.cpu_count() or 1) // self.cluster.cpus_per_run))
        )

    def open(self, state_dir: Path):
        return contextlib.nullcontext("slurm")  # no address: submitit talks to SLURM itself

    def keeps_logs(self, state_dir: Path) -> bool:
        return True  # files in the sweep dir's slurm/ (submitit's)

    def jobs(self, address: str, state_dir: Path) -> SlurmClient:
        return SlurmClient(self.cluster, state_dir / "slurm")

    def batch(self, jobs: SlurmClient):
        return jobs.batch()

    def placement(self, jobs: SlurmClient, nodes: list, cpus: float, gpus: float) -> list[str]:
        """What `sbatch --test-only` says of a run's job (the probe saw one node only)."""
        refused = jobs.refusal(cpus, gpus)
        return (
            [
                f"SLURM would never start a run's job ({cpus:g} CPUs, {gpus:g} GPUs): {refused} "
                "(cluster.cpus_per_run, cluster.gpus_per_run, cluster.slurm.partition, cluster.slurm.time_min)"
            ]
            if refused
            else []
        )
