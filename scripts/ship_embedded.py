"""Build the default embedded model and ship it with the package (`isoflop_cli/models/`).

Run after a change to the default warm start (its recipe: `model.build`, the default task, the
alphabet): tests/test_embedded.py fails until the shipped model matches the default recipe again,
and names this script. The build runs on one thread; the shipped bytes, not the build, are what
every machine then uses. Prints the new model's SHA-256, which the test pins.

    python scripts/ship_embedded.py
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

from isoflop_cli import config
from isoflop_cli.recipe import checkpoint


def main() -> None:
    torch.set_num_threads(1)
    cfg = config.load(None, [])
    recipe = checkpoint.embedded_recipe(cfg.model, cfg.task)
    target = checkpoint.SHIPPED / checkpoint.recipe_dir_name(cfg.model.name, recipe)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / target.name
        checkpoint.build(cfg.model.build, checkpoint.warm_start_task(cfg.task), out)
        (out / "isoflop_recipe.json").write_text(json.dumps(recipe, indent=2))
        for old in checkpoint.SHIPPED.glob(f"{cfg.model.name}-*"):
            shutil.rmtree(old)
        shutil.copytree(out, target)
    digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
    print(f"shipped {target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target}\nsha256 {digest}")


if __name__ == "__main__":
    main()
