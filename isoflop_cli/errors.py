"""The exceptions isoflop says to its user as one line, by who can fix them.

- `ConfigError`: the input is wrong (a config key or value, a path, a data row, an infeasible
  budget). The same input fails again, so nothing starts: exit code 2.
- `LauncherError`: the cluster could not take or keep the work (the Ray head did not start or
  stopped answering, sbatch refused a job). The input may be fine: exit code 1, and rerunning the
  same command resumes.

Every module raises these rather than its own bases, so the CLI maps them to exit codes in one place.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad user input: reported as one line, exit code 2, nothing started."""


class LauncherError(Exception):
    """The cluster did not take or keep the work: one line, exit code 1, the same command resumes."""


class HeadError(LauncherError):
    """The Ray head did not start, or stopped answering."""


class HeadLost(HeadError):
    """The head stopped answering for longer than the grace a busy head gets: its jobs are gone."""

    def __init__(self, address: str, cause: BaseException, grace_s: float):
        why = "connection refused" if "refused" in str(cause).lower() else type(cause).__name__
        super().__init__(
            f"lost the Ray head at {address} (no answer for {grace_s:.0f}s: {why}); its jobs are gone, "
            "finished runs are kept; rerun the same command to resume"
        )


class SlurmRefused(LauncherError):
    """sbatch refused a submission (a partition, a GPU request or a time limit the cluster does not
    have): its own message."""
