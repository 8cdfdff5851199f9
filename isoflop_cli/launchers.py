"""Launchers by `cluster.launcher`: where a sweep's runs go as jobs, and what dispatch and the
preflight need to know of each (how jobs are submitted, watched and cancelled; how many run at
once; who places the preflight's probe; whether a job of a run's size can ever start), so no module
compares launcher names. A new launcher is one class and one entry here.

The entries name their class as "module:Class" (as `samplers.py` names its engines) and carry
what config checks and planning ask before any launcher is built (whether the runs run on this
machine): this module stays light enough for them, and the classes import Ray or submitit only
when a sweep uses them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Entry:
    cls: str  # "module:Class"
    # On a `cluster` config: whether its runs run on this machine, so that what this machine has
    # (its memory, its model cache, its interpreter) is what every run has.
    runs_here: Callable[[Any], bool]


LAUNCHERS: dict[str, Entry] = {
    # Ray Jobs on cluster.address, $RAY_ADDRESS, or a local head this sweep starts (head.py).
    "ray": Entry("isoflop_cli.head:RayLauncher", lambda c: not (c.address or os.environ.get("RAY_ADDRESS"))),
    # One SLURM job per run through submitit (sbatch, or submitit's local executor: this machine).
    "slurm": Entry("isoflop_cli.slurm:SlurmLauncher", lambda c: c.slurm.executor == "local"),
}


class Jobs(Protocol):
    """The job calls dispatch and the preflight make: Ray's `JobSubmissionClient`'s, which every
    launcher's client answers. A status's `.value` is one of Ray's JobStatus values (PENDING,
    RUNNING, SUCCEEDED, FAILED, STOPPED); an info's `.driver_exit_code` is the run's exit code (None:
    unknown) and its `.message` why the job ended. A job the cluster does not know is a RuntimeError."""

    def submit_job(
        self,
        *,
        entrypoint: str,
        submission_id: str,
        entrypoint_num_cpus: float,
        entrypoint_num_gpus: float,
        runtime_env: dict,
    ) -> str: ...

    def get_job_status(self, submission_id: str) -> Any: ...

    def get_job_info(self, submission_id: str) -> Any: ...

    def get_job_logs(self, submission_id: str) -> str: ...

    def stop_job(self, submission_id: str) -> bool: ...


class Launcher(Protocol):
    """One `cluster.launcher`, built on the sweep's `cluster` config."""

    # The launcher chooses the preflight probe's node, so the probe checks the node it lands on
    # (SLURM); otherwise the probe lists the cluster's nodes and checks one of each type (Ray).
    places_probe: bool

    def __init__(self, cluster) -> None: ...

    def check(self) -> None:
        """Before anything is written: ConfigError (one line) where jobs cannot go."""

    def capacity(self, cells: int) -> int:
        """Jobs in flight at once, for a sweep of `cells` cells (a cluster's queue takes them all)."""

    def open(self, state_dir: Path) -> AbstractContextManager[str]:
        """For the sweep's life: the address jobs go to (started here if it needs starting, its
        state in `state_dir`)."""

    def keeps_logs(self, state_dir: Path) -> bool:
        """Whether the logs of jobs that ran for `state_dir` can be fetched without starting
        anything (a lost local head took its jobs' logs with it)."""

    def jobs(self, address: str, state_dir: Path) -> Jobs:
        """The job client at `address` (a ConnectionError while it does not answer yet: the
        dispatcher asks again, within its grace)."""

    def batch(self, jobs: Jobs) -> AbstractContextManager[None]:
        """Around the submissions of one poll (SLURM: one array job)."""

    def placement(self, jobs: Jobs, nodes: list, cpus: float, gpus: float) -> list[str]:
        """Why a job asking for `cpus` and `gpus` would never start, one line each (none: it can),
        from the probe's `nodes` or the scheduler's own answer."""


def runs_here(cluster) -> bool:
    """Whether the runs of `cluster` run on this machine (a local head, SLURM's local executor)."""
    return LAUNCHERS[cluster.launcher].runs_here(cluster)


def of(cluster) -> Launcher:
    """The launcher `cluster.launcher` names, on `cluster`."""
    module, cls = LAUNCHERS[cluster.launcher].cls.split(":")
    return getattr(importlib.import_module(module), cls)(cluster)
