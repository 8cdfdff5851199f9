"""Will the sweep answer? `plan`'s power analysis of "does n* rise with compute?".

Before a sweep spends, simulate it and read every simulated sweep with `fit`'s own test
(fit/trend.py): the share that calls "rises" is the power; the fewest seeds per cell that reach 80%
is what to run where it falls short. The test reads each run at the first and the last budget every
run covers, so a simulated sweep is a `Scenario` there: each cell's mean at both budgets, one run's
sd about its cell's mean at each (runs spread, or converge, as they train), and how much of a run's
luck its two readings share. It comes from one of two places:

- **A pilot** (`plan --noise-from RESULTS`: a few seeds of the same cells). Its cells' means and
  noise at the two budgets, read as fit reads them. A pilot is noisy itself, so the power is that of
  PILOT_DRAWS scenarios the pilot allows (each cell's means about the pilot's by their standard
  error, the sds by their chi-square): `trend` is their median, `trend_range` their 10-90% range, and
  `seeds_for_80` the seeds at which the range's pessimistic end reaches 80%.
- **A described effect** (no pilot, or a pilot of other cells, whose noise is still used): n* moves
  from `power.start` to `power.end` (n at the first and the last budget; null: `power.doublings`
  centred on the grid's middle), and a cell one doubling of n away from n* stands `power.gap` below
  it. One run's sd is `power.seed_sd` at the first budget and `power.seed_sd_last` at the last, its
  seed's share of it `seed_sd^2 - eval_sd^2` common to both.
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
MAX_GRIDS = 5000  # power.grids' bound: a plan stays seconds
PILOT_DRAWS = 20  # scenarios drawn from what a pilot allows
PESSIMISTIC = 0.1  # the range's lower quantile, where seeds_for_80 is read with a pilot


@dataclass(frozen=True)
class Noise:
    seed_sd: float  # one eval point's sd between the seeds of a cell, at the first budget
    eval_sd: float  # the evaluation's share of it
    source: str  # where the figures come from, in words
    seed_sd_last: float | None = None  # at the last budget; None: seed_sd

    @property
    def sd(self) -> list[float]:
        """[first, last] budget."""
        return [float(self.seed_sd), float(self.seed_sd_last or self.seed_sd)]


@dataclass(frozen=True)
class Scenario:
    """What fit's test sees of a sweep, per designed cell: means (cells, 2) at the first and the last
    common budget, one run's sd about them (2,), and the correlation of a run's two readings."""

    x: np.ndarray  # (cells,) log2 n
    stratum: np.ndarray  # (cells,)
    budgets: np.ndarray  # (2,)
    means: np.ndarray  # (cells, 2)
    sd: np.ndarray  # (2,), or (cells, 2) where cells spread unlike (the test still pools them, as fit's does)
    corr: float


@dataclass(frozen=True)
class Power:
    """`plan --json`'s `power`: the chance fit calls the trend on this grid (`trend`, with
    `trend_range` where a pilot's uncertainty is carried), and the seeds per cell that reach 80%
    (`seeds_for_80`, None beyond MAX_SEEDS); None with `why` where no test can be made (one n value)."""

    trend: float | None
    seeds: int
    seeds_for_80: int | None
    effect: str  # what was simulated, in words
    seed_sd: list[float] | None
    noise_source: str
    grids: int
    trend_range: list[float] | None = None
    why: str | None = None

    def entry(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The plan's footer line."""
        if self.trend is None:
            return f"power: no trend test ({self.why})"
        reach = (
            f"{self.seeds_for_80} seed(s) per cell reach {TARGET:.0%}"
            + (" at the range's low end" if self.trend_range else "")
            if self.seeds_for_80 is not None
            else f"more than {MAX_SEEDS} seeds per cell are needed for {TARGET:.0%}"
        )
        span = f" (10-90%: {self.trend_range[0]:.0%} to {self.trend_range[1]:.0%})" if self.trend_range else ""
        first, last = self.seed_sd
        return (
            f"power: {self.trend:.0%}{span} that fit calls a rising n* when {self.effect} ({self.seeds} seed(s) per "
            f"cell, seed sd {first:.3g} at the first budget and {last:.3g} at the last: {self.noise_source}); {reach}"
        )


