"""Method `scalerl`: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), one curve per axis value.

A is the asymptote (the ceiling a recipe reaches), B the compute efficiency, C_mid the compute at
half the gain. R0 is held at the base model's metric (the step-0 eval points). The eval points of
an axis value's runs are pooled: least squares on every point equals least squares on the mean at
each compute weighted by its count, which is what is fitted. `drop_early` leaves out the earliest
compute (ScaleRL skips the initial transient); `holdout_frac` fits below a cut on the log-compute
axis and reports the RMSE of the extrapolation beyond it.

Which axis value is best is read where the curves were measured: at the largest compute every curve
was fitted to, from the fitted values there (each pools its curve's every eval point, so it is less
noisy than the points at that compute alone). A is not the ranking: on sweeps from how GRPO learns
(fit/bank.py) the larger n are still rising at the last budget, so their extrapolated ceilings come
out highest where a small n is best at every budget run. The best is named where its fitted value
beats every other's at one-sided level ALPHA with Bonferroni over the others (the trend test's
rule, trend.py), the difference's sd from the bootstrap's paired replicates; otherwise the values
not beaten are the `best_set`. Resampling runs does not see the evaluation noise a cell's seeds
share (paired evaluation cancels it between cells only where their pass rates are alike), the same
limit the trend test has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap, holdout
from isoflop_cli.fit.curves import CurveFit, fit_scalerl, scalerl
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.fit.trend import ALPHA

NAMES = ["R0", "A", "C_mid", "B", "holdout_error"]
MIN_COMPUTES = 4  # distinct compute points for three free parameters
MIN_RESAMPLES = 10  # paired bootstrap differences below which nothing is told apart


@dataclass
class Series:
    """One axis value's eval points, keyed by distinct compute, with run indices for bootstrap weights."""

    value: float
    computes: np.ndarray  # distinct positive computes kept for the fit and the holdout
    at: np.ndarray  # index into computes for each eval point
    y: np.ndarray
    run: np.ndarray
    base_y: np.ndarray  # step-0 metric of each run (R0)
    base_run: np.ndarray
    cut: float  # computes above it are held out

    def means(self, weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, float]:
        w = np.ones(self.y.size) if weights is None else weights[self.run].astype(float)
        n = np.bincount(self.at, w, self.computes.size)
        mean = np.bincount(self.at, w * self.y, self.computes.size) / np.where(n > 0, n, 1)
        wb = np.ones(self.base_y.size) if weights is None else weights[self.base_run].astype(float)
        return mean, n, float(np.average(self.base_y, weights=wb)) if wb.sum() > 0 else float(self.base_y.mean())

    def fit(self, weights: np.ndarray | None = None, start: dict | None = None) -> CurveFit:
        mean, n, R0 = self.means(weights)
        train = (self.computes <= self.cut) & (n > 0)
        f = fit_scalerl(self.computes[train], mean[train], n[train], R0, start)
        held = (self.computes > self.cut) & (n > 0)
        if held.any():
            err = scalerl(self.computes[held], **{k: f.params[k] for k in ("R0", "A", "C_mid", "B")}) - mean[held]
            f.params["holdout_error"] = float(np.sqrt(np.average(err**2, weights=n[held])))
        return f


def series(df: pd.DataFrame, spec: FitSpec, runs: pd.Index, held: np.ndarray | None = None) -> list[Series]:
    """One Series per axis value with enough computes; the others are dropped with a warning.
    `held`: the budgets `--holdout K` holds out (the cut is just below the smallest)."""
    out, dropped = [], []
    for value, g in df.groupby(spec.axis):
        c = g[spec.compute].to_numpy(float)
        base = g[c == 0] if (c == 0).any() else g[c == c.min()]
        if not (c == 0).any():
            warn(f"scalerl {spec.axis}={plain(value)}: no step-0 eval point; R0 is the metric at the smallest compute")
        g = g[(c > 0) & (c >= spec.drop_early * c.max())]
        computes, at = np.unique(g[spec.compute].to_numpy(float), return_inverse=True)
        log_c = np.log(computes) if computes.size else np.array([0.0])
        if held is not None:
            cut = held[0] * (1 - 1e-9)
        else:  # no holdout: every compute (exp(log(c)) may land an ulp below the largest c)
            cut = (
                float(np.exp(log_c.max() - spec.holdout_frac * (log_c.max() - log_c.min())))
                if spec.holdout_frac > 0
                else math.inf
            )
        if (computes <= cut).sum() < MIN_COMPUTES or (
            (spec.holdout_frac > 0 or held is not None) and not (computes > cut).any()
        ):
            dropped.append(f"{spec.axis}={plain(value)} ({computes.size} computes)")
            continue
        out.append(
            Series(
                float(value),
                computes,
                at,
                g[spec.metric].to_numpy(float),
                runs.get_indexer(g[RUN]),
                base[spec.metric].to_numpy(float),
                runs.get_indexer(base[RUN]),
                cut,
            )
        )
    if dropped:
        warn(f"scalerl: too few computes to fit (need {MIN_COMPUTES} below the holdout cut) for {', '.join(dropped)}")
    return out


