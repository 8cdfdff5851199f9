"""`isoflop replay`: a schedule simulated on a recorded full grid, with no compute.

Each cell's recorded eval points are what the cell would have recorded under any schedule (one run
to the largest budget; a paused cell resumes from its checkpoint), so a schedule on a full grid's
results is exact: at each stage budget the rule (`schedule.decide`) sees the points the surviving
cells had reached, the cells it stops keep what they had, and the compute a cell spends is its
ledger when it stopped. The replay compares the adaptive frontier and axis*(C) with the full
grid's at every stage budget.

`run` is what the command does between parsing its options and printing; `replayed_share` reads
back the share of the full grid's compute a replay.json says its schedule spent (`plan --replay`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from isoflop_cli.config import check_writable
from isoflop_cli.config.schema import DEFAULT_INDIFFERENCE, DEFAULT_MARGIN, Schedule
from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import data, plots
from isoflop_cli.fit.data import RUN, compute_unit, one_per_run, plain, usable
from isoflop_cli.fit.outputs import jsonable
from isoflop_cli.fit.schedule import decide, noise, stage_of
from isoflop_cli.store import atomic_write, read_json


@dataclass
class Replay:
    schedule: Schedule
    margin: float
    indifference: float
    stages: list[float]
    per_budget: (
        pd.DataFrame
    )  # budget, full_value, adaptive_value, value_gap, full_star, adaptive_star, star_agrees, cells_running
    stopped: (
        pd.DataFrame
    )  # run, axis value, stopped at budget, best; at the later budget it came closest: reach, frontier; learns
    compute_share: float  # compute the schedule spends / the full grid's
    noise: (
        float | None
    )  # the metric's noise (sd) the rule reads from the full grid: the scale of a frontier gap between noisy points

    @property
    def n_star_agreement(self) -> float:
        return float(self.per_budget["star_agrees"].mean())

    @property
    def max_value_gap(self) -> float:
        return float(self.per_budget["value_gap"].max())

    def summary(self) -> dict:
        return {
            "schedule": self.schedule.value,
            "margin": self.margin,
            "indifference": self.indifference,
            "stages": self.stages,
            "compute_share": self.compute_share,
            "n_star_agreement": self.n_star_agreement,
            "max_value_gap": self.max_value_gap,
            "noise_sd": self.noise,
            "cells": int(self.per_budget["cells_running"].iloc[0]),
            "stopped": len(self.stopped),
        }


def default_stages(rows: pd.DataFrame, compute: str) -> list[float]:
    """The largest compute halved down to the first budget every run has a positive point at:
    the doublings a sweep's eval points are spaced on."""
    positive = rows[rows[compute] > 0]
    top = float(positive[compute].max())
    floor = float(positive.groupby(RUN)[compute].min().max())
    stages = [top]
    while stages[-1] / 2 >= floor / 1.1:
        stages.append(stages[-1] / 2)
    return sorted(stages)


def replay(
    df: pd.DataFrame,
    metric: str,
    axis: str,
    compute: str,
    schedule: Schedule,
    margin: float,
    stages: list[float] | None = None,
    indifference: float = DEFAULT_INDIFFERENCE,
) -> Replay:
    rows = usable(df, [metric, axis, compute], "replay")
    one_per_run(rows, [axis], "replay")
    given = stages is not None
    stages = sorted(set(stages)) if given else default_stages(rows, compute)
    first = float(rows.loc[rows[compute] > 0, compute].min())
    if given and stages[0] < first / 1.1:  # a budget no eval point reaches would stop cells on no data
        raise ConfigError(
            f"replay: --budgets {stages[0]:g} is below every eval point of these results (the first is at {first:g} "
            f"{compute})"
        )
    bounded = rows[metric].min() >= 0 and rows[metric].max() <= 1
    if schedule is Schedule.adaptive:
        if len(stages) < 2:
            raise ConfigError(
                "replay: the adaptive schedule decides between budgets; give --budgets two or more distinct values"
                if given
                else "replay: the adaptive schedule decides between budgets; these results span one budget "
                "(give --budgets)"
            )
        if not bounded:
            raise ConfigError(
                f"replay: the adaptive rule's sigmoid is bounded to [0, 1]; {metric} ranges "
                f"{rows[metric].min():.3g}..{rows[metric].max():.3g} (--metric)"
            )
    rows = rows.assign(_stage=stage_of(rows[compute].to_numpy(), stages))
    runs = pd.Index(rows[RUN].unique())
    last = len(stages) - 1
    stop = pd.Series(last, index=runs)  # the stage each run ends at
    decisions = []
    if schedule is Schedule.adaptive:
        alive = set(runs)
        for i in range(last):
            seen = rows[(rows["_stage"] <= i) & rows[RUN].isin(alive)]
            for d in decide(seen, stages[i], stages, margin, indifference, metric, compute, RUN):
                if not d.go:
                    alive.discard(d.run)
                    stop[d.run] = i
                    decisions.append(d)
    axis_of = rows.drop_duplicates(RUN).set_index(RUN)[axis]
    reached = rows[rows["_stage"] <= stop.reindex(rows[RUN]).to_numpy()]
    full_spend = rows.groupby(RUN)[compute].max().sum()
    spend = reached.groupby(RUN)[compute].max().sum()
    table = []
    for i, budget in enumerate(stages):
        full = _frontier_at(rows[rows["_stage"] <= i], metric, axis)
        adaptive = _frontier_at(reached[reached["_stage"] <= i], metric, axis)
        table.append(
            {
                "budget": budget,
                "full_value": full[0],
                "adaptive_value": adaptive[0],
                "value_gap": full[0] - adaptive[0],
                "full_star": full[1],
                "adaptive_star": adaptive[1],
                "star_agrees": _within_2x(full[1], adaptive[1]),
                "cells_running": int((stop >= i).sum()),
            }
        )
    stopped = pd.DataFrame(
        [
            {
                "run": d.run,
                axis: plain(axis_of[d.run]),
                "stopped_at": d.budget,
                "best": d.best,
                "at": d.at,
                "reach": d.reach,
                "frontier": d.frontier,
                "learns": d.learns,
            }
            for d in decisions
        ],
        columns=["run", axis, "stopped_at", "best", "at", "reach", "frontier", "learns"],
    )
    return Replay(
        schedule,
        margin,
        indifference,
        stages,
        pd.DataFrame(table),
        stopped,
        float(spend / full_spend),
        noise(rows, metric, compute, RUN) if bounded else None,
    )


