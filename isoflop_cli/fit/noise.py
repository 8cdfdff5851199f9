"""The metric's noise, from what a sweep recorded: between seed replicates, and within each evaluation.

- Evaluation: an eval point's avg@k is a mean over P problems of m samples each; the run records
  its sampling variance beside it (`<metric>_var`, from the per-problem counts:
  `recipe.evaluate.mean_variance`). That is the noise of one eval point with the problems held
  fixed; evaluation is paired across runs (each problem's samples from a stream of its own seed,
  the same in every run), so a difference between two runs carries less of it than twice that.
- Seeds: the runs of one cell (alike in every run-level column but `seed`: `grid.seed`'s
  replicates) differ at each eval point by what the seed changed in training, and by the part of
  the evaluation noise their policies do not share. The sample variance between them at each eval
  point (the i-th of each run: replicates share a plan, so their eval points stand at the same
  checkpoints), pooled over eval points and cells weighted by degrees of freedom, is that noise.
  The base evaluation is left out: every replicate evaluates the same base model there.

What uses it (allocation.py): ties and extrapolation are judged at the larger of the sigmoid fits'
pooled residual and `Noise.sd` (the residual misses what all of a run's eval points share: its
seed's luck, and the evaluation streams; the model misses a run's wobble between eval points); the
bootstrap behind the n* intervals resamples a replicated cell's runs (its seeds), and redraws an
unreplicated cell's eval points from their evaluation variance (`Resampling`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from isoflop_cli.fit.data import RUN

SEED = "seed"


def variance_column(metric: str) -> str:
    """Where a run records the evaluation variance of `metric` (only avg@k has one: val_avg@k_var)."""
    return f"{metric}_var"


@dataclass(frozen=True)
class Noise:
    """The variance model of a sweep's metric: what each source says, and what the intervals hold."""

    eval_var: float | None  # mean evaluation variance of one eval point; None where results do not record it
    seed_var: (
        float | None
    )  # pooled variance between seed replicates of a cell at one eval point; None without replicates
    seed_dof: int  # degrees of freedom of seed_var
    cells: int  # cells: runs alike in every run-level column but seed
    replicated: int  # cells with two or more seeds

    @property
    def eval_sd(self) -> float | None:
        return _sqrt(self.eval_var)

    @property
    def seed_sd(self) -> float | None:
        return _sqrt(self.seed_var)

    @property
    def sd(self) -> float | None:
        """One run's eval point about its cell's mean: the between-seed sd where replicates measured
        it (it holds the evaluation noise the replicates do not share), else the evaluation's."""
        return self.seed_sd if self.seed_var is not None else self.eval_sd

    @property
    def intervals(self) -> str:
        """What the bootstrap behind the n* intervals resamples (`Resampling`), in words."""
        if self.replicated:
            rest = self.cells - self.replicated
            return f"intervals hold seed noise (the runs of {self.replicated} replicated cells resampled)" + (
                f" and evaluation noise in the {rest} unreplicated"
                if rest and self.eval_var is not None
                else f"; the {rest} unreplicated cells add none"
                if rest
                else ""
            )
        if self.eval_var is not None:
            return "intervals hold evaluation noise only (no seed replicates)"
        return (
            "intervals resample runs within each axis value: no seed "
            "replicates and no evaluation variance in the results"
        )

    def entry(self) -> dict:
        """fit.json's `noise`: each source's sd, the replicates it was read from, what the intervals
        hold, and the report's line (`describe`)."""
        return {
            "eval_sd": self.eval_sd,
            "seed_sd": self.seed_sd,
            "seed_dof": self.seed_dof,
            "cells": self.cells,
            "cells_replicated": self.replicated,
            "sd": self.sd,
            "intervals": self.intervals,
            "summary": self.describe(),
        }

    def describe(self) -> str:
        """One line for the report: both sources, and what the intervals hold."""
        evaluation = (
            f"evaluation sd {self.eval_sd:.3g} (binomial, paired across runs)"
            if self.eval_var is not None
            else "no evaluation variance recorded"
        )
        seeds = (
            f"between seeds sd {self.seed_sd:.3g} ({self.replicated} "
            f"of {self.cells} cells replicated, {self.seed_dof} dof)"
            if self.seed_var is not None
            else "no seed replicates"
        )
        return f"{evaluation}; {seeds}; {self.intervals}"


def _sqrt(var: float | None) -> float | None:
    return None if var is None else float(np.sqrt(var))