@dataclass(frozen=True)
class Design:
    """Every designed cell of a grid (one per combination of its axes but the seed): x = log2 n, its
    stratum (the other designed columns, `rest`) and its eval points in the budget's unit (the base's
    0 left out)."""

    x: np.ndarray  # (cells,)
    stratum: np.ndarray  # (cells,)
    points: list[np.ndarray]  # per cell, its eval points, increasing
    rest: list[dict]  # per cell, its other designed axes

    @classmethod
    def uniform(cls, x: np.ndarray, points: np.ndarray) -> Design:
        """One cell per value of x (log2 n), one stratum, every cell evaluated at `points`."""
        return cls(np.asarray(x, float), np.zeros(len(x), int), [points] * len(x), [{}] * len(x))

    @property
    def budgets(self) -> np.ndarray | None:
        return trend.common_budgets(max(p.min() for p in self.points), min(p.max() for p in self.points))


def design(cells: list) -> Design | None:
    """The design of a grid's feasible cells (grid.Cell)."""
    seen: dict[tuple, tuple[float, tuple, np.ndarray, dict]] = {}
    for cell in cells:
        if not cell.feasible:
            continue
        others = {k: v for k, v in cell.axes.items() if k not in ("n", "seed")}
        rest = tuple(sorted((k, repr(v)) for k, v in others.items()))
        points = np.unique(np.array([c for c in cell.plan.eval_at if c > 0], float))
        seen.setdefault((cell.axes["n"], rest), (math.log2(cell.axes["n"]), rest, points, others))
    if not seen:
        return None
    strata = {rest: i for i, rest in enumerate(dict.fromkeys(rest for _, rest, _, _ in seen.values()))}
    return Design(
        np.array([x for x, _, _, _ in seen.values()]),
        np.array([strata[rest] for _, rest, _, _ in seen.values()]),
        [p for _, _, p, _ in seen.values()],
        [o for _, _, _, o in seen.values()],
    )


def call_rate(s: Scenario, seeds: int, grids: int, rng: np.random.Generator) -> float:
    """The share of `grids` simulated sweeps of scenario `s` (`seeds` per cell) whose test calls "rises"."""
    cell = np.repeat(np.arange(s.x.size), seeds)
    sd = np.broadcast_to(s.sd, s.means.shape)[cell]  # (runs, 2)
    y = s.means[cell] + sd * _paired_normal(rng, (grids, cell.size), s.corr)  # (grids, runs, 2)
    x, stratum = s.x[cell], s.stratum[cell]
    return sum(trend.test(x, stratum, cell, y[g], s.budgets).call == "rises" for g in range(grids)) / grids


def _paired_normal(rng: np.random.Generator, shape: tuple[int, ...], corr: float) -> np.ndarray:
    """Standard normal pairs (shape + (2,)) whose two members correlate by `corr` (clipped to [0, 1])."""
    share = math.sqrt(min(max(corr, 0.0), 1.0))
    return share * rng.standard_normal((*shape, 1)) + math.sqrt(1 - share**2) * rng.standard_normal((*shape, 2))


@dataclass(frozen=True)
class Described:
    """An effect described in the config: n* is `start` at the first budget and `end` at the last (n
    values; either None: `doublings` centred on the grid's middle, or from the one given), a cell one
    doubling of n from n* stands `gap` below it, and the noise is `noise`."""

    start: float | None
    end: float | None
    doublings: float
    gap: float
    noise: Noise

    @property
    def sd(self) -> list[float]:
        return self.noise.sd

    @property
    def source(self) -> str:
        return self.noise.source

    def path(self, d: Design) -> tuple[float, float]:
        """n*'s log2 at the first and the last budget of design `d`."""
        start = math.log2(self.start) if self.start is not None else None
        end = math.log2(self.end) if self.end is not None else None
        if start is None and end is None:
            middle = float(d.x.mean())
            return middle - self.doublings / 2, middle + self.doublings / 2
        if start is None:
            return end - self.doublings, end
        return (start, start + self.doublings) if end is None else (start, end)

    def words(self, d: Design) -> str:
        start, end = self.path(d)
        return f"n* moves from {2**start:.3g} to {2**end:.3g} over the budgets with a gap of {self.gap:g} per doubling"

    def scenarios(self, d: Design, rng: np.random.Generator) -> list[Scenario]:
        """The one scenario: each cell's mean -gap * (log2 n - log2 n*)^2 at the two budgets."""
        star = np.array(self.path(d))
        first, last = self.sd
        shared = max(self.noise.seed_sd**2 - self.noise.eval_sd**2, 0.0)  # the seed's part, common to both
        means = -self.gap * (d.x[:, None] - star[None, :]) ** 2  # (cells, 2)
        return [Scenario(d.x, d.stratum, d.budgets, means, np.array([first, last]), corr=shared / (first * last))]


