"""`isoflop fit --method interference`: the first seed study's explanation of why n*(C) rises.

Training on many problems at once, the updates for some problems set others back; a larger n
evens the updates out across problems. Averages hide this, so each eval point of a run also records
every validation problem's correct samples (`problems.parquet` beside the results). From those:

- per run and validation problem, over the run's eval points in a window, whether it regressed:
  from some eval point s to the window's end its pass rate is below what it was over some stretch
  of eval points before s, by a one-sided Fisher exact test on the pooled binomial counts at family
  level ALPHA_PROBLEM (Bonferroni over the (start, s) pairs; the pair tested is the largest drop by
  a two-proportion z). Rose likewise, upwards. Crossing a pass rate of 0.5 between two evals of 8
  samples, the earlier rule, is mostly sampling noise, and noise near 0.5 is most common where a
  run has made least progress: it called "more regressions with larger n" in 20 of 20 simulated
  sweeps where every problem's true pass rate only rises;
- per run, the shares of its problems that regressed and rose, in two windows: up to the largest
  compute every run reaches (equal compute) and up to the largest step every run reaches (equal
  progress: at equal compute a small-n run has taken more steps, and is further along);
- per axis value (n), the mean over its runs, with 90% intervals from a bootstrap over runs within
  each value; the slope of each share against log2 n, with its bootstrap interval; and a
  permutation test of the regression slope, the n labels shuffled among the runs of each B_p (so
  that no B_p is credited to n), two-sided p < ALPHA. `fewer_regressions_with_larger_n` is called
  only when both windows reject with the same sign; null otherwise.

Training problems are not recorded per problem (which ones a run's batches drew, and how it did on
them), so the same figures on training problems seen in batches against unseen ones cannot be read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.store import PROBLEMS

ALPHA_PROBLEM = 0.05  # each problem's test, over all its (start, s) pairs together
ALPHA = 0.10  # the permutation test's level for calling a trend in n
PERMUTATIONS = 2000
SHARES = ("rose", "regressed")
STRATUM = "B_p"  # n labels are permuted among runs of one B_p
PROBLEM_COLUMNS = ("run_id", "problem_id", "step", "correct", "samples")  # what a run writes per problem and eval point


def load_problems(paths: list[Path]) -> pd.DataFrame | None:
    """problems.parquet beside each input (a sweep dir, or a results file's directory), run keys as
    `data.load` makes them; None when no input has one."""
    frames = []
    for i, path in enumerate(paths):
        where = (path if path.is_dir() else path.parent) / PROBLEMS
        if where.exists():
            try:
                df = pd.read_parquet(where)
            except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
                raise ConfigError(
                    f"{where}: cannot read per-problem records ({' '.join(str(e).split())[:200]})"
                ) from None
            missing = [c for c in PROBLEM_COLUMNS if c not in df.columns]
            if missing:
                raise ConfigError(
                    f"{where}: no column {', '.join(missing)} (per-problem records: {', '.join(PROBLEM_COLUMNS)})"
                )
            frames.append(df.assign(**{RUN: f"{i}:" + df["run_id"].astype(str)}))
    return pd.concat(frames, ignore_index=True) if frames else None


def changes(problems: pd.DataFrame) -> pd.DataFrame:
    """Per run and problem over its eval points in `problems` (RUN, problem_id, step, correct,
    samples): `regressed` and `rose` (bools), `p_drop` and `p_rise` (Bonferroni-adjusted), and how
    many eval points it had (`evals`; fewer than 2: not testable, both False)."""
    p = problems.sort_values([RUN, "problem_id", "step"])
    keys = p[[RUN, "problem_id"]].drop_duplicates().reset_index(drop=True)
    group = p.groupby([RUN, "problem_id"], sort=False).ngroup().to_numpy()
    at = p.groupby([RUN, "problem_id"], sort=False).cumcount().to_numpy()
    evals = np.bincount(group)
    T = int(evals.max())
    c, m = np.zeros((len(evals), T)), np.zeros((len(evals), T))
    c[group, at], m[group, at] = p["correct"].to_numpy(float), p["samples"].to_numpy(float)
    cc = np.concatenate([np.zeros((len(evals), 1)), np.cumsum(c, 1)], 1)  # (G, T + 1): counts before each index
    mm = np.concatenate([np.zeros((len(evals), 1)), np.cumsum(m, 1)], 1)
    rows = np.arange(len(evals))
    end_c, end_m = cc[rows, evals][:, None], mm[rows, evals][:, None]
    # Every pair start a < split s < evals: the stretch [a, s) against [s, end).
    a, s = np.triu_indices(T, 1)
    bc, bm = cc[:, s] - cc[:, a], mm[:, s] - mm[:, a]
    ac, am = end_c - cc[:, s], end_m - mm[:, s]
    valid = s[None, :] < evals[:, None]
    pooled = (bc + ac) / np.maximum(bm + am, 1)
    se = np.sqrt(pooled * (1 - pooled) * (1 / np.maximum(bm, 1) + 1 / np.maximum(am, 1)))
    z = np.where(valid & (se > 0), (bc / np.maximum(bm, 1) - ac / np.maximum(am, 1)) / np.where(se > 0, se, 1), 0.0)
    pairs = np.maximum(evals * (evals - 1) / 2, 1)
    out = keys.assign(evals=evals)
    for name, pick, tail in (("drop", z.argmax(1), stats.hypergeom.cdf), ("rise", z.argmin(1), stats.hypergeom.sf)):
        b_c, b_m, a_c, a_m = (v[rows, pick] for v in (bc, bm, ac, am))
        k = a_c if name == "drop" else a_c - 1  # P(after <= observed) for a drop, P(after >= observed) for a rise
        raw = tail(k, (b_m + a_m).astype(int), (b_c + a_c).astype(int), a_m.astype(int))
        out[f"p_{name}"] = np.where(evals >= 2, np.minimum(raw * pairs, 1.0), np.nan)
    out["regressed"] = out["p_drop"] < ALPHA_PROBLEM
    out["rose"] = out["p_rise"] < ALPHA_PROBLEM
    return out


def interference_method(df: pd.DataFrame, spec: FitSpec, problems: pd.DataFrame | None) -> MethodResult:
    if problems is None or problems.empty:
        raise ConfigError(
            "interference: no problems.parquet beside the results (sweeps record it from this isoflop on: "
            "each eval point's per-problem correct samples)"
        )
    extra = [STRATUM] if STRATUM in df.columns and spec.axis != STRATUM else []
    runs = df[[RUN, "step", spec.axis, spec.compute, *extra]].drop_duplicates([RUN, "step"])
    rated = problems.merge(runs, on=[RUN, "step"], how="inner")
    if rated.empty or rated.groupby(RUN)["step"].nunique().max() < 2:
        raise ConfigError("interference: no run has two eval points with per-problem records")
    windows = {}
    for by, column in (("compute", spec.compute), ("steps", "step")):
        upto = float(rated.groupby(RUN)[column].max().min())  # every run reaches it
        windows[by] = _window(rated[rated[column] <= upto * (1 + 1e-9)], spec, extra, upto)
    main, steps = windows["compute"], windows["steps"]
    agree = main["fewer"] is not None and main["fewer"] == steps["fewer"]
    entry = {
        "params": main["params"],
        "median": main["median"],
        "interval90": main["interval90"],
        "converged": True,
        "fewer_regressions_with_larger_n": main["fewer"] if agree else None,
        "trend_p_value": main["p"],
        "compute_upto": main["upto"],
        "per_value": main["per_value"],
        "per_run": main["per_run"],
        "equal_steps": {
            "steps_upto": steps["upto"],
            "params": steps["params"],
            "interval90": steps["interval90"],
            "per_value": steps["per_value"],
            "trend_p_value": steps["p"],
            "fewer_regressions_with_larger_n": steps["fewer"],
        },
        "equal_compute_call": main["fewer"],
        "permuted_within": extra[0] if extra else None,
        "problem_test": {
            "alpha": ALPHA_PROBLEM,
            "test": "one-sided Fisher exact, pooled counts of [a, s) against [s, end), Bonferroni over the pairs",
        },
        "training_problems": "not recorded per problem: seen against unseen cannot be compared",
    }
    if main["fewer"] is not None and not agree:
        warn(
            f"interference: the trend in {spec.axis} at equal compute (p = {main['p']:.2g}) is not there at "
            f"equal steps (p = {steps['p']:.2g}): it may be progress, not {spec.axis}; no trend is called"
        )
    rates = problems.assign(rate=problems["correct"] / problems["samples"]).merge(runs, on=[RUN, "step"], how="inner")
    return MethodResult(entry, {"per_run": main["frame"], "rates": rates})


def _window(rated: pd.DataFrame, spec: FitSpec, extra: list[str], upto: float) -> dict:
    """The shares, their per-value means, slopes and trend test over the eval points in `rated`."""
    per_problem = changes(rated)
    testable = per_problem[per_problem["evals"] >= 2]
    meta = rated.drop_duplicates(RUN).set_index(RUN)
    per_run = (
        testable.groupby(RUN)
        .agg(rose=("rose", "mean"), regressed=("regressed", "mean"), problems=("evals", "size"), evals=("evals", "max"))
        .reset_index()
    )
    per_run["value"] = meta.loc[per_run[RUN], spec.axis].to_numpy(float)
    strata = meta.loc[per_run[RUN], extra[0]].to_numpy() if extra else np.zeros(len(per_run))
    values = sorted(per_run["value"].unique())
    if len(values) < 2:
        warn(f"interference: one {spec.axis} value ({plain(values[0])}): shares are reported, no trend in {spec.axis}")
    labels = per_run["value"].to_numpy(float)
    counts = np.vstack(
        [np.ones((1, len(per_run)), dtype=np.int64), bootstrap.run_weights(spec.bootstrap, labels, spec.seed)]
    )
    x = np.log2(np.asarray(values, float))
    means = {
        s: _weighted_means(per_run[s].to_numpy(float), labels, values, counts) for s in SHARES
    }  # (replicates, values)
    slopes = {s: _slopes(x, means[s]) for s in SHARES}
    names = {s: f"slope_{s}_per_log2_{spec.axis}" for s in SHARES}
    interval90, median = {}, {}
    for s in SHARES:
        ok = slopes[s][1:][np.isfinite(slopes[s][1:])]
        if ok.size >= 10:
            interval90[names[s]] = [float(v) for v in np.quantile(ok, [0.05, 0.95])]
            median[names[s]] = float(np.median(ok))
    p = _permutation_p(per_run["regressed"].to_numpy(float), labels, strata, values, spec.seed)
    slope = float(slopes["regressed"][0])
    fewer = None if p is None or p >= ALPHA or not np.isfinite(slope) else bool(slope < 0)
    per_value = []
    for j, v in enumerate(values):
        row = {spec.axis: plain(v), "runs": int((labels == v).sum())}
        for s in SHARES:
            row[s] = float(means[s][0, j])
            ok = means[s][1:, j][np.isfinite(means[s][1:, j])]
            row[f"{s}_interval90"] = [float(q) for q in np.quantile(ok, [0.05, 0.95])] if ok.size >= 10 else None
        per_value.append(row)
    rows = [
        {
            "run": r[RUN].split(":", 1)[-1],
            spec.axis: plain(r["value"]),
            **{s: float(r[s]) for s in SHARES},
            "problems": int(r["problems"]),
            "evals": int(r["evals"]),
        }
        for _, r in per_run.iterrows()
    ]
    return {
        "upto": upto,
        "params": {names[s]: float(slopes[s][0]) for s in SHARES},
        "median": median,
        "interval90": interval90,
        "per_value": per_value,
        "per_run": rows,
        "p": p,
        "fewer": fewer,
        "frame": per_run,
    }


def _weighted_means(y: np.ndarray, axis: np.ndarray, values: list, counts: np.ndarray) -> np.ndarray:
    """(replicates, values): per replicate the count-weighted mean of y over each value's runs (NaN y left out)."""
    out = np.full((counts.shape[0], len(values)), np.nan)
    ok = np.isfinite(y)
    for j, v in enumerate(values):
        members = (axis == v) & ok
        w = counts[:, members].astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, j] = (w @ y[members]) / w.sum(axis=1)
    return out


