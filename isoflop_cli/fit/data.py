"""Inputs of `isoflop fit`: load and concatenate results, key runs, drop unusable rows loudly.

Problems with the data surface as `ConfigError` (one line, exit 2) when nothing can be fitted, and
as `FitWarning` when a fit goes ahead on less than it was given.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.store import RESULTS, SweepDir, load_results

RUN = "_run"  # the run key: run_id made unique per input, or the row for files without run_id


class FitWarning(UserWarning):
    """A fit went ahead on less than it was given, or a result should be read with care."""


def warn(message: str) -> None:
    warnings.warn(message, FitWarning, stacklevel=2)


@contextlib.contextmanager
def notes() -> Iterator[list[str]]:
    """The FitWarnings raised inside, each once, as messages the CLI prints one a line (not
    Python's `file:line: FitWarning:` form); the libraries' own warnings (numpy's on a degenerate
    fit) are left out: what they mean for the user is a FitWarning's to say."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FitWarning)
        yield found
    found.extend(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, FitWarning)))


@dataclass
class FitSpec:
    metric: str = "val_avg@k"
    axis: str = "n"
    compute: str = "rollouts"
    size_col: str | None = None
    tokens_col: str | None = None
    compute_col: str | None = None
    holdout_frac: float = 0.0
    holdout: int = 0  # largest budgets held out of a law's fit and predicted (holdout.py)
    drop_early: float = 0.0
    bootstrap: int = 200
    seed: int = 0
    points: int = 32  # compute grid of frontier.csv and axis*(C)


@dataclass
class MethodResult:
    """`entry` goes into fit.json under the method's name; `frames` feed plots, tables and CSVs."""

    entry: dict[str, Any]
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)


def input_file(path: Path) -> Path:
    return path / RESULTS if path.is_dir() else path


def read(path: Path) -> pd.DataFrame:
    """One results input (a sweep directory, parquet or CSV), as fit, replay and race-pilot read it:
    a bad path is the user's error, and so are rows that do not name their run, an eval point given
    twice, compute that falls along a run, and a sweep dir's results that are not its manifest's runs
    (`of_sweep`). Columns of lists or dicts are left out (fit reads none); results with eval points
    but no run_id have their runs told apart by their axes and seed (`runs_by_axes`)."""
    if not path.exists():
        raise ConfigError(f"no such file or directory: {path}")
    if path.is_dir() and not (path / RESULTS).exists():
        raise ConfigError(f"{path} has no {RESULTS} (is it a sweep directory with finished runs?)")
    if input_file(path).is_dir():
        raise ConfigError(f"{input_file(path)} is a directory, not a results file (a parquet or CSV)")
    try:
        df = load_results(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read results ({e})") from None
    df = df[[c for c in df.columns if not _holds_containers(df[c])]]  # lists, dicts: nothing fit reads
    if "run_id" not in df.columns and "step" in df.columns:
        df = df.assign(run_id=runs_by_axes(df, path))
    if "run_id" in df.columns:
        named_runs(df, path)
        one_row_per_eval_point(df, path)
        compute_grows(df, path)
    if path.is_dir():
        of_sweep(df, path)
    return df


RUN_AXES = ("model", "reward", "n", "B_p", "algo.epochs", "lr", "seed")  # what tells runs apart without run_id
COMPUTE_COLUMNS = ("rollouts", "flops_total", "tokens_generated")  # spent: never less at a later step


def _holds_containers(column: pd.Series) -> bool:
    return column.dtype == object and column.map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray))).any()


def runs_by_axes(df: pd.DataFrame, path: Path) -> pd.Series:
    """Results with eval points (a `step` column) but no run_id: each run is one combination of the
    RUN_AXES columns they have (said); without n and seed among them runs cannot be told apart, and
    every row would be a run of its own."""
    axes = [c for c in RUN_AXES if c in df.columns]
    if not {"n", "seed"} <= set(axes):
        raise ConfigError(
            f"{path}: no run_id column, and no n and seed to tell its runs apart: name each row's run (run_id)"
        )
    warn(f"{path}: no run_id column: runs are identified by {', '.join(axes)}")
    return df[axes].astype(str).agg(" ".join, axis=1)


