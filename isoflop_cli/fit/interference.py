"""`isoflop fit --method interference`: the first seed study's explanation of why n*(C) rises.

Training on many problems at once, the updates for some problems set others back; a larger n
evens the updates out across problems. Averages hide this, so each eval point of a run also records
every validation problem's correct samples (`problems.parquet` beside the results). From those:

- per run and eval interval (consecutive eval points), the share of problems whose pass rate rose,
  the share whose pass rate fell, and, of the problems solved at the interval's start (pass rate
  >= SOLVED), the share below it at its end (regressed: what training on the others undid);
- per run, the mean of those shares over its intervals up to a common compute (the largest compute
  every run reaches), so runs of different n are compared at equal compute;
- per axis value (n), the mean over its runs, with 90% intervals from a bootstrap over runs within
  each value; and the slope of each share against log2 n (least squares over the per-value means),
  with its bootstrap interval. Whether a larger n means fewer regressions
  (`fewer_regressions_with_larger_n`) is called by a permutation test of that slope (the n labels
  shuffled among runs, two-sided p < ALPHA): with the few runs a sweep has per n, the bootstrap
  interval alone called a trend in 9 of 40 synthetic sweeps where n does not matter; null when
  the test does not reject.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.store import PROBLEMS

SOLVED = 0.5  # a problem counts as solved at an eval point at this pass rate or above
ALPHA = 0.10  # the permutation test's level for calling a trend in n
PERMUTATIONS = 2000
SHARES = ("rose", "fell", "regressed")


def load_problems(paths: list[Path]) -> pd.DataFrame | None:
    """problems.parquet beside each input (a sweep dir, or a results file's directory), run keys as
    `data.load` makes them; None when no input has one."""
    frames = []
    for i, path in enumerate(paths):
        where = (path if path.is_dir() else path.parent) / PROBLEMS
        if where.exists():
            df = pd.read_parquet(where)
            frames.append(df.assign(**{RUN: f"{i}:" + df["run_id"].astype(str)}))
    return pd.concat(frames, ignore_index=True) if frames else None


def intervals(problems: pd.DataFrame) -> pd.DataFrame:
    """Per run and pair of consecutive eval points (keyed by the later step): the shares of problems
    that rose and fell, how many were solved at the start, and the share of those that regressed."""
    p = problems.assign(rate=problems["correct"] / problems["samples"]).sort_values([RUN, "problem_id", "step"])
    p = p.assign(before=p.groupby([RUN, "problem_id"], sort=False)["rate"].shift()).dropna(subset=["before"])
    solved = p["before"] >= SOLVED
    p = p.assign(rose=p["rate"] > p["before"], fell=p["rate"] < p["before"], solved=solved, regressed=solved & (p["rate"] < SOLVED))
    agg = p.groupby([RUN, "step"]).agg(problems=("rate", "size"), rose=("rose", "mean"), fell=("fell", "mean"),
                                       solved_at_start=("solved", "sum"), regressed_count=("regressed", "sum"))
    agg["regressed"] = agg["regressed_count"] / agg["solved_at_start"].where(agg["solved_at_start"] > 0)
    return agg.drop(columns="regressed_count").reset_index()


def interference_method(df: pd.DataFrame, spec: FitSpec, problems: pd.DataFrame | None) -> MethodResult:
    if problems is None or problems.empty:
        raise ConfigError("interference: no problems.parquet beside the results (sweeps record it from this isoflop on: "
                          "each eval point's per-problem correct samples)")
    runs = df[[RUN, "step", spec.axis, spec.compute]].drop_duplicates([RUN, "step"])
    steps = intervals(problems[problems[RUN].isin(runs[RUN])]).merge(runs, on=[RUN, "step"], how="inner")
    if steps.empty:
        raise ConfigError("interference: no run has two eval points with per-problem records")
    common = float(steps.groupby(RUN)[spec.compute].max().min())  # every run reaches it
    upto = steps[steps[spec.compute] <= common * (1 + 1e-9)]
    per_run = upto.groupby(RUN).agg(**{s: (s, "mean") for s in SHARES}, value=(spec.axis, "first"), intervals=("step", "size")).reset_index()
    values = sorted(per_run["value"].unique())
    if len(values) < 2:
        warn(f"interference: one {spec.axis} value ({plain(values[0])}): shares are reported, no trend in {spec.axis}")
    counts = np.vstack([np.ones((1, len(per_run)), dtype=np.int64), bootstrap.run_counts(spec.bootstrap, per_run["value"].to_numpy(), spec.seed)])
    means = {s: _weighted_means(per_run[s].to_numpy(float), per_run["value"].to_numpy(float), values, counts) for s in SHARES}  # (replicates, values)
    x = np.log2(np.asarray(values, float))
    slopes = {s: _slopes(x, means[s]) for s in SHARES}
    params = {f"slope_{s}_per_log2_{spec.axis}": float(slopes[s][0]) for s in SHARES}
    interval90, median = {}, {}
    for s in SHARES:
        draws = slopes[s][1:]
        ok = draws[np.isfinite(draws)]
        if ok.size >= 10:
            interval90[f"slope_{s}_per_log2_{spec.axis}"] = [float(v) for v in np.quantile(ok, [0.05, 0.95])]
            median[f"slope_{s}_per_log2_{spec.axis}"] = float(np.median(ok))
    p_value = _permutation_p(per_run["regressed"].to_numpy(float), per_run["value"].to_numpy(float), values, spec.seed)
    slope = params[f"slope_regressed_per_log2_{spec.axis}"]
    fewer = None if p_value is None or p_value >= ALPHA or not np.isfinite(slope) else bool(slope < 0)
    per_value = []
    for j, v in enumerate(values):
        row = {spec.axis: plain(v), "runs": int((per_run["value"] == v).sum())}
        for s in SHARES:
            row[s] = float(means[s][0, j])
            ok = means[s][1:, j][np.isfinite(means[s][1:, j])]
            row[f"{s}_interval90"] = [float(q) for q in np.quantile(ok, [0.05, 0.95])] if ok.size >= 10 else None
        per_value.append(row)
    entry = {
        "params": params, "median": median, "interval90": interval90, "converged": True,
        "per_value": per_value, "fewer_regressions_with_larger_n": fewer, "trend_p_value": p_value, "compute_upto": common, "solved_at": SOLVED,
        "per_run": [{"run": r[RUN].split(":", 1)[1], spec.axis: plain(r["value"]), **{s: _num(r[s]) for s in SHARES}, "intervals": int(r["intervals"])}
                    for _, r in per_run.iterrows()],
    }
    rates = problems.assign(rate=problems["correct"] / problems["samples"]).merge(runs, on=[RUN, "step"], how="inner")
    return MethodResult(entry, {"per_run": per_run, "rates": rates})


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


def _permutation_p(y: np.ndarray, axis: np.ndarray, values: list, seed: int) -> float | None:
    """Two-sided permutation p-value of the slope of per-value mean `y` on log2 value, the values
    shuffled among runs (None with fewer than two values or no finite y)."""
    ok = np.isfinite(y)
    y, axis = y[ok], axis[ok]
    if len(values) < 2 or np.unique(axis).size < 2:
        return None
    x = np.log2(np.asarray(values, float))
    one = lambda labels: _slopes(x, _weighted_means(y, labels, values, np.ones((1, y.size))))[0]  # noqa: E731
    observed = abs(one(axis))
    rng = np.random.default_rng(seed)
    shuffled = np.array([abs(one(rng.permutation(axis))) for _ in range(PERMUTATIONS)])
    return float((1 + np.sum(shuffled >= observed - 1e-15)) / (1 + PERMUTATIONS))


def _slopes(x: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Per replicate, the least-squares slope of the per-value means on x (NaN with < 2 finite values)."""
    out = np.full(means.shape[0], np.nan)
    for b, m in enumerate(means):
        ok = np.isfinite(m)
        if ok.sum() >= 2 and np.unique(x[ok]).size >= 2:
            out[b] = np.polyfit(x[ok], m[ok], 1)[0]
    return out


def _num(v: float) -> float | None:
    return None if not np.isfinite(v) else float(v)
