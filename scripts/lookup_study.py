"""The lookup study end to end, through isoflop's own commands: the seed's easy and hard sets side
by side, where problems need skills of their own (isoflop_cli/recipe/lookup.py says why a lookup).

1. the pool (512 keys, verl-style parquet) and the warm-started model (built once, cached);
2. `isoflop calibrate --config lookup`: every key's pass rate over 16 samples, cut into easy
   ([0.3, 0.6]) and hard ([0.0625, 0.125]: one or two successes in 16) sets;
3. `isoflop sweep --config lookup` on each set (n 2-16, B_p 16; budgets doubling from 1,024 rollouts
   to 8,192 on the easy set, to 32,768 on the hard one; validation asks the set's own keys), then
   `isoflop fit`. Seeds: at least three, and as many as the plan's power analysis asks for to make
   the fit's answer to "does n* rise?" 80% likely (at most MAX_SEEDS); its plan shows the cost;
4. one table per set: val_avg@k per n and budget (mean and sd over seeds), zero_var_frac, and
   best@k / worst@k at the largest budget (coverage against sharpening); and one figure of both sets
   side by side (`study.png` / `.svg`: val_avg@k against rollouts per n, mean and range over seeds).

`make sweep` runs it (the embedded default study):

    python scripts/lookup_study.py [--out isoflop-runs/lookup] [--seeds 0,1,2] [--easy-to 8192] [--hard-to 32768]
                                   [--n 2,4,8,16]

A rerun keeps every finished run (isoflop's own resume).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import matplotlib
import pandas as pd

from isoflop_cli.recipe import lookup

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SETS = ("easy", "hard")
# Each set's largest budget. Every n has levelled off on the easy set by 8,192 rollouts; on the hard
# set the small-n cells level off below the large-n ones only past 16,384 (the README's "What it
# shows"), so its sweep goes a doubling further.
TOP = {"easy": 8192, "hard": 32768}
FIRST = 1024


# The between-seed sd of val_avg@4 that the hard set's three-seed sweep measured (its fit.json's
# noise.seed_sd): the power analysis before each sweep reads the noise from it, not the default.
SEED_SD = 0.033


def doubling(top: int) -> list[int]:
    """FIRST, 2 FIRST, 4 FIRST, ... up to `top` (FIRST alone when top is below it)."""
    budgets = [FIRST]
    while budgets[-1] * 2 <= top:
        budgets.append(budgets[-1] * 2)
    return budgets


def isoflop(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "isoflop_cli", *args], check=True)


MAX_SEEDS = 6  # what this study spends at most per cell on a 2-core machine (each seed of the hard set: ~2.5 min)


def powered_seeds(overrides: list[str]) -> int:
    """The seeds per cell the plan's power analysis asks for (80% that fit calls a rising n* of the
    size power.* describes), at most MAX_SEEDS; says which, with the figures."""
    planned = subprocess.run(
        [sys.executable, "-m", "isoflop_cli", "plan", "--config", "lookup", "--json", *overrides],
        check=True,
        capture_output=True,
        text=True,
    )
    power = json.loads(planned.stdout)["power"]
    want = power["seeds_for_80"]
    seeds = min(want or MAX_SEEDS, MAX_SEEDS)
    print(
        f"power: {power['trend']:.0%} with {power['seeds']} seed(s) per cell; {want or f'more than {MAX_SEEDS}'} "
        f"reach 80%: running {seeds}"
        + ("" if want and want <= MAX_SEEDS else f" (this study's budget is {MAX_SEEDS} a cell)"),
        flush=True,
    )
    return seeds


def summary(sweep_dir: Path) -> str:
    """val_avg@k (mean ± sd over seeds) per budget and n, zero_var_frac, and best/worst@k at the top."""
    df = pd.read_parquet(sweep_dir / "results.parquet")
    df = df[df["rollouts"] > 0]
    last = df.loc[df.groupby("run_id")["step"].idxmax()]
    lines = []
    for column in ("val_avg@k", "zero_var_frac"):
        mean = df.pivot_table(index="rollouts", columns="n", values=column, aggfunc="mean")
        sd = df.pivot_table(index="rollouts", columns="n", values=column, aggfunc="std")
        cells = mean.map("{:.3f}".format) + " ± " + sd.map("{:.3f}".format)
        lines += [f"{column} (mean ± sd over {df['seed'].nunique()} seeds)", cells.to_string(), ""]
    ends = last.groupby("n")[["val_avg@k", "val_best@k", "val_worst@k"]].mean()
    lines += [f"at {int(last['rollouts'].max()):,} rollouts (means over seeds)", ends.round(3).to_string()]
    return "\n".join(lines)


def figure(out: Path) -> Path:
    """Both sets side by side, as the seed's figures show them: val_avg@k against rollouts, one line
    per n (the mean over seeds), the band between the seeds' lowest and highest."""
    fig, axes = plt.subplots(
        1, len(SETS), figsize=(10, 4), sharex=True, sharey=True
    )  # one rollouts axis: the sets compare at a glance
    for ax, name in zip(axes, SETS):
        df = pd.read_parquet(out / name / "results.parquet")
        for n, rows in df.groupby("n"):
            by = rows.groupby("rollouts")["val_avg@k"]
            x = (
                by.mean().index.to_numpy().clip(min=rows["rollouts"][rows["rollouts"] > 0].min() / 2)
            )  # the base point, drawn left of the first budget
            (line,) = ax.plot(x, by.mean(), marker="o", ms=3, label=f"n={n}")
            ax.fill_between(x, by.min(), by.max(), color=line.get_color(), alpha=0.15, lw=0)
        ax.set(
            xscale="log",
            xlabel="rollouts (leftmost point: the base model)",
            title=f"{name} set ({df['seed'].nunique()} seeds)",
        )
    axes[0].set_ylabel("validation avg@k")
    axes[-1].legend()
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(out / f"study{suffix}", dpi=120)
    plt.close(fig)
    return out / "study.png"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("isoflop-runs/lookup"))
    parser.add_argument(
        "--seeds",
        default=None,
        help="seeds per cell, e.g. 0,1,2 (default: at least three, as many as the plan's power "
        f"analysis asks for, at most {MAX_SEEDS})",
    )
    for name in SETS:
        parser.add_argument(
            f"--{name}-to",
            type=int,
            default=TOP[name],
            help=f"the {name} set's largest budget (rollouts; budgets double from {FIRST:,})",
        )
    parser.add_argument("--n", default="2,4,8,16")
    args = parser.parse_args()
    out = args.out.resolve()
    lookup.write_pool(out / "pool.parquet")
    model = lookup.model_dir()
    common = [f"model.path={model}"]
    isoflop(
        "calibrate",
        "--config",
        "lookup",
        "--root",
        str(out),
        *common,
        f"task.train={out / 'pool.parquet'}",
        f"task.val={out / 'pool.parquet'}",
        "name=calibration",
        "eval.problems=8",
    )  # calibrate plans a sweep on each set: sized by the set
    for name in SETS:
        problems = out / "calibration" / f"{name}.parquet"
        keys = len(pd.read_parquet(problems))
        budgets = ",".join(map(str, doubling(getattr(args, f"{name}_to"))))
        overrides = [
            *common,
            f"task.train={problems}",
            f"task.val={problems}",
            f"name={name}",
            f"eval.problems={keys}",
            f"grid.budgets=[{budgets}]",
            f"grid.n=[{args.n}]",
            f"power.seed_sd={SEED_SD}",
        ]
        seeds = args.seeds or ",".join(map(str, range(max(3, powered_seeds([*overrides, "grid.seed=[0,1,2]"])))))
        isoflop(
            "sweep", "--config", "lookup", "--root", str(out), *overrides, f"grid.seed=[{seeds}]"
        )  # its plan: cost and power first
        isoflop("fit", str(out / name))
    for name in SETS:
        print(f"\n== {name} set ==\n{summary(out / name)}")
    print(f"\nboth sets side by side: {figure(out)}; each set's fit: {out}/<set>/fit/report.md")


if __name__ == "__main__":
    main()
