"""RACE analysis: the regime a pilot grid shows, and how much to trust it.

Each run is read at a few FLOP budgets (linear in log compute between its eval points), giving one
point (x, y = target) per run, budget and model (a *slice*). x is the log-odds of rho, log2(rho /
(1 - rho)) = log2(C_learning / (C_search + C_reward)): one more update per batch's worth of
learning moves it by about the same step wherever it starts (doubling the pilot's updates adds
about 1), where log2 rho crowds the high-rho levels together (0.30, 0.23, 0.19, 0.08 apart for
epochs 0.25 to 4). Per reward system, three
local response curves of y against x are fitted in every slice (constant, log-linear, quadratic),
and the curve is chosen by pooled leave-one-out error with the one-standard-error rule: a richer
curve is kept only when it beats the simpler one by more than the noise of the LOO errors. The
effect is the fitted change of the target from the lowest to the highest rho of the pilot, averaged
over slices, with a 90% interval from a bootstrap over runs. A regime is named only when both say
so: the constant curve is beaten and the interval excludes 0. Otherwise it is `undetermined`.

`interior` comes first: where the quadratic is chosen, the slice-averaged curve's peak (its vertex)
is the optimum rho, and each bootstrap replicate gives one (a replicate whose curve peaks at an end
of the range counts as that end). When the 90% interval of the optimum lies strictly inside the
pilot's rho range and the peak is measured (a level inside the range beats both end levels beyond
the noise: `measured_peak`; a quadratic also bends through a target that rises and then stays
flat, with its vertex between two levels), the target peaks there: the regime is `interior`,
with `optimum_rho` and its interval, and the same optimum in rho without reward FLOPs and in the
lever's own units (updates per batch), read off the levels between which it falls. A monotone
target has no optimum (null).

Reward-heavy is the same test between reward systems: at equal compute (the same slice), does a
model-based reward (one that spends reward FLOPs: a learned PRM) beat the best rule-based one?
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.fit.trend import ALPHA  # a measured peak's lead over each end level: one-sided
from isoflop_cli.rewards import REWARDS

CURVES = {"constant": 0, "log-linear": 1, "quadratic": 2}  # polynomial degree in x = log2(rho / (1 - rho))
SEARCH, UPDATE, REWARD, UNDETERMINED = "search-heavy", "update-heavy", "reward-heavy", "undetermined"
INTERIOR = "interior"  # the target peaks inside the pilot's rho range (the second seed study's finding)
REACH = 1.5  # a run is read at a budget up to this factor beyond its first or last eval point
BANDWIDTH = (
    0.75  # the optimum's local quadratic weighs points by a normal kernel of this sd in x (about 3/4 of a level)
)
LOCAL_STEPS = 3  # ... re-centred on its own vertex this many times


@dataclass
class Data:
    """The points of the analysis and what they came from."""

    points: pd.DataFrame  # run, reward, model, budget, slice, n, epochs, rho, x, x_no_reward, y
    metric: str
    budgets: list[float]
    model_based: list[str]  # reward systems that spend reward FLOPs
    runs: list[str]


# ---------------------------------------------------------------------------------------------
# Reading runs at budgets


def infer_budgets(df: pd.DataFrame, count: int) -> list[float]:
    """Budgets a results file supports: the largest compute every run reaches, halved count - 1 times."""
    finals = df[df["flops_total"] > 0].groupby("run_id")["flops_total"].max()
    top = float(finals.min())
    return sorted(top / 2**j for j in range(count))


def log_odds(rho: float) -> float:
    """The fitting coordinate of a rho: log2(rho / (1 - rho)), NaN where rho is or is outside (0, 1)."""
    return float(np.log2(rho) - np.log2(1 - rho)) if 0 < rho < 1 else float("nan")


def rho_of(x: float) -> float:
    """The rho of a fitting coordinate (the inverse of `log_odds`)."""
    return float(1 / (1 + 2.0**-x))


def read_at(run: pd.DataFrame, budget: float, metric: str) -> tuple[float, float, float] | None:
    """(target, rho, rho without reward FLOPs) of one run at `budget` FLOPs: linear in log compute
    between the eval points that bracket it, or the nearest eval point within a factor REACH; None
    when the run does not get there. The third is NaN where the run has no `_rho_no_reward`."""
    rows = run[(run["flops_total"] > 0)].dropna(subset=[metric, "rho"]).sort_values("flops_total")
    if rows.empty:
        return None
    log_c = np.log(rows["flops_total"].to_numpy(float))
    target = np.log(budget)
    if not log_c[0] - np.log(REACH) <= target <= log_c[-1] + np.log(REACH):
        return None
    at = lambda col: float(np.interp(target, log_c, rows[col].to_numpy(float))) if col in rows else float("nan")  # noqa: E731
    return at(metric), at("rho"), at("_rho_no_reward")


def rho_no_reward(df: pd.DataFrame) -> pd.Series:
    """Per row, C_learning / (C_search + C_learning): rho with the reward FLOPs taken out of the
    total, as a reward system that spends none would count it (NaN without a flops_reward column)."""
    if "flops_reward" not in df.columns:
        return pd.Series(np.nan, index=df.index)
    return df["rho"] * df["flops_total"] / (df["flops_total"] - pd.to_numeric(df["flops_reward"], errors="coerce"))


def model_based_rewards(df: pd.DataFrame) -> list[str]:
    """Reward systems that spend model FLOPs on feedback: flops_reward > 0, or without that column
    those the reward registry calls model-based."""
    if "flops_reward" in df.columns:
        spent = df.groupby("reward")["flops_reward"].max()
        return sorted(str(r) for r, f in spent.items() if f > 0)
    return sorted(str(r) for r in df["reward"].unique() if str(r) in REWARDS and REWARDS[str(r)].model_based)


def collect(df: pd.DataFrame, metric: str, budgets: list[float] | None, count: int = 3) -> Data:
    """One point per run and slice (budget, and model where results have several)."""
    needed = ["run_id", "reward", "rho", "flops_total", metric]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ConfigError(
            f"results have no column {', '.join(missing)} (RACE needs run_id, reward, rho, flops_total and the target)"
        )
    df = df.assign(**{c: pd.to_numeric(df[c], errors="coerce") for c in ("rho", "flops_total", metric)})
    if df[metric].notna().sum() == 0:
        raise ConfigError(f"results column {metric} has no numeric values")
    budgets = sorted(budgets) if budgets else infer_budgets(df, count)
    models = df["model"].astype(str) if "model" in df.columns else pd.Series("", index=df.index)

    def number(col: str) -> pd.Series:
        return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, index=df.index)

    df = df.assign(_model=models, _n=number("n"), _epochs=number("algo.epochs"), _rho_no_reward=rho_no_reward(df))
    several_models = df["_model"].nunique() > 1
    rows = []
    for run_id, run in df.groupby("run_id", sort=True):
        first = run.iloc[0]
        for budget in budgets:
            got = read_at(run, budget, metric)
            if got is None or not 0 < got[1] < 1:
                continue
            y, rho, rho_nr = got
            label = f"{budget:.3g}" + (f" {first['_model']}" if several_models else "")
            rows.append(
                {
                    "run": str(run_id),
                    "reward": str(first["reward"]),
                    "model": first["_model"],
                    "budget": budget,
                    "slice": label,
                    "n": first["_n"],
                    "epochs": first["_epochs"],
                    "rho": rho,
                    "x": log_odds(rho),
                    "x_no_reward": log_odds(rho_nr),
                    "y": y,
                }
            )
    points = pd.DataFrame(
        rows, columns=["run", "reward", "model", "budget", "slice", "n", "epochs", "rho", "x", "x_no_reward", "y"]
    )
    if points.empty:
        raise ConfigError(
            f"no run reaches the budgets {', '.join(f'{b:.3g}' for b in budgets)} FLOPs with a value of {metric}"
        )
    read = [b for b in budgets if (points["budget"] == b).any()]
    return Data(points, metric, read, model_based_rewards(df), sorted(points["run"].unique()))


# ---------------------------------------------------------------------------------------------
# Curves


def fit_weighted(x: np.ndarray, y: np.ndarray, w: np.ndarray, degree: int) -> np.ndarray:
    """Polynomial coefficients (lowest first) of y on x for each weight row of w (replicates, points):
    one batched solve of the normal equations; NaN where the weighted points cannot pin the curve."""
    X = np.vander(x, degree + 1, increasing=True)
    A = np.einsum("bn,ni,nj->bij", w, X, X)
    b = np.einsum("bn,ni,n->bi", w, X, y)
    ok = np.array([np.unique(x[row > 0]).size > degree for row in w])
    A[~ok] = np.eye(degree + 1)
    coef = np.linalg.solve(A, b[..., None])[..., 0]
    coef[~ok] = np.nan
    return coef


def predict(coef: np.ndarray, x: np.ndarray | float) -> np.ndarray:
    return np.polynomial.polynomial.polyval(x, coef.T).T if coef.ndim > 1 else np.polynomial.polynomial.polyval(x, coef)


def loo_errors(x: np.ndarray, y: np.ndarray, degree: int) -> np.ndarray:
    """Leave-one-out prediction errors of one slice; NaN where the rest cannot pin the curve."""
    n = x.size
    w = 1.0 - np.eye(n)
    coef = fit_weighted(x, y, w, degree)
    return y - np.array([predict(coef[i], x[i]) for i in range(n)])


def one_se_choice(errors: dict[str, np.ndarray]) -> tuple[str, dict[str, dict]]:
    """The simplest curve whose LOO mean squared error is within one standard error (paired, over
    points) of the best one. Curves that some point cannot be predicted by are not eligible."""
    table = {}
    for name, e in errors.items():
        if e.size and np.isfinite(e).all():
            table[name] = {"loo_mse": float(np.mean(e**2))}
    best = min(table, key=lambda k: table[k]["loo_mse"])
    for name in table:
        diff = errors[name] ** 2 - errors[best] ** 2
        table[name]["se_vs_best"] = float(np.std(diff, ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else 0.0
    chosen = next(
        n for n in errors if n in table and table[n]["loo_mse"] - table[best]["loo_mse"] <= table[n]["se_vs_best"]
    )
    return chosen, table


@dataclass
class Slices:
    """The points of one reward system grouped by slice, as arrays."""

    names: list[str]
    x: list[np.ndarray]
    y: list[np.ndarray]
    run: list[np.ndarray]  # indices into Data.runs
    level: list[np.ndarray]  # each point's allocation level: its algo.epochs, else its x to a quarter

    @classmethod
    def of(cls, pts: pd.DataFrame, runs: list[str]) -> Slices:
        index = {r: i for i, r in enumerate(runs)}
        groups = [g for _, g in pts.groupby("slice", sort=False)]
        level = lambda g: g["epochs"].to_numpy(float) if g["epochs"].notna().all() else np.round(4 * g["x"]) / 4  # noqa: E731
        return cls(
            [g["slice"].iloc[0] for g in groups],
            [g["x"].to_numpy(float) for g in groups],
            [g["y"].to_numpy(float) for g in groups],
            [g["run"].map(index).to_numpy() for g in groups],
            [np.asarray(level(g), float) for g in groups],
        )

    def subset(self, keep: list[int]) -> Slices:
        return Slices(*([getattr(self, f)[i] for i in keep] for f in ("names", "x", "y", "run", "level")))


def trend_effect(s: Slices, degree: int, weights: np.ndarray) -> np.ndarray:
    """Per replicate, the fitted change of y from the lowest to the highest rho, averaged over slices."""
    per_slice = []
    for x, y, run in zip(s.x, s.y, s.run):
        coef = fit_weighted(x, y, weights[:, run].astype(float), max(degree, 1))
        per_slice.append(predict(coef, x.max()) - predict(coef, x.min()))
    return np.mean(per_slice, axis=0)


MIN_DRAWS = 10  # finite bootstrap draws a 90% interval is read from


def interval(draws: np.ndarray) -> list[float] | None:
    ok = draws[np.isfinite(draws)]
    return [float(v) for v in np.quantile(ok, [0.05, 0.95])] if ok.size >= MIN_DRAWS else None


def trend(s: Slices, weights: np.ndarray) -> dict:
    """Curve choice, effect, interval and the rho regime of one reward system."""
    usable = [i for i, x in enumerate(s.x) if np.unique(x).size >= 3]
    if not usable:
        return {
            "regime": UNDETERMINED,
            "curve": "constant",
            "effect": None,
            "interval90": None,
            "why": "needs at least 3 runs at 2 or more rho levels in a budget",
        }
    s = s.subset(usable)
    errors = {name: np.concatenate([loo_errors(x, y, d) for x, y in zip(s.x, s.y)]) for name, d in CURVES.items()}
    curve, loo = one_se_choice(errors)
    degree = CURVES[curve]
    ones = np.ones((1, weights.shape[1]))
    effect = float(trend_effect(s, degree, ones)[0])
    band = interval(trend_effect(s, degree, weights))
    regime = UNDETERMINED
    if curve != "constant" and band is not None:
        regime = UPDATE if band[0] > 0 else SEARCH if band[1] < 0 else UNDETERMINED
    optimum, optimum_band = optimum_x(s, weights) if degree == 2 else (None, None)
    low, high = (
        max(x.min() for x in s.x),
        min(x.max() for x in s.x),
    )  # the range every slice covers, where `optimum_x` reads a peak
    fitted_inside = (
        optimum is not None and optimum_band is not None and low < optimum_band[0] and optimum_band[1] < high
    )
    peak = measured_peak(s) if fitted_inside else None
    if fitted_inside and peak["measured"]:
        regime = INTERIOR
    params = {}
    for name, x, y in zip(s.names, s.x, s.y):
        coef = fit_weighted(x, y, np.ones((1, x.size)), degree)[0]
        params[name] = {
            "coef": [float(c) for c in coef],
            "rho_range": [rho_of(x.min()), rho_of(x.max())],
            "points": int(x.size),
        }
        if degree == 2 and coef[2] < 0 and x.min() < -coef[1] / (2 * coef[2]) < x.max():
            params[name]["optimum_rho"] = rho_of(-coef[1] / (2 * coef[2]))
    why = {
        UNDETERMINED: "the constant curve is not beaten by more than the noise"
        if curve == "constant"
        else "the effect's 90% interval covers 0"
        if band is not None
        else "too few runs for a bootstrap interval",
        UPDATE: "the target rises toward higher rho",
        SEARCH: "the target rises toward lower rho (more rollouts)",
        INTERIOR: "the target peaks inside the rho range (the optimum's 90% interval excludes both ends, and a "
        "level inside beats both end levels beyond the noise)",
    }[regime]
    if fitted_inside and regime != INTERIOR:
        why += "; the fitted peak lies inside the range, but no level inside beats both end levels beyond the noise"
    return {
        "regime": regime,
        "curve": curve,
        "effect": effect,
        "interval90": band,
        "loo": loo,
        "params": params,
        "why": why,
        "optimum_x": optimum if regime == INTERIOR else None,
        "optimum_x_interval90": optimum_band if regime == INTERIOR else None,
        "measured_peak": peak,
    }


def measured_peak(s: Slices) -> dict:
    """Whether the peak is measured, not only fitted: the level inside the range with the highest
    mean leads both end levels by a one-sided t test at ALPHA / (levels - 2) each (Bonferroni over
    the inside levels the best was picked from: the highest of two equal means leads a third by
    chance twice as often as one does). A run is its mean over the slices; a level's mean is its
    runs' mean; the sd between runs is pooled within levels (runs - levels dof). A pilot has two
    runs a level, so a bootstrap of them would read each level's spread from one difference, and
    its intervals come out too narrow. A quadratic bends through a target that rises and then stays
    flat and places a vertex between two measured levels; a measured peak is a level that beats the
    ends."""
    run = np.concatenate(s.run)
    runs, at = np.unique(run, return_inverse=True)
    y = np.bincount(at, np.concatenate(s.y)) / np.bincount(at)  # each run's mean over the slices
    level = np.concatenate(s.level)[np.unique(at, return_index=True)[1]]
    x = np.bincount(at, np.concatenate(s.x)) / np.bincount(at)
    order = sorted(np.unique(level), key=lambda v: np.median(x[level == v]))
    if len(order) < 3:
        return {"measured": False, "level": None, "why": "fewer than 3 levels"}
    index = np.array([order.index(v) for v in level])  # each run's level, by rho
    means, counts = np.bincount(index, y) / np.bincount(index), np.bincount(index)
    dof = runs.size - len(order)
    sd = float(np.sqrt(((y - means[index]) ** 2).sum() / dof)) if dof > 0 else float("nan")
    best = 1 + int(np.argmax(means[1:-1]))
    need = stats.t.ppf(1 - ALPHA / (len(order) - 2), dof) if dof > 0 else float("inf")
    out = {"level": float(order[best]), "sd": sd, "dof": int(dof)}
    for end, i in (("lead_low", 0), ("lead_high", len(order) - 1)):
        lead, se = float(means[best] - means[i]), sd * math.sqrt(1 / counts[best] + 1 / counts[i])
        out[end], out[f"{end}_se"] = lead, se
        out[f"{end}_shown"] = bool(np.isfinite(se) and lead > need * se)
    out["measured"] = out["lead_low_shown"] and out["lead_high_shown"]
    return out


def optimum_x(s: Slices, weights: np.ndarray) -> tuple[float | None, list[float] | None]:
    """The x (log-odds of rho) where the slice-averaged quadratic peaks (`local`), on the data (None where
    it does not peak inside the range every slice covers) and its 90% bootstrap interval (a replicate peaking at
    or beyond an end counts as that end; None with too few replicates)."""
    low, high = max(x.min() for x in s.x), min(x.max() for x in s.x)
    if not low < high:
        return None, None

    def vertices(weights: np.ndarray, centre: np.ndarray | None) -> np.ndarray:
        """Per replicate, where the slice-averaged quadratic peaks in the range, its points weighted
        by a kernel around `centre` (none: all alike)."""
        near = (
            (lambda x: np.exp(-0.5 * ((x[None, :] - centre[:, None]) / BANDWIDTH) ** 2))
            if centre is not None
            else (lambda x: 1.0)
        )
        coef = np.mean(
            [fit_weighted(x, y, weights[:, run] * near(x), 2) for x, y, run in zip(s.x, s.y, s.run)], axis=0
        )  # (B, 3)
        with np.errstate(divide="ignore", invalid="ignore"):
            vertex = -coef[:, 1] / (2 * coef[:, 2])
        peak_inside = (coef[:, 2] < 0) & (vertex > low) & (vertex < high)
        # Otherwise the curve's highest point in the range is an end: the one where it is higher.
        value = lambda v: coef[:, 0] + coef[:, 1] * v + coef[:, 2] * v * v  # noqa: E731
        at_end = np.where(value(high) >= value(low), high, low)
        return np.where(np.isnan(coef[:, 2]), np.nan, np.where(peak_inside, vertex, at_end))

    def local(weights: np.ndarray) -> np.ndarray:
        """The global vertex, refined LOCAL_STEPS times by a quadratic weighted around the last one:
        a truth that is not quadratic in x (an asymmetric peak) pulls a quadratic over the whole
        range off its peak, by up to a level's spacing on seven levels; the local one stays within
        about half of it."""
        vertex = vertices(weights.astype(float), None)
        for _ in range(LOCAL_STEPS):
            vertex = np.where(np.isnan(vertex), np.nan, vertices(weights.astype(float), np.nan_to_num(vertex)))
        return vertex

    data = local(np.ones((1, weights.shape[1])))[0]
    inside = low < data < high
    band = interval(local(weights))
    return (float(data) if inside else None), band


UNITS = {
    "rho_no_reward": rho_of,
    "algo.epochs": np.exp2,
    "n": np.exp2,
}  # each unit's column in `level_table`, and back from it


def level_table(pts: pd.DataFrame) -> pd.DataFrame:
    """Per allocation level of one reward system, sorted by x: the medians of x and of the units an
    optimum is read in (x without reward FLOPs; log2 algo.epochs; log2 n, where each level has one n
    and the levels' n differ: a pilot's levels share one N, so n is not its lever). A level is the runs of
    one algo.epochs, or each run where results do not name it (then x without reward FLOPs only)."""
    key = "epochs" if pts["epochs"].notna().all() else "run"
    levels = pts.groupby(key)
    table = pd.DataFrame({"x": levels["x"].median(), "rho_no_reward": levels["x_no_reward"].median()})
    if key == "epochs":
        table["algo.epochs"] = np.log2(levels["epochs"].median())
        if (levels["n"].nunique() == 1).all() and levels["n"].median().nunique() > 1:
            table["n"] = np.log2(levels["n"].median())
    return table.sort_values("x")


def optimum_units(pts: pd.DataFrame, x: float | None, band: list[float] | None) -> dict | None:
    """An optimum at `x` (and its 90% interval) in rho without reward FLOPs and in the lever's own
    units (updates per batch, n), each linear in x between the levels that bracket it (an end level's
    value beyond them); the units `level_table` has. None without an optimum."""
    if x is None:
        return None
    table = level_table(pts)
    units = {}
    for unit, back in UNITS.items():
        if unit in table and table[unit].notna().all():

            def at(v: float, column=table[unit].to_numpy(float), back=back) -> float:
                return float(back(np.interp(v, table["x"].to_numpy(float), column)))

            units[unit] = {
                "value": at(x),
                "interval90": sorted(at(v) for v in band) if band else None,
            }  # n falls as x rises
    return units


# ---------------------------------------------------------------------------------------------
# Reward systems against each other


def reward_gap(data: Data, model: str, weights: np.ndarray) -> dict | None:
    """Does `model` (a model-based reward) beat the best rule-based reward at equal compute?

    Per slice, its mean target minus the best rule-based mean; averaged over the slices where both
    have runs. The noise check is LOO: per-reward means against one mean per slice.
    """
    pts = data.points
    rule = sorted(set(pts["reward"]) - set(data.model_based))
    if not rule:
        return None
    index = {r: i for i, r in enumerate(data.runs)}
    slices = [
        g
        for _, g in pts[pts["reward"].isin([model, *rule])].groupby("slice", sort=False)
        if (g["reward"] == model).sum() >= 2 and g["reward"].isin(rule).sum() >= 2
    ]
    if not slices:
        return None
    gaps, pooled, split = [], [], []
    for g in slices:
        w = weights[:, g["run"].map(index).to_numpy()].astype(float)
        y = g["y"].to_numpy(float)
        means = {}
        for reward in [model, *rule]:
            mask = (g["reward"] == reward).to_numpy()
            if mask.any():
                with np.errstate(invalid="ignore", divide="ignore"):
                    means[reward] = (w[:, mask] @ y[mask]) / w[:, mask].sum(axis=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            best_rule = np.nanmax(np.vstack([means[r] for r in rule if r in means]), axis=0)
        gaps.append(means[model] - best_rule)
        pooled.append(_loo_group_errors(y, np.zeros(len(g), dtype=int)))
        split.append(_loo_group_errors(y, (g["reward"] == model).to_numpy().astype(int)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a replicate without runs of one side stays NaN
        draws = np.nanmean(np.vstack(gaps), axis=0)
    effect, band = float(draws[0]), interval(draws[1:])
    errors = {"one mean per budget": np.concatenate(pooled), "model-based apart": np.concatenate(split)}
    chosen, loo = one_se_choice(errors)
    beats = chosen == "model-based apart" and band is not None and band[0] > 0
    return {"effect": effect, "interval90": band, "loo": loo, "beats_rule_based": bool(beats), "against": rule}


def _loo_group_errors(y: np.ndarray, group: np.ndarray) -> np.ndarray:
    """LOO errors of predicting each point by the mean of the other points of its group (NaN if none)."""
    out = np.full(y.size, np.nan)
    for i in range(y.size):
        others = (group == group[i]) & (np.arange(y.size) != i)
        if others.any():
            out[i] = y[i] - y[others].mean()
    return out


# ---------------------------------------------------------------------------------------------
# Decision and validation


def replicate_weights(data: Data, n_boot: int, seed: int) -> np.ndarray:
    """(1 + n_boot, runs): the data itself, then bootstrap resamples of whole runs within each reward
    system. Not within allocation levels: with the two or three runs a pilot has per level, that
    would understate the spread; a replicate that loses a level is fitted on the levels it has."""
    by_run = data.points.drop_duplicates("run").set_index("run").loc[data.runs]
    return np.vstack(
        [np.ones((1, len(data.runs)), dtype=np.int64), bootstrap.run_weights(n_boot, by_run["reward"].to_numpy(), seed)]
    )


def decide(data: Data, target: str, n_boot: int = 200, seed: int = 0) -> list[dict]:
    """One entry per reward system: its regime and the evidence for it."""
    weights = replicate_weights(data, n_boot, seed)
    boot = weights[1:]
    entries = []
    for reward, pts in data.points.groupby("reward", sort=True):
        t = trend(Slices.of(pts, data.runs), boot)
        gap = reward_gap(data, reward, weights) if reward in data.model_based else None
        x, band = t.get("optimum_x"), t.get("optimum_x_interval90")
        entry = {
            "reward": reward,
            "target": target,
            "metric": data.metric,
            **{k: t[k] for k in ("regime", "curve", "effect", "interval90")},
            "optimum_rho": rho_of(x) if x is not None else None,
            "optimum_interval90": [rho_of(v) for v in band] if band else None,
            "optimum_units": optimum_units(pts, x, band),
            "measured_peak": t.get("measured_peak"),
            "basis": "rho",
            "why": t["why"],
            "rho_regime": t["regime"],
            "loo": t.get("loo"),
            "params": t.get("params"),
            "model_based": reward in data.model_based,
            "runs": int(pts["run"].nunique()),
        }
        if gap is not None:
            entry["reward_gap"] = gap
            if gap["beats_rule_based"]:
                entry.update(
                    regime=REWARD,
                    effect=gap["effect"],
                    interval90=gap["interval90"],
                    basis="reward",
                    why=f"beats the best rule-based reward ({', '.join(gap['against'])}) at equal compute",
                )
        entries.append(entry)
    return entries


def agreement(pairs: list[tuple[str, str]]) -> tuple[float | None, int]:
    """The share of paired calls (the pilot's, another's) that name the same regime, and how many
    pairs were left out of it: those `undetermined` on both sides, which is no regime found twice,
    not a regime confirmed. None where every pair is such (or there are none)."""
    named = [(a, b) for a, b in pairs if not a == b == UNDETERMINED]
    return (sum(a == b for a, b in named) / len(named) if named else None), len(pairs) - len(named)


def validate(data: Data, target: str, entries: list[dict], n_boot: int = 100, seed: int = 0) -> dict:
    """The same decision from subsets: leave one budget out (and one model out, with several models).

    Returns the leave-one-out same-regime rate over the (subset, reward system) pairs (`agreement`),
    and each subset's regimes: how stable the pilot's call is within the pilot, not whether it holds
    at full scale (that is `same_regime` against full-scale results).
    """
    full = {e["reward"]: e["regime"] for e in entries}
    subsets = [("budget", b, data.points["budget"] != b) for b in data.budgets] if len(data.budgets) > 1 else []
    if data.points["model"].nunique() > 1:
        subsets += [("model", m, data.points["model"] != m) for m in sorted(data.points["model"].unique())]
    checks, pairs = [], []
    for kind, left_out, keep in subsets:
        pts = data.points[keep]
        sub = Data(
            pts,
            data.metric,
            [b for b in data.budgets if kind != "budget" or b != left_out],
            data.model_based,
            sorted(pts["run"].unique()),
        )
        regimes = {e["reward"]: e["regime"] for e in decide(sub, target, n_boot, seed)}
        these = [(g, regimes.get(r, UNDETERMINED)) for r, g in full.items()]
        pairs += these
        checks.append(
            {"left_out": {kind: left_out}, "regimes": regimes, "same": sum(a == b != UNDETERMINED for a, b in these)}
        )
    rate, both_undetermined = agreement(pairs)
    why = (
        None
        if rate is not None
        else "one budget and one model: no subset to leave out"
        if not checks
        else "undetermined with and without every subset: no regime to agree on"
    )
    return {"loo_same_regime_rate": rate, "subsets": checks, "both_undetermined": both_undetermined, "why": why}


def same_regime(entries: list[dict], full: Data, target: str, n_boot: int = 100, seed: int = 0) -> dict:
    """The second seed study's same-regime rate: the pilot's call per reward system against the call
    the same analysis makes on full-scale results (`--validate-with`), as `agreement` counts it."""
    calls = {e["reward"]: e["regime"] for e in decide(full, target, n_boot, seed)}
    shared = [e["reward"] for e in entries if e["reward"] in calls]
    rate, both_undetermined = agreement([(e["regime"], calls[e["reward"]]) for e in entries if e["reward"] in calls])
    why = (
        None
        if rate is not None
        else "the full-scale results share no reward system with the pilot"
        if not shared
        else "undetermined in the pilot and at full scale for every reward system: no regime to agree on"
    )
    return {
        "same_regime_rate": rate,
        "full_regimes": calls,
        "rewards_compared": shared,
        "both_undetermined": both_undetermined,
        "why": why,
    }
