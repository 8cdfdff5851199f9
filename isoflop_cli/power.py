"""Will the sweep answer? `plan`'s power analysis of "does n* rise with compute?".

Before a sweep spends, simulate it: the configured grid (its n values, its strata such as B_p, its
seeds, each run's eval points) filled with a metric whose n* moves by the smallest effect worth
finding, plus the noise a sweep of this kind shows, and read every simulated sweep with `fit`'s own
test (fit/trend.py). The share of sweeps where it calls "rises" is the power; the fewest seeds per
cell that reach 80% is what to run instead where it falls short.

The simulated truth (what "the smallest effect" means):

    y(x, C) = -gap * (x - x*(C))^2,   x = log2 n,   x*(C) = start + doublings * t(C)

where t runs from 0 to 1 over the grid's log2 C: n* moves by `power.doublings` doublings across the
budgets, and a run one doubling of n away from n* stands `power.gap` below it. The path is centred on
the grid's middle (the mean log2 n of its cells), which is what the test asks about: whether n*
crosses the middle (fit/trend.py). A move that stays within one half of the grid is not seen at any
number of seeds, so the power is that of a grid centred on where n* is expected.

The noise: each run is shifted as a whole by N(0, seed_sd^2 - eval_sd^2) (what its seed does to all
its eval points alike) and each eval point by N(0, eval_sd^2) (the evaluation's own sampling), so one
eval point's sd between the seeds of a cell is `seed_sd`, as fit.json's noise.seed_sd reads it. A seed
that changes how fast a run learns, not only where it stands, makes the real power lower than this.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import trend

TARGET = 0.8  # the power `seeds_for_80` reaches
WARN_BELOW = 0.5  # a sweep less likely than this to answer is warned of before any compute
MAX_SEEDS = 32  # seeds per cell searched for the target


@dataclass(frozen=True)
class Noise:
    seed_sd: float  # one eval point's sd between the seeds of a cell
    eval_sd: float  # the evaluation's share of it
    source: str  # where the figures come from, in words


@dataclass(frozen=True)
class Power:
    """`plan --json`'s `power`: the chance fit calls the trend on this grid (`trend`), and the seeds per
    cell that reach 80% (`seeds_for_80`, None beyond MAX_SEEDS); None with `why` where no test can be
    made (one n value)."""

    trend: float | None
    seeds: int
    seeds_for_80: int | None
    doublings: float
    gap: float
    seed_sd: float
    eval_sd: float
    noise_source: str
    grids: int
    why: str | None = None

    def entry(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The plan's footer line."""
        if self.trend is None:
            return f"power: no trend test ({self.why})"
        reach = (
            f"{self.seeds_for_80} seed(s) per cell reach {TARGET:.0%}"
            if self.seeds_for_80 is not None
            else f"more than {MAX_SEEDS} seeds per cell are needed for {TARGET:.0%}"
        )
        return (
            f"power: {self.trend:.0%} that fit calls a rising n* when n* moves {self.doublings:g} doubling(s) over "
            f"the budgets with a gap of {self.gap:g} per doubling of n ({self.seeds} seed(s) per cell, "
            f"seed sd {self.seed_sd:.3g}, eval sd {self.eval_sd:.3g}: {self.noise_source}); {reach}"
        )


@dataclass(frozen=True)
class Design:
    """Every designed cell of a grid (one per combination of its axes but the seed): x = log2 n, its
    stratum (the other designed columns) and its eval points in the budget's unit (the base's 0 left out)."""

    x: np.ndarray  # (cells,)
    stratum: np.ndarray  # (cells,)
    points: list[np.ndarray]  # per cell, its eval points, increasing


def design(cells: list) -> Design | None:
    """The design of a grid's feasible cells (grid.Cell)."""
    seen: dict[tuple, tuple[float, tuple, np.ndarray]] = {}
    for cell in cells:
        if not cell.feasible:
            continue
        rest = tuple(sorted((k, repr(v)) for k, v in cell.axes.items() if k not in ("n", "seed")))
        points = np.unique(np.array([c for c in cell.plan.eval_at if c > 0], float))
        seen.setdefault((cell.axes["n"], rest), (math.log2(cell.axes["n"]), rest, points))
    if not seen:
        return None
    strata = {rest: i for i, rest in enumerate(dict.fromkeys(rest for _, rest, _ in seen.values()))}
    return Design(
        np.array([x for x, _, _ in seen.values()]),
        np.array([strata[rest] for _, rest, _ in seen.values()]),
        [p for _, _, p in seen.values()],
    )


