"""The compute-optimal frontier: the best metric reachable with compute <= C over all runs.

A run read at compute c <= C is a run stopped early within budget C (constant LR after warm-up),
so the empirical frontier at C is the best eval point at or below C, and axis*(C) is the axis value
(n by default) of the run that reaches it. The fitted frontier (method `frontier`) is in allocation.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def compute_grid(df: pd.DataFrame, compute: str, points: int) -> np.ndarray:
    positive = df.loc[df[compute] > 0, compute]
    if positive.empty:
        return np.array([])
    lo, hi = positive.min(), positive.max()
    return np.unique(np.geomspace(lo, hi, points)) if hi > lo else np.array([hi])


def best_at(compute: np.ndarray, values: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each C in grid, the highest of `values` with compute <= C and its position in them
    (NaN and -1 where no compute is that small). Vectorised: a running maximum over compute."""
    compute, values = np.asarray(compute, float), np.asarray(values, float)
    if compute.size == 0:
        return np.full(np.size(grid), np.nan), np.full(np.size(grid), -1)
    order = np.argsort(compute, kind="stable")
    v = values[order]
    best = np.maximum.accumulate(v)
    first = np.r_[True, v[1:] > best[:-1]]  # where the running maximum is set: its first occurrence
    where = np.maximum.accumulate(np.where(first, np.arange(v.size), 0))
    k = np.searchsorted(compute[order], np.asarray(grid, float) * (1 + 1e-9), side="right") - 1
    seen = k >= 0
    k = np.maximum(k, 0)
    return np.where(seen, best[k], np.nan), np.where(seen, order[where[k]], -1)


def best_below(df: pd.DataFrame, metric: str, compute: str, grid: np.ndarray, axis: str | None = None) -> pd.DataFrame:
    """For each C in grid, the row with the highest metric among rows with compute <= C."""
    rows = df.dropna(subset=[metric])
    value, at = best_at(rows[compute].to_numpy(float), rows[metric].to_numpy(float), grid)
    seen = at >= 0
    out = pd.DataFrame({"compute": np.asarray(grid, float)[seen], "value": value[seen]})
    if axis:
        out["axis_star"] = rows[axis].to_numpy()[at[seen]]
    return out


def frontier(
    df: pd.DataFrame, metric: str = "val_avg@k", axis: str = "n", compute: str = "rollouts", points: int = 24
) -> pd.DataFrame:
    """Columns compute, value, axis_star: one row per point of a log grid over the runs' compute."""
    _require(df, [metric, axis, compute])
    return best_below(df, metric, compute, compute_grid(df, compute, points), axis=axis)


def axis_curves(
    df: pd.DataFrame, metric: str = "val_avg@k", axis: str = "n", compute: str = "rollouts", points: int = 24
) -> pd.DataFrame:
    """Per axis value (each n), its own best-so-far curve over the other axes (B_p ...)."""
    _require(df, [metric, axis, compute])
    grid = compute_grid(df, compute, points)
    parts = [best_below(g, metric, compute, grid).assign(**{axis: value}) for value, g in df.groupby(axis)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["compute", "value", axis])


def _require(df: pd.DataFrame, columns: list[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"results have no column(s) {', '.join(missing)} (have: {', '.join(map(str, df.columns))})")