def _permutation_p(y: np.ndarray, axis: np.ndarray, strata: np.ndarray, values: list, seed: int) -> float | None:
    """Two-sided permutation p-value of the slope of per-value mean `y` on log2 value, the values
    shuffled among the runs of each stratum (None with fewer than two values or no finite y)."""
    ok = np.isfinite(y)
    y, axis, strata = y[ok], axis[ok], strata[ok]
    if len(values) < 2 or np.unique(axis).size < 2:
        return None
    rng = np.random.default_rng(seed)
    shuffled = np.tile(axis, (PERMUTATIONS, 1))
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        shuffled[:, members] = rng.permuted(shuffled[:, members], axis=1)
    labels = np.vstack([axis[None, :], shuffled])  # (1 + permutations, runs)
    x = np.log2(np.asarray(values, float))
    onehot = labels[:, :, None] == np.asarray(values, float)[None, None, :]  # (perm, runs, values)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (onehot * y[None, :, None]).sum(1) / onehot.sum(1)
    slope = np.abs(_slopes(x, means))
    return float((1 + np.sum(slope[1:] >= slope[0] - 1e-15)) / (1 + PERMUTATIONS))


def _slopes(x: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Per row of `means` (replicates, values), the least-squares slope on x over its finite
    entries (NaN with fewer than two distinct x)."""
    w = np.isfinite(means)
    m = np.where(w, means, 0.0)
    n = w.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        xbar = (w * x).sum(1) / n
        mbar = m.sum(1) / n
        dx = np.where(w, x[None, :] - xbar[:, None], 0.0)
        var = (dx * dx).sum(1)
        out = (dx * (m - mbar[:, None])).sum(1) / var
    return np.where(var > 1e-12, out, np.nan)
