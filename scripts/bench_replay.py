"""The adaptive schedule's margin: compute share against agreement with the full grid, by replay.

Replays `grid.schedule=adaptive` at several margins on synthetic full grids with a known n*(C)
(rising from 4 to 64, then saturating; three noise levels) and on any recorded results given as
arguments (a sweep dir, results.parquet or CSV), and prints per grid and margin: the share of the
full grid's compute spent, the share of budgets whose n* is within a factor of 2 of the full
grid's, the largest frontier value gap between the recorded points, and on the synthetic grids the
frontier lost in truth (noise-free curves). The README's table is this script's output.

    python scripts/bench_replay.py [RESULTS ...] [--margins 1,1.5,2,2.5] [--seeds 6]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from isoflop_cli.fit import data
from isoflop_cli.fit.replay import replay
from isoflop_cli.config.schema import Schedule


def truth(n: float, c: np.ndarray) -> np.ndarray:
    """The synthetic grid's noise-free curve of a cell with n rollouts per prompt at compute c > 0:
    a sigmoid in log2 C; larger n rises later to a higher plateau (the plateau stops growing at
    n = 64, and n = 128 rises later still), so n*(C) climbs from 4 to 64 and saturates."""
    level = min(np.log2(n / 4), 4)
    upper, mid = 0.5 + 0.1 * level, 11 + 1.5 * np.log2(n / 4)
    return 0.1 + (upper - 0.1) * special.expit(1.2 * (np.log2(c) - mid))


def synthetic(noise: float, seed: int = 0, n_values=(4, 8, 16, 32, 64, 128), B_p=(8, 16), c_max: float = 2.0**20,
              points: int = 10) -> pd.DataFrame:
    """A full grid of `truth` curves, one cell per (n, B_p): eval points at C_max halved, as a sweep
    records them, with noise per point and a random effect per run."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in n_values:
        for bp in B_p:
            effect = rng.normal(0, noise / 2)
            for c in [0.0] + [c_max / 2**i for i in range(points - 1, -1, -1)]:
                if 0 < c < n * bp:
                    continue
                y = float(np.clip(truth(n, c) + effect + rng.normal(0, noise), 0, 1)) if c else 0.1
                rows.append({"run_id": f"n{n}_bp{bp}", "n": n, "B_p": bp, "rollouts": c, "val_avg@k": y})
    return pd.DataFrame(rows)


def true_gap(df: pd.DataFrame, r) -> float:
    """The frontier the adaptive schedule lost, in truth: at each stage budget, the best noise-free
    value of any cell less the best of the cells as far as they ran (a stopped cell keeps its value
    where it stopped). Free of the noise a frontier of recorded points carries."""
    stop = dict(zip(r.stopped["run"], r.stopped["stopped_at"]))
    cells = df.drop_duplicates("run_id")[["run_id", "n"]].itertuples(index=False)
    cells = list(cells)
    return max(max(truth(n, b) for _, n in cells) - max(truth(n, min(b, stop.get(run, b))) for run, n in cells) for b in r.stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--margins", default="1,1.5,2,2.5")
    parser.add_argument("--noise", default="0.005,0.02,0.05", help="noise sd of the synthetic grids")
    parser.add_argument("--seeds", type=int, default=6, help="synthetic grids per noise level")
    parser.add_argument("--metric", default="val_avg@k")
    parser.add_argument("--compute", default="rollouts")
    args = parser.parse_args()
    margins = [float(m) for m in args.margins.split(",")]
    print("| grid | margin | compute share, mean (max) | n* within 2x, worst | frontier gap, worst | true frontier lost, worst |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for sd in (float(s) for s in args.noise.split(",")):
        grids = [synthetic(sd, seed).assign(**{data.RUN: lambda d: d["run_id"]}) for seed in range(args.seeds)]
        for margin in margins:
            runs = [(replay(df, args.metric, "n", args.compute, Schedule.adaptive, margin), df) for df in grids]
            share = [r.compute_share for r, _ in runs]
            print(f"| synthetic, noise {sd:g} ({args.seeds} seeds) | {margin:g} | {np.mean(share):.2f} ({max(share):.2f}) | "
                  f"{min(r.n_star_agreement for r, _ in runs):.2f} | {max(r.max_value_gap for r, _ in runs):.3f} | "
                  f"{max(true_gap(df, r) for r, df in runs):.3f} |", flush=True)
    for path in args.results:
        df, _ = data.load([path])
        for margin in margins:
            r = replay(df, args.metric, "n", args.compute, Schedule.adaptive, margin)
            print(f"| {path} | {margin:g} | {r.compute_share:.2f} | {r.n_star_agreement:.2f} | {r.max_value_gap:.3f} | (unknown) |", flush=True)


if __name__ == "__main__":
    main()
