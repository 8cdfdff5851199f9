"""Time `isoflop fit` on a sweep-sized synthetic result set: 2,000 runs x 40 eval points, 200 bootstrap
resamples (target: under 60 s on 2 cores). Prints the time per method and in all.

    .venv/bin/python scripts/bench_fit.py [--runs 2000] [--points 40] [--bootstrap 200] [--methods frontier ...]

The runs: n in 2..256 x B_p in {4, 8, 16, 32, 64} x seeds; each run's metric is a sigmoid of log10 C
whose plateau and midpoint rise with n (so n*(C) rises), plus noise. Parametric gets its own data,
as Chinchilla's approach 3 uses it: as many runs, each one final loss (`--parametric-points` reads
each run at more token counts), with the Chinchilla law as truth.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from isoflop_cli.fit.curves import sigmoid
from isoflop_cli.fit.data import RUN, FitSpec
from isoflop_cli.fit.methods import METHODS, run


def sweep_results(runs: int, points: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ns, bps = 2 ** np.arange(1, 9), np.array([4, 8, 16, 32, 64])
    cells = [(n, bp) for n in ns for bp in bps]
    compute = np.r_[0.0, np.geomspace(1e3, 1e7, points - 1)]
    frames = []
    for i in range(runs):
        n, bp = cells[i % len(cells)]
        k = np.log2(n)
        mean = sigmoid(
            np.log10(np.maximum(compute, 1)),
            0.1,
            0.55 + 0.04 * min(k, 6) - 0.03 * max(k - 6, 0) - 0.01 * np.log2(bp / 4),
            2.5 + 0.5 * k,
            1.5,
        )
        frames.append(
            pd.DataFrame(
                {
                    "run_id": f"r{i}",
                    "n": n,
                    "B_p": bp,
                    "seed": i // len(cells),
                    "rollouts": compute,
                    "val_avg@k": np.clip(mean + rng.normal(0, 0.01, points), 0, 1),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def chinchilla_results(runs: int, points: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = np.repeat(10 ** rng.uniform(7.8, 10.2, runs), points)  # model sizes 7e7..1.6e10
    d = 10 ** rng.uniform(9.0, 11.7, runs * points)  # tokens 1e9..5e11
    loss = (1.82 + 478 / n**0.347 + 2144 / d**0.367) * np.exp(rng.normal(0, 0.01, n.size))
    return pd.DataFrame({"run_id": np.repeat([f"m{i}" for i in range(runs)], points), "N": n, "D": d, "loss": loss})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--parametric-points", type=int, default=1)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    args = ap.parse_args()
    sweep = sweep_results(args.runs, args.points).assign(**{RUN: lambda d: d["run_id"]})
    chin = chinchilla_results(args.runs, args.parametric_points).assign(**{RUN: lambda d: d["run_id"]})
    print(
        f"{args.runs} runs x {args.points} eval points ({args.parametric_points} "
        f"for parametric), {args.bootstrap} bootstrap resamples"
    )
    total = 0.0
    for method in args.methods:
        if method == "parametric":
            df, spec = chin, FitSpec(metric="loss", size_col="N", tokens_col="D", bootstrap=args.bootstrap)
        else:
            df, spec = sweep, FitSpec(bootstrap=args.bootstrap)
        start = time.perf_counter()
        result = run(df, spec, [method], explicit=True)[method]
        seconds = time.perf_counter() - start
        total += seconds
        shown = {k: round(v, 4) for k, v in list(result.entry["params"].items())[:5]}
        print(f"{method:15s} {seconds:7.2f} s  converged={result.entry['converged']}  {shown}")
    print(f"{'all':15s} {total:7.2f} s")


if __name__ == "__main__":
    main()