def scalerl_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Per axis value the ScaleRL curve; `best` the value whose curve is highest at `best_at` (the
    largest compute every curve was fitted to) beyond the noise, else None with the values it does
    not beat in `best_set`: a winner picked from a tie would be the noise's. The top-level params are
    the curve that is highest there."""
    if spec.holdout and spec.holdout_frac:  # their ranges: `methods.check`
        raise ConfigError("scalerl: give --holdout or --holdout-frac, not both")
    runs = pd.Index(df[RUN].unique())
    held = holdout.split(df, spec, spec.holdout, "scalerl")[1] if spec.holdout else None
    fitted = series(df, spec, runs, held)
    if not fitted:
        raise ConfigError(f"scalerl: no {spec.axis} value has {MIN_COMPUTES} distinct positive computes to fit")
    fits = [s.fit() for s in fitted]
    at = min(float(s.computes[s.computes <= s.cut].max()) for s in fitted)
    strata = df.drop_duplicates(RUN).set_index(RUN).loc[runs, spec.axis].to_numpy()
    draws = [[] for _ in fitted]
    values = np.full((spec.bootstrap, len(fitted)), np.nan)  # (resamples, curves): each refit's value at `at`
    for r, weights in enumerate(bootstrap.run_weights(spec.bootstrap, strata, spec.seed)):
        for i, (d, s, f) in enumerate(zip(draws, fitted, fits)):
            refit = s.fit(weights, f.params)
            if refit.converged:
                d.append(refit.params)
                values[r, i] = _value(refit, at)
    curves = {}
    for s, f, d in zip(fitted, fits, draws):
        median, interval = bootstrap.summarise(d, NAMES)
        fitted_max = float(s.computes[s.computes <= s.cut].max())
        curves[f"{spec.axis}={plain(s.value)}"] = {
            "params": f.params,
            "interval90": interval,
            "median": median,
            "value_at_best_at": _value(f, at),
            "converged": f.converged,
            "at_bound": f.at_bound,
            "holdout_cut": s.cut if spec.holdout_frac > 0 else None,
            # The midpoint past every fitted compute: the points saw the lower half of
            # the curve only, so its ceiling A is extrapolated, not measured.
            "C_mid_beyond_data": bool(f.params["C_mid"] > fitted_max),
            "bootstrap": {"resamples": spec.bootstrap, "converged": len(d)},
        }
        if not f.converged:
            warn(f"scalerl {spec.axis}={plain(s.value)}: the fit did not converge")
    names = list(curves)
    at_values = np.array([curves[k]["value_at_best_at"] for k in names])
    top = int(np.argmax(at_values))
    runs_per = np.array([np.unique(s.run).size for s in fitted])
    tied = [names[i] for i in best_set(at_values, values, top, runs_per)]
    best = names[top] if tied == [names[top]] else None
    entry = {
        **{k: curves[names[top]][k] for k in ("params", "interval90", "median", "converged", "at_bound")},
        "best": best,
        "best_set": tied,
        "best_at": at,
        "curves": curves,
        "drop_early": spec.drop_early,
        "holdout_frac": spec.holdout_frac,
        "held": ["R0"],
    }  # not fitted: the base model's measured value
    if held is not None:
        entry["holdout"] = _holdout(df, spec, held, fitted, fits)
    return MethodResult(entry, {"scalerl": _frame(fitted, fits)})


def _value(f: CurveFit, compute: float) -> float:
    return float(scalerl(np.array([compute]), **{k: f.params[k] for k in ("R0", "A", "C_mid", "B")})[0])


def best_set(values: np.ndarray, resamples: np.ndarray, top: int, runs: np.ndarray) -> list[int]:
    """The curves the top one (`values`' highest, its index `top`) does not beat: every other whose
    shortfall values[top] - values[i] is below t(1 - ALPHA / (K - 1)) times the sd of the paired
    difference over the bootstrap `resamples` (replicates, K; NaN where a refit failed). The sd is
    read from the two curves' runs (`runs` each), so its quantile is Student's t on
    runs[top] + runs[i] - 2 dof: with the 2-4 seeds a cell of a sweep, a normal quantile would name a
    winner from a tie several times as often as ALPHA says. With fewer than MIN_RESAMPLES paired
    replicates, or a single run per curve, nothing is told apart: every curve is in the set."""
    out = []
    for i in range(values.size):
        diff = resamples[:, top] - resamples[:, i]
        diff = diff[np.isfinite(diff)]
        dof = runs[top] + runs[i] - 2
        beaten = (
            i != top
            and diff.size >= MIN_RESAMPLES
            and dof > 0
            and values[top] - values[i] > stats.t.ppf(1 - ALPHA / max(values.size - 1, 1), dof) * diff.std(ddof=1)
        )
        if not beaten:
            out.append(i)
    return out


def _holdout(df: pd.DataFrame, spec: FitSpec, held: np.ndarray, fitted: list[Series], fits: list[CurveFit]) -> dict:
    """`--holdout K` (holdout.py): at each held-out budget the axis value whose curve, fitted below
    it, predicts the highest metric, and that prediction."""

    def predict(computes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = np.array([scalerl(computes, **{k: f.params[k] for k in ("R0", "A", "C_mid", "B")}) for f in fits])
        return np.array([s.value for s in fitted])[values.argmax(0)], values.max(0)

    train = df[df[spec.compute] < held[0]]
    return holdout.entry(spec.holdout, train, spec, holdout.score(df, spec, held, predict))


def _frame(fitted: list[Series], fits: list[CurveFit]) -> pd.DataFrame:
    parts = []
    for s, f in zip(fitted, fits):
        mean, _, _ = s.means(None)
        p = {k: f.params[k] for k in ("R0", "A", "C_mid", "B")}
        parts.append(
            pd.DataFrame(
                {
                    "axis_value": s.value,
                    "compute": s.computes,
                    "value": mean,
                    "fit": scalerl(s.computes, **p),
                    "held_out": s.computes > s.cut,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)
