"""The embedded study, pre-registered, through isoflop's own commands: a pilot picks the design by a
rule fixed before it ran (studies/lookup-preregistration.yaml), and a confirmatory sweep on fresh
seeds answers "does n* rise with compute?" once (isoflop_cli/recipe/lookup.py says why a lookup).

    python scripts/lookup_study.py --pilot [--out isoflop-runs/lookup]   # writes studies/lookup-design.json
    python scripts/lookup_study.py [--out isoflop-runs/lookup]           # make sweep: the confirmatory study

Both first write the pool (512 keys, verl-style parquet), take the shipped warm-started model and run
`isoflop calibrate --config lookup` (16 samples a key), cutting the pre-registered bands.

`--pilot` sweeps every candidate on the pilot seeds, reads what the pilot measured (results.parquet:
cell means at each budget, wall time) and `isoflop plan --noise-from` (the power the pilot predicts),
applies the rule and writes the design with the evidence for every candidate. The default runs the
design's sweep on seeds confirm_first_seed, ... (never a pilot seed), fits it, prints the fit's answer,
a table (val_avg@k per n and budget, mean and sd over seeds; zero_var_frac; best@k and worst@k at the
largest budget) and draws `study.png` / `.svg`. A rerun keeps every finished run (isoflop's own resume).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import yaml

from isoflop_cli.recipe import lookup

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
PREREGISTRATION = ROOT / "studies" / "lookup-preregistration.yaml"
DESIGN = ROOT / "studies" / "lookup-design.json"
METRIC = "val_avg@k"
CALIBRATE_CUTS = {"medium": "easy", "hard": "hard"}  # a band's calibrate cut (calibrate.easy / .hard)


def isoflop(*args: str, capture: bool = False) -> str:
    done = subprocess.run([sys.executable, "-m", "isoflop_cli", *args], check=True, capture_output=capture, text=True)
    return done.stdout if capture else ""


def prepare(out: Path, bands: dict[str, list[float]]) -> tuple[list[str], dict[str, Path], float]:
    """The pool, the model and calibrate's bands: (the overrides every sweep shares, each band's set
    file, the seconds it took)."""
    start = time.monotonic()
    lookup.write_pool(out / "pool.parquet")
    common = [f"model.path={lookup.model_dir()}"]
    cuts = [f"calibrate.{CALIBRATE_CUTS[band]}=[{lo},{hi}]" for band, (lo, hi) in bands.items()]
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
        *cuts,
    )
    sets = {}
    for band in bands:
        sets[band] = out / "sets" / f"{band}.parquet"
        sets[band].parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / "calibration" / f"{CALIBRATE_CUTS[band]}.parquet", sets[band])
    return common, sets, time.monotonic() - start


def overrides(common: list[str], problems: Path, design: dict, budgets: list[int], seeds: list[int]) -> list[str]:
    return [
        *common,
        f"task.train={problems}",
        f"task.val={problems}",
        f"eval.problems={len(pd.read_parquet(problems))}",
        f"grid.n=[{','.join(map(str, design['n']))}]",
        f"grid.B_p=[{design['B_p']}]",
        f"grid.budgets=[{','.join(map(str, budgets))}]",
        f"grid.eval_points={len(budgets)}",
        f"grid.seed=[{','.join(map(str, seeds))}]",
    ]


def cell_means(df: pd.DataFrame, budgets: list[int]) -> pd.DataFrame:
    """(budgets, n): the mean over seeds of each cell's metric at exactly each budget."""
    at = df[df["rollouts"].isin(budgets)]
    return at.pivot_table(index="rollouts", columns="n", values=METRIC, aggfunc="mean").reindex(budgets)


def window(means: pd.DataFrame, level_off: float) -> list[int]:
    """The budgets up to the last at which the best cell still gained `level_off` over the one before."""
    budgets = list(means.index)
    kept = budgets[:1]
    for before, budget in itertools.pairwise(budgets):
        best = means.loc[budget].idxmax()
        if means.loc[budget, best] - means.loc[before, best] < level_off:
            break
        kept.append(budget)
    return kept


