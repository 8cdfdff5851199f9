"""The fitting methods by name, the columns each needs, and which run when none is asked for."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit.allocation import fixed_batch_method, frontier_method
from isoflop_cli.fit.data import FitSpec, FitWarning, MethodResult, compute_unit, one_per_run, signs, usable, warn
from isoflop_cli.fit.evidence import TIE_SD
from isoflop_cli.fit.interference import interference_method
from isoflop_cli.fit.parametric import parametric_method
from isoflop_cli.fit.scalerl import scalerl_method
from isoflop_cli.fit.slices import slices_method
from isoflop_cli.fit.surface import surface_method


@dataclass(frozen=True)
class Method:
    """A fitting method with what it reads: the columns its rows need (rows missing one are left
    out, and said), and whether it also reads the per-problem records (problems.parquet)."""

    fit: Callable[..., MethodResult]  # (data, spec) -> result; (data, spec, problems) where it reads problems
    columns: Callable[[FitSpec], list[str]]
    reads_problems: bool = False


def _curves(spec: FitSpec) -> list[str]:
    return [spec.metric, spec.axis, spec.compute]


METHODS: dict[str, Method] = {
    "frontier": Method(frontier_method, _curves),
    "fixed-batch": Method(fixed_batch_method, lambda spec: [spec.metric, spec.compute, "n", "B_p"]),
    "scalerl": Method(scalerl_method, _curves),
    "isoflop-slices": Method(slices_method, _curves),
    "surface": Method(surface_method, _curves),
    "parametric": Method(
        parametric_method, lambda spec: [spec.size_col, spec.tokens_col or spec.compute_col, spec.metric]
    ),
    "interference": Method(interference_method, lambda spec: ["step", spec.axis, spec.compute], reads_problems=True),
}

HOLDOUT = {"frontier", "surface", "scalerl"}  # the methods that make a law to carry to a budget not yet run


def check(spec: FitSpec, methods: list[str]) -> None:
    """Option errors, before any data is read."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method {', '.join(unknown)} (choose from {', '.join(METHODS)})")
    if spec.tokens_col and spec.compute_col:
        raise ConfigError("give --tokens-col or --compute-col, not both")
    if "parametric" in methods and not (spec.size_col and (spec.tokens_col or spec.compute_col)):
        raise ConfigError(
            "parametric needs --size-col (parameters N) and --tokens-col or --compute-col (D = C / (6 N))"
        )
    if spec.holdout < 0:
        raise ConfigError("--holdout must be >= 0")
    if spec.holdout and methods and not set(methods) & HOLDOUT:
        raise ConfigError(f"--holdout predicts from a law: give --method {' or '.join(sorted(HOLDOUT))}")
    if spec.bootstrap < 0:
        raise ConfigError("--bootstrap must be >= 0")
    if spec.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {spec.seed}")
    if not 0 <= spec.holdout_frac < 1 or not 0 <= spec.drop_early < 1:
        raise ConfigError("--holdout-frac and --drop-early must be in [0, 1)")
    if (spec.holdout_frac or spec.drop_early) and "scalerl" not in methods:
        raise ConfigError("--holdout-frac and --drop-early are scalerl's: add --method scalerl")
    if len({spec.metric, spec.axis, spec.compute}) < 3:
        raise ConfigError(
            "--metric, --axis and --compute must name three different "
            f"columns, got {spec.metric}, {spec.axis}, {spec.compute}"
        )


def defaults(df: pd.DataFrame, spec: FitSpec) -> list[str]:
    """What the data supports: frontier for sweep results, parametric when --size-col is given."""
    chosen = ["parametric"] if spec.size_col else []
    if not chosen or set(METHODS["frontier"].columns(spec)) <= set(df.columns):
        chosen.insert(0, "frontier")
    return chosen


def run(
    df: pd.DataFrame, spec: FitSpec, methods: list[str], explicit: bool, problems: pd.DataFrame | None = None
) -> dict[str, MethodResult]:
    """Fit each method on its usable rows (and `problems`, the per-problem records, where it reads
    them). A method that cannot fit is an error when asked for by name, and a warning when it was
    only a default (the empirical frontier still gets written)."""
    results = {}
    for method in methods:
        result, failure = None, None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FitWarning)
            warnings.simplefilter(
                "ignore", RuntimeWarning
            )  # overflow inside trial steps; convergence is reported per fit
            entry = METHODS[method]
            data = usable(df, entry.columns(spec), method)
            signs(data, spec, entry.columns(spec), method)
            one_per_run(
                data,
                [
                    c
                    for c in entry.columns(spec)
                    if c not in (spec.metric, spec.compute, "step", spec.tokens_col, spec.compute_col)
                ],
                method,
            )
            try:
                result = entry.fit(data, spec, problems) if entry.reads_problems else entry.fit(data, spec)
            except ConfigError as e:
                if explicit:
                    raise
                failure = f"{e}; not fitted"
        notes = [str(w.message) for w in caught if issubclass(w.category, FitWarning)] + ([failure] if failure else [])
        serious = bool(notes)  # a curve left out, a fit that did not converge, a method that failed
        if result is not None:
            for message, grave in doubts(method, result.entry, spec):
                notes.append(message)
                serious |= grave
        for message in notes:
            warn(message)
        if result is not None:
            result.entry.update(
                warnings=notes,
                reliable=bool(result.entry.get("converged")) and not serious,
                metric=spec.metric,
                axis=spec.axis,
                compute=spec.compute,
                compute_unit=compute_unit(spec.compute),
                bootstrap_resamples=spec.bootstrap,
                seed=spec.seed,
            )
            results[method] = result
    return results


