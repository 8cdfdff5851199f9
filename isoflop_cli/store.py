"""The sweep directory on disk: what each file holds, and writes that never leave a torn file.

    <out>/<sweep>/sweep.yaml          resolved sweep config
    <out>/<sweep>/manifest.json       cells: run_id, axes, plan, status, job submissions (`Manifest`)
    <out>/<sweep>/runs/<run_id>/      config.yaml, metrics.jsonl, status.json, job.log, lease.json,
                                      problems.jsonl (per eval point, each validation problem's
                                      correct samples), checkpoint/ (while the run is unfinished,
                                      and after with checkpoint.keep_final)
    <out>/<sweep>/results.parquet     one row per eval point of every finished run
    <out>/<sweep>/problems.parquet    run_id, step, problem_id, correct, samples of those runs

A run writes its own metrics.jsonl (appended and flushed per eval point) and status.json; the
dispatcher owns the manifest and results. Both sides use this module and nothing else for files.

Every file is written here (`atomic_write`, `_append`), into a directory opened component by
component below the sweep dir without following a link (`_open_dir`): a link placed in the tree (a
run dir pointing elsewhere) is refused, never written through; `SweepDir.check_tree` refuses one
before a sweep computes anything, and a state file that could not be written there (a directory in
its place, a read-only or immutable file). Every read and write goes through `on_disk`: an OSError
the user must fix (permission denied, immutable, a directory where a file belongs, a name too long)
is one line naming the path, what failed and what to do, never a traceback. New files and
directories get the umask's mode less o+w (FILE_MODE, DIR_MODE): readable by the team as the user's
tools make them, never world-writable.

A run's records carry its identity (`Identity`: its run id and its config's fingerprint), checked
where they are read: a run dir copied from another cell or sweep is refused, not taken for this one.

One attempt writes a run dir at a time (`RunFiles.take_lease`): the dispatcher starts a new
attempt only when it believes the last one lost, but a lost node may still run it (a network
partition, a head gone for less than the minute its workers outlive it). The new attempt writes a
new lease.json; the old one checks the lease before each write and stops at the first it no longer
holds, so two attempts do not interleave rows, statuses or checkpoints. What a check cannot cover
is a process frozen in the microseconds between its check and its write and woken after the
takeover's grace: only a filesystem that fences stale writers could.

A run is finished only when its records are whole: `RunFiles.finish` seals it, writing the rows
once more atomically and keeping a copy in status.json, so a metrics file torn or cut later is
repaired from that copy instead of silently losing eval points (`RunFiles.finished_rows`).
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.joblog import last_exception

RESULTS = "results.parquet"
PROBLEMS = "problems.parquet"
MANIFEST = "manifest.json"
CHECKPOINT_STATE = "run_state.pt"  # a checkpoint's progress, scheduler and RNG states (recipe/resume.py writes it)
CHECKPOINT_FILES = "files.json"  # the file a whole checkpoint ends with: each of its files and its size
STATE_FILES = {
    "sweep.yaml",
    MANIFEST,
    RESULTS,
    PROBLEMS,
    "cost.json",  # a sweep dir's, then a run dir's
    "config.yaml",
    "metrics.jsonl",
    "status.json",
    "job.log",
    "lease.json",
    "problems.jsonl",
}

# Run states, as status.json and the manifest spell them.
PENDING, SUBMITTED, RUNNING, FINISHED, FAILED, STOPPED = (
    "pending",
    "submitted",
    "running",
    "finished",
    "failed",
    "stopped",
)
PAUSED = "paused"  # an adaptive sweep's cell stopped at a budget, its checkpoint kept to continue from
KILLED = "killed"  # shown by `status` only: marked running, its process gone
MISSING = (
    "missing"  # shown by `status` only: a cell the sweep ran whose run dir or records are gone (or not a directory)
)
RETRYING = (
    "retrying"  # its job failed for a reason that may pass (a lost node, a killed process): resubmitted after a wait
)


LEASE_GRACE_S = (
    2.0  # a new holder waits this long where the old one may still run: a write it began before the takeover ends first
)


class LeaseLost(RuntimeError):
    """Another attempt of this run holds its directory now: this one stops without writing more."""


FILE_MODE = 0o664  # a new file's mode before the umask: 0644 under umask 022, never world-writable
DIR_MODE = 0o775  # a new directory's likewise (0755 under 022)


def atomic_write(path: Path, data: str | bytes, durable: bool = True, root: Path | None = None) -> None:
    """`path` holds the old data or the new, never a mix: a temporary file in its directory, renamed
    over it (a link at `path` is replaced, not followed). `root`: the tree `path` is confined to
    (`_open_dir`). `durable`: on disk before the rename (an fsync, ~1 ms), so that a crash of the
    machine cannot leave the file empty; what the next write replaces anyway (a running run's
    progress) need not pay for it."""
    with on_disk(path, "write"):
        _atomic_write(path, data, durable, root)


def _atomic_write(path: Path, data: str | bytes, durable: bool, root: Path | None) -> None:
    directory = _open_dir(path.parent, root)
    tmp = f".{path.name}.{uuid.uuid4().hex[:12]}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE, dir_fd=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path.name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=directory)
        if is_disk_full(e) and not e.filename:  # say where: "disk full at PATH"
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        os.close(directory)


def no_world_writes() -> None:
    """The process's umask, and its children's (the Ray head, its jobs, the libraries that save a
    checkpoint or a tracker's files), with o+w added: what they create follows the user's umask but
    is never world-writable, as FILE_MODE and DIR_MODE are for isoflop's own writes."""
    os.umask(os.umask(0) | 0o002)


def make_dirs(path: Path) -> None:
    """`path` and its missing parents, each of DIR_MODE (os.makedirs makes the parents 0777 less the
    umask: world-writable under umask 000)."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, DIR_MODE)


def _open_dir(path: Path, root: Path | None) -> int:
    """A descriptor of directory `path`, made where missing. Below `root` (a sweep dir, or the dir a
    single run's dir lies in) each component is opened without following a link: a write cannot
    leave the tree, and a link or a file where a directory of it belongs is refused (ConfigError
    naming it). Above `root`, links are the user's own (an --out on another disk)."""
    if root is None or not path.is_relative_to(root):
        make_dirs(path)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    make_dirs(root)
    fd, here = os.open(root, os.O_RDONLY | os.O_DIRECTORY), root
    for part in path.relative_to(root).parts:
        here = here / part
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, DIR_MODE, dir_fd=fd)
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise not_own(here, root) from None
            raise
        os.close(fd)
        fd = child
    return fd


def not_own(path: Path, root: Path) -> ConfigError:
    """The refusal of a link (or another kind of file) where a directory or file of isoflop's tree
    `root` belongs: writing through it would change files outside the sweep."""
    kind = "a symbolic link" if path.is_symlink() else "not a directory"
    return ConfigError(
        f"{path} is {kind} where {root}'s own files belong: isoflop writes a sweep's state only inside its own "
        "tree, never through a link; nothing was changed; move it aside and rerun"
    )


# What the user does about an OSError on a state file: the errnos the same command meets again
# until someone changes the file system. Others (EIO, a stale NFS handle) are raised as they are.
FIXES = {
    errno.EACCES: (
        "permission denied: fix its permissions or its directory's "
        "(chmod), or its immutable attribute (lsattr; chattr -i)"
    ),
    errno.EPERM: "operation not permitted: it may be immutable (lsattr; chattr -i) or another user's",
    errno.EROFS: "the file system is read-only: give a --root on a writable one",
    errno.EISDIR: "it is a directory where a file belongs: move it aside",
    errno.ENOTDIR: "a file stands where a directory of its path belongs: move it aside",
    errno.ENAMETOOLONG: "a name in its path is too long for the file system: use a shorter --root or sweep name",
}


@contextlib.contextmanager
def on_disk(path: Path, doing: str) -> Iterator[None]:
    """Every read and write of a sweep's state goes through here: an OSError the user must fix (FIXES)
    becomes one line (ConfigError, exit 2) naming `path`, what failed in words and what to do,
    never a traceback; a full disk is left to its own message (freeing space resumes the sweep)."""
    try:
        yield
    except OSError as e:
        if e.errno not in FIXES or is_disk_full(e):
            raise
        raise fs_error(e, path, doing) from None


def fs_error(e: OSError, path: Path, doing: str) -> ConfigError:
    """`doing` ("read", "write") `path` failed: why in words, and what to do."""
    return ConfigError(f"cannot {doing} {path}: {FIXES.get(e.errno, e.strerror or type(e).__name__)}")


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(e: OSError) -> str:
    where = e.filename or "the output dir"
    return f"disk full at {where}: free space there and rerun the same command to resume (finished runs are kept)"


def write_json(path: Path, obj: Any, durable: bool = True, root: Path | None = None) -> None:
    atomic_write(path, json.dumps(obj, indent=1) + "\n", durable, root)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return default


@dataclass(frozen=True)
class Identity:
    """Which run a run dir's records belong to: its run id (its cell: what it computes, to which
    budget) and its fingerprint (`config.identity.fingerprints`: what it computes, the same for every
    budget of one trajectory, so a run continued from a smaller budget keeps its rows)."""

    run_id: str
    fingerprint: str


IDENTITY_KEYS = ("run_id", "fingerprint")  # in status.json; each metrics and problems row carries the fingerprint


class RunFiles:
    """The files of one run directory. With `holder` (the run's own, from `take_lease`), every write
    first checks that this attempt still holds the directory's lease. With `identity`, every record
    written carries it and every record read must match it (`_check_status`, `_check_rows`); without,
    records are neither stamped nor checked (a calibration slice, a manifest of an older isoflop).
    Writes stay inside `root` (`_open_dir`): the run's sweep dir, or the dir a single run's dir lies in."""

    def __init__(
        self,
        run_dir: Path | str,
        holder: str | None = None,
        identity: Identity | None = None,
        root: Path | str | None = None,
    ):
        self.dir = Path(run_dir)
        self.holder = holder
        self.identity = identity
        self.root = Path(root) if root is not None else run_root(self.dir)
        self.lease = self.dir / "lease.json"
        self.config = self.dir / "config.yaml"
        self.metrics = self.dir / "metrics.jsonl"
        self.problems = self.dir / "problems.jsonl"
        self.status_file = self.dir / "status.json"
        self.log = self.dir / "job.log"
        self.checkpoint = self.dir / "checkpoint"

    def take_lease(self) -> RunFiles:
        """Make this process the run dir's one writer; returns the RunFiles it writes through.

        Where the last holder may still run (marked running, and not a process of this host known
        dead), the new holder waits LEASE_GRACE_S after taking over: a write the old one began
        before it could see the new lease ends before this one reads or rewrites anything."""
        maybe_alive = self.lease.exists() and self.status().state == RUNNING and not self.process_gone()
        holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        write_json(self.lease, asdict(Lease(holder=holder, since=time.time())), root=self.root)
        if maybe_alive:
            time.sleep(LEASE_GRACE_S)
        return RunFiles(self.dir, holder, self.identity, self.root)

    def check_lease(self, cause: BaseException | None = None) -> None:
        """Raise LeaseLost (from `cause`, an error that may be the takeover's doing) where another
        attempt took the run dir over; no check without a holder. A lease that cannot be read is
        read again (a transient error on a network filesystem is not a takeover); one that still
        does not fit its schema stops this attempt too, naming the file (no write is safe then)."""
        if self.holder is None:
            return
        for wait in (0.1, 0.5, 2.0, None):
            try:
                now = Lease.from_json(json.loads(self.lease.read_text())).holder
                break
            except (OSError, ValueError) as e:
                why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
                if wait is None:
                    raise LeaseLost(
                        f"{self.lease} is not a readable lease ({why}): this "
                        f"attempt ({self.holder}) stops without writing more"
                    ) from cause
                time.sleep(wait)
        if now != self.holder:
            raise LeaseLost(
                f"another attempt ({now}) took over {self.dir}: this one ({self.holder}) stops without writing more"
            ) from cause

    def status(self) -> RunStatus:
        """The run's status.json (pending where there is none). One that cannot be read or does not
        fit its schema is refused (ConfigError naming the file), never taken for pending or for
        finished: either would rewrite or drop the run's records on a guess."""
        try:
            text = self.status_file.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return RunStatus()
        except OSError as e:  # it is there but cannot be read: not damaged, and not to be thrown away
            raise fs_error(e, self.status_file, "read") from None
        try:
            status = RunStatus.from_json(json.loads(text))
        except (ValueError, RecursionError) as e:
            raise ConfigError(
                f"{self.status_file} is not a well-formed run status ({_malformed(e)}): nothing was changed; "
                "fix it or move it aside (the run is then redone)"
            ) from None
        self._check_status(status)
        return status

    def _check_status(self, status: RunStatus) -> None:
        """status.json is this run's: of its fingerprint, and, once finished, of its run id (a run
        continued from a smaller budget keeps the earlier run's paused status until it writes its
        own). A status without an identity was written by an older isoflop, and is taken as it is."""
        if self.identity is None or status.fingerprint is None:
            return
        if status.fingerprint != self.identity.fingerprint:
            self._refuse(
                self.status_file,
                f"of another configuration (fingerprint {status.fingerprint[:12]}, "
                f"this cell's {self.identity.fingerprint[:12]})",
            )
        if status.state == FINISHED and status.run_id != self.identity.run_id:
            self._refuse(self.status_file, f"the finished record of run {status.run_id}")

    def _check_rows(self, path: Path, rows: list[dict]) -> list[dict]:
        """Rows of this run's fingerprint (rows without one were written by an older isoflop)."""
        if self.identity is not None:
            other = next(
                (
                    r["fingerprint"]
                    for r in rows
                    if r.get("fingerprint", self.identity.fingerprint) != self.identity.fingerprint
                ),
                None,
            )
            if other is not None:
                self._refuse(
                    path,
                    "holds rows of another configuration (fingerprint "
                    f"{str(other)[:12]}, this cell's {self.identity.fingerprint[:12]})",
                )
        return rows

    def _refuse(self, path: Path, what: str) -> NoReturn:
        raise ConfigError(
            f"run {self.identity.run_id}: {path} is {what}, not this run's: nothing was changed; "
            f"move {self.dir} aside to run this cell again"
        )

    def _stamp(self) -> dict[str, str]:
        return asdict(self.identity) if self.identity is not None else {}

    def set_status(self, state: str, *, durable: bool = True, **fields: Any) -> None:
        """With `pid`, its process's start time too: `process_gone` tells a reused pid from the run's."""
        self.check_lease()
        if "pid" in fields:
            fields["pid_started"] = process_start(fields["pid"])
        write_json(
            self.status_file,
            {
                "version": STATUS_VERSION,
                "state": state,
                "updated": time.time(),
                "host": socket.gethostname(),
                **self._stamp(),
                **fields,
            },
            durable,
            self.root,
        )

    def finish(self, rows: list[dict], **fields: Any) -> None:
        """Seal a finished run: its rows written whole, and a copy in status.json to repair from."""
        self.check_lease()
        atomic_write(self.metrics, _jsonl(rows), root=self.root)
        self.set_status(FINISHED, rows=rows, **fields)

    def finished_rows(self) -> list[dict] | None:
        """The eval points of a finished run, or None while it is not finished.

        A sealed run whose metrics file holds a prefix of its sealed rows (a torn or cut tail, an
        emptied or deleted file) is repaired from the copy in status.json; one whose file holds other
        rows is refused (ConfigError naming both files): which of the two is right is not for isoflop
        to guess. A run marked finished without that copy (written by an older isoflop) counts when
        its file has no torn line."""
        status = self.status()
        if status.state != FINISHED:
            return None
        text = read_text(self.metrics) if self.metrics.exists() else ""
        sealed = status.rows
        if sealed is None:
            rows = self.read_metrics()
            return rows if rows and _jsonl(rows) == text else None
        if text != _jsonl(sealed):
            kept = self.read_metrics()
            if kept != sealed[: len(kept)]:
                raise ConfigError(
                    f"{self.status_file} seals {len(sealed)} rows that {self.metrics} contradicts (its row "
                    f"{_first_difference(kept, sealed)}): nothing was changed; move the one that is wrong aside"
                )
            atomic_write(self.metrics, _jsonl(sealed), root=self.root)
        return self._check_rows(self.status_file, sealed)

    def finished(self) -> bool:
        return self.finished_rows() is not None

    def has_checkpoint(self) -> bool:
        """A whole checkpoint is here (or its `.old` copy, where a kill fell between a save's renames)."""
        return any(
            d.is_dir() and checkpoint_gap(d) is None
            for d in (self.checkpoint, self.checkpoint.with_name(self.checkpoint.name + ".old"))
        )

    def process_gone(self) -> bool:
        """A run marked running whose process, on this host, no longer exists (killed)."""
        status = self.status()
        if status.state != RUNNING or status.host != socket.gethostname() or status.pid is None:
            return False
        try:
            os.kill(status.pid, 0)
        except ProcessLookupError:
            return True
        except (PermissionError, OverflowError):
            return False
        # A live pid that started at another time than the run's process is another process now
        # (status files of an older isoflop have no start time: the pid is all there is).
        return status.pid_started is not None and process_start(status.pid) != status.pid_started

    def failure_reason(self) -> str | None:
        """Why the run failed, as the run or its log says it: the error the run recorded, else the
        last exception line of its log (not the traceback's last frame)."""
        error = self.status().error
        if error:
            return str(error)
        return last_exception(self.read_log()) if self.log.exists() else None

    def read_log(self) -> str:
        """job.log as far as it is written ("" before the sweep copies it)."""
        return read_text(self.log, errors="replace") if self.log.exists() else ""

    def reset_metrics(self) -> None:
        """A run that starts over starts its metrics (and per-problem records) over: no duplicated rows."""
        self.check_lease()
        atomic_write(self.metrics, "", root=self.root)
        self.problems.unlink(missing_ok=True)

    def keep_metrics(self, until_step: int) -> None:
        """A run resumed from a checkpoint at `until_step` drops the rows it wrote after it (it writes them again)."""
        self.check_lease()
        atomic_write(
            self.metrics, _jsonl([row for row in self.read_metrics() if row["step"] <= until_step]), root=self.root
        )
        atomic_write(
            self.problems, _jsonl([row for row in self.read_problems() if row["step"] <= until_step]), root=self.root
        )

    def append_metrics(self, row: dict) -> None:
        self.check_lease()
        _append(self.metrics, {**row, **self._fingerprint()}, self.root)

    def append_problems(self, step: int, per_problem: list[tuple[str, int, int]]) -> None:
        """One eval point's validation problems: ids, correct samples, samples (written before its metrics row)."""
        self.check_lease()
        ids, correct, samples = zip(*per_problem) if per_problem else ((), (), ())
        _append(
            self.problems,
            {
                "step": step,
                "problem_id": list(ids),
                "correct": list(correct),
                "samples": list(samples),
                **self._fingerprint(),
            },
            self.root,
        )

    def _fingerprint(self) -> dict[str, str]:
        return {"fingerprint": self.identity.fingerprint} if self.identity is not None else {}

    def read_problems(self) -> list[dict]:
        return self._check_rows(self.problems, _read_jsonl(self.problems))

    def read_metrics(self) -> list[dict]:
        return self._check_rows(self.metrics, _read_jsonl(self.metrics))

    def write_config(self, text: str) -> None:
        """config.yaml: what the run's job runs (written by the sweep)."""
        atomic_write(self.config, text, root=self.root)

    def write_log(self, text: str) -> None:
        """job.log: the job's log as its launcher keeps it (copied by the sweep)."""
        atomic_write(self.log, text, root=self.root)


def run_root(run_dir: Path) -> Path:
    """The tree a run dir's writes stay in: its sweep dir (runs/<id>), else the dir it lies in."""
    return run_dir.parent.parent if run_dir.parent.name == "runs" else run_dir.parent


def checkpoint_gap(directory: Path) -> str | None:
    """What the checkpoint in `directory` lacks (None: it is whole): a file its list names that is
    gone or shorter than it was written. A checkpoint of an isoflop before the list is whole when it
    has its state file, the last file it wrote."""
    try:
        listed = json.loads((directory / CHECKPOINT_FILES).read_text())
    except FileNotFoundError:
        return None if (directory / CHECKPOINT_STATE).is_file() else f"it has no {CHECKPOINT_STATE}"
    except (OSError, ValueError):
        return f"its {CHECKPOINT_FILES} cannot be read"
    if not isinstance(listed, dict) or not _is(listed.get("files"), "object"):
        return f"its {CHECKPOINT_FILES} lists no files"
    for name, size in listed["files"].items():
        try:
            have = (directory / name).stat().st_size
        except OSError:
            return f"{name} is gone"
        if have != size:
            return f"{name} has {have} of its {size} bytes"
    return None


def checkpoint_files(directory: Path) -> dict[str, Any]:
    """The list `checkpoint_gap` checks, of the files in `directory` as they are now."""
    return {
        "version": 1,
        "files": {str(f.relative_to(directory)): f.stat().st_size for f in sorted(directory.rglob("*")) if f.is_file()},
    }


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc/<pid>/stat), None where it cannot be
    read: with the pid, it names one process, not whoever gets the pid next."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22; the name before ')' may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def _first_difference(kept: list[dict], sealed: list[dict]) -> int:
    return next((i for i, (a, b) in enumerate(zip(kept, sealed)) if a != b), min(len(kept), len(sealed)))