def call_rate(
    d: Design, seeds: int, doublings: float, gap: float, noise: Noise, grids: int, rng: np.random.Generator
) -> float:
    """The share of `grids` simulated sweeps of design `d` (`seeds` per cell) whose trend test calls "rises"."""
    budgets = trend.common_budgets(max(p.min() for p in d.points), min(p.max() for p in d.points))
    zlo, zhi = math.log2(min(p.min() for p in d.points)), math.log2(max(p.max() for p in d.points))
    start = d.x.mean() - doublings / 2  # n*'s path, centred on the grid's middle
    offset_sd = math.sqrt(max(noise.seed_sd**2 - noise.eval_sd**2, 0.0))
    y = []  # per cell: (grids, seeds, budgets), each run read at the common budgets as fit reads it
    for x, points in zip(d.x, d.points):
        star = start + doublings * (np.log2(points) - zlo) / max(zhi - zlo, 1e-12)  # (grids, 1, points)
        values = -gap * (x - star) ** 2 + rng.normal(0.0, noise.eval_sd, (grids, seeds, points.size))
        y.append(values @ trend.weights(points, budgets).T + rng.normal(0.0, offset_sd, (grids, seeds, 1)))
    y = np.concatenate(y, axis=1)  # (grids, runs, budgets)
    cell = np.repeat(np.arange(d.x.size), seeds)
    x, stratum = d.x[cell], d.stratum[cell]
    return sum(trend.test(x, stratum, cell, y[g], budgets).call == "rises" for g in range(grids)) / grids


def analyse(cells: list, seeds: int, doublings: float, gap: float, noise: Noise, grids: int, seed: int = 0) -> Power:
    """The power of the grid's trend test with its `seeds` per cell, and the fewest seeds that reach
    80% (doubling until it is reached, then halving the bracket: the power grows with the seeds)."""
    known = dict(
        seeds=seeds,
        doublings=doublings,
        gap=gap,
        seed_sd=noise.seed_sd,
        eval_sd=noise.eval_sd,
        noise_source=noise.source,
        grids=grids,
    )
    d = design(cells)
    if d is None or np.unique(d.x).size < 2:
        return Power(None, seeds_for_80=None, why="the grid has one n value", **known)
    if trend.common_budgets(max(p.min() for p in d.points), min(p.max() for p in d.points)) is None:
        return Power(
            None, seeds_for_80=None, why="the runs' eval points share less than one doubling of compute", **known
        )
    rng = np.random.default_rng(seed)
    rate = call_rate(d, seeds, doublings, gap, noise, grids, rng)
    if rate >= TARGET:
        return Power(rate, seeds_for_80=seeds, **known)
    low, high = seeds, seeds
    while high < MAX_SEEDS:
        low, high = high, min(MAX_SEEDS, 2 * high)
        if call_rate(d, high, doublings, gap, noise, grids, rng) >= TARGET:
            break
    else:
        return Power(rate, seeds_for_80=None, **known)
    while high - low > 1:  # low falls short, high reaches it
        mid = (low + high) // 2
        low, high = (low, mid) if call_rate(d, mid, doublings, gap, noise, grids, rng) >= TARGET else (mid, high)
    return Power(rate, seeds_for_80=high, **known)


def binomial_sd(problems: int, samples: int) -> float:
    """One eval point's evaluation sd at its worst (a pass rate of 0.5) over problems x samples completions."""
    return math.sqrt(0.25 / (problems * samples))


def check(settings) -> None:
    """power.* values a simulation can run on (ConfigError otherwise)."""
    for key in ("seed_sd", "doublings", "gap"):
        value = settings[key]
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"power.{key} must be a finite number > 0, got {value}")
    if settings.eval_sd is not None and not (
        math.isfinite(settings.eval_sd) and 0 <= settings.eval_sd <= settings.seed_sd
    ):
        raise ConfigError(
            f"power.eval_sd must be between 0 and power.seed_sd ({settings.seed_sd:g}: the evaluation is a share of "
            f"the noise between seeds), got {settings.eval_sd}"
        )
    if settings.grids < 20:
        raise ConfigError(f"power.grids must be >= 20 (simulated sweeps per estimate), got {settings.grids}")


def noise_of(cfg, results: Path | None = None) -> Noise:
    """The noise to simulate: read from earlier results where given (a pilot's or a similar sweep's:
    their between-seed and evaluation sds, as fit reads them), else power.seed_sd and power.eval_sd
    (null: the binomial sd of cfg's eval.problems x eval.samples)."""
    settings = cfg.power
    check(settings)
    if results is None:
        if settings.eval_sd is not None:
            return Noise(settings.seed_sd, settings.eval_sd, "power.seed_sd and power.eval_sd")
        eval_sd = min(binomial_sd(cfg.eval.problems, cfg.eval.samples), settings.seed_sd)
        return Noise(
            settings.seed_sd,
            eval_sd,
            f"power.seed_sd; eval sd binomial over {cfg.eval.problems} x {cfg.eval.samples} completions",
        )
    from isoflop_cli.fit import data, noise

    df, _ = data.load([results])
    read = noise.estimate(df)
    if read.seed_sd is None:
        raise ConfigError(
            f"--noise-from {results}: no seed replicates to read the noise between seeds from "
            "(a cell run with two or more seeds); set power.seed_sd instead"
        )
    eval_sd = read.eval_sd if read.eval_sd is not None else binomial_sd(cfg.eval.problems, cfg.eval.samples)
    return Noise(read.seed_sd, min(eval_sd, read.seed_sd), f"read from {results} ({read.replicated} replicated cells)")


def of_sweep(cfg, cells: list, results: Path | None = None) -> Power:
    """The power of the configured sweep (its grid.seed replicates per cell) under cfg.power's effect."""
    settings = cfg.power
    return analyse(cells, len(cfg.grid.seed), settings.doublings, settings.gap, noise_of(cfg, results), settings.grids)