def power(common: list[str], problems: Path, design: dict, budgets: list[int], seeds: int, pilot: Path) -> dict:
    """plan's power at `seeds` a cell on these budgets, the cells simulated as the pilot shows them."""
    args = overrides(common, problems, design, budgets, list(range(seeds)))
    planned = isoflop("plan", "--config", "lookup", "--json", "--noise-from", str(pilot), *args, capture=True)
    return json.loads(planned)["power"]


def judge(
    name: str, design: dict, pilot: Path, common: list[str], problems: Path, rule: dict, pilot_seeds: int, costs: dict
) -> dict:
    """The rule's steps 1-3 on one candidate's pilot: its window, whether its grid is centred, its seeds
    and predicted power, and why it is not eligible where it is not."""
    df = pd.read_parquet(pilot / "results.parquet")
    means = cell_means(df, design["budgets"])
    kept = window(means, rule["level_off"])
    star = [float(means.loc[b].idxmax()) for b in (kept[0], kept[-1])]
    middle = (math.log2(min(design["n"])) + math.log2(max(design["n"]))) / 2
    off_centre = abs(np.mean(np.log2(star)) - middle)
    ends = df[df["rollouts"] > 0].groupby("run_id")
    at_window = df[df["rollouts"] == kept[-1]]["wall_s"].sum()
    share = at_window / ends["wall_s"].max().sum()
    per_seed_min = costs["pilot_s"] * share / pilot_seeds / 60
    affordable = math.floor((rule["minutes"] - costs["fixed_s"] / 60) / per_seed_min)
    first = power(common, problems, design, kept, 3, pilot)
    chosen = max(3, min(first["seeds_for_80"] or rule["max_seeds"], affordable, rule["max_seeds"]))
    at = first if chosen == 3 else power(common, problems, design, kept, chosen, pilot)
    why = []
    if len(kept) < rule["min_budgets"]:
        why.append(f"the best cell levels off within {len(kept)} budgets")
    if off_centre > rule["centre_doublings"]:
        why.append(f"n* at the window's ends is {star[0]:g} and {star[1]:g}: {off_centre:.2f} doublings off the middle")
    return {
        "candidate": name,
        **design,
        "window": kept,
        "pilot_means": {str(b): {str(n): round(float(v), 4) for n, v in means.loc[b].items()} for b in means.index},
        "n_star_at_window_ends": star,
        "off_centre_doublings": round(float(off_centre), 3),
        "seeds": chosen,
        "seeds_for_80": first["seeds_for_80"],
        "affordable_seeds": affordable,
        "power": at["trend"],
        "power_range": at.get("trend_range"),
        "minutes": round(costs["fixed_s"] / 60 + chosen * per_seed_min, 1),
        "eligible": not why,
        "why_not": why,
    }


def choose(judged: list[dict], tie: float) -> dict:
    """Rule step 4: the eligible candidate of highest power (within `tie`: the fewest minutes), else
    the highest power of all."""
    pool = [j for j in judged if j["eligible"]] or judged
    top = max(j["power"] or 0 for j in pool)
    return min((j for j in pool if (j["power"] or 0) >= top - tie), key=lambda j: j["minutes"])


def run_pilot(out: Path, pre: dict) -> None:
    common, sets, prepare_s = prepare(out / "pilot", pre["bands"])
    judged = []
    for name, design in pre["candidates"].items():
        pilot = out / "pilot" / name
        args = overrides(common, sets[design["band"]], design, design["budgets"], pre["pilot_seeds"])
        start = time.monotonic()
        isoflop("sweep", "--config", "lookup", "--root", str(out / "pilot"), f"name={name}", *args)
        pilot_s = time.monotonic() - start
        start = time.monotonic()
        isoflop("fit", str(pilot))
        costs = {"pilot_s": pilot_s, "fixed_s": prepare_s + time.monotonic() - start}
        judged.append(
            judge(name, design, pilot, common, sets[design["band"]], pre["rule"], len(pre["pilot_seeds"]), costs)
        )
        print(json.dumps(judged[-1]), flush=True)
    chosen = choose(judged, pre["rule"]["tie"])
    design = {
        "preregistration": str(PREREGISTRATION.relative_to(ROOT)),
        "chosen": chosen["candidate"],
        "band": chosen["band"],
        "bounds": pre["bands"][chosen["band"]],
        "n": chosen["n"],
        "B_p": chosen["B_p"],
        "budgets": chosen["window"],
        "seeds": list(range(pre["confirm_first_seed"], pre["confirm_first_seed"] + chosen["seeds"])),
        "predicted_power": chosen["power"],
        "predicted_power_range": chosen["power_range"],
        "any_eligible": any(j["eligible"] for j in judged),
        "candidates": judged,
    }
    DESIGN.write_text(json.dumps(design, indent=2) + "\n")
    print(f"chosen: {chosen['candidate']} ({DESIGN.relative_to(ROOT)})")