def _append(path: Path, row: dict, root: Path | None) -> None:
    """One line at the end of `path`, never through a link (it would append to another file)."""
    with on_disk(path, "write"):
        _append_line(path, row, root)


def _append_line(path: Path, row: dict, root: Path | None) -> None:
    directory = _open_dir(path.parent, root)
    try:
        fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE, dir_fd=directory)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise not_own(path, root or path.parent) from None
        raise
    finally:
        os.close(directory)
    with open(fd, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _read_jsonl(path: Path) -> list[dict]:
    """Complete lines only: a line torn by a kill is ignored."""
    if not path.exists():
        return []
    rows = []
    for line in read_text(path).splitlines():
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(row, dict):  # a line that parses to something else is not one of the run's rows either
            rows.append(row)
    return rows


def read_text(path: Path, errors: str = "strict") -> str:
    """A state file's text (`on_disk`: one that cannot be read is one line saying why)."""
    with on_disk(path, "read"):
        return path.read_text(errors=errors)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


# The manifest: what a sweep dir holds (its cells) and where each cell's job stands. `SweepDir`
# reads and writes it, here and nowhere else; every other module works on these objects.

MANIFEST_VERSION = 1  # 0: a manifest written before it had a version (the same keys)
SWEEP, CALIBRATION = "sweep", "calibration"  # what a manifest's cells are: grid cells, or slices of task.train
CELL_STATES = (PENDING, SUBMITTED, RUNNING, FINISHED, FAILED, STOPPED, PAUSED, RETRYING)


class Malformed(ValueError):
    """What in a file read back (a manifest, a run's status or lease) does not fit its schema (said
    in the refusal that names the file)."""


@dataclass
class Failure:
    """One failed attempt of a cell's job, and why (the run's error or its log's exception line)."""

    attempt: int
    reason: str
    at: float  # when the dispatcher saw it (time.time())


@dataclass
class CellState:
    """One cell of a manifest: what it is (a grid cell as `sweep.prepare` planned it, or a slice of
    rows for calibration) and where its job stands (the dispatcher's, kept across reruns)."""

    axes: dict[str, Any] = field(default_factory=dict)
    columns: dict[str, Any] = field(default_factory=dict)  # the run's columns in results.parquet (sweep.run_columns)
    M: int = 0  # steps to the cell's budget (a sweep's cells have it)
    eval_steps: list[int] = field(default_factory=list)
    step_flops: list[float] | None = (
        None  # one step's (search, learning, reward) upper bound; None where planned before isoflop kept it
    )
    rows: list[int] | None = None  # calibration: the slice [start, stop) of task.train
    state: str = PENDING
    submission_id: str | None = None  # the job of the last attempt
    attempts: int = 0  # jobs submitted over every dispatch (an adaptive sweep's budgets are one each)
    failures: list[Failure] = field(default_factory=list)
    error: str | None = None  # why it failed for good
    continues: str | None = None  # the run of a smaller budget whose directory and checkpoint this cell took over
    fingerprint: str | None = (
        None  # what the run computes (`Identity`): its records must carry it; None where planned before isoflop kept it
    )
    stopped_at: float | None = (
        None  # the budget where the adaptive schedule stopped it (paused for the rest of the schedule)
    )
    why: str | None = None  # the adaptive schedule's reason

    @classmethod
    def from_json(cls, data: Any, kind: str) -> CellState:
        if not isinstance(data, dict):
            raise Malformed("not an object")
        if kind == CALIBRATION and not _is(data.get("rows"), "ints"):
            raise Malformed("it needs rows [start, stop]")
        if kind == SWEEP and not _is(data.get("M"), "int"):
            raise Malformed("it needs an integer M")
        values = schema_fields(
            data,
            {
                "axes": "object",
                "columns": "object",
                "M": "int",
                "eval_steps": "ints",
                "step_flops": "numbers",
                "rows": "ints",
                "state": "str",
                "submission_id": "str",
                "attempts": "int",
                "failures": "list",
                "error": "str",
                "continues": "str",
                "stopped_at": "number",
                "why": "str",
                "fingerprint": "str",
            },
        )
        values["failures"] = [
            Failure(
                **schema_fields(
                    _object("failures", f), {"attempt": "int", "reason": "str", "at": "number"}, required=True
                )
            )
            for f in values.get("failures", [])
        ]
        cell = cls(**values)
        bad = [
            k
            for k, kind in (("n", "number"), ("B_p", "number"), ("model", "str"))
            if k in cell.columns and not _is(cell.columns[k], kind)
        ]
        if bad:
            raise Malformed(
                f"columns.{bad[0]} is {json.dumps(cell.columns[bad[0]])[:40]}, "
                f"not a {'name' if bad[0] == 'model' else 'number'}"
            )
        if cell.M < 0:
            raise Malformed(f"M is {cell.M}, not a number of steps")
        if cell.step_flops is not None and (min(cell.step_flops, default=0) < 0 or not sum(cell.step_flops) > 0):
            raise Malformed(f"step_flops {cell.step_flops} is not a step's FLOPs (numbers >= 0, not all 0)")
        if cell.state not in CELL_STATES:
            raise Malformed(f"state '{cell.state}' is none of {', '.join(CELL_STATES)}")
        if (
            cell.state == RETRYING and not cell.failures
        ):  # the dispatcher writes the failure it retries after with the state
            raise Malformed(f"state {RETRYING} without the failure it retries after")
        return cell

    def to_json(self) -> dict:
        """Fields not set (None, empty) are left out, as isoflop before version 1 wrote them."""
        return {k: v for k, v in asdict(self).items() if v is not None and v != [] and v != {}}


@dataclass
class SweepSchedule:
    """The schedule the dispatcher drives the cells by (`schedule.Schedule`): full, or adaptive
    with the budgets it decides at, its margin and indifference, and the ledger column and metric
    its rule reads (a manifest written before the indifference existed ran its rule without one: 0)."""

    name: str = "full"
    budgets: list[float] | None = None
    margin: float | None = None
    column: str | None = None
    metric: str | None = None
    indifference: float | None = None

    @classmethod
    def from_json(cls, data: dict) -> SweepSchedule:
        schedule = cls(
            **schema_fields(
                data,
                {
                    "name": "str",
                    "budgets": "numbers",
                    "margin": "number",
                    "column": "str",
                    "metric": "str",
                    "indifference": "number",
                },
            )
        )
        if schedule.name != "full" and None in (schedule.budgets, schedule.margin, schedule.column, schedule.metric):
            raise Malformed(f"schedule {schedule.name} needs budgets, margin, column and metric")
        if schedule.name != "full" and schedule.indifference is None:
            schedule.indifference = 0.0
        return schedule


@dataclass
class Infeasible:
    """A cell of the grid that cannot run, and why (the plan's reason)."""

    axes: dict[str, Any]
    reason: str


@dataclass
class Manifest:
    """A sweep dir's cells by run id (or a calibration's slices), the schedule, and the grid's
    infeasible cells."""

    name: str = ""
    kind: str = SWEEP
    schedule: SweepSchedule = field(default_factory=SweepSchedule)
    cells: dict[str, CellState] = field(default_factory=dict)
    infeasible: list[Infeasible] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """A manifest of this version or an earlier one (version 0 has the same keys, without
        `version`, and `kind` only on a calibration's); keys it does not know are left out."""
        if not isinstance(data, dict):
            raise Malformed("not a JSON object")
        top = schema_fields(
            data,
            {
                "version": "int",
                "name": "str",
                "kind": "str",
                "cells": "object",
                "schedule": "object",
                "infeasible": "list",
            },
        )
        if "cells" not in top:
            raise Malformed("no cells object")
        if top.get("version", 0) > MANIFEST_VERSION:
            raise Malformed(
                f"version {top['version']}, written by a newer isoflop: this one reads up to version {MANIFEST_VERSION}"
            )
        kind = top.get("kind", SWEEP)
        if kind not in (SWEEP, CALIBRATION):
            raise Malformed(f"kind '{kind}' is neither {SWEEP} nor {CALIBRATION}")
        cells = {}
        for run_id, cell in top["cells"].items():
            if run_id in ("", ".", "..") or Path(run_id).name != run_id:  # it names the run's directory under runs/
                raise Malformed(f"cell '{run_id}' is not a directory name")
            try:
                cells[run_id] = CellState.from_json(cell, kind)
            except Malformed as e:
                raise Malformed(f"cell '{run_id}' is malformed ({e})") from None
        infeasible = [
            Infeasible(**schema_fields(_object("infeasible", i), {"axes": "object", "reason": "str"}, required=True))
            for i in top.get("infeasible", [])
        ]
        return cls(
            name=top.get("name", ""),
            kind=kind,
            schedule=SweepSchedule.from_json(top.get("schedule", {})),
            cells=cells,
            infeasible=infeasible,
        )

    def to_json(self) -> dict:
        return {
            "version": MANIFEST_VERSION,
            "name": self.name,
            "kind": self.kind,
            "schedule": {k: v for k, v in asdict(self.schedule).items() if v is not None},
            "cells": {run_id: cell.to_json() for run_id, cell in self.cells.items()},
            "infeasible": [asdict(i) for i in self.infeasible],
        }


_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
}
_CHECKS["ints"] = lambda v: isinstance(v, list) and all(map(_CHECKS["int"], v))
_CHECKS["numbers"] = lambda v: isinstance(v, list) and all(map(_CHECKS["number"], v))


