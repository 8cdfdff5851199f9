"""Preflight: before a sweep submits its first run, one short probe job checks on the cluster what
every run will need, so a sweep fails in seconds with one line per problem instead of hours later
(`isoflop doctor` runs the same checks alone).

On a Ray cluster the probe is a Ray job (the runs' interpreter, `cluster.python`) that asks its
cluster for its alive nodes and runs one check on a node of each type (its CPU and GPU counts),
pinned there; on SLURM it is one small job in the runs' partition, checking the node SLURM gives
it. The check: the node's isoflop version and Python against the CLI's; whether the sweep dir is
shared (the node reads a file the CLI wrote there, and writes one the CLI then reads); whether
the files the runs read (model, reward model, data) are readable there, and the directories they
write (the model cache, the trackers' files) there or able to be made; whether vLLM and the
trackers import. The CLI adds what only the whole cluster tells: whether a job of a run's size
can ever start (Ray: some node has its CPUs and GPUs; SLURM: `sbatch --test-only` accepts it),
since a request no node can satisfy would stay pending forever. What the probe finds comes back
in its job log, so it arrives even when nothing is shared.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from isoflop_cli import hub, vllm_pin
from isoflop_cli.config.machine import builds_embedded, cannot_make
from isoflop_cli.config.schema import cache_dir
from isoflop_cli.joblog import job_message, last_exception
from isoflop_cli.samplers import SAMPLERS
from isoflop_cli.tracking import PACKAGES as TRACKER_PACKAGES
from isoflop_cli.tracking import writes_dir

MARK = "ISOFLOP_PREFLIGHT "  # the probe's result line in its job log
DIR = ".preflight"  # in the sweep dir: the files of the shared-dir check
WAIT_S = 120.0  # a probe not done by then is a problem (a cluster with no room even for it, a hung node)
ATTEMPTS = (
    2  # a probe job the cluster ended itself (its job supervisor died: no exit code of the probe's) runs once more
)


@dataclass(frozen=True)
class Spec:
    """What the probe checks, sent in its entrypoint (no shared file needed to read it)."""

    version: str  # the CLI's isoflop version
    python: str  # the CLI's Python, major.minor
    sweep_dir: str
    nonce: str
    paths: dict[str, str]  # config key -> a file or directory every run reads
    vllm: bool
    interpreter: str  # the runs' Python on the nodes (cluster.python), whose packages are checked
    trackers: list[str]  # tracking.backends: each must import there
    # Directories the runs write: config key -> path ("ISOFLOP_CACHE": the node's own, where an
    # embedded model is built; tracking.dir, where a tracker keeps files there). Last, with a
    # default, as Node.unwritable.
    writes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Node:
    """One node type as its probe saw it."""

    host: str
    cpus: float
    gpus: float
    count: int  # alive nodes of this type
    version: str
    python: str
    reads_cli_file: bool
    wrote: str | None  # the file it wrote in the sweep dir, None when it could not
    unreadable: dict[str, str]  # config key -> why
    vllm: bool
    trackers_missing: list[str]
    # Spec.writes key -> the directory there and why; last, with a default, so that a node with an
    # older isoflop still reads as a node (whose version the CLI then names).
    unwritable: dict[str, str] = field(default_factory=dict)
    vllm_version: str | None = None  # where vLLM imports: its version (vllm_pin), None where unread


def _read(cls, sent: dict):
    """A Spec or a Node as the other side's isoflop wrote it, whatever its version: the fields this
    one does not know are left out, so that a version mismatch is found and named, not a TypeError."""
    return cls(**{f.name: sent[f.name] for f in fields(cls) if f.name in sent})


def version() -> str:
    return importlib.metadata.version("isoflop")


def spec_for(cfg, sweep_dir: Path, interpreter: str) -> Spec:
    from isoflop_cli.config.schema import PATH_KEYS

    paths = {
        key: value
        for key in PATH_KEYS
        if key != "tracking.dir" and isinstance(value := _select(cfg, key), str) and value
    }
    paths.update({f"eval.{part}.{name}": str(p) for part in ("sets", "judges") for name, p in cfg.eval[part].items()})
    paths = {
        key: p for key, p in paths.items() if not (hub.takes_ids(key) and hub.hub_id(p))
    }  # each node's own Hugging Face cache
    writes = {"ISOFLOP_CACHE": ""} if builds_embedded(cfg) else {}
    if cfg.tracking.dir and writes_dir(cfg.tracking):
        writes["tracking.dir"] = cfg.tracking.dir
    return Spec(
        version(),
        platform.python_version_tuple()[0] + "." + platform.python_version_tuple()[1],
        str(sweep_dir.absolute()),
        uuid.uuid4().hex[:12],
        paths,
        SAMPLERS[cfg.sampler.name].package == "vllm",
        interpreter,
        list(cfg.tracking.backends),
        writes,
    )


def check(
    launcher, client, cfg, sweep_dir: Path, python: str, env: dict[str, str], wait_s: float = WAIT_S
) -> tuple[list[Node], list[str]]:
    """Run the probe job on the cluster behind `client` (the `launcher`'s jobs client); the node
    types it saw and one line per problem (none: every run can start)."""
    spec = spec_for(cfg, sweep_dir, python)
    shared = sweep_dir.absolute() / DIR
    shared.mkdir(parents=True, exist_ok=True)
    try:
        (shared / f"{spec.nonce}.cli").write_text(spec.nonce)
        return _probe_job(launcher, client, cfg, spec, shared, env, wait_s)
    finally:
        for p in shared.glob(f"{spec.nonce}.*"):
            p.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            shared.rmdir()  # empty unless another check runs beside this one


def _probe_job(
    launcher, client, cfg, spec: Spec, shared: Path, env: dict[str, str], wait_s: float
) -> tuple[list[Node], list[str]]:
    encoded = base64.urlsafe_b64encode(json.dumps(asdict(spec)).encode()).decode()
    command = [
        spec.interpreter,
        "-m",
        "isoflop_cli",
        "preflight-probe",
        encoded,
        *(["--here"] if launcher.places_probe else []),
    ]
    for attempt in range(ATTEMPTS):
        sid = client.submit_job(
            entrypoint="exec " + shlex.join(command),
            submission_id=f"isoflop-preflight-{spec.nonce}" + (f"-{attempt}" if attempt else ""),
            entrypoint_num_cpus=0,
            runtime_env={"env_vars": env},
        )
        deadline = time.monotonic() + wait_s
        while (state := str(client.get_job_status(sid).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            if time.monotonic() > deadline:
                client.stop_job(sid)
                return [], [
                    f"the preflight probe did not finish in {wait_s:.0f} s (job {sid}, {state.lower()}): the cluster "
                    "has no room even for it, or a node hangs; cluster.preflight=false skips the preflight"
                ]
            time.sleep(0.5)
        log = client.get_job_logs(sid)
        lines = [line[len(MARK) :] for line in log.splitlines() if line.startswith(MARK)]
        if lines:
            try:
                nodes = [_read(Node, n) for n in json.loads(lines[-1])]
            except (TypeError, ValueError) as e:  # a probe of another isoflop version, missing what this one asks
                return [], [
                    f"the preflight probe's answer does not read (job {sid}, with {spec.interpreter}: {e}): install "
                    "the same isoflop on every node (cluster.python names the runs' interpreter)"
                ]
            placed = launcher.placement(client, nodes, cfg.cluster.cpus_per_run, cfg.cluster.gpus_per_run)
            return nodes, problems(spec, nodes, shared) + placed
        try:
            info = client.get_job_info(sid)
            code, message = info.driver_exit_code, info.message
        except RuntimeError:  # the cluster no longer knows the job
            code, message = None, None
        if code is not None or attempt == ATTEMPTS - 1:
            break
    output = [
        line.strip() for line in log.splitlines() if line.strip() and not line.startswith("Running entrypoint for job")
    ]  # Ray's own first line
    detail = last_exception(log) or (output[-1] if output else (job_message(message) if message else "no output"))
    return [], [f"the preflight probe failed on the cluster (job {sid}, with {spec.interpreter}): {detail}"]


def unplaceable(nodes: list[Node], cpus: float, gpus: float) -> list[str]:
    """A run's request that no node type of a Ray cluster satisfies (one line), or none."""
    if not nodes or any(n.cpus >= cpus and n.gpus >= gpus for n in nodes):
        return []
    have = "; ".join(f"{n.count} x ({_count(n.cpus)} CPU, {_count(n.gpus)} GPU)" for n in nodes)
    return [
        f"no node has the {_count(cpus)} CPUs and {_count(gpus)} GPUs a run asks for (cluster.cpus_per_run, "
        f"cluster.gpus_per_run): its runs would wait forever; the cluster has {have}"
    ]


def problems(spec: Spec, nodes: list[Node], shared: Path) -> list[str]:
    """One line per problem, from the node types the probe saw (pure: tested on made-up nodes)."""
    out = []
    for n in nodes:
        where = (
            f"node {n.host} ({_count(n.cpus)} CPU, {_count(n.gpus)} GPU{', x' + str(n.count) if n.count > 1 else ''})"
        )
        if (n.version, n.python) != (spec.version, spec.python):
            out.append(
                f"{where} has isoflop {n.version} on Python {n.python}, the CLI {spec.version} on {spec.python}: "
                "install the same isoflop and Python on every node (cluster.python names the runs' interpreter)"
            )
        if not n.reads_cli_file or not (n.wrote and (shared / n.wrote).exists()):
            out.append(
                f"{where} does not share the sweep dir {spec.sweep_dir} with the CLI (a file written on one side is "
                "not there on the other): mount it at the same path on every node and where the CLI runs"
            )
        for key, why in n.unreadable.items():
            out.append(f"{key} ({spec.paths[key]}) is {why} on {where}: every node must read it at that path")
        for key, why in n.unwritable.items():
            out.append(f"{key} {why} on {where}: every run there writes into it")
        if spec.vllm and not n.vllm:
            out.append(
                f"sampler=vllm but vLLM does not import on {where}: install it there (pip install 'isoflop[vllm]') or "
                "point cluster.python at a Python that has it"
            )
        elif spec.vllm and n.vllm_version is not None and (why := vllm_pin.mismatch(n.vllm_version, where)):
            out.append(why)
        for name in n.trackers_missing:
            out.append(
                f"tracking.backends {name} does not import on {where}: pip install {TRACKER_PACKAGES[name]} there "
                "(or 'isoflop[tracking]'); a run would go on without it"
            )
    return out


def probe(encoded: str) -> None:
    """The probe job's body: one check per node type, pinned to a node of it; prints the result line."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    spec = _read(Spec, json.loads(base64.urlsafe_b64decode(encoded)))
    ray.init(logging_level="ERROR")
    here = ray.get_runtime_context().get_node_id()
    types: dict[tuple[float, float], list[dict]] = {}
    for node in ray.nodes():
        if node["Alive"]:
            resources = node["Resources"]
            types.setdefault((resources.get("CPU", 0.0), resources.get("GPU", 0.0)), []).append(node)
    for group in types.values():
        group.sort(key=lambda node: node["NodeID"] != here)  # this node first among its type
    remote = ray.remote(num_cpus=0)(_check_node)

    def check(kind: tuple[float, float], i: int):
        """The check on the i-th node of its type, pinned there; the type's count is the nodes left.
        On this job's own node it runs here: a task would start a Ray worker for it (~1 CPU-s, and
        the whole of the check on a one-node cluster such as a local head)."""
        group = types[kind]
        if group[i]["NodeID"] == here:
            return _check_node(spec, *kind, len(group) - i)
        return remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(group[i]["NodeID"], soft=False)
        ).remote(spec, *kind, len(group) - i)

    # A node listed alive may be gone by the time its check runs (a lost node the head has not
    # noticed yet): it is not part of the cluster the runs will meet, so another node of its type
    # is checked instead, and a type with none left is not reported.
    gone = (ray.exceptions.TaskUnschedulableError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError)
    tried = dict.fromkeys(types, 0)
    refs = {kind: check(kind, 0) for kind in types}
    nodes = []
    while refs:
        kind, ref = refs.popitem()
        try:
            nodes.append(ref if isinstance(ref, Node) else ray.get(ref, timeout=WAIT_S / 2))
        except gone:
            tried[kind] += 1
            if tried[kind] < len(types[kind]):
                refs[kind] = check(kind, tried[kind])
    print(MARK + json.dumps([asdict(n) for n in nodes]), flush=True)


def probe_here(encoded: str) -> None:
    """The probe job's body where the launcher chose its node (SLURM): the check on this node."""
    spec = _read(Spec, json.loads(base64.urlsafe_b64decode(encoded)))
    gpus = len(
        list(Path("/proc/driver/nvidia/gpus").glob("*"))
    )  # the node's, not the probe's (it asks for none); CUDA untouched
    print(MARK + json.dumps([asdict(_check_node(spec, float(os.cpu_count() or 0), float(gpus), 1))]), flush=True)


