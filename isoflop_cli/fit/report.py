"""Fit results for people: rich tables for the terminal and report.md with the plots embedded."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from rich.table import Table

from isoflop_cli.fit.data import FitSpec
from isoflop_cli.fit.evidence import label
from isoflop_cli.fit.interference import ALPHA

FORMS = {
    "frontier": "log2({axis}*) = lower + (upper - lower) / (1 + exp(-slope * (log10 C - midpoint)))",
    "fixed-batch": (
        "per batch size B: log2({axis}*) = lower + (upper - lower) / (1 + exp(-slope * (log10 C - midpoint)))"
    ),
    "scalerl": "R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)",
    "isoflop-slices": "{axis}* = coef * C^exponent",
    "parametric": "L(N, D) = E + A / N^alpha + B / D^beta",
    "surface": (
        "y = upper - (upper - lower) exp(-(C_eff / C0)^a), log10 C_eff = log10 C - sum over axes k (log2 x - b0 - "
        "b1 (log10 C - log10 C_ref))^2; {axis}*(C) = 2^(b0 + b1 (log10 C - log10 C_ref)); family per-axis: "
        "upper + upper_slope_{axis} (log2 {axis} - log2 {axis}_ref) in place of upper, {axis}*(C) searched"
    ),
    "interference": (
        "per run: shares of problems whose pass rate rose / regressed by a binomial "
        "test, at equal compute and at equal steps; slopes against log2 {axis}"
    ),
}


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def param_rows(entry: dict) -> list[tuple[str, str, str, str]]:
    """(name, estimate, bootstrap median, 90% interval) for every parameter of an entry."""
    rows = []
    for name, value in entry["params"].items():
        lo_hi = entry["interval90"].get(name)
        rows.append(
            (
                name,
                fmt(value),
                fmt(entry.get("median", {}).get(name)),
                f"[{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]" if lo_hi else "-",
            )
        )
    return rows


def extra_rows(method: str, entry: dict) -> list[tuple[str, str, str, str]]:
    if method == "parametric":
        ex = entry["exponents"]
        return [
            (f"{k} (N_opt ~ C^a, D_opt ~ C^b)" if k == "a" else k, fmt(v), "-", _interval(ex["interval90"].get(k)))
            for k, v in ex["params"].items()
        ]
    if method == "interference":
        axis = entry["axis"]
        return [
            (f"{axis}={fmt(v[axis])}: {s}{where}", fmt(v[s]), "-", _interval(v[f"{s}_interval90"]))
            for where, rows in (
                (" (equal compute)", entry["per_value"]),
                (" (equal steps)", entry["equal_steps"]["per_value"]),
            )
            for v in rows
            for s in ("rose", "regressed")
        ]
    if method == "isoflop-slices" and entry["sigmoid"]:
        s = entry["sigmoid"]
        return [
            (f"sigmoid {k}", fmt(v), fmt(s["median"].get(k)), _interval(s["interval90"].get(k)))
            for k, v in s["params"].items()
        ]
    return []


def _outside(row: dict, col: str) -> str:
    """A surface optimum past the values run, said beside it: the fit's curve read where no cell ran."""
    return " (outside the values run)" if row.get(col + "_within_grid") is False else ""


def _interval(lo_hi: list[float] | None) -> str:
    return f"[{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]" if lo_hi else "-"


