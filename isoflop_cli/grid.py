"""Budgets x axes -> cells. Each cell runs once, to the largest budget, and is evaluated at
log-spaced compute checkpoints, so every smaller budget's iso-compute slice reads the same runs.

Budgets are in rollouts (C = B_p * n * M, M fixed in advance) or in FLOPs (a run stops when its
own ledger reaches the budget; M here is what the ledger's upper bound per step allows).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from isoflop_cli import config, flops
from isoflop_cli.config import GROUPS, BudgetUnit, ConfigError, LrScaling
from isoflop_cli.tasks.arith import ArithTask


@dataclass(frozen=True)
class RunPlan:
    """What one run needs from the grid: where it stops and evaluates, its learning rate, and
    the FLOPs it is predicted to spend."""

    batch: int  # B = B_p * n rollouts per step
    M: int  # update steps: exact for rollout budgets, the upper bound's prediction for FLOP budgets
    eval_steps: tuple[int, ...]  # 0 (the base model) ... M (predicted for FLOP budgets)
    lr: float
    column: str  # the ledger column budgets are in: rollouts or flops_total
    limit: float  # the run ends at this ledger value (FLOPs: at the first step that reaches it)
    eval_at: tuple[float, ...]  # evaluate where the ledger column first reaches each of these
    step_flops: tuple[float, float, float]  # upper bound of one step's (search, learning, reward) FLOPs

    @property
    def rollouts(self) -> int:
        return self.batch * self.M

    @property
    def predicted_flops(self) -> dict[str, float]:
        search, learning, reward = (self.M * f for f in self.step_flops)
        total = search + learning + reward
        return {"flops_search": search, "flops_learning": learning, "flops_reward": reward, "flops_total": total, "rho": learning / total}


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


def step_flops(cfg: DictConfig) -> tuple[float, float, float]:
    """Upper bound of one step's search, learning and reward FLOPs: every prompt at the longest
    prompt's width, every completion at max_new_tokens (a reward model scores prompt, completion, eos)."""
    shape = flops.model_shape(cfg.model).with_lora(cfg.lora.rank, cfg.lora.targets)
    rows, prompt, new = cfg.B_p * cfg.n, ArithTask.from_config(cfg.task).max_prompt_len, cfg.task.max_new_tokens
    shared = (cfg.sampler.name == "vllm" or cfg.sampler.shared_prefill) and cfg.n > 1 and prompt > 1
    search = flops.generate(shape, rows, prompt, new, prefill_rows=cfg.B_p if shared else rows)
    tree = cfg.B_p * (prompt + cfg.n * new)  # each prompt once, then its completions
    work = flops.tree_work(cfg.B_p, cfg.n, prompt, prompt + new, tree) if cfg.learner.shared_prompt else flops.plain_work(rows, prompt + new)
    learning = flops.learning(shape, *work, logits=rows * new, **flops.update_passes(cfg.algo))
    reward = 0.0
    if cfg.reward.name == "prm":
        width = prompt + new + 1
        reward = flops.forward(flops.reward_model_shape(cfg.reward), rows, width, width, width).total
    return search, learning, reward


def plan_run(cfg: DictConfig, flops_scale: float = 1.0) -> RunPlan:
    """The plan of the run `cfg` describes (its n, B_p) under the sweep's budgets; raises if infeasible.

    `flops_scale` (measured / upper bound, from finished runs) turns the per-step upper bound into
    a prediction.
    """
    g = cfg.grid
    batch = cfg.B_p * cfg.n
    if batch > g.max_batch:
        raise ConfigError(f"B_p*n = {batch} exceeds grid.max_batch = {g.max_batch}")
    groups_per_update = cfg.B_p // cfg.algo.minibatches  # mini-batches and ranks take whole prompt groups
    if groups_per_update < cfg.learner.world_size:
        raise ConfigError(f"B_p = {cfg.B_p} prompts do not fill algo.minibatches = {cfg.algo.minibatches} x "
                          f"learner.world_size = {cfg.learner.world_size} (each rank trains on whole prompt groups)")
    c_max = max(g.budgets)
    per_step = tuple(f * flops_scale for f in step_flops(cfg))
    by_flops = BudgetUnit(g.budget.unit) is BudgetUnit.flops
    cost, what = (sum(per_step), f"~{sum(per_step):.3g} FLOPs (upper bound)") if by_flops else (batch, f"B = {batch}")
    M = int(c_max // cost)
    if M < g.min_steps:
        raise ConfigError(f"budget {c_max:g} {BudgetUnit(g.budget.unit).value} allows M = {M} steps of {what}, below grid.min_steps = {g.min_steps}")
    checkpoints = eval_budgets(g) if by_flops else [c for c in eval_budgets(g) if c >= cost]
    steps = {0, M} | {int(c // cost) for c in checkpoints if c >= cost}
    return RunPlan(
        batch=batch, M=M, eval_steps=tuple(sorted(steps)), lr=learning_rate(cfg.algo, batch),
        column="flops_total" if by_flops else "rollouts",
        limit=float(c_max) if by_flops else float(M * batch),
        eval_at=tuple(sorted({0.0, *checkpoints})) if by_flops else tuple(float(s * batch) for s in sorted(steps)),
        step_flops=per_step,
    )


def run_id(axes: dict[str, Any], cfg: DictConfig, plan: RunPlan) -> str:
    """Readable axis values plus a hash of what the run computes: same content, same run."""
    content = OmegaConf.to_container(cfg, resolve=True)
    for key in ("grid", "cluster", "name"):
        content.pop(key, None)
    content["plan"] = [plan.column, plan.limit, list(plan.eval_at), plan.lr]
    digest = hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()[:8]
    parts = [f"n{axes['n']}", f"bp{axes['B_p']}", f"s{axes['seed']}"]
    parts += [f"{k.split('.')[-1]}-{v}" for k, v in axes.items() if k not in ("n", "B_p", "seed")]
    slug = "_".join(parts).replace("/", "-").replace(" ", "")
    return f"{slug[:80]}_{digest}"


def expand(
    cfg: DictConfig,
    recompose: Callable[[list[str]], DictConfig] | None = None,
    flops_scale: dict[str, float] | None = None,
) -> list[Cell]:
    """All cells of the sweep, feasible or not.

    Axes that choose a config group (model=..., reward=...) need `recompose(overrides)`, which
    composes the sweep again with them; plain dotted keys are set directly. `flops_scale` maps a
    model name to its measured / upper-bound FLOP ratio (see plan_run).
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
            base = config.with_values(cfg, choice)
        for n, B_p, seed in itertools.product(g.n, g.B_p, g.seed):
            axes = {"n": n, "B_p": B_p, "seed": seed, **choice}
            run_cfg = base.copy()
            run_cfg.n, run_cfg.B_p, run_cfg.seed = n, B_p, seed
            try:
                plan = plan_run(run_cfg, (flops_scale or {}).get(run_cfg.model.name, 1.0))
            except ConfigError as e:
                cells.append(Cell(axes=axes, cfg=None, plan=None, reason=str(e)))
                continue
            cells.append(Cell(axes=axes, cfg=run_cfg, plan=plan, run_id=run_id(axes, run_cfg, plan)))
    if not any(c.feasible for c in cells):
        reasons = sorted({c.reason for c in cells})
        raise ConfigError(f"no feasible cell: {reasons[0]}" + (f" (and {len(reasons) - 1} more reasons)" if len(reasons) > 1 else ""))
    return cells
