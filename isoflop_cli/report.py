"""Rich tables for the terminal: the plan, the live sweep, a run's metrics, the frontier."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd
from rich.console import Console, ConsoleDimensions, Group
from rich.table import Table
from rich.text import Text

from isoflop_cli.config.schema import BudgetUnit
from isoflop_cli.cost import Price
from isoflop_cli.grid import Cell
from isoflop_cli.store import (
    FAILED,
    FINISHED,
    KILLED,
    MISSING,
    PAUSED,
    PENDING,
    RETRYING,
    RUNNING,
    STOPPED,
    SUBMITTED,
    CellState,
    SweepDir,
)

UNBOUNDED = 100_000  # columns of a console no terminal reads: wider than any table isoflop draws


class Output(Console):
    """The console every command prints through. Where no terminal reads it (a SLURM log, CI,
    `| tee`, a test) rich would fit each table into 80 columns, ellipsising the run ids and numbers
    a reader copies into the next command: there it is as wide as the widest line, so nothing is
    cut, whatever COLUMNS says (the width of the shell's terminal, not of the file). On a terminal,
    the terminal's width."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(UNBOUNDED, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


STATE_STYLE = {
    "finished": "green",
    "running": "cyan",
    "submitted": "yellow",
    "failed": "red",
    "stopped": "magenta",
    "killed": "red",
    "paused": "blue",
    "retrying": "yellow",
    "missing": "red",
}


def plan_records(cells: list[Cell]) -> list[dict]:
    out = []
    for c in cells:
        record = {"axes": c.axes, "feasible": c.feasible}
        if c.feasible:
            p = c.plan
            record.update(
                run_id=c.run_id,
                B=p.batch,
                M=p.M,
                eval_steps=list(p.eval_steps),
                budget_column=p.column,
                budget=p.limit,
                eval_at=list(p.eval_at),
                rollouts=p.rollouts,
                lr=p.lr,
                predicted=p.predicted_flops,
            )
            if p.gpu_memory is not None:  # with GPUs: the peak of one GPU, and its terms (memory.Memory)
                record["predicted"]["gpu_memory_gib"] = round(p.gpu_memory.peak, 2)
                record["gpu_memory"] = p.gpu_memory.record()
        else:
            record["reason"] = c.reason
        out.append(record)
    return out


def plan_json(cells: list[Cell], price: Price) -> dict:
    """`plan --json`: the cells (each with its predicted wall time and GPU-hours beside its FLOPs)
    and the sweep's totals, each a top-level key so that more (power, ...) can be added beside them."""
    records = plan_records(cells)
    for record, cost in zip(records, price.cells):
        if cost is not None:
            record["predicted"].update(cost.record())
    return {"cells": records, "totals": price.totals(cells)}


def cost_line(price: Price) -> Text:
    """The plan's price in one line: device-hours, wall time at the cluster's parallelism, and the
    source of the throughput figures."""
    return Text(
        f"cost: {_compact(price.hours)} {price.unit}, {_duration(price.wall_s)} "
        f"wall with {price.parallel} run(s) at once; {price.source}"
    )


def plan_table(cfg, cells: list[Cell], price: Price | None = None) -> Group:
    feasible = [c for c in cells if c.feasible]
    extra = [k for k in cells[0].axes if k not in ("n", "B_p", "seed")]
    budgets = ", ".join(_compact(b) for b in cfg.grid.budgets)
    table = Table(
        title=(
            f"sweep '{cfg.name}': {len(feasible)} feasible cells of {len(cells)}, "
            f"budgets [{budgets}] {BudgetUnit(cfg.grid.budget.unit).value}"
        ),
        caption="M, rollouts and FLOPs (search, learn, reward) predicted from max prompt and response lengths "
        "(scaled by finished runs where the sweep has them, else by calibrated response lengths); "
        "B = B_p * n and more in `plan --json`",
    )
    # Compact numbers (counts whole) and no derivable column, so that a grid of the default's axes stays narrow.
    seeds = len(cfg.grid.seed) > 1
    memory = any(c.plan.gpu_memory is not None for c in feasible)  # GiB/GPU: the memory model's peak (with GPUs)
    if memory:
        limit = cfg.cluster.gpu_memory_gib
        table.caption += "; GiB/GPU: the predicted peak memory of one GPU, " + (
            f"of {limit:g}" if limit is not None else "unchecked (cluster.gpu_memory_gib null)"
        )
    if price is not None:
        table.caption += (
            f"; wall and {price.unit}: each run's predicted training time and its device-hours (the cost line below)"
        )
    for col in [
        "n",
        "B_p",
        *(["seed"] if seeds else []),
        *extra,
        "M",
        "eval",
        "rollouts",
        "lr",
        "search",
        "learn",
        "reward",
        "rho",
        *(["GiB/GPU"] if memory else []),
        *(["wall", price.unit] if price is not None else []),
    ]:
        table.add_column(col, justify="left" if col in extra else "right", overflow="fold")
    infeasible = []
    # A large grid (rendering costs ~1 ms a row) lists each cell's seeds on one row (they share the
    # plan), then the first PLAN_ROWS rows: `plan --json` lists every cell.
    rows = [[c] for c in cells] if len(cells) <= PLAN_ROWS else _by_seeds(cells)
    costs = dict(zip(map(id, cells), price.cells)) if price is not None else {}
    for group in rows[:PLAN_ROWS]:
        c = group[0]
        cost = costs.get(id(c))
        seed = _seeds_label([g.axes["seed"] for g in group])
        axes = (
            [_value_label(c.axes[k]) for k in ("n", "B_p")]
            + ([seed] if seeds else [])
            + [_value_label(c.axes[k]) for k in extra]
        )
        if c.feasible:
            p = c.plan
            f = p.predicted_flops
            table.add_row(
                *axes,
                str(p.M),
                str(len(p.eval_at)),
                _count(p.rollouts),
                _short(p.lr),
                *(_short(f[k]) for k in ("flops_search", "flops_learning", "flops_reward")),
                f"{f['rho']:.2f}",
                *([f"{p.gpu_memory.peak:.0f}" if p.gpu_memory else "-"] if memory else []),
                *([_duration(cost.wall_s), _short(cost.hours)] if cost is not None else []),
            )
        else:
            table.add_row(*axes, *["[red]-[/]"] * (8 + memory + 2 * (price is not None)))
            label = _axes_label({**c.axes, "seed": seed})
            infeasible.append(Text(f"infeasible {label}: {c.reason}", style="red"))
    if len(rows) > PLAN_ROWS:
        table.caption += f"; the first {PLAN_ROWS} of {len(rows)} rows: `isoflop plan --json` lists every cell"
    return Group(table, *infeasible)


PLAN_ROWS = 500  # rows of the plan table at most


def _by_seeds(cells: list[Cell]) -> list[list[Cell]]:
    """Adjacent cells that differ only in their seed (the grid puts seeds innermost): one group each."""
    groups: list[list[Cell]] = []
    for c in cells:
        last = groups[-1][0] if groups else None
        if (
            last is not None
            and last.plan is c.plan
            and last.reason == c.reason
            and all(v == c.axes[k] for k, v in last.axes.items() if k != "seed")
        ):
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _value_label(value: Any) -> str:
    """An axis value as an override writes it: a list-typed key's value as [a,b]."""
    return "[" + ",".join(_value_label(v) for v in value) + "]" if isinstance(value, (list, tuple)) else str(value)


def _seeds_label(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds)) if len(seeds) <= 4 else f"{len(seeds)} seeds"


