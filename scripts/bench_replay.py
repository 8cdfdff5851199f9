"""The adaptive schedule against the full grid, by replay, on truths of several shapes.

Replays `grid.schedule=adaptive` on synthetic full grids with a known, noise-free truth per cell,
in families the rule's own model (one monotone sigmoid per cell) does and does not describe:

- sigmoid: n*(C) rises from 4 to 64 and saturates (larger n rises later to a higher plateau);
- late: the same, but the n = 128 cells stay flat and then jump past the frontier at a late budget
  (a rare success found late on a hard set: their groups rarely show unequal rewards before);
- linear: curves linear in log C after a start that comes later for larger n, which climbs faster
  and overtakes;
- flat: the sigmoid grid whose n <= 16 cells never learn (no group ever has unequal rewards);
- tied: every cell the same sigmoid (no winner: the rule should stop spending on ties).

Each grid records per eval point the metric (truth + noise + a random effect per run) and
`zero_var_frac` (the share of the groups since the last point whose rewards were all equal, drawn
from the training success rate). Printed per family, noise and margin: the share of the full grid's
compute spent (the ratio at equal work: the same cells, each to where the schedule let it run), the
share of grids whose true frontier loss (noise-free curves, every stage budget) is at most 0.01, and
the largest loss; then the same over every grid of every family and noise level. Then the recorded
results given as arguments (a sweep dir, results.parquet or CSV), where there is no truth. The
README's tables are this script's output.

    python scripts/bench_replay.py [RESULTS ...] [--families sigmoid,late,...] [--margins 2.5] [--seeds 8]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from isoflop_cli.config.schema import DEFAULT_INDIFFERENCE, Schedule
from isoflop_cli.fit import data
from isoflop_cli.fit.replay import Replay, replay

LOSS = 0.01  # a grid loses the frontier when its true frontier falls short by more than this
BASE = 0.1  # every cell's metric at C = 0
RARE = 0.002  # the training success rate of a cell that has not risen (0 for one that never learns)
Curve = Callable[[float], float]  # log2 C -> the noise-free metric


def sigmoid(n: int, x: float) -> float:
    """The sigmoid family's curve: larger n rises later to a higher plateau (the plateau stops
    growing at n = 64, and n = 128 rises later still), so n*(C) climbs from 4 to 64 and saturates."""
    level = min(np.log2(n / 4), 4)
    upper, mid = 0.5 + 0.1 * level, 11 + 1.5 * np.log2(n / 4)
    return BASE + (upper - BASE) * special.expit(1.2 * (x - mid))


def family(name: str, n: int, rng: np.random.Generator) -> tuple[Curve, bool]:
    """One cell's truth in a family, and whether it can learn at all."""
    if name == "late" and n == 128:
        jump = rng.uniform(17, 19)  # flat at the base, then up to 0.95 within a doubling or two
        return (lambda x: BASE + 0.85 * special.expit(4 * (x - jump))), True
    if name == "linear":
        start, slope = 10 + np.log2(n / 4), 0.03 * (1 + 0.7 * np.log2(n / 4)) * rng.uniform(0.9, 1.1)
        return (lambda x: min(BASE + slope * max(x - start, 0.0), 1.0)), True
    if name == "flat" and n <= 16:
        return (lambda x: BASE), False
    if name == "tied":
        return (lambda x: sigmoid(16, x)), True
    return (lambda x: sigmoid(n, x)), True


