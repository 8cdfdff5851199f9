"""The schema's dotted keys, and the one closest to a key the schema lacks: a typo (`grid.nn=4`)
is told with the key that was meant (`grid.n`), not only refused."""

from __future__ import annotations

import difflib
from functools import lru_cache

from omegaconf import DictConfig, OmegaConf

from isoflop_cli.config.schema import SweepConfig

# How alike (difflib's ratio) a key must be to be offered: `grid.nn` and `grid.n` are 0.92 alike,
# `foo` and any key of the schema below 0.6; a suggestion far from the typo misleads.
CUTOFF = 0.75


@lru_cache(maxsize=1)
def schema_keys() -> tuple[str, ...]:
    """Every key the schema defines, dotted (`grid.n`, `model.build.layers`), sections included
    (`grid`): a typo may be of either."""
    return tuple(_walk(OmegaConf.structured(SweepConfig), ""))


def _walk(node: DictConfig, prefix: str) -> list[str]:
    keys = []
    for name in node:
        key = f"{prefix}{name}"
        keys.append(key)
        child = node._get_node(name)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            keys += _walk(child, f"{key}.")
    return keys


def unknown_key(key: str) -> str:
    """`unknown config key 'grid.nn' (did you mean grid.n?)`; without the question when no key of
    the schema is close."""
    close = difflib.get_close_matches(key, schema_keys(), n=1, cutoff=CUTOFF)
    return f"unknown config key '{key}'" + (f" (did you mean {close[0]}?)" if close else "")
