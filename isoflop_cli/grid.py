"""Budgets x axes -> cells. Each cell runs once, to the largest budget, and is evaluated at
log-spaced compute checkpoints, so every smaller budget's iso-compute slice reads the same runs.

Budgets are in rollouts (C = B_p * n * M, M fixed in advance) or in FLOPs (a run stops when its
own ledger reaches the budget; M here is what the ledger's upper bound per step allows).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from isoflop_cli import config, flops, memory, tasks
from isoflop_cli.config import identity
from isoflop_cli.config.compose import omegaconf_message
from isoflop_cli.config.schema import GROUPS, BudgetUnit, LrScaling
from isoflop_cli.errors import ConfigError
from isoflop_cli.rewards import REWARDS
from isoflop_cli.samplers import SAMPLERS

# FLOPs one run may be planned to spend: far beyond any cluster's, and low enough that a grid's
# total stays a finite float (a budget of 1e300 made `plan --json` print Infinity).
MAX_RUN_FLOPS = 1e30


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
    step_bound: (
        flops.StepCost
    )  # upper bound of one step's FLOPs per part: longest prompt, every completion at max_new_tokens
    gpu_memory: memory.Memory | None = None  # the predicted memory of one GPU (None on CPU)
    flops_scale: float = 1.0  # measured / bound FLOPs of finished runs (or calibrated response lengths)

    @property
    def step_flops(self) -> flops.StepCost:
        """One step's predicted FLOPs per part: the bound, scaled by what runs measured."""
        return self.step_bound.scaled(self.flops_scale)

    @property
    def key(self) -> list:
        """What of the plan a run's identity holds (`identity.run_id`): where it stops and evaluates, its lr."""
        return [self.column, self.limit, list(self.eval_at), self.lr]

    @property
    def rollouts(self) -> int:
        return self.batch * self.M

    def reached_by(self, rows: list[dict]) -> bool:
        """Whether a finished run's eval points already reach this plan's end: its FLOP budget (the
        first step past it ends a run) or its steps (exact for rollout budgets, which a step may not
        fill). A run kept at its end and planned further (checkpoint.keep_final) has not."""
        last = rows[-1]
        return last.get(self.column, 0) >= self.limit or last.get("step", 0) >= self.M

    @property
    def predicted_flops(self) -> dict[str, float]:
        return flops.Ledger().add(self.step_flops, self.M).columns()


@dataclass
class Cell:
    axes: dict[str, Any]  # n, B_p, seed and any grid.axes, as set on the run config
    plan: RunPlan | None
    reason: str = ""  # why the cell is infeasible
    run_id: str = field(default="")
    # The cell's axes combination: its config is made on demand (`cfg`), not held per cell.
    combo: _Combo | None = field(default=None, repr=False, compare=False)

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    @property
    def cfg(self) -> DictConfig | None:
        """The run's resolved config (None when infeasible), made when asked for."""
        if self.plan is None or self.combo is None:
            return None
        return self.combo.run_config(self.axes["n"], self.axes["B_p"], self.axes["seed"])


def learning_rate(algo: DictConfig, batch: int) -> float:
    """lr = base_lr * f(B / ref_batch), f = sqrt (default), identity or constant."""
    ratio = batch / algo.ref_batch
    scaling = LrScaling(algo.lr_scaling)
    if scaling is LrScaling.sqrt:
        return float(algo.base_lr * math.sqrt(ratio))
    if scaling is LrScaling.linear:
        return float(algo.base_lr * ratio)
    return float(algo.base_lr)


def budget_column(grid: DictConfig) -> str:
    """The ledger column a sweep's budgets are in."""
    return "flops_total" if BudgetUnit(grid.budget.unit) is BudgetUnit.flops else "rollouts"


def eval_budgets(grid: DictConfig) -> list[float]:
    """Compute checkpoints shared by every cell: every budget, and the largest halved eval_points - 1 times.

    Halving keeps the points log-spaced and lands on the budgets when they are powers of two.
    """
    c_max = max(grid.budgets)
    halvings = [c_max / 2**i for i in range(grid.eval_points)]
    return sorted({float(c) for c in [*grid.budgets, *halvings]})


def step_flops(cfg: DictConfig) -> flops.StepCost:
    """Upper bound of one step's search, learning and reward FLOPs: every prompt at the longest
    prompt's width, every completion at max_new_tokens (a reward model scores prompt, completion, eos)."""
    return _step_flops(cfg, cfg.n, cfg.B_p)