def compute_grows(df: pd.DataFrame, path: Path) -> None:
    """Along every run, by step, the compute spent never falls: rows whose compute runs backwards
    would be fitted as another curve."""
    if "step" not in df.columns:
        return
    for column in (c for c in COMPUTE_COLUMNS if c in df.columns):
        spent = pd.to_numeric(df[column], errors="coerce")
        spent = spent.where(spent >= 0)  # a negative one is the sign check's to name (`signs`)
        ordered = df.assign(_spent=spent).sort_values(["run_id", "step"], kind="stable")
        falls = ordered.groupby("run_id", sort=False)["_spent"].diff() < 0
        if falls.any():
            row = ordered[falls].iloc[0]
            raise ConfigError(
                f"{path}: run {row['run_id']} has {column} {plain(row['_spent']):g} at step {row['step']}, "
                f"less than at its step before: a run's compute only grows"
            )


def one_row_per_eval_point(df: pd.DataFrame, path: Path) -> None:
    """Each (run_id, step) once: a row twice counts twice in every fit, bootstrap and regime."""
    if "step" in df.columns and df.duplicated(["run_id", "step"]).any():
        row = df[df.duplicated(["run_id", "step"])].iloc[0]
        raise ConfigError(
            f"{path}: run {row['run_id']} has step {row['step']} twice: "
            "each eval point once (a row twice counts twice in every fit)"
        )


def of_sweep(df: pd.DataFrame, path: Path) -> None:
    """The results.parquet of a sweep dir are its manifest's runs: each run_id a cell of it, with that
    cell's axis values (n, B_p, model, seed ...). Results of another sweep put in its place are
    refused, never fitted under this sweep's name. A dir without a manifest is only a folder of results."""
    sweep = SweepDir(path)
    if not sweep.manifest_file.exists():
        return
    cells = sweep.manifest().cells
    if "run_id" not in df.columns:
        raise ConfigError(
            f"{sweep.results_file}: no run_id column, so its rows cannot be checked against {sweep.manifest_file}"
        )
    for run_id, rows in df.groupby(df["run_id"].astype(str), sort=False):
        cell = cells.get(run_id)
        if cell is None:
            raise ConfigError(
                f"{sweep.results_file}: run {run_id} is not a cell of {sweep.manifest_file}: "
                "these are not this sweep's results (rerun the sweep to collect them again)"
            )
        for column, value in cell.columns.items():
            other = (
                next((v for v in rows[column].unique() if not _same(v, value)), None)
                if column in rows.columns and _scalar(value)
                else None
            )
            if other is not None:
                raise ConfigError(
                    f"{sweep.results_file}: run {run_id} has {column} {other} where its cell in {sweep.manifest_file} "
                    f"has {value}: these are not this sweep's results (rerun the sweep to collect them again)"
                )


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _same(a: Any, b: Any) -> bool:
    """A results value is its cell's: numbers equal as numbers (a parquet column may widen an int)."""
    if isinstance(b, str) or isinstance(a, str):
        return str(a) == str(b)
    return bool(np.isclose(float(a), float(b), rtol=1e-12, atol=0))


def load(paths: list[Path]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Concatenate every input; run keys stay distinct across inputs; sha256 over the input bytes.

    A run given twice (the same run_id in two inputs, or the same file twice) would count twice in
    every fit and bootstrap: it is refused."""
    frames, digest = [], hashlib.sha256()
    seen_runs: dict[str, Path] = {}
    seen_files: dict[str, Path] = {}
    for i, path in enumerate(paths):
        df = read(path)
        content = input_file(path).read_bytes()
        digest.update(content)
        same = seen_files.setdefault(hashlib.sha256(content).hexdigest(), path)
        if same is not path:
            raise ConfigError(f"{path} holds the same results as {same}: give each input once")
        if "run_id" in df.columns:
            for run_id in df["run_id"].astype(str).unique():
                first = seen_runs.setdefault(run_id, path)
                if first is not path:
                    raise ConfigError(f"run {run_id} is in both {first} and {path}: give each run once")
        key = (
            df["run_id"].astype(str)
            if "run_id" in df.columns
            else pd.Series(np.arange(len(df)), index=df.index).astype(str)
        )
        frames.append(df.assign(**{RUN: f"{i}:" + key}))
    df = pd.concat(frames, ignore_index=True)
    if df.empty:
        raise ConfigError(f"{', '.join(map(str, paths))}: no results yet")
    info = {
        "paths": [str(p) for p in paths],
        "sha256": digest.hexdigest(),
        "rows": len(df),
        "runs": int(df[RUN].nunique()),
    }
    return df, info


def named_runs(df: pd.DataFrame, path: Path) -> None:
    """Every row of a results input names its run (a row without one would be a run of its own, or
    all of them one run called 'nan')."""
    if df["run_id"].isna().any():
        raise ConfigError(
            f"{path}: run_id is empty in row {int(np.flatnonzero(df['run_id'].isna())[0])}: every row names its run"
        )


def usable(df: pd.DataFrame, columns: list[str], method: str) -> pd.DataFrame:
    """Rows with a finite number in every column; missing or non-numeric columns are an error."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(
            f"{method}: results have no column {', '.join(missing)} "
            f"(have: {', '.join(c for c in df.columns if c != RUN)})"
        )
    numeric = df[columns].apply(pd.to_numeric, errors="coerce")
    finite = np.isfinite(numeric.to_numpy(float))
    bad = [c for c, any_finite in zip(columns, finite.any(axis=0)) if not any_finite]
    if bad:
        raise ConfigError(f"{method}: column {', '.join(bad)} has no finite numeric values")
    keep = finite.all(axis=1)
    if not keep.all():
        warn(f"{method}: dropped {int((~keep).sum())} of {len(df)} rows with NaN or non-numeric {', '.join(columns)}")
    return df.loc[keep].assign(**{c: numeric.loc[keep, c] for c in columns})


