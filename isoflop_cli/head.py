"""The local Ray head a sweep starts when it is given no cluster: its own process group, every
socket on 127.0.0.1, every port its own (so sweeps in different dirs run heads side by side), token
authentication, usage stats off; stopped by its pid, never by name.

Run as `python -m isoflop_cli.head` by `ray_cluster`; that process runs `ray start --head --block`
as its child and records its address in the sweep dir's `ray-head.json` once jobs can be submitted.

A head is stopped, and its temp dir removed, only where they provably are this dir's: each start
draws a nonce, written into `ray-head.json`, onto the head's command line, and into a marker in its
temp dir with the path of the `ray-head.json` it belongs to. A record copied with its sweep dir (or
left stale) names another dir's head and temp dir: those are left alone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from isoflop_cli.config.schema import cache_dir
from isoflop_cli.errors import ConfigError, HeadError
from isoflop_cli.processes import die_with_parent
from isoflop_cli.store import FILE_MODE, Malformed, read_json, schema_fields, write_json

HEAD_FILE = "ray-head.json"
# Ray's own tree, inside the head's temp dir: Ray makes its temp dir, session dir, sockets/ and logs/
# mode 0777 (again whenever a process joins), so another local user could reach the head's sockets
# and read its logs; the temp dir around it is this user's alone (0700), and Ray never touches it.
RAY_DIR = "ray"
HEAD_VERSION = 1  # 0: a record written before it had a version (no nonce)
TEMP_MARKER = "isoflop-head.json"  # in a head's temp dir: the record it belongs to and its nonce


@dataclass
class HeadRecord:
    """A sweep dir's `ray-head.json`: the local head's address, pid and temp dir, and the nonce that
    proves the pid and the temp dir are this record's head (None in a record of an older isoflop)."""

    address: str
    pid: int
    temp_dir: str | None = None
    gcs_address: str | None = None
    nonce: str | None = None
    version: int = HEAD_VERSION

    @classmethod
    def from_json(cls, data: Any) -> HeadRecord:
        if not isinstance(data, dict):
            raise Malformed("not a JSON object")
        values = {
            **schema_fields(data, {"address": "str", "pid": "int"}, required=True),
            **schema_fields(data, {"temp_dir": "str", "gcs_address": "str", "nonce": "str", "version": "int"}),
        }
        record = cls(**{"version": 0, **values})
        if record.version > HEAD_VERSION:
            raise Malformed(
                f"version {record.version}, written by a newer isoflop: this one reads up to version {HEAD_VERSION}"
            )
        return record


