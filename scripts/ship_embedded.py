"""Build the default embedded model (or, with --lookup, the lookup study's) and ship it with the
package (`isoflop_cli/models/`).

Run after a change to the warm start (its recipe: `model.build`, the default task, the alphabet;
for --lookup, `recipe/lookup.py`'s TABLE and BUILD): tests/test_embedded.py (test_lookup.py) fails
until the shipped model matches the recipe again, and names this script. The build runs on one
thread; the shipped bytes, not the build, are what every machine then uses. Prints the new model's
SHA-256, which the test pins.

    python scripts/ship_embedded.py [--lookup]
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from isoflop_cli import config
from isoflop_cli.recipe import checkpoint, lookup


def main() -> None:
    torch.set_num_threads(1)
    if "--lookup" in sys.argv[1:]:
        name, recipe, build = lookup.NAME, lookup.recipe(), lookup.build
    else:
        cfg = config.load(None, [])
        name, recipe = cfg.model.name, checkpoint.embedded_recipe(cfg.model, cfg.task)
        build = lambda out: checkpoint.build(cfg.model.build, checkpoint.warm_start_task(cfg.task), out)  # noqa: E731
    target = checkpoint.SHIPPED / checkpoint.recipe_dir_name(name, recipe)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / target.name
        build(out)
        (out / "isoflop_recipe.json").write_text(json.dumps(recipe, indent=2))
        for old in checkpoint.SHIPPED.glob(f"{name}-*"):
            shutil.rmtree(old)
        shutil.copytree(out, target)
    digest = hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
    print(f"shipped {target.relative_to(Path.cwd()) if target.is_relative_to(Path.cwd()) else target}\nsha256 {digest}")


if __name__ == "__main__":
    main()