def schedule_line(cfg, cells: list[Cell], share: float | None, replayed) -> Text:
    """The sweep's total, which is the adaptive schedule's worst case (every cell survives), and
    what a replay of a similar sweep says it would spend."""
    feasible = [c for c in cells if c.feasible]
    flops = sum(c.plan.predicted_flops["flops_total"] for c in feasible)
    rollouts = sum(c.plan.rollouts for c in feasible)
    total = f"{_compact(rollouts)} rollouts, {_compact(flops)} FLOPs"
    if cfg.grid.schedule != "adaptive":
        line = f"schedule full: {total}"
        return Text(
            line
            + (
                f"; grid.schedule=adaptive spent {share:.0%} of the full grid in the replay {replayed}"
                if share is not None
                else ""
            )
        )
    line = (
        f"schedule adaptive (margin {cfg.grid.margin:g}, indifference "
        f"{cfg.grid.indifference:g}): at most {total} (every cell survives every budget)"
    )
    if share is not None:
        line += (
            f"; the replay {replayed} spent {share:.0%} of its full grid: "
            f"~{_compact(rollouts * share)} rollouts, {_compact(flops * share)} FLOPs"
        )
    return Text(line)


def _axes_label(axes: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in axes.items())


def run_state(sweep: SweepDir, run_id: str, cell: CellState) -> tuple[str, str]:
    """A run's true state and, when it did not finish, why.

    Sealed records make a run finished; otherwise the sweep's word (failed, stopped: the dispatcher
    saw the job end) outranks the run's own status file, which a killed run cannot update. A run
    still marked running whose process on this host is gone was killed. A cell the sweep saw run
    (running, paused, finished) whose run dir is gone or is not a directory, or that it saw finish
    and whose records are gone since, is missing: the manifest's word is not taken for records that are not there."""
    files = sweep.run(run_id)
    if cell.state in (FINISHED, RUNNING, PAUSED) and (
        files.dir.is_symlink() or not files.dir.is_dir()
    ):  # states only a run's records give
        what = (
            "is gone"
            if not os.path.lexists(files.dir)
            else "is a symbolic link"
            if files.dir.is_symlink()
            else "is not a directory"
        )
        return MISSING, f"its run dir {files.dir} {what}; move whatever is there aside and the next sweep runs it again"
    if files.finished():
        return FINISHED, ""
    status = files.status()
    own, known = status.state, cell.state
    if known in (FAILED, STOPPED):
        return known, cell.error or files.failure_reason() or ""
    if known == RETRYING:
        return (
            RETRYING,
            f"attempt {cell.attempts} failed ({cell.failures[-1].reason}); "
            "resubmitting, it resumes from its checkpoint",
        )
    if cell.stopped_at is not None:
        return PAUSED, cell.why or ""
    if own == PAUSED:
        return PAUSED, f"at {_compact(status.paused_at or 0)}, waiting for the others to reach that budget"
    if own == FAILED:
        return FAILED, files.failure_reason() or ""
    if own == RUNNING:
        if files.process_gone():
            return KILLED, f"process {status.pid} is gone; rerun the sweep to resume from its last checkpoint"
        return RUNNING, ""
    if own == FINISHED:  # marked finished, records not whole: the sweep redoes it
        return known if known != FINISHED else PENDING, "its metrics are torn; the next sweep resumes it"
    if known == FINISHED:  # the sweep saw it finish; its status is gone since
        return MISSING, f"{files.status_file} is gone: its records are lost; the next sweep runs it again"
    return known, ""