def cells(df: pd.DataFrame, run: str = RUN) -> pd.Series:
    """Per row, its run's cell (an integer): runs alike in every column that is constant within
    every run (n, B_p, model, lr, the grid's axes ...), `seed` and the run's id aside. Results
    without a `seed` column have no replicates to tell apart: there every run is a cell of its own."""
    if SEED not in df.columns:
        return df.groupby(run, sort=False).ngroup()
    constant = (
        df.drop(columns=[SEED, "run_id", run], errors="ignore")
        .groupby(df[run], sort=False)
        .nunique(dropna=False)
        .le(1)
        .all()
    )
    keys = list(constant.index[constant])
    return df.groupby(keys, dropna=False, sort=False).ngroup() if keys else pd.Series(0, index=df.index)


def seed_variance(df: pd.DataFrame, metric: str, compute: str, run: str = RUN) -> tuple[float | None, int, int, int]:
    """(pooled between-seed variance or None, its dof, cells, replicated cells) of `metric` at the
    eval points past the base, the i-th of each run matched across a cell's seeds."""
    cell = cells(df, run)
    if SEED not in df.columns:
        return None, 0, int(cell.nunique()), 0
    seeds = df.groupby(cell)[run].nunique()
    d = df.assign(_cell=cell).sort_values([run, compute], kind="stable")
    d = d[d[compute].to_numpy(float) > 0]
    d = d.assign(_point=d.groupby(run, sort=False).cumcount())
    groups = d[d["_cell"].isin(seeds.index[seeds >= 2])].groupby(["_cell", "_point"])[metric]
    dof = groups.count() - 1
    dof = dof[dof > 0]
    if dof.empty:
        return None, 0, int(seeds.size), 0
    var = groups.var(ddof=1)[dof.index]
    return float((var * dof).sum() / dof.sum()), int(dof.sum()), int(seeds.size), int((seeds >= 2).sum())


def eval_variance(df: pd.DataFrame, metric: str) -> float | None:
    """The mean recorded evaluation variance of `metric` over its eval points; None if not recorded."""
    column = variance_column(metric)
    values = pd.to_numeric(df[column], errors="coerce") if column in df.columns else pd.Series(dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else None


def estimate(df: pd.DataFrame, metric: str = "val_avg@k", compute: str = "rollouts", run: str = RUN) -> Noise:
    """Both sources of a sweep's eval points (`df`: one row per eval point, `run` the run's key)."""
    seed_var, dof, n_cells, replicated = seed_variance(df, metric, compute, run)
    return Noise(eval_variance(df, metric), seed_var, dof, n_cells, replicated)


@dataclass(frozen=True)
class Resampling:
    """What one bootstrap replicate varies: runs drawn with replacement within `strata` (one per
    run), and each eval point's metric redrawn with normal noise of sd `redraw_sd` (one per row)."""

    strata: np.ndarray
    redraw_sd: np.ndarray

    def redraw(self, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """`values` (one per row) with evaluation noise added, kept within [0, 1]."""
        return np.clip(values + rng.normal(0.0, 1.0, values.size) * self.redraw_sd, 0.0, 1.0)


def resampling(df: pd.DataFrame, runs: pd.Index, axis: str, metric: str, noise: Noise, run: str = RUN) -> Resampling:
    """How the bootstrap over `runs` varies the data of `df` under `noise` (`Noise.intervals`):
    a cell with replicates by resampling its seeds; a cell without, by redrawing its eval points
    from their recorded evaluation variance; with neither known, runs resampled within each axis
    value as before (which reads the spread of the designed cells of one value, not a noise)."""
    cell = cells(df, run)
    per_run = pd.Series(cell.to_numpy(), index=df[run]).groupby(level=0).first()
    if not (noise.replicated or noise.eval_var is not None):
        axis_of = df.drop_duplicates(run).set_index(run)[axis]
        return Resampling(axis_of.loc[runs].to_numpy(), np.zeros(len(df)))
    runs_per_cell = per_run.value_counts()
    single = cell.map(runs_per_cell).to_numpy() == 1
    column = variance_column(metric)
    var = (
        pd.to_numeric(df[column], errors="coerce").fillna(0.0).clip(lower=0.0).to_numpy()
        if column in df.columns
        else np.zeros(len(df))
    )
    return Resampling(per_run.loc[runs].to_numpy(), np.where(single, np.sqrt(var), 0.0))