@dataclass(frozen=True)
class Pilot:
    """A pilot's reading of the design's cells at the two budgets, as fit reads runs."""

    means: np.ndarray  # (cells, 2)
    sd: np.ndarray  # (2,): pooled between seeds
    corr: float
    seeds: np.ndarray  # (cells,): its runs per cell
    dof: int
    source: str

    @classmethod
    def of(cls, y: np.ndarray, cell: np.ndarray, source: str) -> Pilot:
        """From its runs' readings y (runs, 2) and their cells (runs,) = 0..cells-1."""
        seeds = np.bincount(cell)
        means = np.stack([np.bincount(cell, y[:, j]) / seeds for j in (0, 1)], axis=1)
        dev = y - means[cell]
        dof = int(y.shape[0] - seeds.size)
        cov = dev.T @ dev / max(dof, 1)
        sd = np.sqrt(np.diag(cov))
        corr = float(cov[0, 1] / (sd[0] * sd[1])) if (sd > 0).all() else 0.0
        return cls(means, sd, corr, seeds, dof, f"{source}: {int(np.median(seeds))} seed(s) a cell")

    def words(self, d: Design) -> str:
        return "its cells are as the pilot shows them"

    def scenarios(self, d: Design, rng: np.random.Generator) -> list[Scenario]:
        """PILOT_DRAWS scenarios the pilot allows: its cells' means moved by their standard error, its sds
        by their chi-square (dof), the correlation kept."""
        se = self.sd / np.sqrt(self.seeds)[:, None]  # (cells, 2)
        out = []
        for _ in range(PILOT_DRAWS):
            sd = self.sd * np.sqrt(self.dof / rng.chisquare(max(self.dof, 1), 2))
            means = self.means + se * _paired_normal(rng, (self.means.shape[0],), self.corr)
            out.append(Scenario(d.x, d.stratum, d.budgets, means, sd, self.corr))
        return out


def read_pilot(path: Path, d: Design, eval_sd: float) -> Pilot | Noise:
    """Results of a pilot or a similar sweep: a Pilot where they hold two or more runs of every cell of
    `d` covering its two budgets, else their Noise only (their evaluation sd where recorded, else
    `eval_sd`; ConfigError without seed replicates)."""
    from isoflop_cli.fit import data, noise
    from isoflop_cli.fit.data import RUN, FitSpec

    spec = FitSpec()
    everything, _ = data.load([path])
    df = everything[everything[spec.compute] > 0]
    runs = []  # per cell of d, its runs
    for x, rest in zip(d.x, d.rest):
        keep = np.isclose(np.log2(df[spec.axis].astype(float)), x)
        for key, value in rest.items():
            if key in df.columns:
                keep &= df[key].astype(str) == str(value)
        runs.append([g for _, g in df[keep].groupby(RUN, sort=False)])
    lo, hi = d.budgets
    if all(
        len(rs) >= 2 and all(r[spec.compute].min() <= lo * 1.0001 and r[spec.compute].max() >= hi * 0.9999 for r in rs)
        for rs in runs
    ):
        y = np.concatenate([np.stack([trend.at(r, spec, d.budgets) for r in rs]) for rs in runs])  # (runs, 2)
        cell = np.concatenate([np.full(len(rs), i) for i, rs in enumerate(runs)])
        return Pilot.of(y, cell, f"a pilot at {path}")
    read = noise.estimate(everything)
    if read.seed_sd is None:
        raise ConfigError(
            f"--noise-from {path}: no seed replicates to read the noise between seeds from "
            "(a cell run with two or more seeds); set power.seed_sd instead"
        )
    measured = read.eval_sd if read.eval_sd is not None else eval_sd
    return Noise(read.seed_sd, min(measured, read.seed_sd), f"read from {path} ({read.replicated} replicated cells)")


def predicted(
    scenarios: list[Scenario], seeds: int, grids: int, rng: np.random.Generator
) -> tuple[float, list[float] | None]:
    """The power over `scenarios` (`grids` sweeps each): one scenario's rate, or several's median with
    their PESSIMISTIC..1-PESSIMISTIC range."""
    got = np.array([call_rate(sc, seeds, grids, rng) for sc in scenarios])
    if got.size == 1:
        return float(got[0]), None
    return float(np.median(got)), [float(v) for v in np.quantile(got, [PESSIMISTIC, 1 - PESSIMISTIC])]


