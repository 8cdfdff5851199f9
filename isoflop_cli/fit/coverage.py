"""Coverage and sharpening: what RL changed, read the two ways the seed study reads it.

Three columns every run records at each eval point say how it learned, not only how far:
- `zero_var_frac`: the share of the training groups since the last eval point whose n rewards were
  all equal (all right or all wrong), which give GRPO no signal. On a hard set it falls as n grows
  (a rare success gets found); when it rises with compute the groups are being solved.
- `val_best@k` (some of k samples right): rising, RL covers problems the base model could not solve.
- `val_worst@k` (all k right): rising while best@k stays, RL sharpens what the base could already
  sometimes do.

The table is a description, not a fit: per axis value and budget the mean over runs of each column,
with runs' eval points within a quarter octave of compute read as one budget (FLOP-budget runs stop
within a step past their eval points, rollout-budget runs exactly on them). It makes no claim a test would
have to back; its deltas are read against the noise the frontier reports.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.table import Table

from isoflop_cli.fit.data import RUN, FitSpec

COLUMNS = ("zero_var_frac", "val_best@k", "val_worst@k")


def coverage(df: pd.DataFrame, spec: FitSpec) -> pd.DataFrame | None:
    """Per axis value and compute: runs, and the mean of each of COLUMNS (zero_var_frac is empty at
    compute 0, where no step has run). None when the results lack a column."""
    need = [spec.axis, spec.compute, *COLUMNS]
    if not set(need) <= set(df.columns):
        return None
    rows = df[[RUN, *need]].apply(pd.to_numeric, errors="coerce").assign(**{RUN: df[RUN]})
    rows = rows.dropna(subset=[spec.axis, spec.compute])
    if rows.empty:
        return None
    grouped = rows.assign(**{spec.compute: budgets(rows[spec.compute])}).groupby([spec.axis, spec.compute])
    table = grouped[list(COLUMNS)].mean().join(grouped[RUN].nunique().rename("runs")).reset_index()
    return table[[spec.axis, spec.compute, "runs", *COLUMNS]]


def budgets(compute: pd.Series, octaves: float = 0.25) -> pd.Series:
    """Each compute value as the budget it reads: eval points within `octaves` of the smallest
    point of their cluster (in log2 compute) are one budget, named by that smallest point; 0 stays 0."""
    label: dict[float, float] = {}
    start = None
    for c in sorted(set(compute[compute > 0])):
        if start is None or np.log2(c / start) > octaves:
            start = c
        label[c] = start
    return compute.map(lambda c: label.get(c, c))


def summary(table: pd.DataFrame, spec: FitSpec) -> pd.DataFrame:
    """Per axis value, from its first eval point to its last: best@k and worst@k there and their
    change, and zero_var_frac at the first and the last budget where steps had run."""
    out = []
    for value, rows in table.groupby(spec.axis):
        rows = rows.sort_values(spec.compute)
        first, last = rows.iloc[0], rows.iloc[-1]
        trained = rows[rows["zero_var_frac"].notna()]
        out.append(
            {
                spec.axis: value,
                "from": first[spec.compute],
                "to": last[spec.compute],
                "best@k": last["val_best@k"],
                "d_best@k": last["val_best@k"] - first["val_best@k"],
                "worst@k": last["val_worst@k"],
                "d_worst@k": last["val_worst@k"] - first["val_worst@k"],
                "zero_var_first": trained["zero_var_frac"].iloc[0] if len(trained) else np.nan,
                "zero_var_last": trained["zero_var_frac"].iloc[-1] if len(trained) else np.nan,
            }
        )
    return pd.DataFrame(out)


def entry(table: pd.DataFrame, spec: FitSpec) -> dict:
    """fit.json's `coverage`: the summary per axis value and the table behind it (coverage.csv)."""
    return {
        "axis": spec.axis,
        "compute": spec.compute,
        "per_value": summary(table, spec).to_dict("records"),
        "csv": "coverage.csv",
    }


def rich_table(table: pd.DataFrame, spec: FitSpec) -> Table:
    out = Table(
        title=f"coverage and sharpening per {spec.axis}: validation best@k and worst@k at the last budget "
        "(change from the first), zero_var_frac at the first and last trained budget"
    )
    for col in (
        spec.axis,
        f"{spec.compute} to",
        "best@k",
        "change",
        "worst@k",
        "change",
        "zero_var first",
        "zero_var last",
    ):
        out.add_column(col, justify="right")
    for r in summary(table, spec).to_dict("records"):
        out.add_row(
            f"{r[spec.axis]:g}",
            f"{r['to']:,.4g}",
            f"{r['best@k']:.3f}",
            f"{r['d_best@k']:+.3f}",
            f"{r['worst@k']:.3f}",
            f"{r['d_worst@k']:+.3f}",
            f"{r['zero_var_first']:.3f}",
            f"{r['zero_var_last']:.3f}",
        )
    return out


def markdown(table: pd.DataFrame, spec: FitSpec, plots: list[str]) -> list[str]:
    """report.md's section: what the columns mean, the summary per axis value, the plot."""
    lines = [
        "## coverage and sharpening",
        "",
        "`zero_var_frac`: the share of training groups whose rewards were all equal (no GRPO "
        "signal); `best@k` rising: RL covers problems the base could not solve; `worst@k` rising "
        "with `best@k` flat: RL sharpens what the base could sometimes do. Means over runs per "
        f"{spec.axis} (coverage.csv has every budget); changes from the first eval point to the last.",
        "",
        f"| {spec.axis} | {spec.compute} | best@k | change | worst@k | change | zero_var_frac first | last |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r[spec.axis]:g} | {r['to']:.4g} | {r['best@k']:.3f} | {r['d_best@k']:+.3f} | {r['worst@k']:.3f} "
        f"| {r['d_worst@k']:+.3f} | {r['zero_var_first']:.3f} | {r['zero_var_last']:.3f} |"
        for r in summary(table, spec).to_dict("records")
    ]
    return lines + [""] + [f"![coverage]({name})" for name in plots if name.endswith(".png")] + [""]
