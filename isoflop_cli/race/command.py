"""What `isoflop race-pilot` does around the dispatch: check the target before any compute, then
analyse results (a pilot's or a file's) into regime.json, race.md, the plot and a summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import data as fit_data
from isoflop_cli.race import analysis, outputs
from isoflop_cli.race import pilot as pilot_mod
from isoflop_cli.race.recommend import recommend

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
                f"--metric {metric}: {where} no such column (have: {', '.join(c for c in columns if not c.startswith('_'))})"
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
                    f"--target downstream: {where} no downstream_*_pass@1 or {VERIFIED} column; name the target with --metric COL"
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
            f"{path}: no column {', '.join(missing)} (RACE reads isoflop results: run_id, reward, rho, flops_total, the target)"
        )
    if "reward" in df.columns and df["reward"].isna().any():  # it would be a reward system named "nan"
        raise ConfigError(
            f"{path}: reward is empty in row {int(np.flatnonzero(df['reward'].isna())[0])}: every row names its run's reward"
        )
    rho = (
        {"rho": fit_data.numbers(df, "rho", path)} if "rho" in df.columns else {}
    )  # its absence is said with the target's
    if rho:
        # rho = C_learning / C_total: a share strictly inside (0, 1) wherever compute was spent (the log-odds RACE fits).
        outside = rho["rho"].notna() & ~rho["rho"].between(0, 1, inclusive="neither")
        if outside.any():
            row = int(outside.to_numpy().nonzero()[0][0])
            raise ConfigError(
                f"{path}: rho in row {row} is {rho['rho'].iloc[row]:g}; rho = C_learning / C_total lies strictly between 0 and 1"
            )
        if rho["rho"].isna().all():
            raise ConfigError(
                f"{path}: rho has no value (rho = C_learning / C_total, recorded by each run at its eval points)"
            )
    return df.assign(flops_total=fit_data.numeric_column(df, "flops_total", path), **rho)


def pilot_flops(df: pd.DataFrame) -> float:
    """FLOPs the runs of a results table spent: each run's last ledger value, summed."""
    return float(df.groupby("run_id")["flops_total"].max().sum())


def analyse(
    df: pd.DataFrame,
    target: str,
    metric: str,
    budgets: list[float] | None,
    config: str | None,
    overrides: list[str],
    cost: dict,
    out: Path,
    sweep_out: str | None,
    n_boot: int = 200,
    seed: int = 0,
    full: pd.DataFrame | None = None,
) -> tuple[dict, list[Path]]:
    """Steps 3 to 6 on a results table: curves, regimes, validation, recommendation; writes into `out`.

    `cost` holds pilot_flops, pilot_share (None for a results file), full_flops and the FLOP scale
    measured on the pilot (for the recommendation's prediction). `full`: full-scale results, whose
    own regimes the pilot's are checked against (same_regime_rate; null without them).
    """
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
        "recommendation": recommend(entries, data, config, overrides, cost.get("scale"), sweep_out),
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
