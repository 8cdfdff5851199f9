"""The suite's tiers and what they share.

Tiers, by marker: unmarked tests are units (no Ray head, no model built or trained: `make
test-fast`); `slow` tests train or build models in this process or its children, without Ray;
`e2e` tests go through a real Ray head. `make test` runs all three, in that order (units fail in the
first minutes); within a worker's session the tests on the shared head come last (it lives only
while they run).

Shared per session: one embedded-model cache (built before the first test that trains, for every
variant the suite's runs use) and one local Ray head for the end-to-end tests that do not test a
head's own life.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# One embedded-model cache per test session, shared with the Ray jobs (they inherit the env);
# `make test` gives one to both of its sessions (main and vLLM). A cache made here is removed at exit.
if "ISOFLOP_CACHE" not in os.environ:
    os.environ["ISOFLOP_CACHE"] = tempfile.mkdtemp(prefix="isoflop-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ISOFLOP_CACHE"], ignore_errors=True)
# Torch's threads sleep while they wait instead of spinning: beside any other busy process, a
# spinning pair on 2 cores ran the embedded warm start 6-11x slower (200 steps: 118-202 s, against
# 18 s on one thread and 19 s on two that sleep; scripts/bench_threads.py). Set before torch is
# imported, which reads it once.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And each xdist worker gets its share of the cores, not all of them (read by torch at import, and by
# every run a test starts): `make test`'s two workers on two cores each trained on two threads, four
# on two cores. On one thread each, the tests that train in their own process (test_run,
# test_schedule, test_devices, test_output, test_trainer, test_learner) took 57-64 s against 74-75 s.
# Tests of thread counts set their own.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _workers)))
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.pop("RAY_ADDRESS", None)

ROOT = Path(__file__).resolve().parent.parent

# The embedded models the suite's runs warm-start from, as the overrides that select them: the
# default (most runs, every task=dataset run, the vLLM tests) and test_e2e's PRM sweep (a short
# warm start on arith-steps, and the PRM that test_prm and test_devices score with).
EMBEDDED = [[], ["task=arith-steps", "model.build.steps=100", "reward=prm", "reward.build.steps=250"]]


def run_isoflop(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in a process of its own (what the end-to-end tests drive)."""
    return subprocess.run(
        [sys.executable, "-m", "isoflop_cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def may_thaw(proc) -> bool:
    """Whether a process a test froze (SIGSTOP, to hold a run mid-run until a kill, a stop or a
    requeue reaches it) may be continued now: it is gone, or something else continued it, or a
    SIGTERM waits for it (a stopped process takes it once continued; a SIGKILL ends it stopped or not)."""
    import psutil

    try:
        if proc.status() != psutil.STATUS_STOPPED:
            return True
        lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
    except (psutil.NoSuchProcess, OSError):
        return True
    bit = 1 << (signal.SIGTERM - 1)
    return any(line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & bit for line in lines)


@pytest.fixture
def cfg():
    from isoflop_cli import config

    return config.load()


@pytest.fixture(scope="session")
def embedded_models():
    """Each embedded model the suite's Ray jobs warm-start from, built once, here, on every core,
    before the first end-to-end test. Left to the jobs, the first to need one builds it on its one
    CPU while the job beside it waits on the build's lock, inside whichever test comes first."""
    from isoflop_cli import config
    from isoflop_cli.recipe import checkpoint, prm
    from isoflop_cli.tasks.arith import ArithTask

    for overrides in EMBEDDED:
        cfg = config.load(None, overrides)
        checkpoint.ensure_embedded(cfg.model, cfg.task)
        if cfg.reward.name == "prm":
            prm.load(cfg.reward, ArithTask.from_config(cfg.task))


@pytest.fixture(autouse=True)
def _models_before_ray_jobs(request):
    """End-to-end tests train in Ray jobs: the embedded models are built before the first of them.
    (Slow tests train here, and build what they need on first use as fast as the fixture would.)"""
    if request.node.get_closest_marker("e2e"):
        request.getfixturevalue("embedded_models")


@pytest.fixture(scope="session")
def shared_head(tmp_path_factory):
    """One local Ray head per session (per xdist worker: `make test` runs the end-to-end tier on two)
    (isoflop's own: loopback, token auth) for the end-to-end tests that need a cluster but not a
    head of their own: they pass `cluster.address=` to it, as a user of a running
    cluster does, and a head's start and stop (~8 s, more under load) is paid once. The tests of
    the head's own life (started, reattached, stopped with its sweep) start their own."""
    from omegaconf import OmegaConf

    from isoflop_cli.config.schema import ClusterConfig
    from isoflop_cli.head import ray_cluster

    with ray_cluster(OmegaConf.structured(ClusterConfig), tmp_path_factory.mktemp("ray-head")) as address:
        yield address


@pytest.fixture
def ray_address(shared_head):
    """The shared head's address, for one test. Jobs the test leaves queued or running there (a
    test that failed mid-sweep) are stopped after it, and fail it: the next test's runs would wait
    behind them, and its limits would then fail it too, for a failure that is not its own."""
    from ray.job_submission import JobStatus

    yield shared_head
    client = job_client(shared_head)
    left = [job.submission_id for job in client.list_jobs() if job.status in (JobStatus.PENDING, JobStatus.RUNNING)]
    for sid in left:
        client.stop_job(sid)
    while any(not client.get_job_status(sid).is_terminal() for sid in left):
        time.sleep(0.2)
    assert not left, f"jobs left on the shared head (stopped): {left}"


@pytest.fixture
def ray_jobs(ray_address):
    """Ray's job client for the shared head."""
    return job_client(ray_address)


def job_client(address: str):
    """Ray's job client for a head of isoflop's, with its token (head._ensure_token's). Passed as a
    header: this process's Ray read RAY_AUTH_MODE when it was imported, maybe before a head set it."""
    from ray.job_submission import JobSubmissionClient

    token = (
        os.environ.get("RAY_AUTH_TOKEN")
        or Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token")).read_text()
    )
    return JobSubmissionClient(address, headers={"Authorization": f"Bearer {token.strip()}"})


def _tier(item) -> int:
    if "e2e" in item.keywords:
        return 3 if "shared_head" in item.fixturenames else 2
    return 1 if "slow" in item.keywords else 0


def pytest_collection_modifyitems(config, items):
    """Units, then slow tests, then end-to-end ones, those on the shared head last (a stable sort:
    each tier in the files' order). vLLM tests need vLLM's environment; elsewhere they are skipped,
    saying where they run."""
    import importlib.util

    items.sort(key=_tier)
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM: make setup-vllm, then .venv-vllm/bin/python -m pytest -m vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
