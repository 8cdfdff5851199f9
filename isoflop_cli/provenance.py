"""What a sweep's result rows say of where they came from, beside the cell's axes: the checkpoint its
runs started from (a local path, a Hub id at the commit its cache holds, or the embedded model),
the isoflop version and, where isoflop runs from a git checkout, its commit ("-dirty" with
uncommitted changes to tracked files). Read once per sweep, when its cells are prepared.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path
from typing import Any

from isoflop_cli import hub

CHECKOUT = Path(__file__).resolve().parent.parent  # the repository root, where isoflop runs from a checkout


def columns(model) -> dict[str, Any]:
    """The provenance columns of a run whose model config is `model`."""
    return {"checkpoint": checkpoint(model), "isoflop_version": version(), "isoflop_commit": commit()}


def checkpoint(model) -> str:
    """model.path as given, a Hub id with the commit of its cached snapshot, or the embedded model by name."""
    if not model.path:
        return f"embedded:{model.name}"
    ref = hub.hub_id(model.path)
    if ref is None:
        return str(model.path)
    return f"{ref.repo}@{hub.checkpoint(model.path, 'model.path', model.download).name}"


@functools.lru_cache(maxsize=1)
def version() -> str | None:
    try:
        return importlib.metadata.version("isoflop")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def commit() -> str | None:
    """The checkout's HEAD, "-dirty" where tracked files differ from it; None outside a checkout
    (an installed wheel) or without git."""
    if not (CHECKOUT / ".git").exists():
        return None
    try:
        head = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