def analyse(d: Design | None, seeds: int, grids: int, effect: Described | Pilot, seed: int = 0) -> Power:
    """The power of design `d`'s trend test with `seeds` per cell under `effect`, and the fewest seeds
    that reach 80% (doubling until it is reached, then halving the bracket: the power grows with the
    seeds). With several scenarios (a pilot's), 80% is asked of their range's low end."""
    known = dict(seeds=seeds, seed_sd=[float(v) for v in effect.sd], noise_source=effect.source, grids=grids)
    if d is None or np.unique(d.x).size < 2:
        return Power(None, seeds_for_80=None, effect="-", why="the grid has one n value", **known)
    if d.budgets is None:
        why = "the runs' eval points share less than one doubling of compute"
        return Power(None, seeds_for_80=None, effect="-", why=why, **known)
    rng = np.random.default_rng(seed)
    scenarios = effect.scenarios(d, rng)
    each = max(grids // len(scenarios), 10)

    def reached(value: float, span: list[float] | None) -> bool:
        return (span[0] if span else value) >= TARGET

    value, span = predicted(scenarios, seeds, each, rng)
    known |= dict(trend_range=span, effect=effect.words(d))
    if reached(value, span):
        return Power(value, seeds_for_80=seeds, **known)
    low, high = seeds, seeds
    while high < MAX_SEEDS:
        low, high = high, min(MAX_SEEDS, 2 * high)
        if reached(*predicted(scenarios, high, each, rng)):
            break
    else:
        return Power(value, seeds_for_80=None, **known)
    while high - low > 1:  # low falls short, high reaches it
        mid = (low + high) // 2
        low, high = (low, mid) if reached(*predicted(scenarios, mid, each, rng)) else (mid, high)
    return Power(value, seeds_for_80=high, **known)


def binomial_sd(problems: int, samples: int) -> float:
    """One eval point's evaluation sd at its worst (a pass rate of 0.5) over problems x samples completions."""
    return math.sqrt(0.25 / (problems * samples))


def check(settings) -> None:
    """power.* values a simulation can run on (ConfigError otherwise)."""
    for key in ("seed_sd", "doublings", "gap"):
        value = settings[key]
        if not (math.isfinite(value) and 0 < value <= 1e6):
            raise ConfigError(f"power.{key} must be a finite number in (0, 1e6], got {value}")
    for key in ("seed_sd_last", "start", "end"):
        value = settings[key]
        if value is not None and not (math.isfinite(value) and 0 < value <= 1e6):
            raise ConfigError(f"power.{key} must be null or a finite number in (0, 1e6], got {value}")
    if settings.eval_sd is not None and not (
        math.isfinite(settings.eval_sd) and 0 <= settings.eval_sd <= settings.seed_sd
    ):
        raise ConfigError(
            f"power.eval_sd must be between 0 and power.seed_sd ({settings.seed_sd:g}: the evaluation is a share of "
            f"the noise between seeds), got {settings.eval_sd}"
        )
    if not 20 <= settings.grids <= MAX_GRIDS:
        raise ConfigError(
            f"power.grids must be between 20 and {MAX_GRIDS} (simulated sweeps per estimate), got {settings.grids}"
        )


def noise_of(cfg) -> Noise:
    """The noise to simulate without a pilot: power.seed_sd (and seed_sd_last) and power.eval_sd (null:
    the binomial sd of cfg's eval.problems x eval.samples)."""
    settings = cfg.power
    check(settings)
    if settings.eval_sd is not None:
        return Noise(settings.seed_sd, settings.eval_sd, "power.seed_sd and power.eval_sd", settings.seed_sd_last)
    eval_sd = min(binomial_sd(cfg.eval.problems, cfg.eval.samples), settings.seed_sd)
    return Noise(
        settings.seed_sd,
        eval_sd,
        f"power.seed_sd; eval sd binomial over {cfg.eval.problems} x {cfg.eval.samples} completions",
        settings.seed_sd_last,
    )


def of_sweep(cfg, cells: list, results: Path | None = None) -> Power:
    """The power of the configured sweep (its grid.seed replicates per cell): from a pilot's results
    where they cover its cells, else under cfg.power's effect (with the results' noise where given)."""
    settings, noise, d = cfg.power, noise_of(cfg), design(cells)
    effect: Described | Pilot | Noise = noise
    if results is not None and d is not None and d.budgets is not None:
        effect = read_pilot(results, d, noise.eval_sd)
    if isinstance(effect, Noise):
        effect = Described(settings.start, settings.end, settings.doublings, settings.gap, effect)
    return analyse(d, len(cfg.grid.seed), settings.grids, effect)
