"""The n* trend test's call rates on synthetic sweeps (docs/fitting.md's table): for each truth of
tests/test_fit_trend.py (saturating curves per n, not the test's model) and two ties the docs name,
how often `fit`'s test calls "rises" and "falls", per seeds a cell.

    .venv/bin/python scripts/trend_calibration.py [--grids 300] [--seeds 2 4 8]

The grids are the tests' own (numpy generators seeded 0..grids-1), so the 4-seed rows are the
suite's figures. One core, about 1 s per 100 grids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_fit_trend import NS, NULLS, RISING, calls, true_n_star

TIES = {
    # n = 4, 8 and 16 level at one ceiling, 8 and 16 later: n* = 4 by a hair at the last budget, where
    # values on both sides of the grid's middle tie.
    "tie-across-the-middle": ({2: 0.62, 4: 0.65, 8: 0.65, 16: 0.65}, {2: 1200.0, 4: 1200.0, 8: 1920.0, 16: 3072.0}),
    # one ceiling, each doubling of n 1.3 times slower: n = 2 best until every n ties at the last budget.
    "all-tie-at-the-end": ({n: 0.65 for n in NS}, {n: 1200.0 * 1.3**k for k, n in enumerate(NS)}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grids", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    truths = {"rising": RISING, **NULLS, **TIES}
    print(f"{'truth':24} {'n* per budget':18} " + " ".join(f"{f'{s} seeds: rises/falls':>22}" for s in args.seeds))
    for name, truth in truths.items():
        rates = []
        for seeds in args.seeds:
            got = calls(truth, seeds=seeds, grids=args.grids)
            rates.append(f"{got['rises'] / args.grids:>10.1%} / {got['falls'] / args.grids:<9.1%}")
        print(
            f"{name:24} {','.join(map(str, true_n_star(truth))):18} " + " ".join(f"{r:>22}" for r in rates), flush=True
        )


if __name__ == "__main__":
    main()