def sweep_status(sweep: SweepDir) -> dict:
    """The sweep as `status` shows it, as data (`status --json`): per run its state, tries, step
    of M, rollouts so far, latest val_avg@k and wall_s, and why it is not finished (or what
    failed before it was); totals of runs per state, rollouts so far and still to run, and the
    rate the running runs go at. The table (sweep_table) is drawn from this, so the two agree."""
    manifest = sweep.manifest()
    runs = []
    states: dict[str, int] = {}
    rate, left = 0.0, 0.0  # rollouts/s of the running runs; rollouts the unfinished ones still have to run
    for run_id, cell in manifest.cells.items():
        files = sweep.run(run_id)
        status = files.status()
        state, why = run_state(sweep, run_id, cell)
        states[state] = states.get(state, 0) + 1
        if state not in (FINISHED, FAILED, STOPPED) and cell.stopped_at is None:
            left += cell.M * cell.columns.get("n", 0) * cell.columns.get("B_p", 0) - status.ledger.get("rollouts", 0)
        if state == RUNNING and status.started and (status.updated or 0) > status.started:
            rate += status.ledger.get("rollouts", 0) / (status.updated - status.started)
        rows = files.read_metrics() if state != PENDING else []
        last = rows[-1] if rows else {}
        rollouts = status.ledger.get("rollouts", last.get("rollouts", 0)) if state != PENDING else None
        runs.append(
            {
                "run": run_id,
                "state": state,
                "tries": cell.attempts,
                "step": cell.M if state == FINISHED else status.step or 0,
                "M": cell.M,
                "rollouts": _whole(rollouts),
                "val_avg@k": _number(last.get("val_avg@k")),
                "wall_s": _number(last.get("wall_s")),
                "why": why if state != FINISHED else None,
                "host": status.host if state in (FAILED, KILLED) else None,
                "failures": [{"attempt": f.attempt, "reason": f.reason} for f in cell.failures],
            }
        )
    totals = {
        "runs": len(runs),
        "states": states,
        "rollouts": sum(r["rollouts"] or 0 for r in runs),
        "rollouts_left": _whole(max(left, 0.0)),
        "rollouts_per_s": rate,
        "infeasible": len(manifest.infeasible),
    }
    return {"sweep": str(sweep.path), "runs": runs, "totals": totals}


