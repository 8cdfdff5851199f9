"""The RACE pilot: a small iso-FLOP grid derived from the sweep the user would run at full scale.

The pilot moves rho through updates per rollout batch (`algo.epochs` levels: a fraction below one
learns from that share of each group's completions, lowering rho; each further epoch adds a
forward and backward over the same rollouts while search stays put) at two of the sweep's n values
(rho barely depends on n; the second n is a replicate that also samples the n axis), crosses them
with every reward system of the sweep, and runs them to one to three small FLOP budgets read off
the same runs. Its cost and the full sweep's both come from the grid's own predictions
(`grid.expand` plans), so the share compares like with like.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

from omegaconf import DictConfig

from isoflop_cli import config as config_mod
from isoflop_cli import grid as grid_mod
from isoflop_cli.errors import ConfigError

MIN_STEPS = 4  # steps the most expensive pilot cell gets at the largest budget
MIN_STEPS_SMALLEST = 2  # ... and at the smallest budget
FIXED = ("n", "B_p", "seed")


@dataclass
class PilotSpec:
    epochs: list[float] = field(default_factory=lambda: [0.25, 0.5, 1, 2, 4])  # allocation levels: algo.epochs values, both sides of one epoch
    budgets: int = 3  # FLOP budgets read off the pilot's runs (1 to 3)
    share: float = 0.10  # target: pilot FLOPs / full sweep FLOPs
    cap: float = 0.25  # refuse above this share unless forced

    def check(self) -> None:
        if len(set(self.epochs)) < 2 or any(not e > 0 or (e > 1 and not float(e).is_integer()) for e in self.epochs):
            raise ConfigError(f"--epochs needs two or more distinct levels: shares of each group below 1, whole epochs from 1, got {self.epochs}")
        if not 1 <= self.budgets <= 3:
            raise ConfigError(f"--budgets must be 1, 2 or 3, got {self.budgets}")
        if not 0 < self.cap <= 1:
            raise ConfigError(f"--cap must be in (0, 1], got {self.cap}")
        if not 0 < self.share <= self.cap:
            raise ConfigError(f"--share must be in (0, --cap = {self.cap}], got {self.share}")


@dataclass
class Pilot:
    """The pilot's config and cells, how it was derived and what it costs next to the full sweep."""

    cfg: DictConfig
    cells: list[grid_mod.Cell]
    overrides: list[str]  # the pilot's own overrides, after the user's
    budgets: list[float]
    full_flops: float  # the full sweep's predicted FLOPs
    flops: float  # the pilot's predicted FLOPs
    rewards: list[str]
    n_levels: list[int]
    notes: list[str]
    full_by_bound: bool = False  # the full sweep's FLOPs come from per-step upper bounds (rollout budgets)

    @property
    def share(self) -> float:
        return self.flops / self.full_flops


def expand(config: str | None, overrides: list[str], flops_scale: dict[str, float] | None = None) -> tuple[DictConfig, list[grid_mod.Cell]]:
    """A sweep's config and cells, composed as `isoflop sweep` composes them."""
    cfg = config_mod.load(config, overrides)
    recompose: Callable[[list[str]], DictConfig] = lambda extra: config_mod.load(config, overrides + extra)  # noqa: E731
    return cfg, grid_mod.expand(cfg, recompose=recompose, flops_scale=flops_scale)


def cell_flops(cell: grid_mod.Cell) -> float:
    """A cell's predicted FLOPs: where a FLOP budget stops its ledger, else the plan's prediction."""
    if cell.plan.column == "flops_total":
        return cell.plan.limit
    return cell.plan.predicted_flops["flops_total"]


def total_flops(cells: list[grid_mod.Cell]) -> float:
    return sum(cell_flops(c) for c in cells if c.feasible)


def rewards_of(cfg: DictConfig) -> list[str]:
    return [str(r) for r in cfg.grid.axes.get("reward", [cfg.reward.name])]


def n_levels(values: list[int]) -> list[int]:
    """Two of the sweep's n values, at a third and two thirds of its sorted range (both if it has two)."""
    values = sorted(set(values))
    if len(values) <= 2:
        return values
    last = len(values) - 1
    return sorted({values[round(last / 3)], values[round(2 * last / 3)]})


def level(value: float) -> int | float:
    """An epoch level as written: whole epochs as integers (their run ids and labels stay as they were)."""
    return int(value) if float(value).is_integer() else float(value)