def summary(sweep_dir: Path) -> str:
    """val_avg@k (mean ± sd over seeds) per budget and n, zero_var_frac, and best/worst@k at the top."""
    df = pd.read_parquet(sweep_dir / "results.parquet")
    df = df[df["rollouts"] > 0]
    last = df.loc[df.groupby("run_id")["step"].idxmax()]
    lines = []
    for column in (METRIC, "zero_var_frac"):
        mean = df.pivot_table(index="rollouts", columns="n", values=column, aggfunc="mean")
        sd = df.pivot_table(index="rollouts", columns="n", values=column, aggfunc="std")
        cells = mean.map("{:.3f}".format) + " ± " + sd.map("{:.3f}".format)
        lines += [f"{column} (mean ± sd over {df['seed'].nunique()} seeds)", cells.to_string(), ""]
    ends = last.groupby("n")[[METRIC, "val_best@k", "val_worst@k"]].mean()
    lines += [f"at {int(last['rollouts'].max()):,} rollouts (means over seeds)", ends.round(3).to_string()]
    return "\n".join(lines)


def figure(sweep_dir: Path, title: str) -> Path:
    """val_avg@k against rollouts, one line per n (the mean over seeds), the band between the seeds'
    lowest and highest; the base model drawn left of the first budget."""
    df = pd.read_parquet(sweep_dir / "results.parquet")
    fig, ax = plt.subplots(figsize=(6, 4))
    first = df["rollouts"][df["rollouts"] > 0].min()
    for n, rows in df.groupby("n"):
        by = rows.groupby("rollouts")[METRIC]
        x = by.mean().index.to_numpy().clip(min=first / 2)
        (line,) = ax.plot(x, by.mean(), marker="o", ms=3, label=f"n={n}")
        ax.fill_between(x, by.min(), by.max(), color=line.get_color(), alpha=0.15, lw=0)
    ax.set(xscale="log", xlabel="rollouts (leftmost point: the base model)", ylabel="validation avg@k", title=title)
    ax.legend()
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(sweep_dir.parent / f"study{suffix}", dpi=120)
    plt.close(fig)
    return sweep_dir.parent / "study.png"


def run_confirmatory(out: Path, pre: dict) -> None:
    design = json.loads(DESIGN.read_text())
    if set(design["seeds"]) & set(pre["pilot_seeds"]):
        raise SystemExit(f"{DESIGN}: its seeds {design['seeds']} include pilot seeds {pre['pilot_seeds']}")
    common, sets, _ = prepare(out, {design["band"]: design["bounds"]})
    confirm = out / "confirm"
    args = overrides(common, sets[design["band"]], design, design["budgets"], design["seeds"])
    isoflop("sweep", "--config", "lookup", "--root", str(out), "name=confirm", *args)  # its plan: cost and power first
    isoflop("fit", str(confirm))
    trend = json.loads((confirm / "fit" / "fit.json").read_text())["n_star_trend"]
    print(f"\n== the confirmatory sweep: {design['chosen']} ({len(design['seeds'])} seeds) ==\n{summary(confirm)}")
    reading = trend["reading"] or f"p = {trend['p_value']:.2g}"
    print(
        f"\ndoes n* rise with compute? {trend['call']} ({reading}); "
        f"the pilot predicted {design['predicted_power']:.0%} power"
    )
    title = f"{design['chosen']}, {len(design['seeds'])} seeds"
    print(f"figure: {figure(confirm, title)}; the fit: {confirm}/fit/report.md; the design: {DESIGN.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("isoflop-runs/lookup"))
    parser.add_argument("--pilot", action="store_true", help="run the candidates' pilot and write the design")
    args = parser.parse_args()
    pre = yaml.safe_load(PREREGISTRATION.read_text())
    (run_pilot if args.pilot else run_confirmatory)(args.out.resolve(), pre)


if __name__ == "__main__":
    main()