def _is(value: Any, kind: str) -> bool:
    return _CHECKS[kind](value)


def _malformed(e: Exception) -> str:
    """Why a JSON record (a manifest, a run's status) that was read does not parse, for its one-line refusal."""
    return "nested too deep" if isinstance(e, RecursionError) else str(e)


def _eval_point(row: Any) -> bool:
    """A sealed row: an object with an integer step, and the ledger columns readers add up as finite numbers >= 0."""
    return (
        isinstance(row, dict)
        and _is(row.get("step"), "int")
        and all(_is(row[k], "number") and 0 <= row[k] < math.inf for k in ("rollouts", "flops_total") if k in row)
    )


def schema_fields(data: dict, schema: dict[str, str], required: bool = False) -> dict[str, Any]:
    """The keys of `schema` that `data` has (all of them, if `required`), each checked as its kind;
    numbers as floats."""
    out = {}
    for key, kind in schema.items():
        if key not in data:
            if required:
                raise Malformed(f"{key} is missing")
            continue
        value = data[key]
        if not _is(value, kind):
            _refuse(key, value)
        out[key] = float(value) if kind == "number" else [float(v) for v in value] if kind == "numbers" else value
    return out


def _object(key: str, value: Any) -> dict:
    """An entry of the list `key` (failures, infeasible), which is an object."""
    if not isinstance(value, dict):
        _refuse(key, value)
    return value


