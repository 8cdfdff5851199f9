"""Rich tables for the terminal: the plan, the live sweep, a run's metrics, the frontier."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from rich.console import Group
from rich.table import Table
from rich.text import Text

from isoflop_cli.config import BudgetUnit
from isoflop_cli.grid import Cell
from isoflop_cli.store import FINISHED, SweepDir

STATE_STYLE = {"finished": "green", "running": "cyan", "submitted": "yellow", "failed": "red", "stopped": "magenta"}


def run_columns(cell: Cell) -> dict[str, Any]:
    """The axis columns of a run's result rows: n, B_p, model, reward, algo, seed, lr and any extra axis."""
    cfg = cell.cfg
    columns = {"n": cfg.n, "B_p": cfg.B_p, "model": cfg.model.name, "reward": cfg.reward.name, "algo": cfg.algo.name, "seed": cfg.seed, "lr": cell.plan.lr}
    for key, value in cell.axes.items():
        columns.setdefault(key, value)
    return columns


def plan_records(cells: list[Cell]) -> list[dict]:
    out = []
    for c in cells:
        record = {"axes": c.axes, "feasible": c.feasible}
        if c.feasible:
            p = c.plan
            record.update(run_id=c.run_id, B=p.batch, M=p.M, eval_steps=list(p.eval_steps), budget_column=p.column,
                          budget=p.limit, eval_at=list(p.eval_at), rollouts=p.rollouts, lr=p.lr, predicted=p.predicted_flops)
        else:
            record["reason"] = c.reason
        out.append(record)
    return out


def plan_table(cfg, cells: list[Cell]) -> Group:
    feasible = [c for c in cells if c.feasible]
    extra = [k for k in cells[0].axes if k not in ("n", "B_p", "seed")]
    budgets = ", ".join(f"{b:.4g}" for b in cfg.grid.budgets)
    table = Table(title=f"sweep '{cfg.name}': {len(feasible)} feasible cells of {len(cells)}, budgets [{budgets}] {BudgetUnit(cfg.grid.budget.unit).value}",
                  caption="M, rollouts and FLOPs predicted from max prompt and response lengths (scaled by finished runs where the sweep has them)")
    for col in ["n", "B_p", "seed", *extra, "B", "M", "eval points", "rollouts", "lr", "search", "learning", "reward", "rho"]:
        table.add_column(col, justify="left" if col in extra else "right")
    infeasible = []
    for c in cells:
        axes = [str(c.axes[k]) for k in ("n", "B_p", "seed", *extra)]
        if c.feasible:
            p = c.plan
            f = p.predicted_flops
            table.add_row(*axes, str(p.batch), str(p.M), str(len(p.eval_at)), f"{p.rollouts:,}", f"{p.lr:.3g}",
                          *(f"{f[k]:.3g}" for k in ("flops_search", "flops_learning", "flops_reward")), f"{f['rho']:.2f}")
        else:
            table.add_row(*axes, str(c.axes["n"] * c.axes["B_p"]), *["[red]-[/]"] * 8)
            infeasible.append(Text(f"infeasible {_axes_label(c.axes)}: {c.reason}", style="red"))
    return Group(table, *infeasible)


def _axes_label(axes: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in axes.items())


def sweep_table(sweep: SweepDir) -> Table:
    manifest = sweep.manifest()
    cells = manifest["cells"]
    done = 0
    table = Table(title=f"{sweep.path}")
    for col in ("cell", "status", "step/M", "rollouts", "val_avg@k", "val_best@k", "wall_s"):
        table.add_column(col, justify="left" if col in ("cell", "status") else "right")
    for run_id, cell in cells.items():
        files = sweep.run(run_id)
        status = files.status()
        state = status.get("state", "pending")
        if cell.get("state") in ("failed", "stopped", "submitted") and state not in (FINISHED, "running"):
            state = cell["state"]
        done += state == FINISHED
        rows = files.read_metrics() if state != "pending" else []
        last = rows[-1] if rows else {}
        step = status.get("step", 0) if state != FINISHED else cell["M"]
        table.add_row(
            run_id,
            f"[{STATE_STYLE.get(state, 'white')}]{state}[/]",
            f"{step}/{cell['M']}",
            f"{status.get('rollouts', last.get('rollouts', 0)):,}" if state != "pending" else "-",
            _fmt(last.get("val_avg@k")),
            _fmt(last.get("val_best@k")),
            _fmt(last.get("wall_s")),
        )
    table.caption = f"{done}/{len(cells)} finished" + (f"; {len(manifest.get('infeasible', []))} infeasible cells skipped" if manifest.get("infeasible") else "")
    return table


def metrics_table(rows: list[dict]) -> Table:
    cols = ["step", "rollouts", "tokens_generated", "train_reward_mean", "val_avg@k", "val_best@k", "val_worst@k", "wall_s"]
    table = Table(title="eval points")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*[_fmt(r.get(c)) for c in cols])
    return table


def frontier_table(df: pd.DataFrame, metric: str, axis: str, compute: str) -> Table:
    from isoflop_cli.fit.frontier import frontier

    front = frontier(df, metric, axis, compute, points=12)
    table = Table(title=f"frontier: best {metric} with {compute} <= C, and {axis}*(C)")
    for col in (compute, metric, f"{axis}*"):
        table.add_column(col, justify="right")
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