def axes_override(cfg: DictConfig, rewards: list[str], epochs: list[float]) -> str:
    """`++grid.axes={...}`: every reward, the epoch levels, and every other axis at its first value."""
    axes = {k: [v[0]] for k, v in cfg.grid.axes.items() if k not in ("reward", "algo.epochs")}
    axes.update({"reward": rewards, "algo.epochs": [level(e) for e in epochs]})
    return "++grid.axes={" + ",".join(f"{k}:[{','.join(str(v) for v in vals)}]" for k, vals in axes.items()) + "}"


def base_overrides(cfg: DictConfig, spec: PilotSpec, n: list[int], budgets: list[float]) -> list[str]:
    g = cfg.grid
    return [
        f"name={cfg.name}-pilot",
        f"grid.n=[{','.join(map(str, n))}]",
        f"grid.B_p=[{min(g.B_p)}]",
        f"grid.seed=[{g.seed[0]}]",
        "grid.budget.unit=flops",
        f"grid.budgets=[{','.join(f'{b:.6g}' for b in budgets)}]",
        f"grid.eval_points={len(budgets)}",
        "grid.min_steps=1",
        axes_override(cfg, rewards_of(cfg), spec.epochs),
    ]


def budget_plan(target: float, step: float, wanted: int) -> tuple[float, int, str | None]:
    """The largest budget and how many budgets it carries: as many as `wanted` that still leave the
    most expensive cell MIN_STEPS_SMALLEST steps at the smallest budget and MIN_STEPS at the largest;
    raised to that minimum when the target share is too small for it (with a note)."""
    for count in range(wanted, 0, -1):
        need = max(MIN_STEPS, MIN_STEPS_SMALLEST * 2 ** (count - 1)) * step
        if target >= need:
            return target, count, None
    count = min(2, wanted)
    need = max(MIN_STEPS, MIN_STEPS_SMALLEST * 2 ** (count - 1)) * step
    return need, count, f"raised the pilot budget to {need:.3g} FLOPs, the least that gives every cell {MIN_STEPS} steps"


def round_up(x: float, digits: int = 3) -> float:
    """x rounded up to `digits` significant figures: readable budgets that do not drift between reruns."""
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / scale) * scale


def derive(config: str | None, overrides: list[str], spec: PilotSpec, force: bool = False) -> Pilot:
    """The pilot for the sweep `config` + `overrides` describes; raises ConfigError above the cap.

    Sized from unscaled (upper-bound) predictions on both sides, so the same command derives the
    same pilot again and a rerun resumes it.
    """
    spec.check()
    full_cfg, full_cells = expand(config, overrides)
    full = total_flops(full_cells)
    n = n_levels(list(full_cfg.grid.n))
    rewards = rewards_of(full_cfg)
    # A first expansion at a budget every cell can afford gives the most expensive step of the pilot
    # (well below the cap on a run's FLOPs, which would make the largest cells infeasible).
    _, probe = expand(config, overrides + base_overrides(full_cfg, spec, n, [grid_mod.MAX_RUN_FLOPS / 1e6]))
    feasible = [c for c in probe if c.feasible]
    step = max(c.plan.step_flops.total for c in feasible)
    cells_count = len(feasible)
    target = spec.share * full / cells_count
    largest_run = statistics.median(cell_flops(c) for c in full_cells if c.feasible)
    notes = []
    if target > largest_run:
        target = largest_run
        notes.append("capped the pilot budget at the median FLOPs of a full-sweep run")
    top, count, note = budget_plan(target, step, spec.budgets)
    notes += [note] if note else []
    top = round_up(top)
    budgets = [top / 2**j for j in reversed(range(count))]
    pilot_overrides = base_overrides(full_cfg, spec, n, budgets)
    cfg, cells = expand(config, overrides + pilot_overrides)
    by_bound = any(c.plan.column != "flops_total" for c in full_cells if c.feasible)
    pilot = Pilot(cfg, cells, pilot_overrides, budgets, full, total_flops(cells), rewards, n, notes, by_bound)
    if pilot.share > spec.cap and not force:
        raise ConfigError(
            f"the pilot would cost {pilot.share:.0%} of the full sweep's predicted FLOPs ({pilot.flops:.3g} of {full:.3g}), "
            f"above the cap of {spec.cap:.0%}: its {len(feasible)} cells need {MIN_STEPS} steps each; "
            "use a larger sweep, fewer --epochs levels, a higher --cap, or --force")
    if pilot.share > spec.share * 1.01:
        notes.append(f"the pilot costs {pilot.share:.1%} of the full sweep, above the {spec.share:.0%} target (cap {spec.cap:.0%})")
    return pilot