# What the runs' interpreter says of itself on a node: isoflop's version, its Python, which of vLLM
# and the trackers import, and vLLM's version (the probe's own process may be another Python: Ray's
# workers').
FACTS = f"""
import importlib.metadata, importlib.util, json, sys
def version(*names):
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
print(json.dumps({{"version": version("isoflop") or "not installed", "python": "%d.%d" % sys.version_info[:2],
                  "found": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None],
                  "vllm_version": version(*{vllm_pin.DISTRIBUTIONS!r})}}))
"""


def _check_node(spec: Spec, cpus: float, gpus: float, count: int) -> Node:
    shared = Path(spec.sweep_dir) / DIR
    try:
        reads = (shared / f"{spec.nonce}.cli").read_text() == spec.nonce
    except OSError:
        reads = False
    name = f"{spec.nonce}.{socket.gethostname()}-{os.getpid()}"
    try:
        (shared / name).write_text(spec.nonce)
        wrote = name
    except OSError:
        wrote = None
    unreadable = {}
    for key, value in spec.paths.items():
        path = Path(value)
        if not path.exists():
            unreadable[key] = "missing"
        elif not os.access(path, os.R_OK):
            unreadable[key] = "not readable"
    unwritable = {}
    for key, value in spec.writes.items():
        path = Path(value).expanduser() if value else cache_dir()
        if why := cannot_make(path):
            unwritable[key] = f"({path}) {why}"
    modules = ["vllm", *spec.trackers]
    try:
        answer = subprocess.run(
            [spec.interpreter, "-c", FACTS, *modules], capture_output=True, text=True, timeout=120, check=True
        )
        facts = json.loads(answer.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        facts = {"version": f"unusable ({type(e).__name__})", "python": "?", "found": []}
    return Node(
        host=socket.gethostname(),
        cpus=cpus,
        gpus=gpus,
        count=count,
        version=facts["version"],
        python=facts["python"],
        reads_cli_file=reads,
        wrote=wrote,
        unreadable=unreadable,
        unwritable=unwritable,
        vllm="vllm" in facts["found"],
        trackers_missing=[t for t in spec.trackers if t not in facts["found"]],
        vllm_version=facts.get("vllm_version") if "vllm" in facts["found"] else None,
    )


def _select(cfg, key: str):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, throw_on_missing=False)


def _count(x: float) -> str:
    return f"{x:g}"
