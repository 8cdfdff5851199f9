"""Budgets x axes -> cells. Each cell runs once, to the largest budget, and is evaluated at
log-spaced compute checkpoints, so every smaller budget's iso-compute slice reads the same runs.

Budgets are in rollouts: C = B_p * n * M.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from isoflop_cli.config import GROUPS, ConfigError, LrScaling


@dataclass(frozen=True)
class RunPlan:
    """What one run needs from the grid: its steps, where to evaluate, its learning rate."""

    batch: int  # B = B_p * n rollouts per step
    M: int  # update steps to reach the largest budget
    eval_steps: tuple[int, ...]  # 0 (the base model) ... M
    lr: float

    @property
    def rollouts(self) -> int:
        return self.batch * self.M


@dataclass
class Cell:
    axes: dict[str, Any]  # n, B_p, seed and any grid.axes, as set on the run config
    cfg: DictConfig | None  # the run's resolved config (None when infeasible)
    plan: RunPlan | None
    reason: str = ""  # why the cell is infeasible
    run_id: str = field(default="")

    @property
    def feasible(self) -> bool:
        return self.plan is not None


def learning_rate(algo: DictConfig, batch: int) -> float:
    """lr = base_lr * f(B / ref_batch), f = sqrt (default), identity or constant."""
    ratio = batch / algo.ref_batch
    scaling = LrScaling(algo.lr_scaling)
    if scaling is LrScaling.sqrt:
        return float(algo.base_lr * math.sqrt(ratio))
    if scaling is LrScaling.linear:
        return float(algo.base_lr * ratio)
    return float(algo.base_lr)


def eval_budgets(grid: DictConfig) -> list[float]:
    """Compute checkpoints shared by every cell: every budget, and the largest halved eval_points - 1 times.

    Halving keeps the points log-spaced and lands on the budgets when they are powers of two.
    """
    c_max = max(grid.budgets)
    halvings = [c_max / 2**i for i in range(grid.eval_points)]
    return sorted({float(c) for c in [*grid.budgets, *halvings]})


def plan_run(cfg: DictConfig) -> RunPlan:
    """The plan of the run `cfg` describes (its n, B_p) under the sweep's budgets; raises if infeasible."""
    g = cfg.grid
    batch = cfg.B_p * cfg.n
    if batch > g.max_batch:
        raise ConfigError(f"B_p*n = {batch} exceeds grid.max_batch = {g.max_batch}")
    c_max = max(g.budgets)
    M = c_max // batch
    if M < g.min_steps:
        raise ConfigError(
            f"budget {c_max} rollouts allows M = {M} steps of B = {batch}, below grid.min_steps = {g.min_steps}"
        )
    steps = {0, M} | {int(c // batch) for c in eval_budgets(g) if c // batch >= 1}
    return RunPlan(batch=batch, M=M, eval_steps=tuple(sorted(steps)), lr=learning_rate(cfg.algo, batch))


def run_id(axes: dict[str, Any], cfg: DictConfig, plan: RunPlan) -> str:
    """Readable axis values plus a hash of what the run computes: same content, same run."""
    content = OmegaConf.to_container(cfg, resolve=True)
    for key in ("grid", "cluster", "name"):
        content.pop(key, None)
    content["plan"] = [plan.M, list(plan.eval_steps), plan.lr]
    digest = hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()[:8]
    parts = [f"n{axes['n']}", f"bp{axes['B_p']}", f"s{axes['seed']}"]
    parts += [f"{k.split('.')[-1]}-{v}" for k, v in axes.items() if k not in ("n", "B_p", "seed")]
    slug = "_".join(parts).replace("/", "-").replace(" ", "")
    return f"{slug[:80]}_{digest}"


def expand(cfg: DictConfig, recompose: Callable[[list[str]], DictConfig] | None = None) -> list[Cell]:
    """All cells of the sweep, feasible or not.

    Axes that choose a config group (model=..., reward=...) need `recompose(overrides)`, which
    composes the sweep again with them; plain dotted keys are set directly.
    """
    g = cfg.grid
    extra = {k: list(v) for k, v in g.axes.items()}
    cells: list[Cell] = []
    for combo in itertools.product(*extra.values()) if extra else [()]:
        choice = dict(zip(extra, combo))
        if any(k in GROUPS for k in choice):
            if recompose is None:
                raise ConfigError("group axes (model, reward, ...) need the sweep's overrides to recompose")
            base = recompose([f"{k}={v}" for k, v in choice.items()])
        else:
            base = _set_keys(cfg, choice)
        for n, B_p, seed in itertools.product(g.n, g.B_p, g.seed):
            axes = {"n": n, "B_p": B_p, "seed": seed, **choice}
            run_cfg = base.copy()
            run_cfg.n, run_cfg.B_p, run_cfg.seed = n, B_p, seed
            try:
                plan = plan_run(run_cfg)
            except ConfigError as e:
                cells.append(Cell(axes=axes, cfg=None, plan=None, reason=str(e)))
                continue
            cells.append(Cell(axes=axes, cfg=run_cfg, plan=plan, run_id=run_id(axes, run_cfg, plan)))
    if not any(c.feasible for c in cells):
        reasons = sorted({c.reason for c in cells})
        raise ConfigError(f"no feasible cell: {reasons[0]}" + (f" (and {len(reasons) - 1} more reasons)" if len(reasons) > 1 else ""))
    return cells


def _set_keys(cfg: DictConfig, choice: dict[str, Any]) -> DictConfig:
    out = cfg.copy()
    for key, value in choice.items():
        OmegaConf.update(out, key, value, merge=False)
    return out
