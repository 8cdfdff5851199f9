"""`plan`'s power against `fit` on the truth bank (docs/fitting.md): for each rising truth of
isoflop_cli/fit/bank.py, fit's observed call rate at each seeds a cell beside what plan predicts from
the truth described exactly (its expected means and noise at the two budgets: what a perfect pilot
would give), and from a pilot of that truth (its cells at `--pilot-seeds` seeds): the median
over the scenarios the pilot allows, their 10-90% range, and the seeds plan recommends (80% at the
range's low end), with fit's rate at those seeds.

    .venv/bin/python scripts/power_calibration.py [--grids 200] [--seeds 4 8 16] [--pilots 3]

One core, about a minute per truth.
"""

from __future__ import annotations

import argparse

import numpy as np

from isoflop_cli import power
from isoflop_cli.fit.bank import BANK, Truth


def pilot(truth: Truth, seeds: int, rng: np.random.Generator) -> power.Pilot:
    return power.Pilot.of(truth.readings(seeds, 1, rng)[0], truth.cells(seeds), f"a {truth.name} pilot")


def oracle(truth: Truth, d: power.Design, rng: np.random.Generator) -> power.Scenario:
    """The truth described to plan as a perfect pilot would: its expected means at the two budgets, each
    cell's sd about them and the runs' correlation over 4 sweeps of 8 seeds (tests/test_power.py's)."""
    sd, corr = truth.spread(8, 4, rng)
    return power.Scenario(d.x, d.stratum, d.budgets, truth.expected[:, [0, -1]], sd, corr)


def observed(truth: Truth, seeds: int, grids: int, seed: int) -> float:
    return sum(t.call == "rises" for t in truth.trends(seeds, grids, np.random.default_rng(seed))) / grids


def recommended(d: power.Design, p: power.Pilot, grids: int) -> int | None:
    return power.analyse(d, 4, grids, p).seeds_for_80


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--pilot-seeds", type=int, default=4)
    parser.add_argument("--pilots", type=int, default=3)
    parser.add_argument("--truths", nargs="+", default=[n for n, t in BANK.items() if t.kind == "rise"])
    args = parser.parse_args()
    print(
        "| truth | seeds | fit | plan, truth described | plan from each pilot: median (10-90%) "
        "| recommended: seeds -> fit |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.truths:
        truth = BANK[name]
        rng = np.random.default_rng(50_000 + list(BANK).index(name))
        pilots = [pilot(truth, args.pilot_seeds, rng) for _ in range(args.pilots)]
        d = power.Design.uniform(np.log2(truth.ns), truth.points)
        described = oracle(truth, d, rng)
        for seeds in args.seeds:
            fit = observed(truth, seeds, args.grids, seed=1000 * list(BANK).index(name) + seeds)
            plans = []
            for p in pilots:
                mid, span = power.predicted(p.scenarios(d, rng), seeds, args.grids // 10, rng)
                plans.append(f"{mid:.0%} ({span[0]:.0%}-{span[1]:.0%})")
            told = power.call_rate(described, seeds, args.grids, rng)
            print(f"| {name} | {seeds} | {fit:.0%} | {told:.0%} | {'; '.join(plans)} | |", flush=True)
        recs = []
        for p in pilots:
            s = recommended(d, p, args.grids)
            recs.append(f"{s} -> {observed(truth, s, args.grids, seed=7 + s):.0%}" if s else f"> {power.MAX_SEEDS}")
        print(f"| {name} | plan | | | | {'; '.join(recs)} |", flush=True)


if __name__ == "__main__":
    main()
