"""Torch's CPU threads waiting by spinning (OMP_WAIT_POLICY=ACTIVE) or by sleeping (PASSIVE), alone
on the machine and beside one other torch process (as a second run would be).

Why the test suite sets PASSIVE (tests/conftest.py: its runs share two cores with the pytest
process, the Ray jobs and each other) and isoflop itself does not: a sweep's jobs get
OMP_NUM_THREADS=cluster.cpus_per_run and the head never runs more jobs than its CPUs, so no two
runs' threads compete, and a run alone is faster spinning.

The same `isoflop run` (the embedded default to 128 rollouts, all threads torch chooses) in each of
four settings, each a fresh process: prints the run's own wall time (its last eval point's wall_s:
training and evaluation, not interpreter start) and the ratio to ACTIVE alone. Run it alone on the
machine: the "beside torch" settings start their own competitor (a loop of small matrix products
in torch, with its own threads and the same wait policy).

    .venv/bin/python scripts/bench_threads.py [--repeats 3]

On 2 cores (median of 3): ACTIVE 0.62 s, PASSIVE 1.51 s (2.41x), ACTIVE beside torch 5.25 s
(8.40x), PASSIVE beside torch 0.79 s (1.27x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMPETITOR = "import torch\na = torch.randn(64, 64)\nwhile True:\n    a = torch.tanh(a @ a)"
RUN = ["n=4", "B_p=2", "eval.problems=8", "eval.samples=4", "grid.budgets=[128]", "grid.eval_points=4"]


def run_wall_s(policy: str, busy: bool) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"OMP_WAIT_POLICY": policy}
    # The competitor: another torch process with its own threads and the same wait policy, as a
    # second run on the machine would be.
    spinner = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=env) if busy else None
    try:
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(
                [sys.executable, "-m", "isoflop_cli", "run", *RUN, "--out", out],
                env=env,
                check=True,
                capture_output=True,
            )
            rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
            return float(rows[-1]["wall_s"])
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    run_wall_s("PASSIVE", False)  # builds the embedded model once, outside the timings
    settings = [
        ("ACTIVE", "ACTIVE", False),
        ("PASSIVE", "PASSIVE", False),
        ("ACTIVE, beside torch", "ACTIVE", True),
        ("PASSIVE, beside torch", "PASSIVE", True),
    ]
    medians = {}
    for label, policy, busy in settings:
        medians[label] = statistics.median(run_wall_s(policy, busy) for _ in range(args.repeats))
    reference = medians["ACTIVE"]
    print(f"{'setting':<24} {'run wall_s':>10} {'vs ACTIVE':>10}   ({os.cpu_count()} CPUs, median of {args.repeats})")
    for label, wall in medians.items():
        print(f"{label:<24} {wall:>10.2f} {wall / reference:>9.2f}x")


if __name__ == "__main__":
    main()