def summary(method: str, entry: dict, spec: FitSpec) -> str:
    """Convergence and what to take away, in one line."""
    parts = ["converged" if entry["converged"] else "NOT converged"]
    if not entry.get("reliable", True):
        parts.append(f"NOT reliable: {len(entry.get('warnings', []))} warning(s)")
    if entry.get("note"):
        parts.append(entry["note"])
    if method == "frontier" and entry.get("saturation") and not set(entry.get("at_bound") or []) - {"lower"}:
        sat = entry["saturation"]
        where = (
            f"saturates at {spec.axis}* ~ {sat['axis_star']:.3g} from C ~ {sat['compute']:.3g}"
            if sat["within_data"]
            else "does not saturate within the data"
        )
        parts.append(where)
    if method == "frontier":
        parts.append(evidence_line(entry, spec))
    if entry.get("noise"):
        parts.append(f"noise model: {entry['noise']['summary']}")
    if method == "scalerl":
        at = f"{entry['best_at']:.4g} {spec.compute}"
        parts.append(
            f"curve of {entry['best']} (the highest at {at}, beyond the noise)"
            if entry["best"]
            else (
                f"no single best: {', '.join(entry['best_set'])} tied at {at} (the highest fitted value "
                "there is not above theirs at one-sided 5%, Bonferroni over the others)"
            )
        )
    if method == "isoflop-slices":
        parts.append(f"preferred law: {entry['preferred']}")
    if method == "surface":
        parts.append(
            f"{spec.axis}*(C) "
            + ("determined" if entry["axis_star_determined"] else "NOT determined")
            + f" (log10 C_ref {entry['log10_C_ref']:.3g}; residual sd {entry['noise_sd']:.3g})"
        )
        parts.append(_family(entry, spec))
    if entry.get("holdout"):
        h = entry["holdout"]
        parts.append(
            f"fitted below the {h['k']} largest budgets, the worst held-out "
            f"error is {fmt(h['max_abs_axis_star_log2_error'])} in log2 "
            f"{spec.axis}* and {fmt(h['max_abs_value_error'])} in value"
            + (f" (the {h['family']} family, chosen by the {h['chosen_by']})" if h.get("chosen_by") else "")
        )
    if method == "parametric":
        parts.append(f"Huber objective {entry['objective']:.6g} over {entry['rows']} rows")
    if method == "interference":
        fewer = entry["fewer_regressions_with_larger_n"]
        p = [entry["trend_p_value"], entry["equal_steps"]["trend_p_value"]]
        parts.append(
            (
                "a larger " + spec.axis + " means fewer regressions"
                if fewer
                else "a larger " + spec.axis + " means more regressions"
                if fewer is False
                else f"no trend of regressions in {spec.axis}"
            )
            + (
                f" (permutation p = {p[0]:.2g} up to {spec.compute} {entry['compute_upto']:.4g}, {p[1]:.2g} up to step "
                f"{entry['equal_steps']['steps_upto']:.4g}; called only when both are below {ALPHA:g} with one sign)"
                if None not in p
                else f" (one {spec.axis} value)"
            )
        )
    return "; ".join(parts)


def _family(entry: dict, spec: FitSpec) -> str:
    """The surface's family and what chose it: the held-out n* errors, or the BIC difference."""
    c, ceiling = (
        entry["family_choice"],
        ("a ceiling per " + spec.axis if entry["family"] == "per-axis" else "a shared ceiling"),
    )
    if c["by"] == "holdout":
        errors = " against ".join(f"{f} {fmt(s['mean_abs_axis_star_log2_error'])}" for f, s in c["scores"].items())
        return f"{ceiling}, chosen by the held-out {spec.axis}* error (mean |log2|: {errors})"
    ahead = c["scores"]["shared"]["bic"] - c["scores"]["per-axis"]["bic"]
    return (
        f"{ceiling}, chosen by BIC (per-axis ahead by {ahead:.3g}, "
        f"needed {c['margin']:g}; design effect {c['design_effect']:.3g})"
    )


def evidence_line(entry: dict, spec: FitSpec) -> str:
    """The noise the frontier was read at, the budgets where axis* is a tie and where the frontier is extrapolated."""
    top = entry["axis_star"][-1]
    line = (
        f"noise sd {entry['noise_sd']:.3g}: {spec.axis}* tied (within {entry['tie_within']:.3g} "
        f"of the top) at {entry['budgets_tied']} of {entry['budgets']} budgets"
        + (f", at the largest {spec.axis}* = {label(top['axis_star_set'])}" if len(top["axis_star_set"]) > 1 else "")
    )
    if entry["budgets_extrapolated"]:
        line += (
            "; the frontier is EXTRAPOLATED (above the best measured by the next eval "
            f"point by more than the noise) at {entry['budgets_extrapolated']} budgets"
        )
    return line


def _note(row: dict) -> str:
    """A frontier budget's caveat: its value above what was measured by the next eval point by more than the noise."""
    return (
        f"extrapolated (+{row['value'] - row['measured_next']:.3f} over measured by the next eval point)"
        if row["extrapolated"]
        else "-"
    )


def method_table(method: str, entry: dict, spec: FitSpec) -> Table:
    caption = f"{FORMS[method].format(axis=spec.axis)}; {summary(method, entry, spec)}"
    table = Table(title=f"{method}: estimate, bootstrap median and 90% interval", caption=caption)
    for col in ("parameter", "estimate", "median", "90% interval"):
        table.add_column(col, justify="left" if col == "parameter" else "right", overflow="fold")
    for row in param_rows(entry) + extra_rows(method, entry):
        table.add_row(*row)
    return table


def _at(compute: float) -> float:
    """A frontier grid point as a key: frontier.csv and the axis* rows hold the same log grid, each
    computed on its own, so equal to the ulp only in relative terms (a compute of 1e80 is as
    much the same point as one of 1e3)."""
    return round(math.log10(compute), 9)


