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


def pytest_collection_modifyitems(config, items):
    """vLLM tests need vLLM's environment; elsewhere they are skipped, saying where they run."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs vLLM: make setup-vllm, then .venv-vllm/bin/python -m pytest -m vllm")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