def sweep_table(sweep: SweepDir) -> Group:
    """The sweep as `status` and the live view draw it (status_table)."""
    return status_table(sweep_status(sweep))


def status_table(data: dict) -> Group:
    """sweep_status drawn: its table, the runs per state and rate under it, then a line per run
    that did not finish (or finished after failed attempts) saying why."""
    table = Table(title=data["sweep"])
    for col in ("run", "status", "tries", "step/M", "rollouts", "val_avg@k", "wall_s"):
        table.add_column(col, justify="left" if col in ("run", "status") else "right", overflow="fold")
    reasons = []
    for r in data["runs"]:
        state, style = r["state"], STATE_STYLE.get(r["state"], "white")
        if r["why"]:
            where = f" on {r['host']}" if r["host"] else ""
            reasons.append(Text(f"{state} {r['run']}{where}: {r['why']}", style=style))
        elif state == FINISHED and r["failures"]:
            earlier = "; ".join(f"attempt {f['attempt']}: {f['reason']}" for f in r["failures"])
            reasons.append(
                Text(f"finished {r['run']} after {len(r['failures'])} failed attempt(s): {earlier}", style="dim")
            )
        table.add_row(
            r["run"],
            f"[{style}]{state}[/]",
            str(r["tries"]),
            f"{r['step']}/{r['M']}",
            _count(r["rollouts"]),
            _fmt(r["val_avg@k"]),
            _fmt(r["wall_s"]),
        )
    totals = data["totals"]
    table.caption = f"{totals['states'].get(FINISHED, 0)}/{totals['runs']} finished" + (
        f"; {totals['infeasible']} infeasible cells skipped" if totals["infeasible"] else ""
    )
    return Group(table, cluster_line(totals["states"], totals["rollouts_per_s"], totals["rollouts_left"]), *reasons)


def _whole(v: Any) -> int | None:
    """A count as an integer (a ledger holds rollouts as floats: 24160.0 is 24160 rollouts)."""
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else round(float(v))


