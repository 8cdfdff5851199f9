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
    shared = rng.standard_normal((grids, cell.size, 1))  # a run's luck that both its readings share
    own = rng.standard_normal((grids, cell.size, 2))
    rho = math.sqrt(min(max(s.corr, 0.0), 1.0))
    sd = np.broadcast_to(s.sd, s.means.shape)[cell]  # (runs, 2)
    y = s.means[cell] + sd * (rho * shared + math.sqrt(1 - rho**2) * own)  # (grids, runs, 2)
    x, stratum = s.x[cell], s.stratum[cell]
    return sum(trend.test(x, stratum, cell, y[g], s.budgets).call == "rises" for g in range(grids)) / grids


def described(d: Design, start: float, end: float, gap: float, noise: Noise) -> Scenario:
    """The described effect on design `d`: n* at log2 n = `start`, then `end`; a cell one doubling of
    n from n* stands `gap` below it."""
    star = np.array([start, end])
    first, last = noise.seed_sd, noise.seed_sd_last or noise.seed_sd
    shared = max(noise.seed_sd**2 - noise.eval_sd**2, 0.0)
    return Scenario(
        d.x,
        d.stratum,
        d.budgets,
        -gap * (d.x[:, None] - star[None, :]) ** 2,
        np.array([first, last]),
        corr=shared / (first * last),
    )


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


def read_pilot(path: Path, d: Design) -> Pilot | Noise:
    """Results of a pilot or a similar sweep: a Pilot where they hold two or more runs of every cell of
    `d` covering its two budgets, else their Noise only (ConfigError without seed replicates)."""
    from isoflop_cli.fit import data
    from isoflop_cli.fit.data import RUN, FitSpec

    spec = FitSpec()
    metric, compute = spec.metric, spec.compute
    everything, _ = data.load([path])
    df = everything[everything[compute] > 0]
    runs = {}
    for i, (x, rest) in enumerate(zip(d.x, d.rest)):
        keep = np.isclose(np.log2(df["n"].astype(float)), x)
        for key, value in rest.items():
            if key in df.columns:
                keep &= df[key].astype(str) == str(value)
        runs[i] = [g for _, g in df[keep].groupby(RUN, sort=False)]
    budgets = d.budgets
    covered = all(
        len(rs) >= 2
        and all(r[compute].min() <= budgets[0] * 1.0001 and r[compute].max() >= budgets[1] * 0.9999 for r in rs)
        for rs in runs.values()
    )
    if not covered:
        return _noise(everything, path)
    y = [np.stack([_at(r, metric, compute, budgets) for r in rs]) for rs in runs.values()]  # per cell (runs, 2)
    cell = np.concatenate([np.full(len(v), i) for i, v in enumerate(y)])
    return Pilot.of(np.concatenate(y), cell, f"a pilot at {path}")


def _at(run, metric: str, compute: str, budgets: np.ndarray) -> np.ndarray:
    """A run's metric at `budgets`, as fit's test reads it (a repeated compute: the mean of its values)."""
    curve = run.groupby(compute)[metric].mean()
    return trend.weights(curve.index.to_numpy(float), budgets) @ curve.to_numpy(float)


def _noise(df, path: Path) -> Noise:
    from isoflop_cli.fit import noise

    read = noise.estimate(df)
    if read.seed_sd is None:
        raise ConfigError(
            f"--noise-from {path}: no seed replicates to read the noise between seeds from "
            "(a cell run with two or more seeds); set power.seed_sd instead"
        )
    eval_sd = read.eval_sd if read.eval_sd is not None else 0.0
    return Noise(read.seed_sd, min(eval_sd, read.seed_sd), f"read from {path} ({read.replicated} replicated cells)")


def drawn(d: Design, p: Pilot, rng: np.random.Generator) -> Scenario:
    """One scenario the pilot allows: its cells' means moved by their standard error, its sds by their
    chi-square (dof), the correlation kept."""
    sd = p.sd * np.sqrt(p.dof / rng.chisquare(max(p.dof, 1), 2))
    se = p.sd / np.sqrt(p.seeds)[:, None]  # (cells, 2)
    rho = math.sqrt(min(max(p.corr, 0.0), 1.0))
    shared = rng.standard_normal((p.means.shape[0], 1))
    means = p.means + se * (rho * shared + math.sqrt(1 - rho**2) * rng.standard_normal(p.means.shape))
    return Scenario(d.x, d.stratum, d.budgets, means, sd, p.corr)