MIN_AXIS_VALUES = 3  # a law of axis*(C) read from fewer values than this is a step, not a law


def doubts(method: str, entry: dict, spec: FitSpec) -> list[tuple[str, bool]]:
    """What makes a fitted result less than it looks, to say beside it, and whether it makes the
    result unreliable: parameters pinned at their bounds (the data did not place them), parameters
    most bootstrap resamples pin at a bound, 90% intervals of zero width (the resamples all landed
    on one value: a bound or too few runs, not certainty), and an axis*(C) law read from fewer than
    three axis values; and, as notes, curves and frontier values above what was measured by the next
    eval point by more than the noise (extrapolated) and budgets where axis* is a tie. A law's lower plateau
    at the grid's smallest value is a note, not a doubt: axis* is the smallest value tried there."""
    out = []
    pinned = entry.get("at_bound") or []
    if pinned and entry.get("params"):
        edge = method in ("frontier", "fixed-batch") and pinned == ["lower"]
        why = (
            f"{spec.axis}* at the smallest budgets is the grid's "
            f"smallest {spec.axis}; the optimum may lie below the grid"
            if edge
            else "pinned there, not measured" + ("; no saturation is read from the law" if method == "frontier" else "")
        )
        out.append((f"{method}: {', '.join(pinned)} at the fit's bounds: {why}", not edge))
    for name, curve in (entry.get("curves") or {}).items():
        if curve.get("at_bound"):
            out.append((f"{method}: the curve {name} has {', '.join(curve['at_bound'])} at the fit's bounds", False))
        if curve.get("C_mid_beyond_data"):  # scalerl: unreliable where it is the reported curve
            out.append(
                (
                    f"{method}: the curve {name} has its midpoint C_mid beyond its "
                    "largest fitted compute: its ceiling A is extrapolated, not measured",
                    name == entry.get("best"),
                )
            )
        if curve.get("extrapolated"):
            out.append(
                (
                    f"{method}: the curve {name} stands up to {curve['above_measured']:.3f} "
                    "above the best its runs measured by their next eval point (noise sd "
                    f"{entry['noise_sd']:.3g}): extrapolated there, dashed in the plot",
                    False,
                )
            )
    if entry.get("budgets_extrapolated"):
        out.append(
            (
                f"{method}: the frontier is above the best measured by the next eval point by "
                f"more than the noise at {entry['budgets_extrapolated']} of {entry['budgets']} "
                "budgets: extrapolated there (`extrapolated` in axis_star, dashed in the plot)",
                False,
            )
        )
    if entry.get("budgets_tied"):
        out.append(
            (
                f"{method}: {spec.axis}* is tied (curves within {entry['tie_within']:.3g} of the top, "
                f"{TIE_SD:g} sd of the noise) at {entry['budgets_tied']} of {entry['budgets']} budgets: "
                "there it is a set (`axis_star_set`), not one value, and no switch is read from it",
                False,
            )
        )
    shares = (entry.get("bootstrap") or {}).get("at_bound_share") or {}
    most = [
        f"{name} ({share:.0%})"
        for name, share in shares.items()
        if share > 0.5 and name not in pinned and name != "lower"
    ]
    if most:
        out.append(
            (
                f"{method}: most bootstrap resamples pin {', '.join(most)} at the fit's "
                "bounds: its 90% interval runs into a bound, not a measured range",
                True,
            )
        )
    # Zero width to rounding: resamples that all land on one value differ in the last bits, not at all
    # (a parameter pinned at its bound is said above, with why).
    held = (
        entry.get("held") or []
    )  # not fitted (scalerl's R0: the base model's value, the same in every resample of one base)
    flat = [
        name
        for name, (lo, hi) in (entry.get("interval90") or {}).items()
        if math.isclose(lo, hi, rel_tol=1e-9) and name not in pinned and name not in held
    ]
    if flat and spec.bootstrap > 0:
        out.append(
            (
                f"{method}: the 90% interval of {', '.join(flat)} has zero width: the bootstrap "
                "resamples all gave one value, which says the fit is stuck, not that it is certain",
                True,
            )
        )
    if method == "scalerl" and entry.get("best") is None and len(entry.get("best_set") or []) > 1:
        out.append(
            (
                f"{method}: no single best {spec.axis}: the curve highest at {entry['best_at']:.4g} "
                f"does not beat {', '.join(entry['best_set'])} beyond the "
                "noise" + ("" if spec.bootstrap else " (--bootstrap 0: nothing is told apart)"),
                True,
            )
        )
    if method == "frontier" and entry.get("curves") is not None and len(entry["curves"]) < MIN_AXIS_VALUES:
        out.append(
            (
                f"{method}: {spec.axis}*(C) is read from {len(entry['curves'])} {spec.axis} "
                f"value(s) with a fitted curve; a law of it needs at least {MIN_AXIS_VALUES}",
                True,
            )
        )
    return out
