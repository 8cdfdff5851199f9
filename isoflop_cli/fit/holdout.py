"""`--holdout K`: fit a law on all but the K largest budgets and score what it predicts at them.

A budget is a distinct positive value of the compute column among the eval points (in a sweep,
the rollouts at which runs are evaluated: every run evaluated there shares it). The law is fitted
on the eval points below the smallest held-out budget, as ScaleRL checks its curves: what a law
is for is the budget not yet run, so its error there is the one to report.

What is observed at a held-out budget is read per cell (each combination of the axis and, where
present, the other allocation axis): the mean of its runs' eval points at exactly that budget; the
observed optimum is the cell with the highest mean. That maximum over cells carries the noise of
the best cell (it is biased up by about one cell mean's sd when cells are close): the value error
is read with that in mind, and n* errors are on a log2 scale (a factor, as n* is a grid value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit.data import FitSpec

Predict = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # computes -> (axis*, value)


@dataclass(frozen=True)
class HeldBudget:
    """One held-out budget: the law's prediction from the smaller budgets against what was observed."""

    compute: float
    axis_star_predicted: float
    axis_star_observed: float
    axis_star_log2_error: float  # log2(predicted / observed): 1 is a factor of two
    value_predicted: float
    value_observed: float
    value_error: float  # predicted - observed


def split(df: pd.DataFrame, spec: FitSpec, k: int, method: str) -> tuple[pd.DataFrame, np.ndarray]:
    """(eval points below the K largest budgets, those K budgets ascending); an error when fewer than
    K + 3 budgets exist (a law from fewer than three is no law)."""
    budgets = np.unique(df.loc[df[spec.compute] > 0, spec.compute].to_numpy(float))
    if budgets.size < k + 3:
        raise ConfigError(
            f"{method}: --holdout {k} needs at least {k + 3} distinct "
            f"positive {spec.compute} values (have {budgets.size})"
        )
    held = budgets[-k:]
    return df[df[spec.compute] < held[0]], held


def cells(df: pd.DataFrame, spec: FitSpec) -> list[str]:
    """The allocation axes a cell is made of: the axis, and B_p or n beside it where the data has it."""
    other = {"n": "B_p", "B_p": "n"}.get(spec.axis)
    return [spec.axis] + ([other] if other and other in df.columns and df[other].notna().all() else [])


def observed(df: pd.DataFrame, spec: FitSpec, compute: float) -> tuple[float, float]:
    """(axis value, mean metric) of the cell with the highest mean at exactly `compute`."""
    at = df[np.isclose(df[spec.compute].to_numpy(float), compute, rtol=1e-9)]
    means = at.groupby(cells(df, spec))[spec.metric].mean()
    if means.empty:
        return np.nan, np.nan
    top = means.idxmax()
    return float(top[0] if isinstance(top, tuple) else top), float(means.max())


def score(df: pd.DataFrame, spec: FitSpec, held: np.ndarray, predict: Predict) -> list[HeldBudget]:
    """The law's predictions (`predict`, fitted on the smaller budgets) at each held-out budget."""
    star, value = predict(held)
    out = []
    for c, s, v in zip(held, star, value):
        s_obs, v_obs = observed(df, spec, c)
        out.append(
            HeldBudget(
                float(c),
                float(s),
                s_obs,
                float(np.log2(s / s_obs)) if s > 0 and s_obs > 0 else np.nan,
                float(v),
                v_obs,
                float(v - v_obs),
            )
        )
    return out


def entry(k: int, train: pd.DataFrame, spec: FitSpec, rows: list[HeldBudget]) -> dict:
    """fit.json's `holdout`: what was held out, and per budget and at worst the errors."""
    errors = [r.axis_star_log2_error for r in rows if np.isfinite(r.axis_star_log2_error)]
    return {
        "k": k,
        "fitted_below": float(min(r.compute for r in rows)),
        "train_max_compute": float(train[spec.compute].max()),
        "budgets": [asdict(r) for r in rows],
        "max_abs_axis_star_log2_error": max(map(abs, errors), default=None),
        "max_abs_value_error": max((abs(r.value_error) for r in rows if np.isfinite(r.value_error)), default=None),
    }