def pilot_scenarios(d: Design, pilot: Pilot, rng: np.random.Generator) -> list[Scenario]:
    return [drawn(d, pilot, rng) for _ in range(PILOT_DRAWS)]


def predicted(
    scenarios: list[Scenario], seeds: int, grids: int, rng: np.random.Generator
) -> tuple[float, list[float] | None]:
    """The power over `scenarios` (`grids` sweeps each): one scenario's rate, or several's median with
    their PESSIMISTIC..1-PESSIMISTIC range."""
    got = np.array([call_rate(sc, seeds, grids, rng) for sc in scenarios])
    if got.size == 1:
        return float(got[0]), None
    return float(np.median(got)), [float(v) for v in np.quantile(got, [PESSIMISTIC, 1 - PESSIMISTIC])]


def analyse(
    d: Design | None, seeds: int, settings, noise: Noise, grids: int, pilot: Pilot | None = None, seed: int = 0
) -> Power:
    """The power of design `d`'s trend test with `seeds` per cell, and the fewest seeds that reach 80%
    (doubling until it is reached, then halving the bracket: the power grows with the seeds)."""
    if pilot is None:
        first, last = noise.seed_sd, noise.seed_sd_last or noise.seed_sd
        source = noise.source
    else:
        (first, last), source = pilot.sd, pilot.source
    known = dict(seeds=seeds, seed_sd=[float(first), float(last)], noise_source=source, grids=grids)
    if d is None or np.unique(d.x).size < 2:
        return Power(None, seeds_for_80=None, effect="-", why="the grid has one n value", **known)
    if d.budgets is None:
        why = "the runs' eval points share less than one doubling of compute"
        return Power(None, seeds_for_80=None, effect="-", why=why, **known)
    rng = np.random.default_rng(seed)
    if pilot is not None:
        scenarios = pilot_scenarios(d, pilot, rng)
        each = max(grids // PILOT_DRAWS, 10)
        effect = "its cells are as the pilot shows them"
    else:
        start, end = _path(d, settings)
        scenarios, each = [described(d, start, end, settings.gap, noise)], grids
        effect = (
            f"n* moves from {2**start:.3g} to {2**end:.3g} over the budgets with a gap of {settings.gap:g} per "
            "doubling of n"
        )

    def rate(s: int) -> tuple[float, list[float] | None]:
        return predicted(scenarios, s, each, rng)

    def enough(s: int) -> bool:
        value, span = rate(s)
        return (span[0] if span else value) >= TARGET

    value, span = rate(seeds)
    known |= dict(trend_range=span, effect=effect)
    if (span[0] if span else value) >= TARGET:
        return Power(value, seeds_for_80=seeds, **known)
    low, high = seeds, seeds
    while high < MAX_SEEDS:
        low, high = high, min(MAX_SEEDS, 2 * high)
        if enough(high):
            break
    else:
        return Power(value, seeds_for_80=None, **known)
    while high - low > 1:  # low falls short, high reaches it
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return Power(value, seeds_for_80=high, **known)


def _path(d: Design, settings) -> tuple[float, float]:
    """n*'s log2 at the first and the last budget: power.start and power.end where given, else
    power.doublings centred on the grid's middle."""
    middle = float(d.x.mean())
    start = math.log2(settings.start) if settings.start is not None else None
    end = math.log2(settings.end) if settings.end is not None else None
    if start is None and end is None:
        return middle - settings.doublings / 2, middle + settings.doublings / 2
    if start is None:
        return end - settings.doublings, end
    if end is None:
        return start, start + settings.doublings
    return start, end


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
    settings = cfg.power
    noise, pilot = noise_of(cfg), None
    d = design(cells)
    if results is not None and d is not None and d.budgets is not None:
        read = read_pilot(results, d)
        pilot, noise = (read, noise) if isinstance(read, Pilot) else (None, read)
    return analyse(d, len(cfg.grid.seed), settings, noise, settings.grids, pilot)