def _number(v: Any) -> float | None:
    """A metric for JSON: NaN (no value) as null."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _count(v: Any) -> str:
    """A count as a whole number with thousands separators: 24,160, not 24160.000."""
    whole = _whole(v)
    return "-" if whole is None else f"{whole:,}"


@dataclass(frozen=True)
class CellView:
    """A cell as one poll saw it: what `events` compares between polls."""

    state: str
    attempts: int
    points: int  # eval points written
    last: dict  # the latest of them ({} before the first)
    why: str


def snapshot(sweep: SweepDir) -> dict[str, CellView]:
    """Every cell of the sweep as it stands (run_state's word, the eval points so far)."""
    out = {}
    for run_id, cell in sweep.manifest().cells.items():
        state, why = run_state(sweep, run_id, cell)
        rows = sweep.run(run_id).read_metrics() if state != PENDING else []
        out[run_id] = CellView(state, cell.attempts, len(rows), rows[-1] if rows else {}, why)
    return out


def events(before: dict[str, CellView], after: dict[str, CellView], metric: str = "val_avg@k") -> list[str]:
    """One line per thing that happened between two snapshots, for a log that no live table draws
    in (a file, CI, a SLURM batch script): a run started, wrote an eval point, changed state
    (finished, failed with the reason, retrying, stopped by the schedule, killed)."""
    lines = []
    for run_id, now in after.items():
        was = before.get(run_id)
        if now.points > (was.points if was else 0) and now.last:
            lines.append(
                f"{run_id} eval point {now.points}: {metric} {_fmt(now.last.get(metric))} at "
                f"{_count(now.last.get('rollouts'))} rollouts (step {now.last.get('step', '-')})"
            )
        if was is None or now.state != was.state or (now.state == RUNNING and now.attempts != was.attempts):
            what = f"{now.state} (attempt {now.attempts})" if now.state == RUNNING else now.state
            lines.append(f"{run_id} {what}" + (f": {now.why}" if now.why else ""))
    return lines


def summary_line(cells: dict[str, CellView]) -> str:
    """Runs per state, for a log's periodic line."""
    states: dict[str, int] = {}
    for c in cells.values():
        states[c.state] = states.get(c.state, 0) + 1
    return cluster_line(states, 0.0, 0.0).plain


def cluster_line(states: dict[str, int], rate: float, left: float) -> Text:
    """The sweep at a glance: runs per state; rollouts/s over the running runs (each its rollouts
    over its wall time so far); the time left if the rest ran at that rate (a rough bound while
    few runs have started)."""
    order = (RUNNING, SUBMITTED, PENDING, RETRYING, PAUSED, FAILED, KILLED, MISSING, STOPPED, FINISHED)
    counts = ", ".join(f"{states[s]} {s}" for s in order if states.get(s))
    line = f"runs: {counts}"
    if rate > 0:
        line += f"; {rate:,.0f} rollouts/s across the sweep"
        if left > 0:
            line += f"; ~{_duration(left / rate)} left at that rate"
    return Text(line, style="bold")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


COUNTS = ("step", "rollouts", "tokens_generated")  # eval point columns that count, shown whole


def metrics_table(rows: list[dict]) -> Table:
    cols = [
        "step",
        "rollouts",
        "tokens_generated",
        "train_reward_mean",
        "val_avg@k",
        "val_best@k",
        "val_worst@k",
        "wall_s",
    ]
    table = Table(title="eval points")
    for col in cols:
        table.add_column(col, justify="right", overflow="fold")
    for r in rows:
        table.add_row(*[_count(r.get(c)) if c in COUNTS else _fmt(r.get(c)) for c in cols])
    return table


def frontier_table(df: pd.DataFrame, metric: str, axis: str, compute: str) -> Table:
    from isoflop_cli.fit.frontier import frontier

    front = frontier(df, metric, axis, compute, points=12)
    table = Table(title=f"frontier: best {metric} with {compute} <= C, and {axis}*(C)")
    for col in (compute, metric, f"{axis}*"):
        table.add_column(col, justify="right", overflow="fold")
    for r in front.itertuples():
        table.add_row(f"{r.compute:,.0f}", _fmt(r.value), str(r.axis_star))
    return table


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def replay_table(result, axis: str) -> Group:
    """Per stage budget: both frontiers, both axis*, and how many cells were still running."""
    table = Table(
        title=(
            f"replay: {result.schedule.value} schedule (margin {result.margin:g}, "
            f"indifference {result.indifference:g}) against the full grid"
        )
    )
    for col in (
        "C",
        "cells",
        "full",
        result.schedule.value,
        "gap",
        f"{axis}* full",
        f"{axis}* {result.schedule.value}",
    ):
        table.add_column(col, justify="right", overflow="fold")
    for r in result.per_budget.itertuples():
        table.add_row(
            _compact(r.budget),
            str(r.cells_running),
            _fmt(r.full_value),
            _fmt(r.adaptive_value),
            _fmt(r.value_gap),
            str(r.full_star),
            f"{r.adaptive_star}" + ("" if r.star_agrees else " [red](>2x)[/]"),
        )
    scale = (
        f" ({result.max_value_gap / result.noise:.1f} sd of the metric's noise, {result.noise:.3f})"
        if result.noise
        else ""
    )
    line = Text(
        f"compute: {result.compute_share:.1%} of the full grid's; {axis}* within 2x at {result.n_star_agreement:.0%} "
        f"of budgets; largest frontier gap {result.max_value_gap:.3f}{scale}; {len(result.stopped)} cells stopped"
    )
    return Group(table, line)


def _short(v: float) -> str:
    """Two significant digits, a bare exponent: 1.8e-5, 6.9e9, 0."""
    text = f"{v:.2g}"
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else text


def _compact(v: float) -> str:
    """4.1k, 1.8e-5, 6.9e9: short enough for an 80-column table."""
    if v == 0:
        return "0"
    if 1e-2 <= abs(v) < 1e3:
        return f"{v:.3g}"
    for scale, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")):
        if scale <= abs(v) < scale * 1e3:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.2g}"


