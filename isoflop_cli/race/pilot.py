"""The RACE pilot: a small iso-FLOP grid derived from the sweep the user would run at full scale.

Each allocation level is one update share at one n: every level samples n = N rollouts per prompt
(N the sweep's largest n), and learns from them `updates` times per rollout batch (`algo.epochs`):
a whole count u is u passes over all N completions, a fraction u < 1 one pass over u N of each
group (the recipe's rollout down-sampling: the u N whose rewards vary the most; the advantages still
come from all N). Search per batch is therefore the same at every level and only the learning on it
moves: at a FLOP budget every level spends the same compute, and the level with more updates per
batch spends more of it learning, so rho = C_learning / C_total rises with updates (its log-odds by
about one per doubling, so doubling levels are evenly spread where the analysis fits). One lever:
a level set that also changed n would confound the update share with the group size (n sets the
share of groups with mixed rewards, and GRPO learns only from those). N is raised to a multiple of
every fraction's denominator, so each level learns from a whole number of completions and its rho
is the one its share says. The default levels, 1/16, 1/4, 1 and 4 updates (at N = 16: learning
from 1, 4 and 16 of each group's 16 completions, and from all 16 four times), span rho from about
0.3 to above 0.9 on the embedded model by the plan's bound, so optima such as the seed study's 0.72
(rule-based rewards) and 0.45 (a PRM) lie inside the pilot's range.

The levels are crossed with every reward system of the sweep and two seeds (the second a
replicate), and run to one to three FLOP budgets read off the same runs, each budget giving every
cell at least MIN_STEPS steps (its slope past the warm-up is measured). The pilot's cost and the
full sweep's both come from the grid's own predictions (`grid.expand` plans), so the share compares
like with like.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from omegaconf import DictConfig

from isoflop_cli import config as config_mod
from isoflop_cli import grid as grid_mod
from isoflop_cli.errors import ConfigError

# steps the most expensive pilot cell takes by the smallest budget: 4x the default warm-up (algo.warmup_steps = 2)
MIN_STEPS = 8
SEEDS = 2  # runs per level and reward system: the sweep's first seed and a replicate
MAX_DENOMINATOR = 64  # a share of a group's completions is read as a fraction up to 1/64


@dataclass(frozen=True)
class Level:
    """One allocation level: n rollouts per prompt, learned from `updates` times per rollout batch
    (below 1: one pass over that share of each group's completions)."""

    n: int
    updates: int | float  # algo.epochs

    def __str__(self) -> str:
        return f"n={self.n} x {level(self.updates)}"


def levels(updates: list[float], sweep_n: list[int]) -> list[Level]:
    """The levels for these update counts, all at n = N: the sweep's largest n (at least 2, a group's
    advantage needs two completions), raised to a multiple of every fraction's denominator so that
    u N is a whole number of completions."""
    step = math.lcm(*(Fraction(u).limit_denominator(MAX_DENOMINATOR).denominator for u in updates))
    N = step * math.ceil(max(*sweep_n, 2) / step)
    return [Level(N, level(u)) for u in sorted(set(updates))]


@dataclass
class PilotSpec:
    # allocation levels: updates per rollout batch, a whole count u paired with n = N / u, a fraction with n = N
    updates: list[float] = field(default_factory=lambda: [0.0625, 0.25, 1, 4])
    budgets: int = 3  # FLOP budgets read off the pilot's runs (1 to 3)
    share: float = 0.10  # target: pilot FLOPs / full sweep FLOPs
    cap: float = 0.25  # refuse above this share unless forced

    def check(self) -> None:
        if len(set(self.updates)) < 2 or any(
            not (0 < u < 1 or (u >= 1 and float(u).is_integer())) for u in self.updates
        ):
            raise ConfigError(
                "--updates needs two or more distinct levels: whole numbers of updates per rollout batch (1, 2, 4 ...) "
                "or fractions below 1 (0.0625, 0.25: learning from that share of each group's completions), "
                f"got {self.updates}"
            )
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
    cells: list[grid_mod.Cell]  # the grid cfg describes: N crossed with every update count and reward
    overrides: list[str]  # the pilot's own overrides, after the user's
    budgets: list[float]
    full_flops: float  # the full sweep's predicted FLOPs
    flops: float  # the pilot's predicted FLOPs
    rewards: list[str]
    levels: list[Level]
    notes: list[str]
    full_by_bound: bool = False  # the full sweep's FLOPs come from per-step upper bounds (rollout budgets)

    @property
    def share(self) -> float:
        return self.flops / self.full_flops

    def steps(self, budget: float) -> tuple[int, int]:
        """The fewest and most steps a cell takes by `budget` FLOPs, at the plan's per-step bound
        (runs take more: their completions are shorter than the bound)."""
        steps = [int(budget // c.plan.step_flops.total) for c in self.cells if c.feasible]
        return min(steps), max(steps)


def expand(
    config: str | None, overrides: list[str], flops_scale: dict[str, float] | None = None
) -> tuple[DictConfig, list[grid_mod.Cell]]:
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


def level(value: float) -> int | float:
    """An epoch level as written: whole epochs as integers (their run ids and labels stay as they were)."""
    return int(value) if float(value).is_integer() else float(value)


def axes_override(cfg: DictConfig, rewards: list[str], levels: list[Level]) -> str:
    """`++grid.axes={...}`: every reward, the levels' update counts, and every other axis at its first value."""
    axes = {k: [v[0]] for k, v in cfg.grid.axes.items() if k not in ("reward", "algo.epochs")}
    axes.update({"reward": rewards, "algo.epochs": [lv.updates for lv in levels]})
    return "++grid.axes={" + ",".join(f"{k}:[{','.join(str(v) for v in vals)}]" for k, vals in axes.items()) + "}"


def base_overrides(cfg: DictConfig, levels: list[Level], budgets: list[float]) -> list[str]:
    g = cfg.grid
    return [
        f"name={cfg.name}-pilot",
        f"grid.n=[{levels[0].n}]",  # every level's N
        f"grid.B_p=[{min(g.B_p)}]",
        f"grid.seed=[{','.join(str(g.seed[0] + i) for i in range(SEEDS))}]",
        "grid.budget.unit=flops",
        f"grid.budgets=[{','.join(f'{b:.6g}' for b in budgets)}]",
        f"grid.eval_points={len(budgets)}",
        "grid.min_steps=1",
        axes_override(cfg, rewards_of(cfg), levels),
    ]


def budget_plan(target: float, step: float, wanted: int) -> tuple[float, int, str | None]:
    """The largest budget and how many budgets it carries, each half the next: as many as `wanted`
    that still give the most expensive cell MIN_STEPS steps by the smallest; raised to that minimum
    at two budgets when the target share is too small for one (with a note)."""
    for count in range(wanted, 0, -1):
        need = MIN_STEPS * 2 ** (count - 1) * step
        if target >= need:
            return target, count, None
    count = min(2, wanted)
    need = MIN_STEPS * 2 ** (count - 1) * step
    return (
        need,
        count,
        f"raised the pilot budget to {need:.3g} FLOPs, the least that gives every cell {MIN_STEPS} steps by the "
        "smallest budget",
    )


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
    lvls = levels(spec.updates, list(full_cfg.grid.n))
    rewards = rewards_of(full_cfg)
    # A first expansion at a budget every cell can afford gives the most expensive step of the pilot
    # (well below the cap on a run's FLOPs, which would make the largest cells infeasible).
    _, probe = expand(config, overrides + base_overrides(full_cfg, lvls, [grid_mod.MAX_RUN_FLOPS / 1e6]))
    feasible = [c for c in probe if c.feasible]
    if not feasible:
        raise ConfigError(f"no pilot level can run: {probe[0].reason if probe else 'no cell'}")
    step = max(c.plan.step_flops.total for c in feasible)
    target = spec.share * full / len(feasible)
    largest_run = statistics.median(cell_flops(c) for c in full_cells if c.feasible)
    notes = []
    if target > largest_run:
        target = largest_run
        notes.append("capped the pilot budget at the median FLOPs of a full-sweep run")
    top, count, note = budget_plan(target, step, spec.budgets)
    notes += [note] if note else []
    top = round_up(top)
    budgets = [top / 2**j for j in reversed(range(count))]
    pilot_overrides = base_overrides(full_cfg, lvls, budgets)
    cfg, cells = expand(config, overrides + pilot_overrides)
    by_bound = any(c.plan.column != "flops_total" for c in full_cells if c.feasible)
    pilot = Pilot(cfg, cells, pilot_overrides, budgets, full, total_flops(cells), rewards, lvls, notes, by_bound)
    if pilot.share > spec.cap and not force:
        raise ConfigError(
            f"the pilot would cost {pilot.share:.0%} of the full sweep's predicted FLOPs ({pilot.flops:.3g} of "
            f"{full:.3g}), above the cap of {spec.cap:.0%}: its {len(feasible)} cells need {MIN_STEPS} steps each by "
            "the smallest budget; "
            "use a larger sweep, fewer --updates levels, a higher --cap, or --force"
        )
    if pilot.share > spec.share * 1.01:
        notes.append(
            f"the pilot costs {pilot.share:.1%} of the full sweep, above the {spec.share:.0%} target "
            f"(cap {spec.cap:.0%})"
        )
    return pilot
