"""Time `grid.expand` (what `isoflop plan` and `isoflop sweep` spend before any compute) on grids of
10^3, 10^4 and 10^5 cells (target: 10^4 cells in under 5 s; 10^5 plannable). Each size runs in a
fresh process; prints the plan's seconds, ms and KB per cell, the process's peak memory above what it
held before planning, and the speed-up against the per-cell cost before the planner was restructured.

    .venv/bin/python scripts/bench_plan.py [--sizes 1000 10000 100000] [--cli]

The grids: grid.n (from 2: a group of one is refused) x grid.B_p x grid.seed x an algo.kl_coef axis,
every cell feasible (rollout budgets).
--cli also times `isoflop plan --json` end to end on the 10^4-cell grid (Hydra compose, JSON output).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

# Before the restructuring (measured 2026-12-01 with this script, this machine, 2 shared cores): every
# cell copied the DictConfig, converted it to a container for its run id and re-derived its step
# FLOPs. 10^3 cells: 8.6 s, 8.6 ms and 128 KB of peak memory per cell (10^2 cells: 5.7 ms, 94 KB).
# The issue reported 25-40 ms and ~0.25 MB per cell elsewhere: 7 minutes and 2.4 GB for 10^4 cells.
REFERENCE_MS_PER_CELL = 8.6
REFERENCE_MB_PER_CELL = 0.125

SHAPES = {  # cells: (n values, B_p values, seeds, kl_coef values)
    100: (5, 2, 10, 1),
    1000: (5, 2, 50, 2),
    10000: (5, 4, 100, 5),
    100000: (10, 5, 100, 20),
}


def overrides(size: int) -> list[str]:
    n, bp, seeds, kl = SHAPES[size]
    return [
        f"grid.n=[{','.join(str(2**i) for i in range(1, n + 1))}]",
        f"grid.B_p=[{','.join(str(2**i) for i in range(bp))}]",
        f"grid.seed=[{','.join(str(s) for s in range(seeds))}]",
        f"+grid.axes={{algo.kl_coef:[{','.join(f'{0.001 * i:g}' for i in range(kl))}]}}",
        "grid.budgets=[65536]",
    ]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM): unlike getrusage's ru_maxrss, it starts afresh at exec, so a
    child of a large process (pytest) does not inherit its parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def one(size: int) -> dict:
    from isoflop_cli import config, grid
    from isoflop_cli.report import plan_records

    cfg = config.load(None, overrides(size))
    before = rss_mb()
    start = time.perf_counter()
    cells = grid.expand(cfg)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb() - before
    start = time.perf_counter()
    json.dumps(plan_records(cells))
    records = time.perf_counter() - start
    assert len(cells) == size and all(c.feasible for c in cells), (len(cells), sum(c.feasible for c in cells))
    return {
        "cells": size,
        "seconds": seconds,
        "ms_per_cell": 1e3 * seconds / size,
        "peak_mb": peak,
        "kb_per_cell": 1024 * peak / size,
        "records_s": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000], choices=sorted(SHAPES))
    parser.add_argument("--cli", action="store_true", help="also time `isoflop plan --json` on 10^4 cells")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    print(f"reference (before): {REFERENCE_MS_PER_CELL} ms/cell, {REFERENCE_MB_PER_CELL} MB/cell")
    for size in args.sizes:
        out = subprocess.run([sys.executable, __file__, "--one", str(size)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['cells']:>7} cells: plan {r['seconds']:7.2f} s  {r['ms_per_cell']:7.3f} ms/cell "
            f"({REFERENCE_MS_PER_CELL / r['ms_per_cell']:6.0f}x faster)  peak +{r['peak_mb']:7.1f} MB "
            f"({r['kb_per_cell']:6.2f} KB/cell, {1024 * REFERENCE_MB_PER_CELL / max(r['kb_per_cell'], 1e-9):5.0f}x "
            f"less)  records+JSON {r['records_s']:5.2f} s",
            flush=True,
        )
    if args.cli:
        exe = Path(sys.executable).with_name("isoflop")
        start = time.perf_counter()
        subprocess.run([str(exe), "plan", "--json", *overrides(10000)], capture_output=True, check=True)
        print(f"isoflop plan --json, 10^4 cells: {time.perf_counter() - start:.2f} s end to end")


if __name__ == "__main__":
    main()
