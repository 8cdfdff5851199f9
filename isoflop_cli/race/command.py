"""What `isoflop race-pilot` does between parsing its options and printing: check the question
before any compute (`Question.checked`), then either analyse a results file (`from_results`) or
derive and check the pilot (`plan`), which the CLI runs as a sweep, and analyse its results
(`conclude`) into regime.json, race.md, the plot and a summary."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from isoflop_cli import config as config_mod
from isoflop_cli import sweep as sweep_mod
from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import data as fit_data
from isoflop_cli.race import analysis, outputs
from isoflop_cli.race import pilot as pilot_mod
from isoflop_cli.race.recommend import recommend
from isoflop_cli.store import SweepDir

TARGETS = ("native", "downstream", "judge")
NATIVE = "val_native"  # the validation completions scored by the run's own training reward
VERIFIED = "val_avg@k"  # the verified-answer accuracy: downstream without a held-out set


def recorded_columns(cfg) -> list[str]:
    """The metric columns runs of this config record (a pilot's, before it runs)."""
    return [
        "val_avg@k",
        "val_best@k",
        "val_worst@k",
        NATIVE,
        "train_reward_mean",
        *(f"downstream_{name}_{m}" for name in cfg.eval.sets for m in ("pass@1", "best@k")),
        *(f"judge_{name}" for name in cfg.eval.judges),
    ]


def target_metric(target: str, metric: str | None, columns: list[str], where: str) -> str:
    """The target's column: native reads val_native; downstream a held-out set's pass@1
    (eval.sets), else the verified-answer accuracy; judge a judge's mean score (eval.judges)."""
    if target not in TARGETS:
        raise ConfigError(f"--target '{target}' is not one of: {', '.join(TARGETS)}")
    if metric is not None:
        if metric not in columns:
            raise ConfigError(
                f"--metric {metric}: {where} no such column (have: "
                f"{', '.join(c for c in columns if not c.startswith('_'))})"
            )
        return metric
    if target == "native":
        if NATIVE not in columns:
            raise ConfigError(
                f"--target native: {where} no {NATIVE} column (the validation set scored by the training reward, "
                "recorded by runs of this isoflop); name the target with --metric COL"
            )
        return NATIVE
    if target == "downstream":
        found = [c for c in columns if c.startswith("downstream_") and c.endswith("_pass@1")]
        if not found:
            if VERIFIED not in columns:
                raise ConfigError(
                    f"--target downstream: {where} no downstream_*_pass@1 or {VERIFIED} column; name the target with "
                    "--metric COL"
                )
            return VERIFIED
    else:
        found = [c for c in columns if c.startswith("judge_")]
        if not found:
            hint = " (give eval.judges={name: CHECKPOINT})" if where.startswith("pilot") else ""
            raise ConfigError(f"--target judge: {where} no judge_* column{hint}")
    if len(found) > 1:
        raise ConfigError(f"--target {target}: several {target} columns ({', '.join(found)}); pick one with --metric")
    return found[0]


def check_full(full: pd.DataFrame | None, column: str, path: Path | None) -> None:
    """Full-scale results to validate against carry the pilot's target column (numbers) and rho."""
    if full is not None:
        missing = [c for c in (column, "rho", "reward") if c not in full.columns]
        if missing:
            raise ConfigError(
                f"--validate-with {path}: no column {', '.join(missing)} (the pilot's target and rho per reward system)"
            )
        fit_data.numbers(full, column, f"--validate-with {path}")


def target_values(df: pd.DataFrame, column: str, path: Path) -> pd.DataFrame:
    """The results with the target as numbers: one that is not a number or not finite is an error
    naming its row (a missing one, a step without an eval, stays missing)."""
    return df.assign(**{column: fit_data.numbers(df, column, path)})


def read_results(path: Path) -> pd.DataFrame:
    df = fit_data.read(path)
    if df.empty:
        raise ConfigError(f"{path}: no results")
    missing = [c for c in ("run_id", "flops_total") if c not in df.columns]
    if missing:
        raise ConfigError(
            f"{path}: no column {', '.join(missing)} (RACE reads isoflop results: run_id, reward, rho, flops_total, "
            "the target)"
        )
    if "reward" in df.columns and df["reward"].isna().any():  # it would be a reward system named "nan"
        raise ConfigError(
            f"{path}: reward is empty in row {int(np.flatnonzero(df['reward'].isna())[0])}: every row names its run's "
            "reward"
        )
    rho = (
        {"rho": fit_data.numbers(df, "rho", path)} if "rho" in df.columns else {}
    )  # its absence is said with the target's
    if rho:
        # rho = C_learning / C_total: a share strictly inside (0, 1) wherever compute was spent (the log-odds
        # RACE fits).
        outside = rho["rho"].notna() & ~rho["rho"].between(0, 1, inclusive="neither")
        if outside.any():
            row = int(outside.to_numpy().nonzero()[0][0])
            raise ConfigError(
                f"{path}: rho in row {row} is {rho['rho'].iloc[row]:g}; rho = C_learning / C_total lies strictly "
                "between 0 and 1"
            )
        if rho["rho"].isna().all():
            raise ConfigError(
                f"{path}: rho has no value (rho = C_learning / C_total, recorded by each run at its eval points)"
            )
    return df.assign(flops_total=fit_data.numeric_column(df, "flops_total", path), **rho)


def pilot_flops(df: pd.DataFrame) -> float:
    """FLOPs the runs of a results table spent: each run's last ledger value, summed."""
    return float(df.groupby("run_id")["flops_total"].max().sum())


@dataclass(frozen=True)
class Question:
    """What a RACE analysis answers and for which sweep. As the options give it: the target
    (native, downstream or judge) and its column if named (--metric), the bootstrap's draws and
    seed, full-scale results to check the call against (--validate-with), and the sweep (its config
    and overrides) whose full-scale run the recommendation names. `checked` reads the full-scale
    results; the target's column is settled against the columns the results have or the pilot's
    runs will record (`column`); `root` is the pilot's --root as given, which the recommendation's
    commands repeat."""

    target: str
    metric: str | None
    config: str | None
    overrides: list[str]
    bootstrap: int = 200
    seed: int = 0
    validate_with: Path | None = None
    full: pd.DataFrame | None = None
    column: str | None = None
    root: str | None = None

    def checked(self) -> Question:
        """The options checked before anything is read or run; the full-scale results read."""
        if self.bootstrap < analysis.MIN_DRAWS:
            raise ConfigError(
                f"--bootstrap must be >= {analysis.MIN_DRAWS}, got {self.bootstrap}: the regime is called from 90% "
                "bootstrap intervals"
            )
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        return replace(self, full=read_results(self.validate_with) if self.validate_with is not None else None)

    def of_columns(self, columns: list[str], where: str) -> Question:
        """With the target's column among `columns` (`target_metric`), which the full-scale results
        must also carry."""
        column = target_metric(self.target, self.metric, columns, where)
        check_full(self.full, column, self.validate_with)
        return replace(self, column=column)


def from_results(path: Path, question: Question, out: Path | None) -> tuple[dict, list[Path]]:
    """`race-pilot --from-results`: steps 3 to 6 on a results file or sweep dir, no compute; written
    into `out` (default: race/ beside the results)."""
    df = read_results(path)
    question = question.of_columns(list(df.columns), "the results have")
    df = target_values(df, question.column, path)
    base = path if path.is_dir() else path.parent
    dest = config_mod.check_writable(out or base / "race")
    cost = {"pilot_flops": pilot_flops(df), "pilot_share": None}
    return analyse(df, question, cost, dest)


@dataclass(frozen=True)
class PilotOptions:
    """The pilot's design as race-pilot's options give it (--updates as written, read once the
    target is known to be one), and whether a pilot above --cap runs anyway (--force)."""

    updates: str
    budgets: int
    share: float
    cap: float
    force: bool = False

    def spec(self) -> pilot_mod.PilotSpec:
        return pilot_mod.PilotSpec(
            updates=_numbers("--updates", self.updates), budgets=self.budgets, share=self.share, cap=self.cap
        )


@dataclass
class Planned:
    """A pilot ready to run: its question (the target's column settled), the pilot and the design it
    came from, and its sweep dir, checked and holding no other grid (None with --dry-run)."""

    question: Question
    pilot: pilot_mod.Pilot
    spec: pilot_mod.PilotSpec
    sweep_dir: SweepDir | None


def plan(question: Question, options: PilotOptions, root: Path | None, dry_run: bool) -> Planned:
    """Steps 1 and 2: the pilot derived from the sweep's config, its target checked against what its
    runs will record, and (unless `dry_run`) its sweep dir in ROOT/<name>-pilot checked like
    `sweep`'s (ROOT: `root`, else the default)."""
    if question.target not in TARGETS:
        raise ConfigError(f"--target '{question.target}' is not one of: {', '.join(TARGETS)}")
    spec = options.spec()
    pilot = pilot_mod.derive(question.config, question.overrides, spec, options.force)
    question = replace(
        question.of_columns(recorded_columns(pilot.cfg), "pilot runs record"), root=str(root) if root else None
    )
    sweep_dir = None
    if not dry_run:
        sweep_dir = sweep_mod.check(root or sweep_mod.DEFAULT_ROOT, pilot.cfg, pilot.cells)
        sweep_mod.check_same_grid(sweep_dir, pilot.cells, extend=False, hint="")
    return Planned(question, pilot, spec, sweep_dir)


def conclude(planned: Planned, results: pd.DataFrame) -> tuple[dict, list[Path]]:
    """Steps 3 to 6 on the pilot's results, with what it spent against the full sweep's FLOPs
    (predicted with the per-step FLOPs the pilot measured); written into race/ in its sweep dir."""
    sweep_dir, question = planned.sweep_dir, planned.question
    scale = sweep_dir.flops_scale()
    spent = pilot_flops(results)
    full = full_sweep_flops(question.config, question.overrides, scale)
    cost = {
        "pilot_flops": spent,
        "pilot_share": spent / full,
        "full_flops": full,
        "pilot_share_planned": planned.pilot.share,
        "scale": scale,
    }
    return analyse(results, question, cost, sweep_dir.path / "race", planned.pilot.budgets)


def analyse(
    df: pd.DataFrame, question: Question, cost: dict, out: Path, budgets: list[float] | None = None
) -> tuple[dict, list[Path]]:
    """Steps 3 to 6 on a results table: curves, regimes, validation, recommendation; writes into `out`.

    `question` has its column settled. `cost` holds pilot_flops, pilot_share (None for a results
    file), full_flops and the FLOP scale measured on the pilot (for the recommendation's
    prediction). `budgets`: the pilot's (None: read off the results). The full-scale results, where
    given, have their own regimes checked against the pilot's (same_regime_rate; null without them).
    """
    metric, target, n_boot, seed, full = (
        question.column,
        question.target,
        question.bootstrap,
        question.seed,
        question.full,
    )
    data = analysis.collect(df, metric, budgets)
    entries = analysis.decide(data, target, n_boot, seed)
    validation = analysis.validate(data, target, entries, max(n_boot // 2, 50), seed)
    if full is not None:
        validation["full_scale"] = analysis.same_regime(
            entries, analysis.collect(full, metric, None), target, max(n_boot // 2, 50), seed
        )
    report = {
        "regimes": entries,
        "same_regime_rate": validation["full_scale"]["same_regime_rate"] if full is not None else None,
        "loo_same_regime_rate": validation["loo_same_regime_rate"],
        "pilot_flops": cost["pilot_flops"],
        "pilot_share": cost["pilot_share"],
        "full_flops": cost.get("full_flops"),
        "pilot_share_planned": cost.get("pilot_share_planned"),
        "recommendation": recommend(
            entries, data, question.config, question.overrides, cost.get("scale"), question.root
        ),
        "target": target,
        "metric": metric,
        "budgets": data.budgets,
        "runs": len(data.runs),
        "bootstrap": n_boot,
        "seed": seed,
        "validation": validation,
        "note": outputs.CAVEAT,
    }
    return report, outputs.write(report, data, out)


def full_sweep_flops(config: str | None, overrides: list[str], scale: dict[str, float]) -> float:
    """The full sweep's predicted FLOPs, with the per-step bound scaled by what the pilot measured."""
    _, cells = pilot_mod.expand(config, overrides, flops_scale=scale)
    return pilot_mod.total_flops(cells)


def _numbers(option: str, text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option} takes numbers separated by commas, got '{text}'") from None