def _frontier_at(rows: pd.DataFrame, metric: str, axis: str) -> tuple[float, float]:
    best = rows.loc[rows[metric].idxmax()]
    return float(best[metric]), plain(best[axis])


def _within_2x(a: float, b: float) -> bool:
    if a > 0 and b > 0:
        return bool(abs(np.log2(a) - np.log2(b)) <= 1 + 1e-9)
    return a == b


def write(result: Replay, info: dict, axis: str, compute: str, out: Path) -> list[Path]:
    """replay.json (the summary, the per-budget table, the cells stopped) and the two frontiers' plot."""
    entry = {
        **result.summary(),
        "axis": axis,
        "compute": compute,
        "input": info,
        "per_budget": result.per_budget.to_dict("records"),
        "stopped_cells": result.stopped.to_dict("records"),
    }
    atomic_write(out / "replay.json", json.dumps(jsonable(entry), indent=1) + "\n")
    t = result.per_budget
    fig, (top, bottom) = plots.plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, height_ratios=[2, 1])
    top.plot(t["budget"], t["full_value"], "o-", color="black", label="full grid")
    top.plot(
        t["budget"],
        t["adaptive_value"],
        "s--",
        color="tab:orange",
        label=(
            f"{result.schedule.value} (margin {result.margin:g}, indifference {result.indifference:g}): "
            f"{result.compute_share:.0%} of the compute"
        ),
    )
    top.set_ylabel("frontier (best metric with compute <= C)")
    top.set_xscale("log")
    top.legend()
    bottom.plot(t["budget"], t["full_star"], "o-", color="black", label=f"{axis}* full grid")
    bottom.plot(t["budget"], t["adaptive_star"], "s--", color="tab:orange", label=f"{axis}* {result.schedule.value}")
    bottom.set_yscale("log", base=2)
    plots.plain_ticks(bottom.yaxis)
    bottom.set_ylabel(f"{axis}*(C)")
    bottom.set_xlabel(f"C ({compute_unit(compute)})")
    bottom.legend()
    return [out / "replay.json", *plots.save(fig, out / "replay")]


@dataclass(frozen=True)
class ReplayOptions:
    """`isoflop replay`'s options as given: the schedule simulated and its knobs, the stage budgets
    (comma-separated; None: `default_stages`), and the columns read."""

    schedule: str = Schedule.adaptive.value
    margin: float = DEFAULT_MARGIN
    indifference: float = DEFAULT_INDIFFERENCE
    budgets: str | None = None
    metric: str = "val_avg@k"
    axis: str = "n"
    compute: str = "rollouts"


@dataclass
class Replayed:
    result: Replay
    written: list[Path]  # replay.json first, then the plots
    notes: list[str]  # warnings on the way, shown beside the result


def run(path: Path, options: ReplayOptions, out: Path | None) -> Replayed:
    """The options checked, the recorded grid read, the schedule replayed on it and written into
    `out` (default: <sweep>/replay, or replay/ beside the file); a ConfigError for anything the user
    must fix, before anything is written."""
    o = options
    if o.schedule not in [s.value for s in Schedule]:
        raise ConfigError(f"--schedule must be one of: {', '.join(s.value for s in Schedule)}, got {o.schedule}")
    if not (o.margin >= 0 and math.isfinite(o.margin)):
        raise ConfigError(f"--margin must be a finite number >= 0, got {o.margin}")
    if not (o.indifference >= 0 and math.isfinite(o.indifference)):
        raise ConfigError(f"--indifference must be a finite number >= 0, got {o.indifference}")
    stages = _positive_numbers("--budgets", o.budgets) if o.budgets else None
    df, info = data.load([path])
    data.numeric_column(df, o.compute, path)
    with data.notes() as notes:
        result = replay(df, o.metric, o.axis, o.compute, Schedule(o.schedule), o.margin, stages, o.indifference)
        dest = check_writable(out or (path if path.is_dir() else path.parent) / "replay")
        written = write(result, info, o.axis, o.compute, dest)
    return Replayed(result, written, notes)


def replayed_share(path: Path) -> float:
    """The share of its full grid a replayed schedule spent (replay.json's compute_share): a number
    in (0, 1] (a schedule spends at most the full grid's compute)."""
    found = read_json(path)
    if not isinstance(found, dict) or not isinstance(found.get("compute_share"), (int, float)):
        raise ConfigError(f"--replay {path}: not a replay.json written by isoflop replay (no compute_share)")
    share = float(found["compute_share"])
    if not 0 < share <= 1:
        raise ConfigError(
            f"--replay {path}: compute_share must be in (0, 1] (a share of the full grid's compute), got {share:g}"
        )
    return share


def _positive_numbers(option: str, text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option} takes numbers separated by commas, got '{text}'") from None
    if not values or not all(v > 0 and math.isfinite(v) for v in values):
        raise ConfigError(f"{option} takes positive numbers, got '{text}'")
    return values