def _spread_note(spread: dict) -> str:
    """Whether the bands tell problems apart (calibrate.Spread), in one line."""
    if spread["dispersion"] is None:
        return f"NOT told apart: every sample scored alike (pass rate {spread['mean']:g} everywhere)"
    figures = f"dispersion {spread['dispersion']:.2f}, p = {spread['p_value']:.2g}"
    if spread["p_value"] >= 0.01:
        return (
            "NOT told apart: the pass rates spread as sampling alone would around one shared rate of "
            f"{spread['mean']:.3f} ({figures}); the bands are cut by chance and both sets will score that rate"
        )
    return f"problems differ beyond sampling: sd of their true pass rates {spread['difficulty_sd']:.3f} ({figures})"


def calibration_table(summary: dict) -> Table:
    """Problems per pass-rate band, their response length, and what a sweep on each set would cost."""
    notes = (
        [f"{summary['left_out']} left out (prompt over task.max_prompt_tokens, or a job that failed)"]
        if summary["left_out"]
        else []
    )
    notes += [f"no sweep on {b['name']}: {b['why_not']}" for b in summary["bands"] if b.get("why_not")]
    notes += [_spread_note(summary["spread"])] if summary.get("spread") else []
    table = Table(
        title=f"calibration: {summary['calibrated']:,} of {summary['rows']:,} problems, avg@{summary['samples']}",
        caption="\n".join(notes) or None,
        caption_justify="left",
    )
    for name in ("set", "pass rate", "problems", "resp. tokens", "sweep FLOPs", "at measured len"):
        table.add_column(name, justify="left" if name == "set" else "right", overflow="fold")
    for b in summary["bands"]:
        low, high = b["range"]
        table.add_row(
            b["name"],
            f"[{low:g}, {high:g}]",
            str(b["problems"]),
            f"{b['mean_response_tokens']:.1f}" if b["mean_response_tokens"] is not None else "-",
            _compact(b["sweep_flops_bound"]) if b["sweep_flops_bound"] is not None else "-",
            _compact(b["sweep_flops_measured"]) if b["sweep_flops_measured"] is not None else "-",
        )
    return table
