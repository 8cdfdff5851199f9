"""The adaptive schedule's margin: compute share against agreement with the full grid, by replay.

Replays `grid.schedule=adaptive` at several margins on synthetic full grids with a known n*(C)
(rising from 4 to 64, then saturating; three noise levels) and on any recorded results given as
arguments (a sweep dir, results.parquet or CSV), and prints per grid and margin: the share of the
full grid's compute spent, the share of budgets whose n* is within a factor of 2 of the full
grid's, and the largest frontier value gap. The README's table is this script's output.

    python scripts/bench_replay.py [RESULTS ...] [--margins 0,0.01,0.02,0.05]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from isoflop_cli.fit import data
from isoflop_cli.fit.replay import replay
from isoflop_cli.schedule import Schedule


def synthetic(noise: float, seed: int = 0, n_values=(4, 8, 16, 32, 64, 128), B_p=(8, 16), c_max: float = 2.0**20,
              points: int = 10) -> pd.DataFrame:
    """A full grid whose cells follow sigmoids in log2 C: larger n rises later to a higher plateau
    (the plateau stops growing at n = 64, and n = 128 rises later still), so n*(C) climbs from 4 to
    64 and saturates. Eval points at C_max halved, as a sweep records them; noise per point and run."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in n_values:
        level = min(np.log2(n / 4), 4)
        upper, mid = 0.5 + 0.1 * level, 11 + 1.5 * np.log2(n / 4)
        for bp in B_p:
            run = f"n{n}_bp{bp}"
            effect = rng.normal(0, noise / 2)
            for c in [0.0] + [c_max / 2**i for i in range(points - 1, -1, -1)]:
                if 0 < c < n * bp:
                    continue
                y = 0.1 + (upper - 0.1) * special.expit(1.2 * (np.log2(c) - mid)) if c else 0.1
                y = float(np.clip(y + (effect + rng.normal(0, noise) if c else 0.0), 0, 1))
                rows.append({"run_id": run, "n": n, "B_p": bp, "rollouts": c, "val_avg@k": y})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--margins", default="0,0.01,0.02,0.05")
    parser.add_argument("--metric", default="val_avg@k")
    parser.add_argument("--compute", default="rollouts")
    args = parser.parse_args()
    grids = {f"synthetic, noise {s}": synthetic(s) for s in (0.005, 0.02, 0.05)}
    for path in args.results:
        df, _ = data.load([path])
        grids[str(path)] = df
    print("| grid | margin | compute share | n* within 2x | max value gap |\n| --- | --- | --- | --- | --- |")
    for name, df in grids.items():
        if data.RUN not in df.columns:
            df = df.assign(**{data.RUN: df["run_id"].astype(str)})
        for margin in (float(m) for m in args.margins.split(",")):
            r = replay(df, args.metric, "n", args.compute, Schedule.adaptive, margin)
            print(f"| {name} | {margin:g} | {r.compute_share:.2f} | {r.n_star_agreement:.2f} | {r.max_value_gap:.3f} |")


if __name__ == "__main__":
    main()
