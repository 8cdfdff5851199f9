"""A real single-node SLURM on this machine, every daemon on 127.0.0.1: munged, MariaDB and
slurmdbd (the accounting that `sacct`, and so submitit's job states, read), slurmctld and slurmd.
A sweep with `cluster=slurm` submits to it as to any SLURM cluster, given SLURM_CONF.

    python scripts/local_slurm.py install      # Debian's packages, where apt can (`make slurm`)
    python scripts/local_slurm.py start DIR    # prints the SLURM_CONF to export
    python scripts/local_slurm.py stop DIR

Needs Debian's packages (APT below) and root, as SLURM's daemons do. Each
daemon runs in the foreground as this script's child in its own session, its PID in
DIR/slurm.json, by which `stop` ends it. The node is this machine under its own hostname, with
its CPUs; state, spool, logs, the munge key and the database all live in DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from isoflop_cli.head import free_ports, listens

PACKAGES = (
    "slurmctld",
    "slurmd",
    "sbatch",
    "sacct",
    "slurmdbd",
    "munged",
    "mungekey",
    "mariadbd",
    "mariadb-install-db",
)
APT = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")
STATE = "slurm.json"


def missing() -> list[str]:
    """The programs this needs that are not installed (PATH, plus the sbin dirs daemons live in)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [p for p in PACKAGES if shutil.which(p, path=path) is None]


def install() -> str | None:
    """Install APT where it is missing and apt-get can (root); None when all is there, else why not.
    Never fails: without these the real-SLURM test is skipped and says why."""
    if not missing():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"not installed: {', '.join(missing())} (needs root and apt-get: apt-get install {' '.join(APT)})"
    install = ["timeout", "600", "apt-get", "install", "-y", "-q", *APT]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, capture_output=True).returncode:
        subprocess.run(
            ["timeout", "300", "apt-get", "update", "-q"], env=env, capture_output=True
        )  # a fresh machine's lists
        subprocess.run(install, env=env, capture_output=True)
    return f"not installed: {', '.join(missing())} (apt-get install {' '.join(APT)} failed)" if missing() else None


def start(path: Path, timeout_s: float = 120) -> Path:
    """Every daemon, in order; returns the slurm.conf once the node takes jobs."""
    os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    path = path.absolute()
    for d in ("state", "spool", "db", "log"):
        (path / d).mkdir(parents=True, exist_ok=True)
    db_port, dbd_port, ctld_port, slurmd_port = free_ports(4)
    host = socket.gethostname()
    munge = path / "munge.socket"
    state: dict = {"pids": [], "conf": str(path / "slurm.conf")}

    def daemon(name: str, *cmd: str) -> subprocess.Popen:
        with open(path / "log" / f"{name}.out", "w") as log:
            proc = subprocess.Popen(
                list(cmd),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "SLURM_CONF": state["conf"]},
            )
        state["pids"].append(proc.pid)
        (path / STATE).write_text(json.dumps(state, indent=1))
        return proc

    def wait(what: str, ready, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not come up; see {path / 'log'}")
            time.sleep(0.3)

    subprocess.run(
        ["mungekey", "--create", "--force", f"--keyfile={path / 'munge.key'}"], check=True, capture_output=True
    )
    proc = daemon(
        "munged",
        "munged",
        "--foreground",
        "--force",
        f"--socket={munge}",
        f"--key-file={path / 'munge.key'}",
        f"--pid-file={path / 'munged.pid'}",
        f"--seed-file={path / 'munge.seed'}",
        f"--log-file={path / 'log' / 'munged.log'}",
    )
    wait("munged", munge.exists, proc)

    if not (path / "db" / "mysql").exists():
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={path / 'db'}",
                "--user=root",
                "--skip-test-db",
                "--auth-root-authentication-method=normal",
            ],
            check=True,
            capture_output=True,
        )
    proc = daemon(
        "mariadb",
        "mariadbd",
        "--no-defaults",
        f"--datadir={path / 'db'}",
        f"--socket={path / 'mysql.sock'}",
        f"--port={db_port}",
        "--bind-address=127.0.0.1",
        "--user=root",
        "--skip-grant-tables",
        f"--pid-file={path / 'mariadb.pid'}",
    )
    wait("MariaDB", lambda: listens(db_port), proc)

    dbd_conf = path / "slurmdbd.conf"
    dbd_conf.write_text(f"""DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
CommunicationParameters=NoInAddrAny
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=root
StorageLoc=slurm_acct_db
PidFile={path / "slurmdbd.pid"}
LogFile={path / "log" / "slurmdbd.log"}
""")
    dbd_conf.chmod(0o600)
    Path(state["conf"]).write_text(f"""ClusterName=isoflop
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
AuthInfo=socket={munge}
CredType=cred/munge
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
AccountingStoragePass={munge}
JobAcctGatherType=jobacct_gather/none
StateSaveLocation={path / "state"}
SlurmdSpoolDir={path / "spool"}
SlurmctldPidFile={path / "slurmctld.pid"}
SlurmdPidFile={path / "slurmd.pid"}
SlurmctldLogFile={path / "log" / "slurmctld.log"}
SlurmdLogFile={path / "log" / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    proc = daemon("slurmdbd", "slurmdbd", "-D")  # reads slurmdbd.conf beside SLURM_CONF
    wait("slurmdbd", lambda: listens(dbd_port), proc)
    subprocess.run(
        ["sacctmgr", "-i", "add", "cluster", "isoflop"],
        env={**os.environ, "SLURM_CONF": state["conf"]},
        capture_output=True,
    )
    proc = daemon("slurmctld", "slurmctld", "-D", "-i")
    wait("slurmctld", lambda: listens(ctld_port), proc)
    proc = daemon("slurmd", "slurmd", "-D", "-N", host)
    wait("the node", lambda: _sinfo(state["conf"]) == "idle", proc)
    return Path(state["conf"])


def stop(path: Path, grace_s: float = 30) -> None:
    """SIGTERM every daemon in reverse order, by PID; SIGKILL what is left of their sessions."""
    pids = json.loads((path / STATE).read_text())["pids"]
    for pid in reversed(pids):
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _sinfo(conf: str) -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env={**os.environ, "SLURM_CONF": conf}
    )
    return out.stdout.strip()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a child of this process that exited is a zombie until reaped
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("install", "start", "stop"))
    parser.add_argument("dir", type=Path, nargs="?")
    args = parser.parse_args()
    if args.command == "install":
        print(install() or "SLURM, munge and MariaDB are installed")
    elif args.command == "start":
        if missing():
            raise SystemExit(
                f"not installed: {', '.join(missing())} (make slurm, "
                "or apt-get install the packages in this script's doc)"
            )
        print(start(args.dir))
    else:
        stop(args.dir)