@dataclass(frozen=True)
class _Shapes:
    """What step FLOPs read of a config beside n and B_p, derived once per axes combination."""

    policy: flops.Shape
    prompt: int
    reward: flops.Shape | None

    @classmethod
    def of(cls, cfg) -> _Shapes:
        return cls(
            policy=flops.model_shape(cfg.model).with_lora(cfg.lora.rank, cfg.lora.targets),
            prompt=tasks.make(cfg.task).max_prompt_tokens,
            reward=flops.reward_model_shape(cfg.reward) if REWARDS[cfg.reward.name].model_based else None,
        )


def _step_flops(cfg, n: int, B_p: int, shapes: _Shapes | None = None) -> flops.StepCost:
    shapes = shapes or _Shapes.of(cfg)
    shape, prompt, new = shapes.policy, shapes.prompt, cfg.task.max_new_tokens
    rows = B_p * n
    shared = SAMPLERS[cfg.sampler.name].shares_prefill(cfg.sampler, n)
    _, k = flops.epoch_plan(cfg.algo.epochs, n)  # completions per group the updates learn from
    # At the bound a group over the token budget splits into pieces of `per_piece` completions, each with its prompt.
    trees = B_p * -(-k // flops.piece_rows(cfg.learner.max_tokens_per_micro_batch, prompt, new, k))
    batch = flops.StepBatch(
        prompts=B_p,
        n=n,
        prompt_width=prompt,
        generated_width=new,
        prefill_rows=B_p if shared else rows,
        n_learn=k,
        tree_tokens=trees * prompt + B_p * k * new,
        learned_tokens=B_p * k * new,
        trees=trees,
    )
    reward = flops.reward_model(shapes.reward, rows, prompt + new + 1) if shapes.reward is not None else 0.0
    return flops.step_cost(shape, cfg.algo, batch, cfg.learner.shared_prompt, reward)


def calibrated_scale(cfg: DictConfig) -> float | None:
    """Step FLOPs at the base model's measured mean response length over those at
    task.max_new_tokens, for a problem set `isoflop calibrate` wrote; None for any other task: the
    plan's first estimate of a sweep on a calibrated set, before any run of it has finished."""
    tokens = tasks.make(cfg.task).response_tokens
    if not tokens or tokens >= cfg.task.max_new_tokens:
        return None
    expected = config.with_values(cfg, {"task.max_new_tokens": max(1, math.ceil(tokens))}, checked=False)
    return step_flops(expected).total / step_flops(cfg).total


def plan_run(cfg: DictConfig, flops_scale: float = 1.0) -> RunPlan:
    """The plan of the run `cfg` describes (its n, B_p) under the sweep's budgets; raises if infeasible.

    `flops_scale` (measured / upper bound, from finished runs) turns the per-step upper bound into
    a prediction.
    """
    return _plan_run(cfg, cfg.n, cfg.B_p, flops_scale)


def _plan_run(
    cfg,
    n: int,
    B_p: int,
    flops_scale: float = 1.0,
    shapes: _Shapes | None = None,
    checkpoints: list[float] | None = None,
) -> RunPlan:
    """plan_run for `n`, `B_p` on `cfg` (a DictConfig or a `_Plain` view of one). Values derived
    here are checked like the config's own (a learning rate, FLOPs that overflow): every run of a
    plan can start."""
    g = cfg.grid
    shapes = shapes or _Shapes.of(cfg)
    batch = B_p * n
    if batch > g.max_batch:
        raise ConfigError(f"B_p*n = {batch} exceeds grid.max_batch = {g.max_batch}")
    groups_per_update = B_p // cfg.algo.minibatches  # mini-batches and ranks take whole prompt groups
    if groups_per_update < cfg.learner.world_size:
        raise ConfigError(
            f"B_p = {B_p} prompts do not fill algo.minibatches = {cfg.algo.minibatches} x "
            f"learner.world_size = {cfg.learner.world_size} (each rank trains on whole prompt groups)"
        )
    c_max = max(g.budgets)
    bound = _step_flops(cfg, n, B_p, shapes)
    per_step = bound.scaled(flops_scale)
    by_flops = BudgetUnit(g.budget.unit) is BudgetUnit.flops
    cost, what = (per_step.total, f"~{per_step.total:.3g} FLOPs (upper bound)") if by_flops else (batch, f"B = {batch}")
    M = int(c_max // cost)
    if g.min_steps > M:
        raise ConfigError(
            f"budget {c_max:g} {BudgetUnit(g.budget.unit).value} allows M "
            f"= {M} steps of {what}, below grid.min_steps = {g.min_steps}"
        )
    if not M * per_step.total <= MAX_RUN_FLOPS:
        raise ConfigError(
            f"budget {c_max:g} {BudgetUnit(g.budget.unit).value} is M = {M:.3g} steps of ~{per_step.total:.3g} FLOPs, "
            f"{M * per_step.total:.3g} FLOPs a run: above {MAX_RUN_FLOPS:.0e}; lower grid.budgets"
        )
    lr = learning_rate(cfg.algo, batch)
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(
            f"algo.base_lr={cfg.algo.base_lr:g} scaled by "
            f"algo.lr_scaling={LrScaling(cfg.algo.lr_scaling).value} to B = {batch} "
            f"(algo.ref_batch={cfg.algo.ref_batch}) is a learning rate of {lr:g}: it must be a finite number > 0"
        )
    shared = eval_budgets(g) if checkpoints is None else checkpoints
    checkpoints = shared if by_flops else [c for c in shared if c >= cost]
    steps = {0, M} | {int(c // cost) for c in checkpoints if c >= cost}
    gpu_memory = memory.predict(shapes.policy, cfg, n, B_p, shapes.prompt)
    memory.check(gpu_memory, cfg)
    memory.check_node(shapes.policy, cfg)
    return RunPlan(
        batch=batch,
        M=M,
        eval_steps=tuple(sorted(steps)),
        lr=lr,
        column=budget_column(g),
        limit=float(c_max) if by_flops else float(M * batch),
        eval_at=tuple(sorted({0.0, *checkpoints})) if by_flops else tuple(float(s * batch) for s in sorted(steps)),
        step_bound=bound,
        flops_scale=flops_scale,
        gpu_memory=gpu_memory,
    )


def run_configs(cells: list[Cell]) -> list[DictConfig]:
    """One run config per axes combination of the feasible cells (the runs differ beyond that only
    in n, B_p and seed): what `config.check_runnable` reads, without a config per cell."""
    configs: dict[int, DictConfig] = {}
    for c in cells:
        if c.feasible and id(c.combo) not in configs:
            configs[id(c.combo)] = c.cfg
    return list(configs.values())


class _Plain:
    """Attribute and item access to a plain config dict, as planning reads a DictConfig (OmegaConf's
    access costs microseconds per key, and planning reads many keys per cell)."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]):
        self._data = data

    def __getattr__(self, key: str) -> Any:
        try:
            value = self._data[key]
        except KeyError:
            raise AttributeError(key) from None
        return _Plain(value) if isinstance(value, dict) else value

    __getitem__ = __getattr__


class _Combo:
    """One combination of grid.axes values. Its cells share it: their configs are made from it on
    demand (`Cell.cfg`), only the last one made in the grid kept (`last`, shared by its combinations),
    so a grid holds no config per cell, and reading one cell's config again costs nothing."""

    def __init__(self, root: DictConfig, choice: dict[str, Any], last: list, base: DictConfig | None = None):
        self.root, self.choice, self.base, self.last = root, choice, base, last

    def run_config(self, n: int, B_p: int, seed: int) -> DictConfig:
        key = (n, B_p, seed)
        if not self.last or self.last[0] is not self or self.last[1] != key:
            cfg = (
                self.base.copy() if self.base is not None else config.with_values(self.root, self.choice, checked=False)
            )
            cfg.n, cfg.B_p, cfg.seed = n, B_p, seed
            self.last[:] = [self, key, cfg]
        return self.last[2]


def _plain_value(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _put(data: Any, parts: list[str], value: Any) -> Any:
    """`data` with the value at a dotted path replaced, copying only the containers along it."""
    out = list(data) if isinstance(data, list) else dict(data)
    key: Any = int(parts[0]) if isinstance(data, list) else parts[0]
    out[key] = value if len(parts) == 1 else _put(data[key], parts[1:], value)
    return out


def _set_axes(work: DictConfig, root_plain: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    """Set a combination's dotted keys on `work` (checked as an override is), and return the plain
    config they make: `root_plain` with each key's value as the schema typed it."""
    for key, value in choice.items():
        try:
            OmegaConf.update(work, key, value, merge=False)
        except OmegaConfBaseException as e:
            raise ConfigError(f"grid.axes.{key}: {omegaconf_message(e)}") from None
    config.check(work, axes=False)  # grid.axes itself was checked with the sweep
    plain = root_plain
    for key in choice:
        plain = _put(plain, key.split("."), _plain_value(OmegaConf.select(work, key)))
    return plain


def _same_run(first: dict[str, Any], second: dict[str, Any], run: str) -> ConfigError:
    differ = [k for k in second if first.get(k) != second[k]] or list(second)
    pairs = " and ".join(", ".join(f"{k}={axes[k]}" for k in differ) for axes in (first, second))
    return ConfigError(
        f"grid.axes: {pairs} are the same run ({run}): every axis value must change what a run "
        f"computes ({', '.join(identity.SWEEP_ONLY)} settings do not)"
    )


def expand(
    cfg: DictConfig,
    recompose: Callable[[list[str]], DictConfig] | None = None,
    flops_scale: dict[str, float] | None = None,
) -> list[Cell]:
    """All cells of the sweep, feasible or not.

    Axes that choose a config group (model=..., reward=...) need `recompose(overrides)`, which
    composes the sweep again with them; plain dotted keys are set directly. `flops_scale` maps a
    model name to its measured / upper-bound FLOP ratio (see plan_run).

    Per-cell work is kept small: each axes combination is set, checked and converted to a plain
    dict once, each (n, B_p) of it planned once (seeds share the plan), and run ids hashed from
    pre-serialised parts; cells make their config only when asked (`Cell.cfg`).
    """
    g = cfg.grid
    root = cfg.copy()  # cells make their configs from it: the caller's later edits do not reach them
    extra = {k: [_plain_value(v) for v in values] for k, values in g.axes.items()}
    ns, bps, seeds = list(g.n), list(g.B_p), list(g.seed)
    scales = flops_scale or {}
    work: DictConfig | None = None
    root_plain: dict[str, Any] = {}
    cells: list[Cell] = []
    runs: dict[str, dict[str, Any]] = {}  # content digest -> the axes of the cell that runs it
    ids: dict[str, dict[str, Any]] = {}
    last: list = []  # the cell config made last (see _Combo)
    for combo in itertools.product(*extra.values()) if extra else [()]:
        choice = dict(zip(extra, combo))
        if any(k in GROUPS for k in choice):
            if recompose is None:
                raise ConfigError("group axes (model, reward, ...) need the sweep's overrides to recompose")
            # Scalars go to Hydra as overrides (as the sweep's own would); list values are set after.
            scalars = {k: v for k, v in choice.items() if not isinstance(v, (list, dict))}
            base = recompose([f"{k}={v}" for k, v in scalars.items()])
            rest = {k: v for k, v in choice.items() if k not in scalars}
            if rest:
                base = config.with_values(base, rest)
            spec = _Combo(root, choice, last, base)
            plain = OmegaConf.to_container(base, resolve=True)
        else:
            if work is None:
                work, root_plain = root.copy(), OmegaConf.to_container(root, resolve=True)
            plain = _set_axes(work, root_plain, choice) if choice else root_plain
            spec = _Combo(root, choice, last)
        view = _Plain(plain)
        hashes = identity.RunIds(identity.applicable(plain), choice)
        shapes = _Shapes.of(view)
        checkpoints = eval_budgets(view.grid)
        scale = scales.get(view.model.name, 1.0)
        for n, B_p in itertools.product(ns, bps):
            try:
                plan = _plan_run(view, n, B_p, scale, shapes, checkpoints)
            except ConfigError as e:
                cells.extend(
                    Cell(axes={"n": n, "B_p": B_p, "seed": seed, **choice}, plan=None, reason=str(e), combo=spec)
                    for seed in seeds
                )
                continue
            for seed, digest, rid in hashes.cells(n, B_p, seeds, plan.key):
                axes = {"n": n, "B_p": B_p, "seed": seed, **choice}
                if digest in runs:
                    raise _same_run(runs[digest], axes, rid)
                if rid in ids:
                    raise ConfigError(
                        f"grid: cells {_axes_text(ids[rid])} and {_axes_text(axes)} share the run id {rid}; "
                        "shorten the axis values or rename the sweep's axes"
                    )
                runs[digest] = ids[rid] = axes
                cells.append(Cell(axes=axes, plan=plan, run_id=rid, combo=spec))
    if not any(c.feasible for c in cells):
        reasons = sorted({c.reason for c in cells})
        raise ConfigError(
            f"no feasible cell: {reasons[0]}" + (f" (and {len(reasons) - 1} more reasons)" if len(reasons) > 1 else "")
        )
    return cells


def _axes_text(axes: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in axes.items())
