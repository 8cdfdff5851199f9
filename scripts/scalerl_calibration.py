"""scalerl's `best` on the truth bank (docs/fitting.md's table): for each truth of
isoflop_cli/fit/bank.py, how often the method names one best n (the curve highest at the largest
budget beyond the noise) and how often the n it names is not in the truth's n* set there.

    .venv/bin/python scripts/scalerl_calibration.py [--grids 50] [--seeds 4] [--truths NAME ...]

Sweeps are drawn from a generator seeded by the truth's position in the bank and the seeds, so a row
is the same on every machine. One core, about 0.4-1.3 s a grid (50 bootstrap resamples).
"""

from __future__ import annotations

import argparse

import numpy as np

from isoflop_cli.fit.bank import BANK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--truths", nargs="+", default=list(BANK), choices=list(BANK))
    args = parser.parse_args()
    print("| truth | n* at the last budget | its lead | one n named | named outside n* |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in args.truths:
        truth = BANK[name]
        got = truth.scalerl_bests(
            args.seeds, args.grids, np.random.default_rng(1000 * list(BANK).index(name) + args.seeds)
        )
        last = truth.n_star()[-1]
        named_share = sum(b is not None for b in got) / args.grids
        wrong = sum(b is not None and b not in last for b in got) / args.grids
        star = "/".join(map(str, last))
        print(f"| {name} | {star} | {truth.gap():.3f} | {named_share:.0%} | {wrong:.0%} |", flush=True)


if __name__ == "__main__":
    main()