def synthetic(
    noise: float,
    seed: int = 0,
    name: str = "sigmoid",
    n_values=(4, 8, 16, 32, 64, 128),
    B_p=(8, 16),
    c_max: float = 2.0**20,
    points: int = 10,
) -> pd.DataFrame:
    """A full grid of one family, one cell per (n, B_p): eval points at C_max halved, as a sweep
    records them, with noise per point and a random effect per run; `truth` is the noise-free curve."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in n_values:
        for bp in B_p:
            curve, learns = family(name, n, rng)
            effect, before = rng.normal(0, noise / 2), 0.0
            for c in [0.0] + [c_max / 2**i for i in range(points - 1, -1, -1)]:
                if 0 < c < n * bp:
                    continue
                true = curve(np.log2(c)) if c else BASE
                y = float(np.clip(true + effect + rng.normal(0, noise), 0, 1)) if c else BASE
                rows.append(
                    {
                        "run_id": f"n{n}_bp{bp}",
                        "n": n,
                        "B_p": bp,
                        "rollouts": c,
                        "val_avg@k": y,
                        "truth": true,
                        "zero_var_frac": zero_var(rng, true, learns, n, c - before) if c else np.nan,
                    }
                )
                before = c
    return pd.DataFrame(rows)


def zero_var(rng: np.random.Generator, true: float, learns: bool, n: int, rollouts: float) -> float:
    """The share of a window's groups (n rollouts each) whose rewards were all equal, at the
    training success rate p = RARE + the cell's gain over its base (0 if it never learns)."""
    p = min(RARE + true - BASE, 1.0) if learns else 0.0
    groups = max(int(rollouts // n), 1)
    return 1 - rng.binomial(groups, 1 - p**n - (1 - p) ** n) / groups


def true_gap(df: pd.DataFrame, r: Replay) -> float:
    """The frontier the adaptive schedule lost, in truth: at each stage budget, the best noise-free
    value of any cell less the best of the cells as far as they ran (a stopped cell keeps its value
    where it stopped). Free of the noise a frontier of recorded points carries."""
    stop = dict(zip(r.stopped["run"], r.stopped["stopped_at"]))
    ran = df["rollouts"] <= df["run_id"].map(stop).fillna(np.inf) * 1.1
    return max(
        df.loc[df["rollouts"] <= b * 1.1, "truth"].max() - df.loc[ran & (df["rollouts"] <= b * 1.1), "truth"].max()
        for b in r.stages
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--families", default="sigmoid,late,linear,flat,tied")
    parser.add_argument("--margins", default="2.5")
    parser.add_argument("--indifference", type=float, default=DEFAULT_INDIFFERENCE)
    parser.add_argument("--noise", default="0.005,0.02,0.05", help="noise sd of the synthetic grids")
    parser.add_argument("--seeds", type=int, default=8, help="synthetic grids per family and noise level")
    parser.add_argument("--metric", default="val_avg@k")
    parser.add_argument("--compute", default="rollouts")
    args = parser.parse_args()
    margins = [float(m) for m in args.margins.split(",")]
    pooled: dict[float, list[tuple[float, float]]] = {m: [] for m in margins}  # margin -> (share, loss) of every grid
    print(
        f"indifference {args.indifference:g}\n\n| family | noise sd | margin | compute share, mean (max) "
        f"| grids losing <= {LOSS:g} | true frontier lost, worst |\n| --- | --- | --- | --- | --- | --- |"
    )
    for name in args.families.split(","):
        for sd in (float(s) for s in args.noise.split(",")):
            grids = [
                synthetic(sd, seed, name).assign(**{data.RUN: lambda d: d["run_id"]}) for seed in range(args.seeds)
            ]
            for margin in margins:
                runs = [
                    (
                        replay(
                            df,
                            args.metric,
                            "n",
                            args.compute,
                            Schedule.adaptive,
                            margin,
                            indifference=args.indifference,
                        ),
                        df,
                    )
                    for df in grids
                ]
                share, lost = [r.compute_share for r, _ in runs], [true_gap(df, r) for r, df in runs]
                pooled[margin] += zip(share, lost)
                print(
                    f"| {name} | {sd:g} | {margin:g} | {np.mean(share):.2f} ({max(share):.2f}) | "
                    f"{np.mean(np.array(lost) <= LOSS):.2f} | {max(lost):.3f} |",
                    flush=True,
                )
    for margin, rows in pooled.items():
        share, lost = np.array(rows).T
        print(
            f"| every grid above ({len(rows)}) | all | {margin:g} | {share.mean():.2f} ({share.max():.2f}) | "
            f"{np.mean(lost <= LOSS):.2f} | {lost.max():.3f} |",
            flush=True,
        )
    for path in args.results:
        df, _ = data.load([path])
        for margin in margins:
            r = replay(df, args.metric, "n", args.compute, Schedule.adaptive, margin, indifference=args.indifference)
            print(
                f"| {path} | (recorded) | {margin:g} | {r.compute_share:.2f} | n* within 2x {r.n_star_agreement:.2f} | "
                f"gap between points {r.max_value_gap:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
