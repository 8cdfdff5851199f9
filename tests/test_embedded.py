"""The embedded model is the same bytes on every machine: the default recipe's model ships with the
package (a warm start on another CPU gives other weights, and the embedded study's figures moved
with them), its hash is pinned, and its base score does not depend on the thread count."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from isoflop_cli import config
from isoflop_cli.recipe import checkpoint

SHA256 = "a70992ad60583d54a656caa53e046fc53d24cad664dc0bae93251aee1367f93c"  # printed by scripts/ship_embedded.py
BASE_AVG = 0.5810546875  # the default validation set's avg@k at step 0 (256 problems, 8 samples each)


def test_the_default_recipe_ships_with_the_package_and_needs_no_build(tmp_path, monkeypatch):
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path))  # an empty cache: nothing built, nothing copied
    cfg = config.load(None, [])
    recipe = checkpoint.embedded_recipe(cfg.model, cfg.task)
    path = checkpoint.ensure_embedded(cfg.model, cfg.task)
    assert path.parent == checkpoint.SHIPPED, (
        "the default embedded recipe changed: run scripts/ship_embedded.py and pin its SHA-256 here"
    )
    assert json.loads((path / "isoflop_recipe.json").read_text()) == json.loads(json.dumps(recipe))
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() == SHA256
    assert not any(tmp_path.iterdir())


def test_another_recipe_is_built_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path))
    cfg = config.load(None, ["model.build.steps=3"])

    def build(out):
        (out / "config.json").write_text("{}")

    path = checkpoint.cached(cfg.model.name, checkpoint.embedded_recipe(cfg.model, cfg.task), build)
    assert path.parent == tmp_path / "models" and (path / "config.json").is_file()


def base_scores(out: Path, *overrides: str) -> list[float]:
    """Step 0's validation avg@k of `isoflop run` with `overrides`, on one and on two threads (two
    machines with different thread counts, emulated): the one-thread run in a process of its own,
    the two-thread one in this process (a run reads OMP_NUM_THREADS into torch's thread count; this
    process's is given back after), one interpreter fewer to import torch."""
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    scores = []
    for threads in (1, 2):
        args = [
            "run",
            *overrides,
            "n=2",
            "B_p=2",
            "grid.budgets=[4]",
            "grid.eval_points=1",
            "--run-dir",
            str(out / str(threads)),
        ]
        if threads == 1:
            run = subprocess.run(
                [sys.executable, "-m", "isoflop_cli", *args],
                env={**os.environ, "OMP_NUM_THREADS": "1"},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        else:
            before, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
            os.environ["OMP_NUM_THREADS"] = str(threads)
            try:
                result = CliRunner().invoke(app, args)
            finally:
                torch.set_num_threads(before)
                if env is None:
                    del os.environ["OMP_NUM_THREADS"]
                else:
                    os.environ["OMP_NUM_THREADS"] = env
            assert result.exit_code == 0, result.output[-3000:]
            assert torch.get_num_threads() == before
        first = json.loads((out / str(threads) / "metrics.jsonl").read_text().splitlines()[0])
        assert first["step"] == 0
        scores.append(first["val_avg@k"])
    return scores


@pytest.mark.slow
def test_the_base_score_is_the_same_on_one_and_two_threads(tmp_path):
    """Step 0's validation avg@k of the embedded default is pinned, on one and on two threads."""
    scores = base_scores(tmp_path)
    assert scores[0] == scores[1] == pytest.approx(BASE_AVG, abs=1e-6), scores
