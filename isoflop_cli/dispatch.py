"""Run every cell of a sweep as a job on its launcher (`launchers.py`: Ray, on a local head or a
cluster, or SLURM).

Resumable by construction: a sealed (finished) run is never submitted again; a job the cluster
still knows as running is reattached; a job the cluster lost (a new local head after a kill) is
submitted again under a new attempt number and resumes from the run's checkpoint. Ctrl-C stops the
jobs in flight and leaves the sweep resumable. With the adaptive schedule each budget is a job of
its own (the run pauses at the budget, keeping a checkpoint), so `attempts` counts those too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import os
import shlex
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from isoflop_cli import launchers, preflight
from isoflop_cli.config.schema import Schedule
from isoflop_cli.errors import ConfigError, HeadLost
from isoflop_cli.fit.noise import variance_column
from isoflop_cli.fit.schedule import SIGNAL, decide
from isoflop_cli.joblog import job_message
from isoflop_cli.store import (
    FAILED,
    FINISHED,
    PAUSED,
    RETRYING,
    STOPPED,
    SUBMITTED,
    CellState,
    Failure,
    Manifest,
    RunFiles,
    SweepDir,
    SweepSchedule,
)

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# Set in a job's environment: `isoflop run` then dies with the job supervisor that started it, so
# no run outlives its job and keeps writing into a run directory that a resubmission now owns.
EXIT_WITH_PARENT = "ISOFLOP_EXIT_WITH_PARENT"


LOCK_FILE = ".lock"
USER_ERROR = 2  # the exit code of `isoflop run` for bad input: the same input fails again
RETRY_WAIT_S = (2.0, 60.0)  # first wait before a resubmission, doubled each time up to the second
# How long the head may fail to answer before the sweep says it is lost (a busy head answers late).
HEAD_GRACE_S = 15.0


@contextlib.contextmanager
def sweep_lock(path: Path) -> Iterator[None]:
    """One sweep dir, one owner: an exclusive flock on `path/.lock`, held until the block exits (the
    kernel drops it when the holder dies, even by kill -9). The file names the holder (pid, host,
    command, start time) for the one-line refusal that a second sweep on the same dir gets."""
    path.mkdir(parents=True, exist_ok=True)
    lock = path / LOCK_FILE
    fd = _open_lock(lock, os.O_RDWR | os.O_CREAT)  # not inherited: a head we spawn never holds it
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"sweep dir {path} is in use by {_holder(lock)}; wait for it or stop it") from None
        except OSError as e:
            raise ConfigError(f"cannot lock sweep dir {path} ({lock}: {e.strerror})") from None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": shlex.join(["isoflop", *sys.argv[1:]]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock


def _open_lock(lock: Path, flags: int) -> int:
    """The lock file, opened without following a link (a sweep writes its holder into it: through a
    link it would overwrite another file); one that is not a regular file is refused in one line."""
    try:
        fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EISDIR):
            raise ConfigError(f"cannot open the sweep dir's lock {lock}: {e.strerror}") from None
        fd = None
    if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd is not None:
            os.close(fd)
        kind = "a symbolic link" if lock.is_symlink() else "a directory" if lock.is_dir() else "a special file"
        raise ConfigError(
            f"{lock} is {kind} where the sweep dir's lock file belongs: nothing was changed; remove it and rerun"
        )
    return fd


def watched(path: Path) -> bool:
    """Whether an isoflop process holds the sweep dir (a sweep watching its jobs)."""
    try:
        fd = _open_lock(path / LOCK_FILE, os.O_RDONLY)
    except ConfigError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _holder(lock: Path) -> str:
    try:
        h = json.loads(lock.read_text())
        where = "" if h.get("host") == socket.gethostname() else f" on {h.get('host')}"
        return f"isoflop pid {h['pid']}{where} (started {h.get('started')}: {h.get('command')})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "another isoflop process"


def should_retry(tries: int, max_attempts: int, exit_code: int | None, reason: str, earlier: list[str]) -> bool:
    """Whether a failed job is worth another attempt: attempts are left, it was not a user error
    (exit 2: the config or data is wrong, and stays wrong), and it did not fail the same way before
    (a deterministic error repeats; a lost node or a killed process does not)."""
    return tries < max_attempts and exit_code != USER_ERROR and reason not in earlier


def log_behind(files: RunFiles, cell: CellState) -> bool:
    """A finished run whose job's log was last copied before it finished (while no CLI watched)."""
    return cell.submission_id is not None and (
        not files.log.exists() or files.log.stat().st_mtime < files.status_file.stat().st_mtime
    )


