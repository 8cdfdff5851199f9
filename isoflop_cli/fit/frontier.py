"""The compute-optimal frontier: the best metric reachable with compute <= C over all runs.

A run read at compute c <= C is a run stopped early within budget C (constant LR after warm-up),
so the frontier at C is the best eval point at or below C, and axis*(C) is the axis value (n by
default) of the run that reaches it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def compute_grid(df: pd.DataFrame, compute: str, points: int) -> np.ndarray:
    positive = df.loc[df[compute] > 0, compute]
    if positive.empty:
        return np.array([])
    lo, hi = positive.min(), positive.max()
    return np.unique(np.geomspace(lo, hi, points)) if hi > lo else np.array([hi])


def best_below(df: pd.DataFrame, metric: str, compute: str, grid: np.ndarray, axis: str | None = None) -> pd.DataFrame:
    """For each C in grid, the row with the highest metric among rows with compute <= C."""
    rows = df.dropna(subset=[metric]).sort_values(compute)
    out = []
    for c in grid:
        seen = rows[rows[compute] <= c * (1 + 1e-9)]
        if seen.empty:
            continue
        best = seen.loc[seen[metric].idxmax()]
        out.append({"compute": float(c), "value": float(best[metric]), **({"axis_star": best[axis]} if axis else {})})
    return pd.DataFrame(out)


def frontier(df: pd.DataFrame, metric: str = "val_avg@k", axis: str = "n", compute: str = "rollouts", points: int = 24) -> pd.DataFrame:
    """Columns compute, value, axis_star: one row per point of a log grid over the runs' compute."""
    _require(df, [metric, axis, compute])
    return best_below(df, metric, compute, compute_grid(df, compute, points), axis=axis)


def axis_curves(df: pd.DataFrame, metric: str = "val_avg@k", axis: str = "n", compute: str = "rollouts", points: int = 24) -> pd.DataFrame:
    """Per axis value (each n), its own best-so-far curve over the other axes (B_p ...)."""
    _require(df, [metric, axis, compute])
    grid = compute_grid(df, compute, points)
    parts = [best_below(g, metric, compute, grid).assign(**{axis: value}) for value, g in df.groupby(axis)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["compute", "value", axis])


def plot(df: pd.DataFrame, front: pd.DataFrame, curves: pd.DataFrame, metric: str, axis: str, compute: str, out: Path) -> list[Path]:
    """Per-axis curves and raw eval points, with the frontier coloured by axis*(C); PNG and SVG."""
    values = sorted(df[axis].unique())
    cmap = plt.get_cmap("viridis")
    colour = {v: cmap(i / max(1, len(values) - 1)) for i, v in enumerate(values)}
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for value in values:
        raw = df[(df[axis] == value) & (df[compute] > 0)]
        ax.scatter(raw[compute], raw[metric], s=10, alpha=0.3, color=colour[value])
        c = curves[curves[axis] == value]
        ax.step(c["compute"], c["value"], where="post", color=colour[value], lw=1.5, label=f"{axis}={value}")
    ax.plot(front["compute"], front["value"], color="black", lw=2.5, alpha=0.35, zorder=3, label="frontier")
    ax.scatter(front["compute"], front["value"], c=[colour[v] for v in front["axis_star"]], edgecolors="black", s=36, zorder=4)
    ax.set_xscale("log")
    ax.set_xlabel(compute)
    ax.set_ylabel(metric)
    ax.set_title(f"compute-optimal frontier; markers coloured by {axis}*(C)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    return paths


def _require(df: pd.DataFrame, columns: list[str]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"results have no column(s) {', '.join(missing)} (have: {', '.join(map(str, df.columns))})")
