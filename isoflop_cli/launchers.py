"""Launchers by `cluster.launcher`: where a sweep's runs go as jobs, and what dispatch and the
preflight need to know of each (how jobs are submitted, watched and cancelled; how many run at
once; who places the preflight's probe; whether a job of a run's size can ever start), so no module
compares launcher names. A new launcher is one class and one entry here.

The entries name their class as "module:Class" (as `samplers.py` names its engines): this module
stays light enough for config checks to read the names, and the classes import Ray or submitit
only when a sweep uses them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from pathlib import Path
from typing import Any, ContextManager, Protocol

LAUNCHERS: dict[str, str] = {
    # Ray Jobs on cluster.address, $RAY_ADDRESS, or a local head this sweep starts (head.py).
    "ray": "isoflop_cli.head:RayLauncher",
    # One SLURM job per run through submitit (sbatch, or submitit's local executor).
    "slurm": "isoflop_cli.slurm:SlurmLauncher",
}


class Jobs(Protocol):
    """The job calls dispatch and the preflight make: Ray's `JobSubmissionClient`'s, which every
    launcher's client answers. A status's `.value` is one of Ray's JobStatus values (PENDING,
    RUNNING, SUCCEEDED, FAILED, STOPPED); an info's `.driver_exit_code` is the run's exit code (None:
    unknown) and its `.message` why the job ended. A job the cluster does not know is a RuntimeError."""

    def submit_job(self, *, entrypoint: str, submission_id: str, entrypoint_num_cpus: float, entrypoint_num_gpus: float,
                   runtime_env: dict) -> str: ...

    def get_job_status(self, submission_id: str) -> Any: ...

    def get_job_info(self, submission_id: str) -> Any: ...

    def get_job_logs(self, submission_id: str) -> str: ...

    def stop_job(self, submission_id: str) -> bool: ...


class Launcher(Protocol):
    """One `cluster.launcher`, built on the sweep's `cluster` config."""

    # The launcher chooses the preflight probe's node, so the probe checks the node it lands on
    # (SLURM); otherwise the probe lists the cluster's nodes and checks one of each type (Ray).
    places_probe: bool

    @property
    def runs_here(self) -> bool:
        """Whether the runs run on this machine (a local head, SLURM's local executor): what this
        machine has (its memory) is what every run has."""

    def __init__(self, cluster) -> None: ...

    def check(self) -> None:
        """Before anything is written: ConfigError (one line) where jobs cannot go."""

    def capacity(self, cells: int) -> int:
        """Jobs in flight at once, for a sweep of `cells` cells (a cluster's queue takes them all)."""

    def open(self, state_dir: Path) -> ContextManager[str]:
        """For the sweep's life: the address jobs go to (started here if it needs starting, its
        state in `state_dir`)."""

    def keeps_logs(self, state_dir: Path) -> bool:
        """Whether the logs of jobs that ran for `state_dir` can be fetched without starting
        anything (a lost local head took its jobs' logs with it)."""

    def jobs(self, address: str, state_dir: Path) -> Jobs:
        """The job client at `address` (a ConnectionError while it does not answer yet: the
        dispatcher asks again, within its grace)."""

    def batch(self, jobs: Jobs) -> ContextManager[None]:
        """Around the submissions of one poll (SLURM: one array job)."""

    def placement(self, jobs: Jobs, nodes: list, cpus: float, gpus: float) -> list[str]:
        """Why a job asking for `cpus` and `gpus` would never start, one line each (none: it can),
        from the probe's `nodes` or the scheduler's own answer."""


def node_memory_gib(cluster) -> float | None:
    """The memory of the node a run lands on: cluster.node_memory_gib, else this machine's where the
    runs run here, else None (unknown)."""
    if cluster.node_memory_gib is not None:
        return cluster.node_memory_gib
    return this_machine_gib() if of(cluster).runs_here else None


@functools.cache
def this_machine_gib() -> float:
    """This machine's memory, or its cgroup's limit where that is lower (a container's)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # cgroup v2, v1
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(limit).read_text()))
    return total / 2**30


def of(cluster) -> Launcher:
    """The launcher `cluster.launcher` names, on `cluster`."""
    module, cls = LAUNCHERS[cluster.launcher].split(":")
    return getattr(importlib.import_module(module), cls)(cluster)