def _refuse(key: str, value: Any) -> NoReturn:
    raise Malformed(f"{key} is {json.dumps(value)[:40]}")


# A run's own files read back: status.json and lease.json, each checked against its schema.

STATUS_VERSION = 1  # 0: a status written before it had a version (the same keys, no pid start time)
RUN_STATES = (PENDING, RUNNING, FINISHED, FAILED, STOPPED, PAUSED)


@dataclass
class RunStatus:
    """A run's status.json: its state as the run last wrote it, where and by which process, and, once
    finished, its sealed rows. Read by `RunFiles.status`; written by `RunFiles.set_status`."""

    state: str = PENDING
    updated: float | None = None
    host: str | None = None
    pid: int | None = None
    pid_started: int | None = None  # the pid's start time (`process_start`): a reused pid is another process
    started: float | None = None  # when the run's training began (rollouts/s in `status`)
    step: int | None = None
    M: int | None = None
    error: str | None = None
    paused_at: float | None = None
    rows: list | None = None  # finished: the sealed eval points; a calibration slice running: its [start, stop]
    ledger: dict[str, float] = field(default_factory=dict)  # the ledger's values at `step` (rollouts, flops_total ...)
    run_id: str | None = None  # whose record this is (`Identity`); None: written by an isoflop before identities
    fingerprint: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> RunStatus:
        """A status of this version or an earlier one; nulls read as absent, keys it does not know as
        the ledger's numbers (others are left out)."""
        if not isinstance(data, dict):
            raise Malformed("not a JSON object")
        data = {k: v for k, v in data.items() if v is not None}
        schema = {
            "version": "int",
            "state": "str",
            "updated": "number",
            "host": "str",
            "pid": "int",
            "pid_started": "int",
            "started": "number",
            "step": "int",
            "M": "int",
            "error": "str",
            "paused_at": "number",
            "rows": "list",
            "run_id": "str",
            "fingerprint": "str",
        }
        values = schema_fields(data, schema)
        if "state" not in values:
            raise Malformed("no state")
        if values.pop("version", 0) > STATUS_VERSION:
            raise Malformed(
                f"version {data['version']}, written by a newer isoflop: this one reads up to version {STATUS_VERSION}"
            )
        status = cls(**values, ledger={k: float(v) for k, v in data.items() if k not in schema and _is(v, "number")})
        if status.state not in RUN_STATES:
            raise Malformed(f"state '{status.state}' is none of {', '.join(RUN_STATES)}")
        if (
            status.state == FINISHED
            and status.rows is not None
            and not (status.rows and all(_eval_point(r) for r in status.rows))
        ):
            raise Malformed(
                f"its sealed rows {json.dumps(status.rows)[:40]} are not eval points (a non-empty "
                "list of objects with a step, and rollouts and flops_total finite numbers >= 0)"
            )
        return status