def frontier_table(front: pd.DataFrame, spec: FitSpec, axis_star: list[dict] | None) -> Table:
    """frontier.csv, and where the frontier was fitted: the best measured at or below C, axis*(C) as the
    set within the noise of the top (a tie is written as one), its bootstrap 90% band, and whether
    the value is extrapolated."""
    band = {_at(r["compute"]): r for r in axis_star or []}
    table = Table(
        title=(
            f"frontier ({'fitted' if axis_star else 'empirical'}): best "
            f"{spec.metric} with {spec.compute} <= C, and {spec.axis}*(C)"
        )
    )
    for col in (spec.compute, spec.metric, "measured", f"{spec.axis}*", f"{spec.axis}* 90%", "note"):
        table.add_column(col, justify="left" if col == "note" else "right", overflow="fold")
    shown = front.iloc[sorted({*range(0, len(front), max(1, len(front) // 12)), len(front) - 1})]
    for r in shown.itertuples():
        b = band.get(_at(r.compute))
        table.add_row(
            f"{r.compute:,.4g}",
            f"{r.value:.3f}",
            f"{b['measured']:.3f}" if b else "-",
            label(b["axis_star_set"]) if b else fmt(r.axis_star),
            _interval([b["low"], b["high"]]) if b and "low" in b else "-",
            _note(b) if b else "-",
        )
    return table


def markdown(
    results: dict[str, dict],
    spec: FitSpec,
    info: dict,
    plots: dict[str, list[str]],
    front: pd.DataFrame | None,
    readings: list[str] = (),
    answer: list[str] = (),
) -> str:
    """report.md: the sweep's question, its answer and how sure (`answer`, the trend test's three
    lines, first), inputs, then per method its form, table, plots and notes, then the readings that
    are no fit (coverage), then frontier.csv."""
    lines = [
        *answer,
        "",
        "# isoflop fit",
        "",
        f"Inputs: {', '.join(f'`{p}`' for p in info['paths'])} ({info['rows']} "
        f"rows, {info['runs']} runs; sha256 `{info['sha256'][:16]}`).",
        f"Metric `{spec.metric}`, axis `{spec.axis}`, compute `{spec.compute}`. Bootstrap "
        f"over runs: {spec.bootstrap} resamples, seed {spec.seed}; intervals are 5%-95%.",
        "",
    ]
    for method, entry in results.items():
        lines += [
            f"## {method}",
            "",
            f"`{FORMS[method].format(axis=spec.axis)}`",
            "",
            summary(method, entry, spec) + ".",
            "",
            "| parameter | estimate | median | 90% interval |",
            "| --- | ---: | ---: | ---: |",
        ]
        lines += [f"| {' | '.join(row)} |" for row in param_rows(entry) + extra_rows(method, entry)]
        lines += [""] + [f"![{method}]({name})" for name in plots.get(method, []) if name.endswith(".png")] + [""]
        lines += _method_details(method, entry, spec) + _holdout_details(entry, spec)
        lines += [f"- warning: {w}" for w in entry.get("warnings", [])] + [""]
        lines += [f"Reliable: {'yes' if entry.get('reliable') else 'no'}.", ""]
    lines += list(readings)
    if front is not None:
        fitted = "frontier" in results
        source = (
            "fitted envelope of the per-axis sigmoids; `measured`: the best eval point at or below C; dashed "
            "and `extrapolated` where the fit is above the best measured by the next eval point (at or after "
            "C: between eval points the fit interpolates) by more than the noise; the axis* column: every "
            "value within the noise of the top, a tie when more than one (frontier.csv keeps the top one)"
            if fitted
            else "empirical: best eval point with compute <= C"
        )
        lines += ["## frontier.csv", "", f"{source}.", "", f"![frontier]({plots['frontier.csv'][0]})", ""]
        if fitted:
            rows = {_at(r["compute"]): r for r in results["frontier"]["axis_star"]}
            lines += [
                f"| {spec.compute} | {spec.metric} | measured | {spec.axis}* | note |",
                "| ---: | ---: | ---: | ---: | --- |",
            ]
            lines += [
                f"| {r.compute:.4g} | {r.value:.4f} | "
                + (
                    f"{b['measured']:.4f} | {label(b['axis_star_set'])} | {_note(b)} |"
                    if b
                    else f"- | {fmt(r.axis_star)} | - |"
                )
                for r in front.itertuples()
                for b in [rows.get(_at(r.compute))]
            ] + [""]
        else:
            lines += [f"| {spec.compute} | {spec.metric} | {spec.axis}* |", "| ---: | ---: | ---: |"]
            lines += [f"| {r.compute:.4g} | {r.value:.4f} | {fmt(r.axis_star)} |" for r in front.itertuples()] + [""]
    return "\n".join(lines)


def _method_details(method: str, entry: dict, spec: FitSpec) -> list[str]:
    if method == "frontier":
        out = [
            f"| {spec.compute} | {spec.axis}* | within the noise | median | 90% interval |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        out += [
            f"| {r['compute']:.4g} | {fmt(r['axis_star'])} | {label(r['axis_star_set'])} | {fmt(r.get('median'))} | "
            f"{_interval([r['low'], r['high']]) if 'low' in r else '-'} |"
            for r in entry["axis_star"]
        ]
        out += [
            "",
            "Per-axis sigmoids of the metric against log10 C (through each run's running "
            "best, up to its last eval point); `above measured`: the most the curve stands "
            "above its runs' best by their next eval point (extrapolated beyond the noise):",
            "",
            "| curve | lower | upper | midpoint | slope | points | converged | above measured |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
        ]
        out += [
            f"| {k} | {' | '.join(fmt(c['params'][p]) for p in ('lower', 'upper', 'midpoint', 'slope'))} "
            f"| {c['points']} | {c['converged']} | "
            f"{c['above_measured']:+.3f}{' EXTRAPOLATED' if c['extrapolated'] else ''} |"
            for k, c in entry["curves"].items()
        ]
        return out + [""]
    if method == "fixed-batch":
        out = [
            "| B | compute | winning " + spec.axis + " | within the noise | 90% interval |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for B, b in entry["batches"].items():
            out += [
                f"| {B} | {r['compute']:.4g} | {fmt(r['axis_star'])} | {label(r['axis_star_set'])} "
                f"| {_interval([r['low'], r['high']]) if 'low' in r else '-'} |"
                for r in b["best"]
            ]
        return out + [""]
    if method == "isoflop-slices":
        out = [
            f"| budget | parabola vertex {spec.axis} | interior (used) | median | 90% interval |",
            "| ---: | ---: | --- | ---: | ---: |",
        ]
        out += [
            f"| {b['compute']:.4g} | {fmt(b['optimum'])} | {b['interior']} | "
            f"{fmt(b.get('median'))} | {_interval([b['low'], b['high']]) if 'low' in b else '-'} |"
            for b in entry["budgets"]
        ]
        return out + [""]
    if method == "surface":
        cols = [f"{a}_star" for a in entry["axes"]] + ["value"]
        out = [
            f"| {spec.compute} | " + " | ".join(f"{c} | {c} 90%" for c in cols) + f" | {spec.axis}* within the noise |",
            "| ---: |" + " ---: | ---: |" * len(cols) + " ---: |",
        ]
        out += [
            f"| {r['compute']:.4g} | "
            + " | ".join(
                f"{fmt(r[c])}{_outside(r, c)} | "
                f"{_interval([r[c + '_low'], r[c + '_high']]) if c + '_low' in r else '-'}"
                for c in cols
            )
            + f" | {label(r[spec.axis + '_star_set'])} |"
            for r in entry["optimum"]
        ]
        return out + [""]
    if method == "scalerl":
        out = ["| curve | R0 | A | C_mid | B | holdout error |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        out += [
            f"| {k} | {' | '.join(fmt(c['params'].get(p)) for p in ('R0', 'A', 'C_mid', 'B', 'holdout_error'))} |"
            for k, c in entry["curves"].items()
        ]
        return out + [""]
    return []


def _holdout_details(entry: dict, spec: FitSpec) -> list[str]:
    """`--holdout K`: per held-out budget the law's prediction from the smaller budgets against the
    best cell observed there (the cell with the highest mean at exactly that budget)."""
    h = entry.get("holdout")
    if not h:
        return []
    out = [
        f"Holdout: fitted on eval points below {h['fitted_below']:.4g} "
        f"(the {h['k']} largest budgets held out), predicted at them:",
        "",
        f"| {spec.compute} | {spec.axis}* predicted | observed | log2 error | value predicted | observed | error |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    out += [
        f"| {b['compute']:.4g} | {fmt(b['axis_star_predicted'])} | "
        f"{fmt(b['axis_star_observed'])} | {fmt(b['axis_star_log2_error'])} | "
        f"{fmt(b['value_predicted'])} | {fmt(b['value_observed'])} | {fmt(b['value_error'])} |"
        for b in h["budgets"]
    ]
    return out + [""]
