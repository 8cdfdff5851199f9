import os
import tempfile
from pathlib import Path

import pytest

# One embedded-model cache per test session, shared with the Ray jobs (they inherit the env).
# A fresh session builds the tiny model once, as a new user's first sweep does.
os.environ.setdefault("ISOFLOP_CACHE", tempfile.mkdtemp(prefix="isoflop-test-cache-"))
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.pop("RAY_ADDRESS", None)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cfg():
    from isoflop_cli import config

    return config.load()


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory):
    """One local Ray head (isoflop's own: loopback, token auth) for the end-to-end tests that need a
    cluster but not a head of their own: they pass `cluster.address=` to it, as a user of a running
    cluster does, and a head's start and stop (~8 s, more under load) is paid once. The tests of
    the head's own life (started, reattached, stopped with its sweep) start their own."""
    from omegaconf import OmegaConf

    from isoflop_cli.config.schema import ClusterConfig
    from isoflop_cli.head import ray_cluster

    with ray_cluster(OmegaConf.structured(ClusterConfig), tmp_path_factory.mktemp("ray-head")) as address:
        yield address


def pytest_collection_modifyitems(config, items):
    """vLLM tests need vLLM's environment; elsewhere they are skipped, saying where they run."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM: make setup-vllm, then .venv-vllm/bin/python -m pytest -m vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