def signs(df: pd.DataFrame, spec: FitSpec, columns: list[str], method: str) -> None:
    """Of the method's columns: the axis is a count or a size (its laws and plots are in log axis):
    positive. Compute is spent: never negative (step 0 spends none)."""
    for column, ok, what in (
        (spec.axis, df[spec.axis] > 0 if spec.axis in columns else None, "positive"),
        (spec.compute, df[spec.compute] >= 0 if spec.compute in columns else None, ">= 0"),
    ):
        if ok is not None and not ok.all():
            row = df[~ok].iloc[0]
            raise ConfigError(
                f"{method}: {column} must be {what}, got {plain(row[column])} in run {str(row[RUN]).split(':', 1)[-1]}"
            )


def one_per_run(df: pd.DataFrame, columns: list[str], method: str) -> None:
    """What a run is (its n, B_p, model size: every column but the metric, compute and step) holds
    one value per run: a run whose n changes between eval points would be split into two curves,
    each part of one run, and the fit's noise and ties would come from the seam."""
    for column in columns:
        counts = df.groupby(RUN)[column].nunique()
        if (counts > 1).any():
            run = counts.index[counts > 1][0]
            values = sorted(df.loc[df[RUN] == run, column].unique())
            raise ConfigError(
                f"{method}: run {str(run).split(':', 1)[-1]} has {column} "
                f"{', '.join(f'{plain(v):g}' for v in values[:3])}{' ...' if len(values) > 3 else ''}: "
                f"a run's {column} is one value (two runs under one run_id?)"
            )


def numbers(df: pd.DataFrame, column: str, where: Path | str) -> pd.Series:
    """`column` as numbers, missing values as NaN: a column that is not there, and a value that is
    not a number or is infinite, are errors naming the column (and the row)."""
    if column not in df.columns:
        raise ConfigError(f"{where}: no column {column} (have: {', '.join(str(c) for c in df.columns if c != RUN)})")
    values = pd.to_numeric(df[column], errors="coerce")
    for bad, what in (
        (values.isna() & df[column].notna(), "not a number"),
        (np.isinf(values.to_numpy(float)), "not finite"),
    ):
        if bad.any():
            row = np.asarray(bad).nonzero()[0][0]
            value = df[column].iloc[row]
            raise ConfigError(
                f"{where}: {column} in row {row} is {what} ({value!r})"
                if isinstance(value, str)
                else f"{where}: {column} in row {row} is {what} ({value})"
            )
    return values


def numeric_column(df: pd.DataFrame, column: str, where: Path | str) -> pd.Series:
    """`column` as numbers (`numbers`); no positive value at all (nothing was spent) is an error
    too, since no compute axis can be drawn from it."""
    values = numbers(df, column, where)
    if not (values > 0).any():
        raise ConfigError(f"{where}: no row has a positive {column}, so there is no compute axis to fit on")
    return values


def compute_unit(column: str) -> str:
    return "rollouts" if column == "rollouts" else "FLOPs" if "flop" in column.lower() else column


def plain(v: float) -> float | int:
    """An axis value as it is written: 8, not 8.0."""
    return int(v) if float(v).is_integer() else float(v)