def read_head(info_file: Path) -> HeadRecord | None:
    """The head recorded in `info_file`, None where there is none. One that cannot be read is refused
    (ConfigError naming the file): which head and temp dir it named is unknown, so nothing of them
    may be stopped or removed, and a new head would write over it."""
    try:
        return HeadRecord.from_json(json.loads(info_file.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        raise ConfigError(
            f"{info_file} is not a readable Ray head record ({why}): nothing was changed; "
            "if no isoflop head of this sweep dir runs, move it aside"
        ) from None


@contextlib.contextmanager
def ray_cluster(cluster: DictConfig, state_dir: Path) -> Iterator[str]:
    """The Ray Jobs address: cluster.address, $RAY_ADDRESS, or a local head on 127.0.0.1.

    The local head runs in its own process group (its pid and address in `state_dir/ray-head.json`),
    on loopback only and on ports of its own, so a sweep in another dir runs its own head beside it.
    A killed CLI leaves it and its jobs running, and the next `isoflop sweep` on the dir reattaches
    to them; otherwise it is stopped, by that pid, when the sweep ends, fails or is interrupted. The
    caller holds `sweep_lock(state_dir)`, so the head recorded there is this sweep's own.
    """
    address = cluster.address or os.environ.get("RAY_ADDRESS")
    if address:
        yield address
        return
    os.environ["RAY_AUTH_MODE"] = "token"  # the head's token (~/.ray/auth_token); jobs use it too
    info_file = state_dir.absolute() / HEAD_FILE
    head = _attach(info_file) or _start_head(cluster, info_file)
    try:
        yield head.address
    finally:
        _stop_head(head.pid, info_file, head.nonce)
        _remove_temp_dir(head.temp_dir, info_file, head.nonce)
        info_file.unlink(missing_ok=True)


def _attach(info_file: Path) -> HeadRecord | None:
    """The head recorded in `info_file` if it still runs (a killed CLI left it), else None; what a
    dead head of this dir left (its process group, its temp dir) is cleared on the way."""
    head = read_head(info_file)
    if head is None:
        return None
    if _is_head(head.pid, info_file, head.nonce):
        return head
    if _owns(head.temp_dir, info_file, head.nonce):  # else a copied or stale record: another dir's head and temp dir
        _stop_head(head.pid, info_file, head.nonce, grace_s=0)
        _remove_temp_dir(head.temp_dir, info_file, head.nonce)
    return None


def _is_head(pid, info_file: Path, nonce: str | None = None) -> bool:
    """`pid` is the head process started for this `info_file` with this `nonce` (not a reused pid,
    not another dir's head)."""
    try:
        args = Path(f"/proc/{int(pid)}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (OSError, TypeError, ValueError):
        return False
    return "isoflop_cli.head" in args and str(info_file) in args and (nonce is None or nonce in args)


def _owns(temp_dir: str | None, info_file: Path, nonce: str | None) -> bool:
    """`temp_dir` was made for the head of this `info_file` with this `nonce` (its marker says so)."""
    return (
        nonce is not None
        and temp_dir is not None
        and read_json(Path(temp_dir) / TEMP_MARKER) == {"info": str(info_file), "nonce": nonce}
    )


MIN_OPEN_FILES = 1024  # a local head's processes, each with its sockets, pipes and logs: at 64 Ray stalls for minutes
MIN_ADDRESS_SPACE = (
    32 << 30
)  # per process: the raylet alone reserves ~7 GiB it never touches, a job's Python with torch more
SOCKET_PATH_MAX = 107  # bytes of a unix socket's path (sun_path, less its NUL)
# The longest socket path a local head binds, below the temp dir: mkdtemp's name, Ray's session dir
# (its date, microseconds and the pid of `ray start`, PID below), the plasma store's socket.
RAY_SOCKET = f"/isoflop-ray-xxxxxxxx/{RAY_DIR}/session_2026-01-01_00-00-00_000000_PID/sockets/plasma_store"


def _pid_digits() -> int:
    """The most digits a pid has on this machine (kernel.pid_max)."""
    try:
        return len(str(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1))
    except (OSError, ValueError):
        return 7  # Linux's largest pid_max, 4194304


def check_limits() -> None:
    """The machine's limits a local Ray head needs, checked before it starts: below them Ray fails
    minutes later, as "no room" in the cluster or "exited (1)" with the reason deep in its log.
    Open files (ulimit -n), address space (ulimit -v), and the length of the socket paths Ray binds
    under the temp dir ($TMPDIR): each refused in one line with what to do."""
    files, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if files != resource.RLIM_INFINITY and files < MIN_OPEN_FILES:
        raise ConfigError(
            f"the open-files limit is {files} (ulimit -n); a local Ray head needs at least {MIN_OPEN_FILES:,}: raise "
            f"it (ulimit -n {MIN_OPEN_FILES if hard == resource.RLIM_INFINITY else min(max(hard, 0), 65536)}) and rerun"
        )
    space, _ = resource.getrlimit(resource.RLIMIT_AS)
    if space != resource.RLIM_INFINITY and space < MIN_ADDRESS_SPACE:
        raise ConfigError(
            f"the address-space limit is {space / 2**30:.3g} GiB (ulimit -v); a local "
            "Ray head's processes reserve more than they use and need at least "
            f"{MIN_ADDRESS_SPACE >> 30} GiB each: lift it (ulimit -v unlimited) and rerun"
        )
    longest = len(os.fsencode(os.path.abspath(tempfile.gettempdir()))) + len(
        RAY_SOCKET.replace("PID", "0" * _pid_digits())
    )
    if longest > SOCKET_PATH_MAX:
        raise ConfigError(
            f"the temp dir {tempfile.gettempdir()} ($TMPDIR) is too long for a local Ray head's "
            f"unix sockets: their paths there reach {longest} bytes, at most {SOCKET_PATH_MAX} "
            "are possible; set TMPDIR to a short directory (such as /tmp) and rerun"
        )


def _start_head(cluster: DictConfig, info_file: Path, timeout_s: float = 180) -> HeadRecord:
    info_file.unlink(missing_ok=True)
    cpus = cluster.local_cpus or os.cpu_count() or 1
    log_file = info_file.with_suffix(".log")
    nonce = secrets.token_hex(8)
    temp_dir = tempfile.mkdtemp(prefix="isoflop-ray-")  # short: Ray's unix sockets live under it
    write_json(Path(temp_dir) / TEMP_MARKER, {"info": str(info_file), "nonce": nonce})
    with open(
        os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE), "w"
    ) as log:  # never world-writable
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "isoflop_cli.head",
                "--cpus",
                str(cpus),
                "--info",
                str(info_file),
                "--temp-dir",
                temp_dir,
                "--nonce",
                nonce,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            head = read_head(info_file)
            if head is not None and head.pid == proc.pid:
                return head
            if proc.poll() is not None:
                raise HeadError(f"the local Ray head exited ({proc.returncode}) before it was ready; see {log_file}")
            time.sleep(0.2)
        raise HeadError(f"the local Ray head did not start in {timeout_s:.0f}s; see {log_file}")
    except BaseException:  # an error, or Ctrl-C while it starts: no head is left behind
        _stop_head(proc.pid, info_file, nonce)
        _remove_temp_dir(temp_dir, info_file, nonce)
        info_file.unlink(missing_ok=True)
        raise


def _stop_head(pid: int, info_file: Path, nonce: str | None, grace_s: float = 60) -> None:
    """SIGTERM (the head stops Ray cleanly), then SIGKILL to its process group, and wait until the
    group is gone. A live pid that is not this dir's head is left alone: the pid was reused, so the
    head and its group are long gone. (A dead head's group is this dir's to stop only where its temp
    dir proves it: `_attach`.)"""
    if not isinstance(pid, int) or pid <= 1 or pid in (os.getpid(), os.getpgrp()):
        return
    if _alive(pid) and not _is_head(pid, info_file, nonce):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and _alive(pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.time() + 10
    with contextlib.suppress(ProcessLookupError, PermissionError):
        while time.time() < deadline:
            _alive(pid)  # reaps it when it is our child
            os.killpg(pid, 0)
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _remove_temp_dir(path: str | None, info_file: Path, nonce: str | None) -> None:
    """The head's temp dir, where its marker proves it this head's (`_owns`)."""
    if _owns(path, info_file, nonce) and Path(path).name.startswith("isoflop-ray-"):
        shutil.rmtree(path, ignore_errors=True)


# `ray start` flags that take a port: all are given one, so no two heads meet on Ray's defaults.
RAY_PORT_FLAGS = (
    "port",
    "dashboard-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
    "ray-client-server-port",
    "node-manager-port",
    "object-manager-port",
)
# Prometheus metrics are served without the token to anyone on the machine, so none are served:
# RAY_enable_metrics_collection=0 keeps the dashboard agent's exporter (metrics-export-port) shut,
# and the autoscaler's and dashboard's own servers, which Ray 2.60 starts without a switch on fixed
# ports taken from the environment (44217, 44227), are given a port no socket can bind: each start
# fails, which Ray logs and goes on from. tests/test_head.py asks every listener without the token.
RAY_METRICS_OFF = {
    "RAY_enable_metrics_collection": "0",
    "AUTOSCALER_METRIC_PORT": "65536",
    "DASHBOARD_METRIC_PORT": "65536",
}
# When its first driver connects, a raylet starts one idle default worker per CPU so that tasks
# start warm. Everything a sweep asks of Ray (its jobs' supervisors, the preflight's tasks) carries
# a job's runtime env, which no default worker matches: those workers start (~0.8 CPU-s each), idle
# and are reaped unused (10 in one end-to-end test tier). The first job on a fresh 2-CPU head took
# 1.8 s with them, 1.1 s without.
RAY_NO_PRESTART = {"RAY_prestart_worker_first_driver": "0"}


def serve_head(cpus: int, info_file: Path, temp_dir: Path, nonce: str) -> None:
    """The local head process: `ray start --head --block` as its child, every socket on 127.0.0.1,
    every port its own, token auth, usage stats off; until SIGTERM or SIGINT (then it stops Ray) or
    until Ray exits. Records its address in `info_file` once jobs can be submitted."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: else Ray "resolves" --node-ip-address=127.0.0.1 to the
    # machine's address (services.resolve_ip_for_localhost), and gcs_server, raylet, the dashboard
    # agent, the runtime-env agent, the client server and every worker then listen on it or on all
    # interfaces; with it they take 127.0.0.1 (Ray then also refuses other nodes joining).
    env = dict(
        os.environ,
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        **RAY_METRICS_OFF,
        **RAY_NO_PRESTART,
    )
    _ensure_token()
    for attempt in range(3):
        flags = dict(zip(RAY_PORT_FLAGS, free_ports(len(RAY_PORT_FLAGS))))
        ray = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                "--block",
                "--node-ip-address=127.0.0.1",
                "--dashboard-host=127.0.0.1",
                "--include-dashboard=true",
                # No log monitor: it copies workers' output to Ray drivers, and isoflop has none. A
                # job's log is the file its supervisor writes, read through the dashboard
                # (`dispatch._stream_logs`). About 1.5 CPU-s a head over an end-to-end test.
                "--include-log-monitor=false",
                f"--num-cpus={cpus}",
                "--num-gpus=0",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir / RAY_DIR}",
                "--min-worker-port=0",
                "--max-worker-port=0",
                *(f"--{flag}={port}" for flag, port in flags.items()),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        address = f"http://127.0.0.1:{flags['dashboard-port']}"
        if _wait_ready(ray, address, flags["dashboard-agent-listen-port"], stop):
            break
        _end(ray)
        if stop.is_set():
            return
        print(f"isoflop: the Ray head did not come up (try {attempt + 1} of 3)", flush=True)
    else:
        raise SystemExit(1)
    write_json(
        info_file,
        asdict(
            HeadRecord(
                address=address,
                pid=os.getpid(),
                temp_dir=str(temp_dir),
                gcs_address=f"127.0.0.1:{flags['port']}",
                nonce=nonce,
            )
        ),
    )
    while not stop.is_set() and ray.poll() is None:
        stop.wait(1)
    _end(ray)


def _ensure_token() -> None:
    """`ray start` needs the token that `ray.init` would make (~/.ray/auth_token): made once, atomically
    (two heads starting at once agree on it), readable by this user only."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".auth_token.")  # mode 0600
    try:
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


PORTS_HELD_S = 600  # a drawn port is kept from other heads' draws this long
PORTS_LOCK_WAIT_S = 10.0  # the registry's lock is waited for this long; then ports are drawn without it


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1, drawn below the kernel's ephemeral range (where the ports
    Ray leaves to the kernel land, so none of those takes one before Ray binds it) and outside Ray
    client's 23000-24000. Heads starting at once draw apart: draws are kept for PORTS_HELD_S in a
    registry only this user can write (`_registry`), read and written under its flock. What the
    registry cannot give is not waited for: a lock held past PORTS_LOCK_WAIT_S, or no directory of
    the user's own, and the ports are drawn without it (said on stderr); entries that cannot be a
    draw (a time ahead of now, a port outside the pool) are ignored."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    pool = [p for p in range(20000, min(low, 32768)) if not 23000 <= p < 24000]
    if len(pool) < 1000:
        pool = [p for p in range(max(low, 1024), 65536)]  # a narrow ephemeral range: draw inside it
    with contextlib.ExitStack() as stack:
        fd, taken = _locked_registry(stack, set(pool))
        ports: list[int] = []
        for port in random.sample(pool, len(pool)):
            if port in taken:
                continue
            probe = stack.enter_context(socket.socket())  # held until all n are drawn: n distinct ports
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == n:
                break
        if fd is not None:
            taken.update({p: time.time() for p in ports})
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(taken).encode(), 0)
    if len(ports) < n:
        raise HeadError(f"no {n} free ports on 127.0.0.1 for a local Ray head")
    return ports


def _registry() -> Path | None:
    """The port registry's file, in the first of the user's runtime directory ($XDG_RUNTIME_DIR), the
    user's default isoflop cache (~/.cache/isoflop, whatever ISOFLOP_CACHE says: one registry for
    every head the user starts on this machine) and ISOFLOP_CACHE that is a directory this user owns
    that no one else can write; None where none is (the shared temp directory would let any user's
    process lock every head's start)."""
    for base in (os.environ.get("XDG_RUNTIME_DIR"), Path.home() / ".cache" / "isoflop", cache_dir()):
        if not base:
            continue
        try:
            Path(base).mkdir(parents=True, exist_ok=True, mode=0o700)
            info = os.stat(base)
        except OSError:
            continue
        if info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return Path(base) / f"isoflop-ray-ports-{os.getuid()}.json"
    return None


def _locked_registry(stack: contextlib.ExitStack, pool: set[int]) -> tuple[int | None, dict[int, float]]:
    """(the registry's fd, locked until `stack` closes, and its plausible draws), or (None, {}) where
    there is no registry of the user's own or its lock is held past PORTS_LOCK_WAIT_S (said)."""
    path = _registry()
    if path is None:
        print(
            "isoflop: no directory of this user's alone for the port registry: ports drawn without it", file=sys.stderr
        )
        return None, {}
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None, {}
    stack.callback(os.close, fd)
    deadline = time.monotonic() + PORTS_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                print(
                    f"isoflop: the port registry {path} has been locked for {PORTS_LOCK_WAIT_S:g} s by another "
                    "process: ports drawn without it",
                    file=sys.stderr,
                )
                return None, {}
            time.sleep(0.05)
    now = time.time()
    try:
        entries = json.loads(os.pread(fd, 1 << 20, 0) or b"{}")
        taken = {int(p): float(t) for p, t in entries.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return fd, {}
    return fd, {p: t for p, t in taken.items() if p in pool and now - PORTS_HELD_S < t <= now + 1}


def _wait_ready(
    ray: subprocess.Popen, address: str, agent_port: int, stop: threading.Event, timeout_s: float = 120
) -> bool:
    """The dashboard answers and the dashboard agent (which runs the jobs) listens."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set() and ray.poll() is None:
        if _answers(address) and listens(agent_port):
            return True
        stop.wait(0.5)
    return False


def _answers(address: str) -> bool:
    try:
        urllib.request.urlopen(f"{address}/api/version", timeout=2).close()
    except urllib.error.HTTPError:
        return True  # it answers (401 without the token)
    except OSError:
        return False
    return True


def listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _end(proc: subprocess.Popen, grace_s: float = 45) -> None:
    """Stop `ray start --block`: on SIGTERM it stops every Ray process it started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RayLauncher:
    """`cluster.launcher=ray` (launchers.py): each run a Ray job on cluster.address, $RAY_ADDRESS,
    or a local head this sweep starts (`ray_cluster`)."""

    places_probe = False  # the probe lists the Ray cluster's nodes and checks one of each type

    def __init__(self, cluster: DictConfig):
        self.cluster = cluster

    @property
    def address(self) -> str | None:
        return self.cluster.address or os.environ.get("RAY_ADDRESS")

    def check(self) -> None:
        """The cluster answers at its address; or a local head has what a job asks for (a job asking
        for more would wait forever)."""
        if self.address:
            from ray.exceptions import AuthenticationError
            from ray.job_submission import JobSubmissionClient

            try:
                JobSubmissionClient(self.address)
            except AuthenticationError:
                raise ConfigError(
                    f"the Ray cluster at {self.address} asks for a token: set RAY_AUTH_MODE=token, with the cluster's "
                    "token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
                ) from None
            except (ConnectionError, ValueError, RuntimeError) as e:
                raise ConfigError(f"cannot reach the Ray cluster at {self.address}: {str(e).splitlines()[0]}") from None
            return
        if self.cluster.gpus_per_run:
            raise ConfigError(
                "cluster.gpus_per_run > 0 needs a Ray cluster with GPUs (cluster.address): the local head has none"
            )
        if self.cluster.cpus_per_run > self._local_cpus():
            raise ConfigError(
                f"cluster.cpus_per_run={self.cluster.cpus_per_run} is more than "
                f"the local head's {self._local_cpus()} CPUs (cluster.local_cpus)"
            )
        check_limits()

    def capacity(self, cells: int) -> int:
        """A cluster queues every job; a local head runs what its CPUs hold."""
        return cells if self.address else max(1, int(self._local_cpus() // self.cluster.cpus_per_run))

    def _local_cpus(self) -> int:
        return self.cluster.local_cpus or os.cpu_count() or 1

    def open(self, state_dir: Path):
        return ray_cluster(self.cluster, state_dir)

    def keeps_logs(self, state_dir: Path) -> bool:
        """A cluster keeps its jobs' logs; a local head only while it runs."""
        if self.address:
            return True
        info_file = state_dir.absolute() / HEAD_FILE
        head = read_json(info_file)
        return isinstance(head, dict) and isinstance(head.get("pid"), int) and _is_head(head["pid"], info_file)

    def jobs(self, address: str, state_dir: Path):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(address)

    def batch(self, jobs):
        return contextlib.nullcontext()

    def placement(self, jobs, nodes: list, cpus: float, gpus: float) -> list[str]:
        from isoflop_cli.preflight import unplaceable

        return unplaceable(nodes, cpus, gpus)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A local Ray head for isoflop (started by `isoflop sweep`).")
    parser.add_argument("--cpus", type=int, required=True)
    parser.add_argument("--info", type=Path, required=True)
    parser.add_argument("--temp-dir", type=Path, required=True)
    parser.add_argument("--nonce", required=True)
    args = parser.parse_args()
    serve_head(args.cpus, args.info, args.temp_dir, args.nonce)
