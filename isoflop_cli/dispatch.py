"""Run every cell of a sweep as a Ray job, on a local head bound to 127.0.0.1 or on a cluster.

Resumable by construction: a run whose status.json says finished is never submitted again; a job
the cluster still knows as running is reattached; a job the cluster lost (a new local head after a
kill) is submitted again under a new attempt number. Ctrl-C stops the jobs in flight and leaves
the sweep resumable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from omegaconf import DictConfig

from isoflop_cli.config import ConfigError
from isoflop_cli.store import FAILED, FINISHED, STOPPED, SUBMITTED, SweepDir, atomic_write, read_json, write_json

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# Set in a job's environment: `isoflop run` then dies with the job supervisor that started it, so
# no run outlives its job and keeps writing into a run directory that a resubmission now owns.
EXIT_WITH_PARENT = "ISOFLOP_EXIT_WITH_PARENT"


HEAD_FILE = "ray-head.json"


def check_cluster(cluster: DictConfig) -> None:
    """Before anything is written: the cluster answers at its address, or a local head has what a
    job asks for (a job asking for more would wait forever)."""
    address = cluster.address or os.environ.get("RAY_ADDRESS")
    if address:
        from ray.job_submission import JobSubmissionClient

        try:
            JobSubmissionClient(address)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ConfigError(f"cannot reach the Ray cluster at {address}: {str(e).splitlines()[0]}") from None
        return
    cpus = cluster.local_cpus or os.cpu_count() or 1
    if cluster.gpus_per_run:
        raise ConfigError("cluster.gpus_per_run > 0 needs a Ray cluster with GPUs (cluster.address): the local head has none")
    if cluster.cpus_per_run > cpus:
        raise ConfigError(f"cluster.cpus_per_run={cluster.cpus_per_run} is more than the local head's {cpus} CPUs (cluster.local_cpus)")


@contextlib.contextmanager
def ray_cluster(cluster: DictConfig, state_dir: Path) -> Iterator[str]:
    """The Ray Jobs address: cluster.address, $RAY_ADDRESS, or a local head on 127.0.0.1.

    The local head runs in its own process (its pid and address in `state_dir/ray-head.json`), so
    a killed CLI leaves its jobs running and the next `isoflop sweep` reattaches to them. It is
    stopped, by that pid, when the sweep ends or is interrupted.
    """
    address = cluster.address or os.environ.get("RAY_ADDRESS")
    if address:
        yield address
        return
    os.environ["RAY_AUTH_MODE"] = "token"  # a local head makes a token (~/.ray/auth_token); jobs use it too
    info_file = state_dir / HEAD_FILE
    head = _attach(info_file) or _start_head(cluster, info_file)
    try:
        yield head["address"]
    finally:
        _stop_head(head["pid"])
        info_file.unlink(missing_ok=True)


def _attach(info_file: Path) -> dict | None:
    head = read_json(info_file)
    if not head or not _is_head(head.get("pid", -1)):
        return None
    return head


def _is_head(pid: int) -> bool:
    try:
        return "isoflop_cli.dispatch" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _start_head(cluster: DictConfig, info_file: Path, timeout_s: float = 180) -> dict:
    info_file.unlink(missing_ok=True)
    cpus = cluster.local_cpus or os.cpu_count() or 1
    log = open(info_file.with_suffix(".log"), "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "isoflop_cli.dispatch", "--cpus", str(cpus), "--info", str(info_file)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        head = read_json(info_file)
        if head and head.get("pid") == proc.pid:
            return head
        if proc.poll() is not None:
            raise RuntimeError(f"local Ray head exited ({proc.returncode}); see {info_file.with_suffix('.log')}")
        time.sleep(0.2)
    _stop_head(proc.pid)
    raise RuntimeError(f"local Ray head did not start in {timeout_s:.0f}s; see {info_file.with_suffix('.log')}")


def _stop_head(pid: int, grace_s: float = 60) -> None:
    """SIGTERM (the head shuts Ray down cleanly), then SIGKILL to its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and _alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def serve_head(cpus: int, info_file: Path) -> None:
    """The local head process: Ray on loopback only, usage stats off, until SIGTERM or SIGINT."""
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    context = ray.init(
        address="local",
        num_cpus=cpus,
        num_gpus=0,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs its own handlers
        signal.signal(sig, lambda *_: stop.set())
    write_json(info_file, {"address": f"http://{context.dashboard_url}", "pid": os.getpid()})
    stop.wait()
    ray.shutdown()


@dataclass
class Dispatcher:
    """Submits, watches and collects the jobs of one sweep."""

    sweep: SweepDir
    cluster: DictConfig
    address: str
    on_poll: Callable[[], None] = lambda: None
    active: dict[str, str] = field(default_factory=dict)  # run_id -> submission_id

    def __post_init__(self) -> None:
        from ray.job_submission import JobSubmissionClient

        self.client = JobSubmissionClient(self.address)

    def capacity(self, cells: int) -> int:
        """Jobs in flight: what the local head can run at once; on a cluster, all (it queues them)."""
        if self.cluster.max_concurrent:
            return int(self.cluster.max_concurrent)
        if self.cluster.address or os.environ.get("RAY_ADDRESS"):
            return cells
        cpus = self.cluster.local_cpus or os.cpu_count() or 1
        return max(1, int(cpus // self.cluster.cpus_per_run))

    def run(self) -> dict[str, str]:
        """Drive every unfinished cell to a terminal state; returns run_id -> final state."""
        manifest = self.sweep.manifest()
        cells = manifest["cells"]
        queue = [rid for rid, c in cells.items() if self.sweep.run(rid).status().get("state") != FINISHED]
        for rid in cells:
            if rid not in queue:
                cells[rid]["state"] = FINISHED
                if "submission_id" in cells[rid] and not self.sweep.run(rid).log.exists():
                    self._save_log(rid, cells[rid]["submission_id"])  # it finished while no CLI watched
        for rid in list(queue):
            sid = cells[rid].get("submission_id")
            if sid and self._job_status(sid) in ("PENDING", "RUNNING"):
                self.active[rid] = sid  # reattach to a job that is still going
                queue.remove(rid)
        self.sweep.write_manifest(manifest)
        limit = self.capacity(len(cells))
        try:
            while queue or self.active:
                while queue and len(self.active) < limit:
                    rid = queue.pop(0)
                    self.active[rid] = self._submit(rid, cells[rid])
                    cells[rid].update(state=SUBMITTED, submission_id=self.active[rid])
                    self.sweep.write_manifest(manifest)
                for rid, sid in list(self.active.items()):
                    job_state = self._job_status(sid)
                    if job_state in TERMINAL or job_state is None:
                        del self.active[rid]
                        self._save_log(rid, sid)
                        ok = self.sweep.run(rid).status().get("state") == FINISHED
                        cells[rid]["state"] = FINISHED if ok else FAILED
                        if not ok:
                            cells[rid]["error"] = self._failure(rid, sid, job_state)
                        self.sweep.write_manifest(manifest)
                self.on_poll()
                if queue or self.active:
                    time.sleep(self.cluster.poll_s)
        except KeyboardInterrupt:
            for rid, sid in self.active.items():
                with contextlib.suppress(Exception):
                    self.client.stop_job(sid)
                cells[rid]["state"] = STOPPED
            self.sweep.write_manifest(manifest)
            raise
        return {rid: c["state"] for rid, c in cells.items()}

    def _submit(self, run_id: str, cell: dict) -> str:
        files = self.sweep.run(run_id)
        attempt = cell.get("attempts", 0) + 1
        cell["attempts"] = attempt
        python = self.cluster.python or sys.executable
        # exec: the run is the job's process, so it ends with its job (see EXIT_WITH_PARENT).
        entrypoint = "exec " + shlex.join([python, "-m", "isoflop_cli", "run", "--config", str(files.config), "--out", str(files.dir)])
        env = {"OMP_NUM_THREADS": str(max(1, int(self.cluster.cpus_per_run))), "RAY_USAGE_STATS_ENABLED": "0", EXIT_WITH_PARENT: "1"}
        if "ISOFLOP_CACHE" in os.environ:
            env["ISOFLOP_CACHE"] = os.environ["ISOFLOP_CACHE"]
        return self.client.submit_job(
            entrypoint=entrypoint,
            submission_id=f"isoflop-{run_id}-{attempt}",
            entrypoint_num_cpus=self.cluster.cpus_per_run,
            entrypoint_num_gpus=self.cluster.gpus_per_run,
            runtime_env={"env_vars": env},
        )

    def _job_status(self, submission_id: str) -> str | None:
        """The job's state, or None when the cluster does not know it (lost with an old head)."""
        try:
            return str(self.client.get_job_status(submission_id).value)
        except RuntimeError:
            return None

    def _save_log(self, run_id: str, submission_id: str) -> None:
        with contextlib.suppress(Exception):
            atomic_write(self.sweep.run(run_id).log, self.client.get_job_logs(submission_id))

    def _failure(self, run_id: str, submission_id: str, job_state: str | None) -> str:
        status = self.sweep.run(run_id).status()
        if status.get("error"):
            return status["error"]
        log = self.sweep.run(run_id).log
        tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
        return f"job {submission_id} ended {job_state or 'lost'}" + (f": {tail[0]}" if tail else "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A local Ray head for isoflop (started by `isoflop sweep`).")
    parser.add_argument("--cpus", type=int, required=True)
    parser.add_argument("--info", type=Path, required=True)
    args = parser.parse_args()
    serve_head(args.cpus, args.info)
