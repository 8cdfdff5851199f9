"""The n* trend test's call rates on the truth bank (docs/fitting.md's table): for each truth of
isoflop_cli/fit/bank.py (sweeps simulated from how GRPO learns), its n* over the budgets and how
often `fit`'s test calls "rises", "falls", or reads every n tied at the last budget, per seeds a cell.

    .venv/bin/python scripts/trend_calibration.py [--grids 300] [--seeds 4 8 16] [--truths NAME ...]

Each truth's sweeps are drawn from a generator seeded by the truth's position in the bank, so a row
is the same on every machine. One core, about 1-4 s per 100 grids at 8 seeds.
"""

from __future__ import annotations

import argparse

import numpy as np

from isoflop_cli.fit.bank import BANK


def rates(truth, seeds: int, grids: int, seed: int) -> dict[str, float]:
    got = truth.trends(seeds, grids, np.random.default_rng(seed))
    tied = sum(t.reading == "tied at the last budget" for t in got)
    return {
        "rises": sum(t.call == "rises" for t in got) / grids,
        "falls": sum(t.call == "falls" for t in got) / grids,
        "tied": tied / grids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--truths", nargs="+", default=list(BANK), choices=list(BANK))
    args = parser.parse_args()
    print(
        "| truth | kind | n grid | n* over the budgets | "
        + " | ".join(f"{s} seeds: rises / falls / tied" for s in args.seeds)
        + " |"
    )
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in args.seeds) + " |")
    for name in args.truths:
        truth = BANK[name]
        star = ", ".join("/".join(map(str, s)) for s in truth.n_star())
        cols = []
        for seeds in args.seeds:
            r = rates(truth, seeds, args.grids, seed=1000 * list(BANK).index(name) + seeds)
            cols.append(f"{r['rises']:.1%} / {r['falls']:.1%} / {r['tied']:.1%}")
        ns = f"{truth.ns[0]}..{truth.ns[-1]}"
        print(f"| {name} | {truth.kind} | {ns} | {star} | " + " | ".join(cols) + " |", flush=True)


if __name__ == "__main__":
    main()
