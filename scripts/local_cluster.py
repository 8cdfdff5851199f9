"""A multi-node Ray cluster on this machine: a head and worker nodes as separate `ray start`
processes, every one on 127.0.0.1, token auth. A sweep talks to it through `cluster.address`
exactly as to a remote cluster; the tests use it to lose nodes on purpose.

    python scripts/local_cluster.py start DIR [--worker CPUS:GPUS ...]   # prints the address
    python scripts/local_cluster.py kill DIR INDEX                       # SIGKILL one worker node (a lost node)
    python scripts/local_cluster.py stop DIR

The head is isoflop's own local head (`isoflop_cli.head`: loopback, ports of its own, token auth,
usage stats off) with no CPUs, so every job runs on a worker. Workers declare the CPUs and GPUs
given (`--worker 1:2`: one CPU, two GPUs), so GPU scheduling and CUDA_VISIBLE_DEVICES are
exercised without a GPU. DIR/cluster.json keeps the address and each process's PID, by which
`stop` ends them (never by name).

Why a worker starts through this script: Ray keeps 127.0.0.1 as a node's address only with
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (otherwise it replaces it with the machine's address and its
processes listen there), and with that setting `ray start` refuses to join a head, a guard meant
for Windows and macOS. The `node` command runs `ray start` in this process with that guard lifted
and 127.0.0.1 kept as given; every process Ray starts from it reads the setting from its
environment and stays on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from isoflop_cli.head import RAY_METRICS_OFF, RAY_NO_PRESTART, free_ports

ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "token",
    "RAY_USAGE_STATS_ENABLED": "0",
    **RAY_METRICS_OFF,
    **RAY_NO_PRESTART,
}
WORKER_PORT_FLAGS = (
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
)
STATE = "cluster.json"


def start(path: Path, workers: list[tuple[float, float]], timeout_s: float = 240) -> dict:
    """The head, then each worker; returns (and writes) the cluster's state once every node is alive."""
    path.mkdir(parents=True, exist_ok=True)
    os.environ.update(ENV)  # this process asks the head which nodes are alive: loopback, with the token
    env = dict(os.environ)
    info = path / "head.json"
    info.unlink(missing_ok=True)
    temp_dir = tempfile.mkdtemp(prefix="isoflop-ray-")  # short: Ray's unix sockets live under it
    with open(path / "head.log", "w") as log:
        head = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "isoflop_cli.head",
                "--cpus",
                "0",
                "--info",
                str(info),
                "--temp-dir",
                temp_dir,
                "--nonce",
                secrets.token_hex(8),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    state = {"head_pid": head.pid, "temp_dir": temp_dir, "workers": []}
    _write(path, state)
    deadline = time.monotonic() + timeout_s
    while not (info.exists() and json.loads(info.read_text()).get("pid") == head.pid):
        _check(head, "the head", path / "head.log", deadline)
        time.sleep(0.5)
    state.update({k: v for k, v in json.loads(info.read_text()).items() if k in ("address", "gcs_address")})
    # One worker at a time: nodes on one machine share the head's session dir, and two raylets
    # starting at once can pick the same socket name there.
    for i, (cpus, gpus) in enumerate(workers):
        ports = dict(zip(WORKER_PORT_FLAGS, free_ports(len(WORKER_PORT_FLAGS))))
        with open(path / f"worker-{i}.log", "w") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "node",
                    "start",
                    f"--address={state['gcs_address']}",
                    "--node-ip-address=127.0.0.1",
                    "--block",
                    f"--num-cpus={cpus:g}",
                    f"--num-gpus={gpus:g}",
                    "--disable-usage-stats",
                    "--min-worker-port=0",
                    "--max-worker-port=0",
                    *(f"--{flag}={port}" for flag, port in ports.items()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        state["workers"].append({"pid": proc.pid, "cpus": cpus, "gpus": gpus})
        _write(path, state)
        while len(_alive_nodes(state["address"])) < 2 + i:
            _check(proc, f"worker {i}", path / f"worker-{i}.log", deadline)
            time.sleep(1)
    return state


def kill(path: Path, index: int) -> None:
    """SIGKILL worker `index`'s whole process group: its raylet and agents. The jobs on it run in
    process groups of their own and end as their supervisors see the node gone (within seconds)."""
    os.killpg(_read(path)["workers"][index]["pid"], signal.SIGKILL)


def stop(path: Path, grace_s: float = 45) -> None:
    """SIGTERM each worker's `ray start --block` and the head (each stops what it started), then
    SIGKILL whatever of their process groups is left."""
    state = _read(path)
    groups = [w["pid"] for w in state["workers"]] + [state["head_pid"]]
    for pid in groups:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(pid) for pid in groups):
        time.sleep(0.5)
    for pid in groups:
        _signal(pid, signal.SIGKILL, group=True)
    subprocess.run(["rm", "-rf", state["temp_dir"]], check=False)


def node(args: list[str]) -> None:
    """`ray start` for a worker node, in this process: the multi-node guard lifted, 127.0.0.1 kept."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray.scripts.scripts import main

    ray_constants.ENABLE_RAY_CLUSTER = True
    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", *args]
    sys.exit(main())


def _alive_nodes(address: str) -> list:
    from ray.util.state import list_nodes

    try:
        return [n for n in list_nodes(address=address, timeout=5) if n.state == "ALIVE"]
    except Exception:  # the head is still coming up
        return []


def _check(proc: subprocess.Popen, what: str, log: Path, deadline: float) -> None:
    if proc.poll() is not None:
        raise SystemExit(f"{what} exited ({proc.returncode}) before the cluster was up; see {log}")
    if time.monotonic() > deadline:
        raise SystemExit(f"the cluster did not come up in time; see {log.parent}")


def _signal(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig) if group else os.kill(pid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _write(path: Path, state: dict) -> None:
    (path / STATE).write_text(json.dumps(state, indent=1))


def _read(path: Path) -> dict:
    return json.loads((path / STATE).read_text())


def _worker(spec: str) -> tuple[float, float]:
    cpus, _, gpus = spec.partition(":")
    return float(cpus), float(gpus or 0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["node"]:
        node(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    begin = commands.add_parser("start", help="start the head and the workers; print the address")
    begin.add_argument("dir", type=Path)
    begin.add_argument(
        "--worker", type=_worker, action="append", help="CPUS:GPUS of a worker node (repeat); default 1:0 twice"
    )
    end = commands.add_parser("stop", help="stop every process of the cluster, by PID")
    end.add_argument("dir", type=Path)
    lose = commands.add_parser("kill", help="SIGKILL a worker node and everything on it")
    lose.add_argument("dir", type=Path)
    lose.add_argument("index", type=int)
    args = parser.parse_args()
    if args.command == "start":
        print(start(args.dir, args.worker or [(1, 0), (1, 0)])["address"])
    elif args.command == "kill":
        kill(args.dir, args.index)
    else:
        stop(args.dir)