def nothing_to_run(sweep: SweepDir, logs_kept: bool) -> dict[str, str] | None:
    """Every cell of the manifest finished, its log copied or beyond reach (`logs_kept` false: the
    head that ran it is gone, and a new head would not have it): their states, and no cluster need
    start (a rerun of a finished sweep starts no Ray head); else None."""
    cells = sweep.manifest().cells
    if cells and all(
        sweep.run(rid).finished() and not (logs_kept and log_behind(sweep.run(rid), cell))
        for rid, cell in cells.items()
    ):
        return dict.fromkeys(cells, FINISHED)
    return None


@dataclass(frozen=True)
class Patient:
    """A job client whose every call goes through `ask` (Dispatcher._ask: retried while the head
    does not answer, HeadLost past its grace)."""

    ask: Callable
    client: Any

    def __getattr__(self, name: str) -> Callable:
        return functools.partial(self.ask, getattr(self.client, name))


@dataclass
class Dispatcher:
    """Submits, watches and collects the jobs of one sweep."""

    sweep: SweepDir
    cluster: DictConfig
    address: str
    on_poll: Callable[[], None] = lambda: None
    active: dict[str, str] = field(default_factory=dict)  # run_id -> submission_id
    failed: set[str] = field(default_factory=set)  # runs that failed in this dispatch: not submitted again in it
    tries: dict[str, int] = field(
        default_factory=dict
    )  # jobs submitted per run in this dispatch (cluster.max_attempts bounds it)
    head_grace_s: float = HEAD_GRACE_S  # a head that does not answer for this long is lost
    command: str = "run"  # the isoflop command each job runs on its directory (calibrate-shard for calibration)
    logged: dict[str, float] = field(
        default_factory=dict
    )  # run_id -> when its running job's log was last copied (monotonic)
    log_sizes: dict[str, tuple[str, int]] = field(
        default_factory=dict
    )  # run_id -> (submission, characters) of the log last written
    job_states: dict[str, str | None] = field(default_factory=dict)  # run_id -> its job's state at the last poll
    client: launchers.Jobs | None = None  # the launcher's job client at `address` (made here when not given)

    def __post_init__(self) -> None:
        self.launcher = launchers.of(self.cluster)
        if self.client is None:
            self.client = self._ask(self.launcher.jobs, self.address, self.sweep.path)

    def _ask(self, call: Callable, *args, **kwargs):
        """A request to the head, retried while the head does not answer; past head_grace_s it is
        lost (HeadLost: one line, no traceback)."""
        import requests

        deadline = time.monotonic() + self.head_grace_s
        while True:
            try:
                return call(*args, **kwargs)
            except (ConnectionError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as e:
                if time.monotonic() >= deadline:
                    raise HeadLost(self.address, e, self.head_grace_s) from None
                time.sleep(1)

    def capacity(self, cells: int) -> int:
        """Jobs in flight: cluster.max_concurrent, else what the launcher can run at once."""
        if self.cluster.max_concurrent:
            return int(self.cluster.max_concurrent)
        return self.launcher.capacity(cells)

    def run(self) -> dict[str, str]:
        """Drive every cell to the end of the sweep's schedule; returns run_id -> final state.

        full: every unfinished cell runs to its budget, including cells an adaptive sweep paused.
        adaptive: budget by budget, the cells still in the race run to the budget and pause there;
        `schedule.decide` then stops those that can no longer reach the frontier (paused for good
        in this schedule, `stopped_at` in the manifest)."""
        manifest = self.sweep.manifest()
        cells = manifest.cells
        for rid, cell in cells.items():
            if self.sweep.run(rid).finished():
                cell.state = FINISHED
                if log_behind(self.sweep.run(rid), cell):
                    self._save_log(rid, cell.submission_id)
        schedule = manifest.schedule
        try:
            if schedule.name == Schedule.adaptive.value:
                for budget in schedule.budgets[:-1]:
                    self._drive(manifest, pause_at=budget)
                    self._stop_behind(manifest, schedule, budget)
                self._drive(manifest, pause_at=None)
            else:
                for cell in cells.values():
                    cell.stopped_at = cell.why = None  # a full sweep continues what an adaptive one paused
                self._drive(manifest, pause_at=None)
        except KeyboardInterrupt:
            for rid, sid in self.active.items():
                with contextlib.suppress(Exception):
                    self.client.stop_job(sid)
                cells[rid].state = STOPPED
            self.sweep.write_manifest(manifest)
            raise
        except HeadLost:
            self._lost(manifest)
            raise
        return {rid: c.state for rid, c in cells.items()}

    def _reached(self, run_id: str, pause_at: float | None) -> bool:
        """The run is finished, or paused at `pause_at` or beyond."""
        files = self.sweep.run(run_id)
        if files.finished():
            return True
        status = files.status()
        return pause_at is not None and status.state == PAUSED and (status.paused_at or 0) >= pause_at

    def _drive(self, manifest: Manifest, pause_at: float | None) -> None:
        """Run every cell still in the race to `pause_at` (None: to its budget), as many at once as
        the capacity allows; reattach to jobs a killed CLI left running."""
        cells = manifest.cells
        queue = [
            rid
            for rid, c in cells.items()
            if c.stopped_at is None and rid not in self.failed and not self._reached(rid, pause_at)
        ]
        waiting: dict[str, float] = {}  # runs to resubmit after a failure -> when (monotonic)
        for rid in list(queue):
            sid = cells[rid].submission_id
            if sid and self._job_status(sid) in ("PENDING", "RUNNING"):
                self.active[rid] = sid  # reattach to a job that is still going
                queue.remove(rid)
        self.sweep.write_manifest(manifest)
        limit = self.capacity(len(cells))
        while queue or self.active or waiting:
            for rid in [r for r, when in waiting.items() if time.monotonic() >= when]:
                del waiting[rid]
                queue.append(rid)  # its checkpoint is where the new job resumes
            with self.launcher.batch(self.client):  # SLURM: these jobs as one array job
                while queue and len(self.active) < limit:
                    rid = queue.pop(0)
                    self.active[rid] = self._submit(rid, cells[rid], pause_at)
                    cells[rid].state, cells[rid].submission_id = SUBMITTED, self.active[rid]
                    self.sweep.write_manifest(manifest)
            for rid, sid in list(self.active.items()):
                job_state = self.job_states[rid] = self._job_status(sid)
                if job_state in TERMINAL or job_state is None:
                    del self.active[rid]
                    self._save_log(rid, sid)
                    cell = cells[rid]
                    if self._reached(rid, pause_at):
                        cell.state = FINISHED if self.sweep.run(rid).finished() else PAUSED
                    elif job_state == "SUCCEEDED" and self.sweep.run(rid).status().state == PAUSED:
                        queue.append(rid)  # a reattached job that paused at an earlier budget
                    else:
                        reason = self._failure(rid, sid, job_state)
                        earlier = [f.reason for f in cell.failures]
                        cell.failures.append(Failure(attempt=cell.attempts, reason=reason, at=time.time()))
                        if should_retry(
                            self.tries.get(rid, 0), self.cluster.max_attempts, self._exit_code(sid), reason, earlier
                        ):
                            cell.state = RETRYING
                            # Backoff doubles with each try of this dispatch; a job a killed CLI left
                            # (reattached) is its first.
                            wait = min(RETRY_WAIT_S[0] * 2 ** (self.tries.get(rid, 1) - 1), RETRY_WAIT_S[1])
                            waiting[rid] = time.monotonic() + wait
                        else:
                            cell.state, cell.error = FAILED, reason
                            self.failed.add(rid)
                    self.sweep.write_manifest(manifest)
            self._stream_logs()
            self.on_poll()
            if queue or self.active or waiting:
                time.sleep(self.cluster.poll_s)

    def _stop_behind(self, manifest: Manifest, schedule: SweepSchedule, budget: float) -> None:
        """The adaptive rule at `budget`, over the cells still in the race (their eval points so far)."""
        cells = manifest.cells
        racing = [rid for rid, c in cells.items() if c.stopped_at is None and rid not in self.failed]
        column, metric = schedule.column, schedule.metric
        # Each run's points with what the rule reads: the learning signal, the evaluation's variance,
        # and the cell's axes (the variance model tells seed replicates of one cell by them).
        wanted = [column, metric, SIGNAL, variance_column(metric)]
        frames = [
            pd.DataFrame(self.sweep.run(rid).read_metrics(), columns=wanted).assign(
                run_id=rid, **{k: str(v) for k, v in cells[rid].axes.items()}
            )
            for rid in racing
        ]
        points = pd.concat(frames, ignore_index=True).dropna(subset=[column, metric]) if frames else pd.DataFrame()
        if points.empty:
            return
        for d in decide(points, budget, schedule.budgets, schedule.margin, schedule.indifference, metric, column):
            if not d.go:
                cell = cells[d.run]
                cell.state, cell.stopped_at = PAUSED, budget
                cell.why = (
                    f"stopped at {budget:g}: best {d.best:.3f}; at {d.at:g} it could reach {d.reach:.3f}"
                    f"{'' if d.learns else ' (no group with unequal rewards yet: it has not learned)'}, "
                    f"not above the frontier's {d.frontier:.3f} there by more than {schedule.indifference:g}"
                )
        self.sweep.write_manifest(manifest)

    def _submit(self, run_id: str, cell: CellState, pause_at: float | None = None) -> str:
        files = self.sweep.run(run_id)
        cell.attempts += 1
        attempt = cell.attempts
        self.tries[run_id] = self.tries.get(run_id, 0) + 1
        # exec: the run is the job's process, so it ends with its job (see EXIT_WITH_PARENT).
        command = [
            self.python,
            "-m",
            "isoflop_cli",
            self.command,
            "--config",
            str(files.config),
            "--run-dir",
            str(files.dir),
        ]
        entrypoint = "exec " + shlex.join(
            command + (["--pause-at", repr(float(pause_at))] if pause_at is not None else [])
        )
        env = {**self.env(), EXIT_WITH_PARENT: "1"}
        # The sweep dir's tag: two sweeps of the same cells in different dirs (a run id is the cell's
        # content) share a cluster without one taking the other's job for its own.
        tag = hashlib.sha1(str(self.sweep.path.resolve()).encode()).hexdigest()[:6]
        submission_id = f"isoflop-{run_id}-{attempt}-{tag}"
        try:
            return self._ask(
                self.client.submit_job,
                entrypoint=entrypoint,
                submission_id=submission_id,
                entrypoint_num_cpus=self.cluster.cpus_per_run,
                entrypoint_num_gpus=self.cluster.gpus_per_run,
                runtime_env={"env_vars": env},
            )
        except RuntimeError as e:
            if "already exists" not in str(e):
                raise
            return submission_id  # an earlier try reached the head (its answer was lost): the job is this run's

    @property
    def python(self) -> str:
        """The runs' interpreter on the nodes."""
        return self.cluster.python or sys.executable

    def env(self) -> dict[str, str]:
        """The environment of every job the sweep submits."""
        env = {"OMP_NUM_THREADS": str(max(1, int(self.cluster.cpus_per_run))), "RAY_USAGE_STATS_ENABLED": "0"}
        for name in ("ISOFLOP_CACHE", "RAY_AUTH_MODE"):
            if name in os.environ:
                env[name] = os.environ[name]
        return env

    def preflight(self, cfg) -> tuple[list, list[str]]:
        """The preflight probe (preflight.check) on this cluster, with the runs' interpreter and
        environment: the node types it saw, and one line per problem. Its requests are patient as
        the dispatcher's: a head lost while it probes is HeadLost (one line), not a traceback."""
        try:
            return preflight.check(
                self.launcher,
                Patient(self._ask, self.client),
                cfg,
                self.sweep.path,
                self.python,
                {**self.env(), EXIT_WITH_PARENT: "1"},
            )
        except HeadLost:
            self._lost(self.sweep.manifest())
            raise

    def _lost(self, manifest: Manifest) -> None:
        """The head is lost, and every job on it: the runs it held (in flight here, or submitted by an
        earlier CLI) are stopped in the manifest, and a rerun resubmits them from their checkpoints."""
        held = [cell for rid, cell in manifest.cells.items() if rid in self.active or cell.state == SUBMITTED]
        for cell in held:
            cell.state = STOPPED
        if held:
            self.sweep.write_manifest(manifest)

    def _job_status(self, submission_id: str) -> str | None:
        """The job's state, or None when the cluster does not know it (lost with an old head)."""
        try:
            return str(self._ask(self.client.get_job_status, submission_id).value)
        except RuntimeError:
            return None

    def _exit_code(self, submission_id: str) -> int | None:
        """The job's driver exit code, where the cluster still knows the job."""
        try:
            return self.client.get_job_info(submission_id).driver_exit_code
        except Exception:  # a lost job, an older Ray
            return None

    def _stream_logs(self) -> None:
        """Every cluster.log_every_s, each running job's log so far into its run dir (`isoflop logs`
        reads it): a run's output is there while it runs, not only when its job ends."""
        now = time.monotonic()
        for rid, sid in self.active.items():
            if (
                self.job_states.get(rid) == "RUNNING"
                and now - self.logged.get(rid, float("-inf")) >= self.cluster.log_every_s
            ):
                self.logged[rid] = now
                self._save_log(rid, sid)

    def _save_log(self, run_id: str, submission_id: str) -> None:
        """The job's whole log (Ray keeps it), written only when it grew."""
        with contextlib.suppress(Exception):
            text = self.client.get_job_logs(submission_id)
            if self.log_sizes.get(run_id) != (submission_id, len(text)):
                self.sweep.run(run_id).write_log(text)
                self.log_sizes[run_id] = (submission_id, len(text))

    def _failure(self, run_id: str, submission_id: str, job_state: str | None) -> str:
        """The run's own error or its log's exception line, else what Ray says of the job's end
        (a killed process: "...exit code -9"); a job the cluster lost says so."""
        files = self.sweep.run(run_id)
        reason = files.failure_reason()
        if reason:
            return reason
        try:
            message = self.client.get_job_info(submission_id).message
        except Exception:  # the cluster no longer knows the job
            message = None
        return f"job {submission_id} ended {job_state or 'lost'}" + (
            f": {job_message(message, files.log)}" if message else ""
        )
