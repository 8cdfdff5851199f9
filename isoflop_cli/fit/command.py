"""What `isoflop fit` does between parsing its options and printing: load, fit, write, collect notes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf
from rich.table import Table

from isoflop_cli.config import check_writable
from isoflop_cli.config.schema import TrackingConfig
from isoflop_cli.fit import coverage, data, methods, outputs, report, trend
from isoflop_cli.fit.data import FitSpec
from isoflop_cli.fit.interference import load_problems
from isoflop_cli.tracking import log_fit, sweep_tracker_root


@dataclass
class Fitted:
    answer: list[
        str
    ]  # the question the sweep exists for, its answer, how sure (trend.Trend.lines); empty without the columns
    tables: list[Table]
    written: list[Path]
    warnings: list[str]
    frontier: pd.DataFrame | None  # frontier.csv (`fit --json` prints its rows)


def default_out(path: Path) -> Path:
    """`<sweep>/fit/`, or `fit/` beside a results file."""
    return (path if path.is_dir() else path.parent) / "fit"


def fit(paths: list[Path], spec: FitSpec, asked: list[str], out: Path | None) -> Fitted:
    """Raises ConfigError for anything the user must fix; everything else is a warning in the result."""
    methods.check(spec, asked)
    with data.notes() as notes:  # from reading the inputs on: what is said goes beside the result
        df, info = data.load(paths)
        if spec.compute in df.columns:
            data.numeric_column(df, spec.compute, ", ".join(map(str, paths)))
        out = check_writable(out or default_out(paths[0]))
        problems = load_problems(paths) if any(methods.METHODS[m].reads_problems for m in asked) else None
        results = methods.run(df, spec, asked or methods.defaults(df, spec), explicit=bool(asked), problems=problems)
        cover = coverage.coverage(df, spec)
        answer = _trend(df, spec)
        written, front = outputs.write(df, info, spec, results, out, cover, answer)
    _track(paths[0], out, written)
    return Fitted(answer.lines(spec.axis) if answer else [], tables(results, spec, front, cover), written, notes, front)


def _trend(df: pd.DataFrame, spec: FitSpec) -> trend.Trend | None:
    """The pre-specified answer (trend.n_star_trend) wherever the results have the curves' columns,
    whichever methods were asked for: it is the question, the methods are the description."""
    columns = [spec.metric, spec.axis, spec.compute]
    if not set(columns) <= set(df.columns):
        return None
    rows = data.usable(df, columns, "n_star_trend")
    return trend.n_star_trend(rows[rows[spec.axis] > 0], spec)


def _track(path: Path, out: Path, written: list[Path]) -> None:
    """A sweep with trackers (its sweep.yaml's tracking.backends) gets its fit in a sweep-level
    tracker run beside its runs' (tracking.log_fit)."""
    file = path / "sweep.yaml"
    if not (path.is_dir() and file.is_file()):
        return
    swept = OmegaConf.load(file)
    tracking = OmegaConf.merge(OmegaConf.structured(TrackingConfig), swept.get("tracking") or {})
    if tracking.backends:
        summary = json.loads((out / "fit.json").read_text()) if (out / "fit.json").exists() else {}
        log_fit(tracking, swept.get("name", path.name), summary, written, sweep_tracker_root(tracking, path))


def tables(results: dict, spec: FitSpec, front: pd.DataFrame | None, cover: pd.DataFrame | None) -> list[Table]:
    out = [report.method_table(m, r.entry, spec) for m, r in results.items()]
    if front is not None:
        fitted = results.get("frontier")
        out.append(report.frontier_table(front, spec, fitted.entry["axis_star"] if fitted else None))
    if cover is not None:
        out.append(coverage.rich_table(cover, spec))
    return out