LEASE_VERSION = 1  # 0: a lease written before it had a version (the same keys)


@dataclass
class Lease:
    """A run dir's lease.json: the attempt that writes the run dir now (`RunFiles.take_lease`)."""

    holder: str
    since: float
    version: int = LEASE_VERSION

    @classmethod
    def from_json(cls, data: Any) -> Lease:
        if not isinstance(data, dict):
            raise Malformed("not a JSON object")
        lease = cls(
            **schema_fields(data, {"holder": "str", "since": "number"}, required=True),
            version=schema_fields(data, {"version": "int"}).get("version", 0),
        )
        if lease.version > LEASE_VERSION:
            raise Malformed(
                f"version {lease.version}, written by a newer isoflop: this one reads up to version {LEASE_VERSION}"
            )
        return lease


class SweepDir:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.manifest_file = self.path / MANIFEST
        self.results_file = self.path / RESULTS
        self.config_file = self.path / "sweep.yaml"
        self._fingerprints: dict[str, str] | None = None  # run id -> its cell's fingerprint, as the manifest has it

    def run(self, run_id: str, fingerprint: str | None = None) -> RunFiles:
        """A run's files, checked against its cell's identity: `fingerprint`, else the manifest's
        (a run id's fingerprint never changes: the one remembered is never stale)."""
        if fingerprint is None:
            if self._fingerprints is None:
                self._fingerprints = {}
                self._remember(self.manifest())
            fingerprint = self._fingerprints.get(run_id)
        identity = Identity(run_id, fingerprint) if fingerprint is not None else None
        return RunFiles(self.path / "runs" / run_id, identity=identity, root=self.path)

    def _remember(self, manifest: Manifest) -> None:
        if self._fingerprints is not None:
            self._fingerprints.update(
                {rid: cell.fingerprint for rid, cell in manifest.cells.items() if cell.fingerprint is not None}
            )

    def check_tree(self) -> None:
        """Before a sweep computes anything: no link where its own files are (the sweep dir, its
        entries, runs/, each run dir and its entries), and no file where a run's directory belongs.
        Writes check this too (`_open_dir`); refused here, nothing is written at all."""
        with on_disk(self.path, "read"):
            for path in self._tree():
                if path.is_symlink():
                    raise not_own(path, self.path)
                self._check_writable(path)
            runs = self.path / "runs"
            for run_dir in runs.iterdir() if runs.is_dir() else ():
                if not run_dir.is_dir():
                    raise not_own(run_dir, self.path)

    def _check_writable(self, path: Path) -> None:
        """One of the sweep's own files or directories can be written where the sweep will write it:
        a state file is a file, not a directory, and nothing is read-only or immutable (a run would
        meet it only after its compute, as a traceback)."""
        if path.name in STATE_FILES and path.is_dir():
            raise fs_error(IsADirectoryError(errno.EISDIR, "is a directory"), path, "write")
        if path.exists() and not os.access(
            path, os.W_OK
        ):  # mode bits for others; an immutable file or dir (chattr +i) for root too
            raise fs_error(PermissionError(errno.EACCES, "permission denied"), path, "write")

    def _tree(self):
        yield self.path
        for directory in (self.path, self.path / "runs"):
            if directory.is_dir() and not directory.is_symlink():
                for entry in directory.iterdir():
                    yield entry
                    if directory.name == "runs" and entry.is_dir() and not entry.is_symlink():
                        yield from entry.iterdir()

    def manifest(self) -> Manifest:
        """The manifest, or an empty one where none is written yet. One that cannot be read is
        refused (ConfigError naming the file), never taken for empty: a sweep would then write its
        own cells over it, and every other finished run would drop out of results.parquet."""
        try:
            text = self.manifest_file.read_text()
        except (
            FileNotFoundError,
            NotADirectoryError,
        ):  # no manifest there (NotADirectory: the dir's path runs through a file)
            return Manifest()
        except OSError as e:  # there, but not readable (permissions, a directory, a name too long): not damaged
            raise fs_error(e, self.manifest_file, "read") from None
        try:
            return Manifest.from_json(json.loads(text))
        except (ValueError, RecursionError) as e:  # not JSON (a torn, cut or absurdly nested file), or not a manifest
            raise ConfigError(
                f"{self.manifest_file} is not a well-formed sweep manifest ({_malformed(e)}): nothing was changed; "
                "move it aside to rebuild it from the grid (finished runs in runs/ are found again)"
            ) from None

    def write_manifest(self, manifest: Manifest) -> None:
        write_json(self.manifest_file, manifest.to_json(), root=self.path)
        self._remember(manifest)

    def write_config(self, text: str) -> None:
        """sweep.yaml: the resolved sweep config."""
        atomic_write(self.config_file, text, root=self.path)

    def flops_scale(self) -> dict[str, float]:
        """Per model, the mean of measured / predicted-upper-bound FLOPs per step over finished runs:
        how much shorter real prompts and completions are than the bounds the plan assumes."""
        ratios: dict[str, list[float]] = {}
        for run_id, cell in self.manifest().cells.items():
            files = self.run(run_id)
            rows = files.finished_rows() if cell.step_flops is not None and "model" in cell.columns else None
            if rows and rows[-1]["step"] > 0:
                if not rows[-1].get("flops_total", 0) > 0:
                    raise ConfigError(
                        f"{files.status_file}: its last sealed eval point (step {rows[-1]['step']}) records "
                        "no flops_total: the run's record is damaged; move the run dir aside to run it again"
                    )
                bound = rows[-1]["step"] * sum(cell.step_flops)
                ratios.setdefault(cell.columns["model"], []).append(rows[-1]["flops_total"] / bound)
        return {model: sum(r) / len(r) for model, r in ratios.items()}

    def collect(self) -> pd.DataFrame:
        """results.parquet from the finished runs of the manifest, and the eval points of those an
        adaptive sweep stopped (the points a full sweep records for them too): axes + eval-point rows."""
        frames, metrics = [], set()
        for run_id, cell in self.manifest().cells.items():
            files = self.run(run_id)
            rows = files.finished_rows() or (files.read_metrics() if files.status().state == PAUSED else None)
            if rows:
                meta = pd.DataFrame([{"run_id": run_id, **cell.columns}] * len(rows))
                eval_points = pd.DataFrame(rows).drop(columns=[*meta.columns, *IDENTITY_KEYS], errors="ignore")
                metrics.update(eval_points.columns)
                frames.append(pd.concat([meta, eval_points], axis=1))
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if not df.empty:  # a metric no run records (kl without a KL term, value_loss without a value head) is left out
            df = (
                df.drop(columns=[c for c in metrics if df[c].isna().all()])
                .sort_values(["run_id", "step"])
                .reset_index(drop=True)
            )
        atomic_write(self.results_file, df.to_parquet(index=False), root=self.path)
        self._collect_problems(df)
        return df

    def _collect_problems(self, results: pd.DataFrame) -> None:
        """problems.parquet: per eval point in results, each validation problem's correct samples."""
        columns = ["run_id", "step", "problem_id", "correct", "samples"]
        frames = []
        for run_id, steps in results.groupby("run_id")["step"] if not results.empty else ():
            wanted = set(steps)
            for row in self.run(run_id).read_problems():
                if row["step"] in wanted:
                    frames.append(pd.DataFrame({"run_id": run_id, **row}))
        df = pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)
        df = df.drop_duplicates(["run_id", "step", "problem_id"], keep="last")  # an eval point redone after a crash
        atomic_write(self.path / PROBLEMS, df.to_parquet(index=False), root=self.path)


def load_results(path: Path | str) -> pd.DataFrame:
    """A sweep directory, a results.parquet or a CSV with the same columns."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS
    if path.suffix.lower() == ".csv":
        with open(path, newline="") as f:
            rows = csv.reader(f)
            width = len(next(rows, []))
            for row in rows:
                if row and len(row) != width:  # pandas would fill a short line with NaN
                    raise ValueError(f"line {rows.line_num} has {len(row)} fields, the header {width}")
        return pd.read_csv(path)
    return pd.read_parquet(path)
