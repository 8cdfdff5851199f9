"""RACE analysis: the regime a pilot grid shows, and how much to trust it.

Each run is read at a few FLOP budgets (linear in log compute between its eval points), giving one
point (x = log2 rho, y = target) per run, budget and model (a *slice*). Per reward system, three
local response curves of y against x are fitted in every slice (constant, log-linear, quadratic),
and the curve is chosen by pooled leave-one-out error with the one-standard-error rule: a richer
curve is kept only when it beats the simpler one by more than the noise of the LOO errors. The
effect is the fitted change of the target from the lowest to the highest rho of the pilot, averaged
over slices, with a 90% interval from a bootstrap over runs. A regime is named only when both say
so: the constant curve is beaten and the interval excludes 0. Otherwise it is `undetermined`.

`interior` comes first: where the quadratic is chosen, the slice-averaged curve's peak (its vertex)
is the optimum rho, and each bootstrap replicate gives one (a replicate whose curve peaks at an end
of the range counts as that end). When the 90% interval of the optimum lies strictly inside the
pilot's rho range, the target peaks there: the regime is `interior`, with `optimum_rho` and its
interval. A monotone target has no optimum (null).

Reward-heavy is the same test between reward systems: at equal compute (the same slice), does a
model-based reward (one that spends reward FLOPs: a learned PRM) beat the best rule-based one?
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.rewards import REWARDS

CURVES = {"constant": 0, "log-linear": 1, "quadratic": 2}  # polynomial degree in x = log2 rho
SEARCH, UPDATE, REWARD, UNDETERMINED = "search-heavy", "update-heavy", "reward-heavy", "undetermined"
INTERIOR = "interior"  # the target peaks inside the pilot's rho range (the second seed study's finding)
LEVEL_COLUMNS = ("algo.epochs", "algo.minibatches")  # the pilot's allocation levels, where results name them
REACH = 1.5  # a run is read at a budget up to this factor beyond its first or last eval point


@dataclass
class Data:
    """The points of the analysis and what they came from."""

    points: pd.DataFrame  # run, reward, model, budget, slice, level, epochs, rho, x, y
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


def read_at(run: pd.DataFrame, budget: float, metric: str) -> tuple[float, float] | None:
    """(target, rho) of one run at `budget` FLOPs: linear in log compute between the eval points that
    bracket it, or the nearest eval point within a factor REACH; None when the run does not get there."""
    rows = run[(run["flops_total"] > 0)].dropna(subset=[metric, "rho"]).sort_values("flops_total")
    if rows.empty:
        return None
    log_c = np.log(rows["flops_total"].to_numpy(float))
    target = np.log(budget)
    if not log_c[0] - np.log(REACH) <= target <= log_c[-1] + np.log(REACH):
        return None
    y = float(np.interp(target, log_c, rows[metric].to_numpy(float)))
    rho = float(np.interp(target, log_c, rows["rho"].to_numpy(float)))
    return y, rho


def model_based_rewards(df: pd.DataFrame) -> list[str]:
    """Reward systems that spend model FLOPs on feedback: flops_reward > 0, or without that column
    those the reward registry calls model-based."""
    if "flops_reward" in df.columns:
        spent = df.groupby("reward")["flops_reward"].max()
        return sorted(str(r) for r, f in spent.items() if f > 0)
    return sorted(str(r) for r in df["reward"].unique() if str(r) in REWARDS and REWARDS[str(r)].model_based)


def level_of(df: pd.DataFrame) -> pd.Series:
    """A label per row of its allocation level, from the level columns the results have (else none)."""
    cols = [c for c in LEVEL_COLUMNS if c in df.columns]
    if not cols:
        return pd.Series("", index=df.index)
    return df[cols].astype(str).agg("x".join, axis=1)


def collect(df: pd.DataFrame, metric: str, budgets: list[float] | None, count: int = 3) -> Data:
    """One point per run and slice (budget, and model where results have several)."""
    needed = ["run_id", "reward", "rho", "flops_total", metric]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ConfigError(f"results have no column {', '.join(missing)} (RACE needs run_id, reward, rho, flops_total and the target)")
    df = df.assign(**{c: pd.to_numeric(df[c], errors="coerce") for c in ("rho", "flops_total", metric)})
    if df[metric].notna().sum() == 0:
        raise ConfigError(f"results column {metric} has no numeric values")
    budgets = sorted(budgets) if budgets else infer_budgets(df, count)
    models = df["model"].astype(str) if "model" in df.columns else pd.Series("", index=df.index)
    epochs = pd.to_numeric(df["algo.epochs"], errors="coerce") if "algo.epochs" in df.columns else pd.Series(np.nan, index=df.index)
    df = df.assign(_model=models, _level=level_of(df), _epochs=epochs)
    several_models = df["_model"].nunique() > 1
    rows = []
    for run_id, run in df.groupby("run_id", sort=True):
        first = run.iloc[0]
        for budget in budgets:
            got = read_at(run, budget, metric)
            if got is None or not got[1] > 0:
                continue
            y, rho = got
            label = f"{budget:.3g}" + (f" {first['_model']}" if several_models else "")
            rows.append({"run": str(run_id), "reward": str(first["reward"]), "model": first["_model"], "budget": budget,
                         "slice": label, "level": first["_level"], "epochs": first["_epochs"], "rho": rho, "x": float(np.log2(rho)), "y": y})
    points = pd.DataFrame(rows, columns=["run", "reward", "model", "budget", "slice", "level", "epochs", "rho", "x", "y"])
    if points.empty:
        raise ConfigError(f"no run reaches the budgets {', '.join(f'{b:.3g}' for b in budgets)} FLOPs with a value of {metric}")
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
    chosen = next(n for n in errors if n in table and table[n]["loo_mse"] - table[best]["loo_mse"] <= table[n]["se_vs_best"])
    return chosen, table


@dataclass
class Slices:
    """The points of one reward system grouped by slice, as arrays."""

    names: list[str]
    x: list[np.ndarray]
    y: list[np.ndarray]
    run: list[np.ndarray]  # indices into Data.runs

    @classmethod
    def of(cls, pts: pd.DataFrame, runs: list[str]) -> Slices:
        index = {r: i for i, r in enumerate(runs)}
        groups = [g for _, g in pts.groupby("slice", sort=False)]
        return cls([g["slice"].iloc[0] for g in groups], [g["x"].to_numpy(float) for g in groups], [g["y"].to_numpy(float) for g in groups],
                   [g["run"].map(index).to_numpy() for g in groups])


def trend_effect(s: Slices, degree: int, counts: np.ndarray) -> np.ndarray:
    """Per replicate, the fitted change of y from the lowest to the highest rho, averaged over slices."""
    per_slice = []
    for x, y, run in zip(s.x, s.y, s.run):
        coef = fit_weighted(x, y, counts[:, run].astype(float), max(degree, 1))
        per_slice.append(predict(coef, x.max()) - predict(coef, x.min()))
    return np.mean(per_slice, axis=0)


def interval(draws: np.ndarray) -> list[float] | None:
    ok = draws[np.isfinite(draws)]
    return [float(v) for v in np.quantile(ok, [0.05, 0.95])] if ok.size >= 10 else None


def trend(s: Slices, counts: np.ndarray) -> dict:
    """Curve choice, effect, interval and the rho regime of one reward system."""
    usable = [i for i, x in enumerate(s.x) if np.unique(x).size >= 3]
    if not usable:
        return {"regime": UNDETERMINED, "curve": "constant", "effect": None, "interval90": None,
                "why": "needs at least 3 runs at 2 or more rho levels in a budget"}
    s = Slices([s.names[i] for i in usable], [s.x[i] for i in usable], [s.y[i] for i in usable], [s.run[i] for i in usable])
    errors = {name: np.concatenate([loo_errors(x, y, d) for x, y in zip(s.x, s.y)]) for name, d in CURVES.items()}
    curve, loo = one_se_choice(errors)
    degree = CURVES[curve]
    ones = np.ones((1, counts.shape[1]))
    effect = float(trend_effect(s, degree, ones)[0])
    band = interval(trend_effect(s, degree, counts))
    regime = UNDETERMINED
    if curve != "constant" and band is not None:
        regime = UPDATE if band[0] > 0 else SEARCH if band[1] < 0 else UNDETERMINED
    optimum, optimum_band = (optimum_rho(s, counts) if degree == 2 else (None, None))
    if optimum_band is not None and optimum_band[0] > min(x.min() for x in s.x) and optimum_band[1] < max(x.max() for x in s.x):
        regime = INTERIOR
    params = {}
    for name, x, y, run in zip(s.names, s.x, s.y, s.run):
        coef = fit_weighted(x, y, np.ones((1, x.size)), degree)[0]
        params[name] = {"coef": [float(c) for c in coef], "rho_range": [float(2 ** x.min()), float(2 ** x.max())], "points": int(x.size)}
        if degree == 2 and coef[2] < 0 and x.min() < -coef[1] / (2 * coef[2]) < x.max():
            params[name]["optimum_rho"] = float(2 ** (-coef[1] / (2 * coef[2])))
    why = {UNDETERMINED: "the constant curve is not beaten by more than the noise" if curve == "constant"
           else "the effect's 90% interval covers 0" if band is not None else "too few runs for a bootstrap interval",
           UPDATE: "the target rises toward higher rho", SEARCH: "the target rises toward lower rho (more rollouts)",
           INTERIOR: "the target peaks inside the rho range (the optimum's 90% interval excludes both ends)"}[regime]
    rho = lambda v: float(2**v)  # noqa: E731
    return {"regime": regime, "curve": curve, "effect": effect, "interval90": band, "loo": loo, "params": params, "why": why,
            "optimum_rho": rho(optimum) if optimum is not None else None,
            "optimum_interval90": [rho(v) for v in optimum_band] if optimum is not None and optimum_band is not None else None}


def optimum_rho(s: Slices, counts: np.ndarray) -> tuple[float | None, list[float] | None]:
    """log2 of the rho where the slice-averaged quadratic peaks, on the data (None where it does not
    peak inside the range every slice covers) and its 90% bootstrap interval (a replicate peaking at
    or beyond an end counts as that end; None with too few replicates)."""
    low, high = max(x.min() for x in s.x), min(x.max() for x in s.x)
    if not low < high:
        return None, None

    def vertices(weights: np.ndarray) -> np.ndarray:
        coef = np.mean([fit_weighted(x, y, weights[:, run].astype(float), 2) for x, y, run in zip(s.x, s.y, s.run)], axis=0)  # (B, 3)
        with np.errstate(divide="ignore", invalid="ignore"):
            vertex = -coef[:, 1] / (2 * coef[:, 2])
        peak_inside = (coef[:, 2] < 0) & (vertex > low) & (vertex < high)
        # Otherwise the curve's highest point in the range is an end: the one where it is higher.
        value = lambda v: coef[:, 0] + coef[:, 1] * v + coef[:, 2] * v * v  # noqa: E731
        at_end = np.where(value(high) >= value(low), high, low)
        return np.where(np.isnan(coef[:, 2]), np.nan, np.where(peak_inside, vertex, at_end))

    data = vertices(np.ones((1, counts.shape[1])))[0]
    inside = low < data < high
    band = interval(vertices(counts))
    return (float(data) if inside else None), band


# ---------------------------------------------------------------------------------------------
# Reward systems against each other


def reward_gap(data: Data, model: str, counts: np.ndarray) -> dict | None:
    """Does `model` (a model-based reward) beat the best rule-based reward at equal compute?

    Per slice, its mean target minus the best rule-based mean; averaged over the slices where both
    have runs. The noise check is LOO: per-reward means against one mean per slice.
    """
    pts = data.points
    rule = sorted(set(pts["reward"]) - set(data.model_based))
    if not rule:
        return None
    index = {r: i for i, r in enumerate(data.runs)}
    slices = [g for _, g in pts[pts["reward"].isin([model, *rule])].groupby("slice", sort=False)
              if (g["reward"] == model).sum() >= 2 and g["reward"].isin(rule).sum() >= 2]
    if not slices:
        return None
    gaps, pooled, split = [], [], []
    for g in slices:
        w = counts[:, g["run"].map(index).to_numpy()].astype(float)
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


def replicate_counts(data: Data, n_boot: int, seed: int) -> np.ndarray:
    """(1 + n_boot, runs): the data itself, then bootstrap resamples of whole runs within each reward
    system. Not within allocation levels: with the two or three runs a pilot has per level, that
    would understate the spread; a replicate that loses a level is fitted on the levels it has."""
    by_run = data.points.drop_duplicates("run").set_index("run").loc[data.runs]
    return np.vstack([np.ones((1, len(data.runs)), dtype=np.int64), bootstrap.run_counts(n_boot, by_run["reward"].to_numpy(), seed)])


def decide(data: Data, target: str, n_boot: int = 200, seed: int = 0) -> list[dict]:
    """One entry per reward system: its regime and the evidence for it."""
    counts = replicate_counts(data, n_boot, seed)
    boot = counts[1:]
    entries = []
    for reward, pts in data.points.groupby("reward", sort=True):
        t = trend(Slices.of(pts, data.runs), boot)
        gap = reward_gap(data, reward, counts) if reward in data.model_based else None
        entry = {"reward": reward, "target": target, "metric": data.metric,
                 **{k: t[k] for k in ("regime", "curve", "effect", "interval90")}, "optimum_rho": t.get("optimum_rho"),
                 "optimum_interval90": t.get("optimum_interval90"),
                 "basis": "rho", "why": t["why"], "rho_regime": t["regime"], "loo": t.get("loo"), "params": t.get("params"),
                 "model_based": reward in data.model_based, "runs": int(pts["run"].nunique())}
        if gap is not None:
            entry["reward_gap"] = gap
            if gap["beats_rule_based"]:
                entry.update(regime=REWARD, effect=gap["effect"], interval90=gap["interval90"], basis="reward",
                             why=f"beats the best rule-based reward ({', '.join(gap['against'])}) at equal compute")
        entries.append(entry)
    return entries


def validate(data: Data, target: str, entries: list[dict], n_boot: int = 100, seed: int = 0) -> dict:
    """The same decision from subsets: leave one budget out (and one model out, with several models).

    Returns the leave-one-out same-regime rate over every (subset, reward system) pair, and each
    subset's regimes: how stable the pilot's call is within the pilot, not whether it holds at full
    scale (that is `same_regime` against full-scale results).
    """
    full = {e["reward"]: e["regime"] for e in entries}
    subsets = [("budget", b, data.points["budget"] != b) for b in data.budgets] if len(data.budgets) > 1 else []
    if data.points["model"].nunique() > 1:
        subsets += [("model", m, data.points["model"] != m) for m in sorted(data.points["model"].unique())]
    checks = []
    for kind, left_out, keep in subsets:
        pts = data.points[keep]
        sub = Data(pts, data.metric, [b for b in data.budgets if kind != "budget" or b != left_out], data.model_based, sorted(pts["run"].unique()))
        regimes = {e["reward"]: e["regime"] for e in decide(sub, target, n_boot, seed)}
        checks.append({"left_out": {kind: left_out}, "regimes": regimes, "same": sum(regimes.get(r) == g for r, g in full.items())})
    total = len(checks) * len(full)
    rate = sum(c["same"] for c in checks) / total if total else None
    why = None if checks else "one budget and one model: no subset to leave out"
    return {"loo_same_regime_rate": rate, "subsets": checks, "why": why}


def same_regime(entries: list[dict], full: Data, target: str, n_boot: int = 100, seed: int = 0) -> dict:
    """The second seed study's same-regime rate: the pilot's call per reward system against the call
    the same analysis makes on full-scale results (`--validate-with`)."""
    calls = {e["reward"]: e["regime"] for e in decide(full, target, n_boot, seed)}
    shared = [e["reward"] for e in entries if e["reward"] in calls]
    rate = sum(calls[r] == next(e["regime"] for e in entries if e["reward"] == r) for r in shared) / len(shared) if shared else None
    return {"same_regime_rate": rate, "full_regimes": calls, "rewards_compared": shared,
            "why": None if shared else "the full-scale results share no reward system with the pilot"}
