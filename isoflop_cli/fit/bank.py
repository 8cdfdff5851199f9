"""Truths for the statistical methods: sweeps simulated from how GRPO learns, not from any fit's model.

A truth is a problem set, a learner and a grid. Every run of a cell is simulated step by step:

- Each training problem i has a pass rate p_i = sigmoid(b_i + w_i * g + u_i): its base logit b_i
  (the task's difficulty), a shared skill g that every problem draws on by its loading w_i (what
  transfers to held-out problems), and what the run learned of that problem alone, u_i.
- A step draws B_p problems and n rollouts of each: k ~ Binomial(n, p_i) successes. GRPO's advantage,
  normalised in the group, gives the group's policy gradient on the problem's logit n * sqrt(q (1 - q))
  with q = k / n (zero where the group's rewards are all equal); the loss is a mean over the batch's
  B = B_p * n rollouts, so the problem's own logit moves by lr * own * sqrt(q (1 - q)) / B_p, and the
  shared skill by lr * transfer * mean over the batch of w_i sqrt(q_i (1 - q_i)).
- The learning rate scales as isoflop scales it: lr = lr_ref * sqrt(B / B_ref), and a run's seed
  multiplies it by exp(N(0, seed_speed^2)) (a seed changes how fast a run learns, not only where it
  stands).
- Interference: every group also disturbs every problem. A step shrinks all that was learned (g and
  every u) by the factor 1 - lr * interference / sqrt(n) (a group's gradient noise falls with n) and
  jolts g by N(0, (lr * jitter / sqrt(B))^2). Learning and forgetting balance at a ceiling that rises
  with n, reached more slowly the larger the batch: saturation comes from the mechanism.
- Evaluation is isoflop's paired one: held-out problems (their own b and w, no u), each sampled
  `eval_samples` times from streams shared by every run of a sweep (one uniform per sample, a success
  where it falls below the pass rate), at the eval points of grid.eval_at's rule.

A truth's n*(C) is read from its expected curves (the mean over many seeds of each cell's expected
held-out pass rate, no evaluation sampling), as a set: every n within `TIE` of the best. Nothing here
knows any fit's model; the tests and scripts/trend_calibration.py read the sweeps it draws with fit's
own code.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from isoflop_cli.fit import trend
from isoflop_cli.fit.data import RUN, FitSpec, FitWarning
from isoflop_cli.fit.scalerl import scalerl_method

TIE = 0.005  # n values within this of the best expected value are tied for n*
TRUTH_SEEDS = 128  # seeds per cell behind a truth's expected curves (a cell mean's sd ~ 0.001)


@dataclass(frozen=True)
class Task:
    """The problem set: base logits N(difficulty, spread^2), loadings on the shared skill
    Gamma-distributed with mean 1 and sd `loading_sd`."""

    problems: int = 128
    eval_problems: int = 64
    eval_samples: int = 8
    difficulty: float = -1.0
    spread: float = 1.5
    loading_sd: float = 0.5
    seed: int = 0  # draws the problems: one problem set per truth


@dataclass(frozen=True)
class Learner:
    lr: float = 0.5  # at B_ref rollouts a step
    ref_batch: int = 256
    own: float = 1.0  # the pull of a group's signal on its own problem's logit
    transfer: float = 1.0  # ... on the shared skill
    interference: float = 0.002  # what a step forgets of all that was learned, per unit lr, times sqrt(n)
    jitter: float = 0.5  # the shared skill's random jolt per step, per unit lr, times sqrt(B)
    seed_speed: float = 0.15  # sd of the log learning rate between seeds
    same_n: int | None = None  # learn as this n whatever the cell's label: a null where n is irrelevant


@dataclass(frozen=True)
class Truth:
    name: str
    kind: str  # "rise" | "null" | "saturated": what its expected curves show (tests check each)
    ns: tuple[int, ...]
    budgets: tuple[float, ...]  # rollouts; the last is every run's length
    task: Task = field(default_factory=Task)
    learner: Learner = field(default_factory=Learner)
    B_p: int = 16
    eval_points: int = 6

    @cached_property
    def points(self) -> np.ndarray:
        """Eval points in rollouts: every budget and the largest halved eval_points - 1 times (grid.py's rule)."""
        top = max(self.budgets)
        points = np.unique(np.array(list(self.budgets) + [top / 2**i for i in range(self.eval_points)]))
        return points[points >= min(self.budgets)]

    def __post_init__(self):
        if min(self.budgets) < max(self.ns) * self.B_p:
            raise ValueError(f"{self.name}: the first budget is less than one step of n = {max(self.ns)}")

    @cached_property
    def problems(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(b_train, w_train, b_eval, w_eval), drawn once per truth."""
        t, rng = self.task, np.random.default_rng(self.task.seed)
        shape = 1 / t.loading_sd**2
        draw = lambda k: (rng.normal(t.difficulty, t.spread, k), rng.gamma(shape, 1 / shape, k))  # noqa: E731
        return (*draw(t.problems), *draw(t.eval_problems))

    @property
    def ends(self) -> np.ndarray:
        """The first and the last budget: where fit's test reads every run."""
        return np.array([self.budgets[0], self.budgets[-1]])

    @cached_property
    def expected(self) -> np.ndarray:
        """(ns, budgets): each cell's expected held-out pass rate at the budgets (TRUTH_SEEDS seeds)."""
        rng = np.random.default_rng(10_000 + self.task.seed)
        out = [self._pass(_learn(self, n, 1, TRUTH_SEEDS, rng)).mean((0, 1, 3)) for n in self.ns]
        return np.stack(out)[:, np.searchsorted(self.points, self.budgets)]

    def _pass(self, g: np.ndarray) -> np.ndarray:
        """(..., eval problems): the held-out pass rates at shared skill g (...)."""
        _, _, b, w = self.problems
        return _sigmoid(b + w * g[..., None])

    @property
    def fixed_best(self) -> int | None:
        """The n with the highest expected value at every budget and alone in n* at the last; None
        where the highest moves or the last budget ties it with another."""
        best, last = set(self.expected.argmax(0)), self.n_star()[-1]
        return self.ns[best.pop()] if len(best) == 1 and len(last) == 1 else None

    def gap(self) -> float:
        """How far the best expected value at the last budget is above the second best."""
        top = np.sort(self.expected[:, -1])
        return float(top[-1] - top[-2])

    def n_star(self, tie: float = TIE) -> list[tuple[int, ...]]:
        """n* at each budget as the set of n within `tie` of the best expected value."""
        return [tuple(n for n, v in zip(self.ns, col) if v >= col.max() - tie) for col in self.expected.T]

    def sweep(self, seeds: int, grids: int, rng: np.random.Generator) -> np.ndarray:
        """(grids, ns, seeds, points): `grids` sweeps of every cell with `seeds` seeds each, measured as
        isoflop's paired evaluation measures them (streams shared within a sweep)."""
        t = self.task
        streams = rng.random((grids, 1, 1, t.eval_problems, t.eval_samples))
        out = []
        for n in self.ns:
            p = self._pass(_learn(self, n, grids, seeds, rng))  # (grids, seeds, points, eval problems)
            out.append((streams < p[..., None]).mean((-1, -2)))
        return np.stack(out, axis=1)

    def readings(self, seeds: int, grids: int, rng: np.random.Generator) -> np.ndarray:
        """(grids, ns * seeds, 2): every run of `grids` sweeps read at the first and the last budget as
        fit reads it (linear in log2 C between eval points)."""
        values = self.sweep(seeds, grids, rng) @ trend.weights(self.points, self.ends).T  # (grids, ns, seeds, 2)
        return values.reshape(grids, -1, 2)

    def cells(self, seeds: int) -> np.ndarray:
        """(ns * seeds,): each run's cell, in `readings`' order."""
        return np.repeat(np.arange(len(self.ns)), seeds)

    def trends(self, seeds: int, grids: int, rng: np.random.Generator) -> list[trend.Trend]:
        """fit's trend test on `grids` sweeps with `seeds` seeds a cell."""
        x, cell = np.log2(self.ns)[self.cells(seeds)], self.cells(seeds)
        return [trend.test(x, np.zeros_like(cell), cell, y, self.ends) for y in self.readings(seeds, grids, rng)]

    def scalerl_bests(self, seeds: int, grids: int, rng: np.random.Generator, resamples: int = 50) -> list[int | None]:
        """The n fit's scalerl method names best on `grids` sweeps with `seeds` seeds a cell (None: a
        tie), `resamples` bootstrap replicates each (the sd of a paired difference needs no more)."""
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FitWarning)  # a curve that did not converge counts as it is
            for values in self.sweep(seeds, grids, rng):
                best = scalerl_method(self.frame(values), FitSpec(bootstrap=resamples)).entry["best"]
                out.append(None if best is None else int(best.split("=")[1]))
        return out

    def spread(self, seeds: int, sweeps: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
        """Each cell's sd between seeds at the two budgets (cells, 2) and the correlation of a run's two
        readings, pooled over `sweeps` sweeps of `seeds` seeds: the noise a perfect pilot would report."""
        y = self.readings(seeds, sweeps, rng).reshape(sweeps, len(self.ns), seeds, 2)
        dev = y - y.mean(2, keepdims=True)
        sd = np.sqrt((dev**2).sum((0, 2)) / (sweeps * (seeds - 1)))
        first, last = dev[..., 0], dev[..., 1]
        return sd, float((first * last).sum() / np.sqrt((first**2).sum() * (last**2).sum()))

    def frame(self, values: np.ndarray) -> pd.DataFrame:
        """One sweep of `sweep` (ns, seeds, points) as results rows, the columns fit reads."""
        ns, seeds, _ = values.shape
        n = np.repeat(np.array(self.ns), seeds * self.points.size)
        seed = np.tile(np.repeat(np.arange(seeds), self.points.size), ns)
        run = [f"n{a}s{s}" for a, s in zip(n, seed)]
        return pd.DataFrame(
            {
                RUN: run,
                "run_id": run,
                "n": n,
                "B_p": self.B_p,
                "seed": seed,
                "lr": self.learner.lr * np.sqrt(n * self.B_p / self.learner.ref_batch),
                "rollouts": np.tile(self.points, ns * seeds),
                "val_avg@k": values.ravel(),
            }
        )


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _learn(truth: Truth, n_label: int, grids: int, seeds: int, rng: np.random.Generator) -> np.ndarray:
    """(grids, seeds, points): the shared skill g of every run of cell n at the truth's eval points."""
    L, P, B_p = truth.learner, truth.task.problems, truth.B_p
    n = L.same_n or n_label
    B = n * B_p
    b, w, _, _ = truth.problems
    steps = np.maximum(np.rint(truth.points / B).astype(int), 1)  # eval points as steps
    lr = L.lr * math.sqrt(B / L.ref_batch) * np.exp(rng.normal(0, L.seed_speed, (grids, seeds)))  # (G, S)
    keep = 1 - np.minimum(lr * L.interference / math.sqrt(n), 1.0)  # (G, S): what a step keeps
    jolt = lr * L.jitter / math.sqrt(B)
    g = np.zeros((grids, seeds))
    u = np.zeros((grids, seeds, P))
    base = (np.arange(grids * seeds) * P).reshape(grids, seeds, 1)
    out = np.empty((grids, seeds, steps.size))
    for m in range(1, steps.max() + 1):
        idx = rng.integers(0, P, (grids, seeds, B_p))
        p = _sigmoid(b[idx] + w[idx] * g[..., None] + np.take_along_axis(u, idx, -1))
        q = rng.binomial(n, p) / n
        signal = np.sqrt(q * (1 - q))  # (G, S, B_p): a group's normalised-advantage gradient, per rollout
        g = (g + lr * L.transfer * (w[idx] * signal).mean(-1)) * keep + jolt * rng.standard_normal((grids, seeds))
        own = signal * (lr * L.own / B_p)[..., None]  # (G, S, B_p): each seen problem's own pull
        u = (u + np.bincount((base + idx).ravel(), own.ravel(), u.size).reshape(u.shape)) * keep[..., None]
        out[..., steps == m] = g[..., None]
    return out


NARROW, WIDE = (2, 4, 8, 16), (2, 4, 8, 16, 32, 64)
SHORT = (1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
LONG = (1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0)


def _truth(name: str, kind: str, ns, budgets, difficulty: float, lr: float, interference: float, **more) -> Truth:
    return Truth(
        name,
        kind,
        ns,
        budgets,
        task=Task(difficulty=difficulty),
        learner=Learner(lr, interference=interference, **more),
    )


# The bank: every kind of truth the issue names, each from the mechanism above with other settings.
BANK = {
    t.name: t
    for t in (
        _truth("rise-middle-narrow", "rise", NARROW, SHORT, -1.0, 1.0, 0.02),
        _truth("rise-middle-wide", "rise", WIDE, LONG, -2.0, 1.0, 0.1),
        _truth("rise-interior-last", "rise", WIDE, LONG, -1.0, 0.25, 0.1),
        _truth("rise-top-tied", "rise", WIDE, LONG, -1.0, 1.0, 0.02),
        _truth("rise-narrow-slow", "rise", NARROW, LONG, 1.0, 0.25, 0.1),
        _truth("rise-hard-task", "rise", WIDE, LONG, -4.0, 4.0, 0.02),
        _truth("rise-easy-task", "rise", WIDE, LONG, 0.0, 4.0, 0.02),
        _truth("rise-slow-lr", "rise", WIDE, LONG, 0.0, 0.25, 0.1),
        _truth("move-within-half", "rise", (4, 8, 16, 32, 64), SHORT[:-1], -1.0, 1.0, 0.02),
        _truth("rise-then-saturate", "saturated", NARROW, LONG, 0.0, 1.0, 0.002),
        _truth("null-n-irrelevant", "null", NARROW, SHORT, -1.0, 1.0, 0.02, same_n=8),
        _truth("null-fixed-best-catching-up", "null", NARROW, SHORT, -1.0, 0.25, 0.002),
        _truth("null-tied-at-ceiling", "null", NARROW, LONG, 0.0, 1.0, 0.0),
        _truth("null-best-at-edge", "null", (4, 8, 16, 32), SHORT, -1.0, 0.25, 0.002),
        # one n best at every budget by more than the noise of a sweep: what scalerl is asked to name
        _truth("null-fixed-best-coarse", "null", (2, 8, 32), SHORT, -1.0, 0.25, 0.02),
        _truth("null-fixed-best-top-edge", "null", NARROW, SHORT, -1.0, 4.0, 0.1),
    )
}
