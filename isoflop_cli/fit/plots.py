"""Figures of `isoflop fit`, each written as PNG and SVG: the runs' mean curves with the spread
between seeds and their slices at fixed budgets (study.py, every fit), the frontier with the
per-axis curves and fits, axis*(C) with its ties and the verdict, isoFLOP slices with their
parabolas, ScaleRL curves, the parametric fit."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from isoflop_cli.fit.curves import sigmoid
from isoflop_cli.fit.data import FitSpec, MethodResult, plain
from isoflop_cli.fit.frontier import axis_curves
from isoflop_cli.fit.trend import Trend
from isoflop_cli.store import atomic_write


def save(fig: plt.Figure, out: Path) -> list[Path]:
    """Every plot's finish: a light grid on each axes, then PNG and SVG (`write_figure`)."""
    for ax in fig.axes:
        ax.grid(alpha=0.3, which="both")
    return write_figure(fig, out)


def write_figure(fig: plt.Figure, out: Path) -> list[Path]:
    """`out`.png and .svg, each rendered in memory and written by the store's one writer (a link at
    its path is replaced, never written through; a kill leaves the old plot or the new)."""
    fig.tight_layout()
    paths = [out.with_suffix(".png"), out.with_suffix(".svg")]
    for p in paths:
        image = io.BytesIO()
        fig.savefig(image, format=p.suffix[1:])
        atomic_write(p, image.getvalue())
    plt.close(fig)
    return paths


def plain_ticks(axis: matplotlib.axis.Axis) -> None:
    """Axis values as numbers on powers of two (2, 4, 8), not powers of ten; no crowded minor labels."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=2))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def palette(values) -> dict:
    values = sorted(values)
    cmap = plt.get_cmap("viridis")
    return {v: cmap(i / max(1, len(values) - 1)) for i, v in enumerate(values)}


def frontier_plot(
    df: pd.DataFrame, front: pd.DataFrame, spec: FitSpec, out: Path, fitted: MethodResult | None
) -> list[Path]:
    """Eval points per axis value, their fitted sigmoids through the running bests (or best-so-far
    steps without a fit), and the frontier with markers coloured by axis*(C). Where a fitted curve or
    the frontier stands above what was measured by the next eval point by more than the noise its
    line is dashed (extrapolated); a budget whose axis* is a tie has a hollow marker."""
    axis, compute, metric = spec.axis, spec.compute, spec.metric
    colour = palette(df[axis].unique())
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    raw = df[df[compute] > 0]
    for value in colour:
        pts = raw[raw[axis] == value]
        ax.scatter(pts[compute], pts[metric], s=8, alpha=0.2, color=colour[value])
    tied = np.zeros(len(front), dtype=bool)
    if fitted is not None:
        best = fitted.frames["running_best"]
        ax.scatter(
            best[compute], best[metric], s=10, color=[colour[v] for v in best[axis]], edgecolors="none", alpha=0.6
        )
        for value, c in fitted.frames["curves"].groupby("axis_value"):
            _dashed_where(
                ax,
                c["compute"].to_numpy(),
                c["value"].to_numpy(),
                c["extrapolated"].to_numpy(),
                color=colour.get(value, "grey"),
                lw=1.6,
                label=f"{axis}={plain(value)}",
            )
        rows = fitted.frames["axis_star"]
        _dashed_where(
            ax,
            front["compute"].to_numpy(),
            front["value"].to_numpy(),
            rows["extrapolated"].to_numpy(bool),
            color="black",
            lw=2.5,
            alpha=0.35,
            zorder=3,
            label="frontier (dashed: extrapolated)",
        )
        tied = rows["axis_star_set"].map(len).to_numpy() > 1
    else:
        steps = axis_curves(df, metric, axis, compute)
        for value, c in steps.groupby(axis):
            ax.step(c["compute"], c["value"], where="post", color=colour[value], lw=1.5, label=f"{axis}={plain(value)}")
        ax.plot(front["compute"], front["value"], color="black", lw=2.5, alpha=0.35, zorder=3, label="frontier")
    marks = [colour.get(v, "grey") for v in front["axis_star"]]
    ax.scatter(
        front["compute"][~tied],
        front["value"][~tied],
        c=[m for m, t in zip(marks, tied) if not t],
        edgecolors="black",
        s=36,
        zorder=4,
    )
    if tied.any():
        ax.scatter(
            front["compute"][tied],
            front["value"][tied],
            facecolors="white",
            edgecolors=[m for m, t in zip(marks, tied) if t],
            linewidths=1.5,
            s=36,
            zorder=4,
            label=f"{axis}* tied within the noise",
        )
    ax.set(
        xscale="log",
        xlabel=compute,
        ylabel=metric,
        title=f"{'fitted' if fitted is not None else 'empirical'} frontier; markers coloured by {axis}*(C)",
    )
    ax.legend(fontsize=7, loc="best", ncol=2)
    return save(fig, out)


def _dashed_where(ax: plt.Axes, x: np.ndarray, y: np.ndarray, dashed: np.ndarray, label: str, **style) -> None:
    """One line, solid where `dashed` is False and dashed where it is True (each segment styled by its
    right end, so a dashed stretch starts at the last solid point)."""
    for i, (start, stop) in enumerate(_runs(dashed)):
        lo = max(start - 1, 0)
        ax.plot(x[lo:stop], y[lo:stop], ls="--" if dashed[start] else "-", label=label if i == 0 else None, **style)


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each stretch of equal flags."""
    edges = np.flatnonzero(np.diff(flags.astype(int))) + 1
    bounds = np.r_[0, edges, flags.size]
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds) if b > a]


def axis_star_plot(result: MethodResult, spec: FitSpec, out: Path, answer: Trend | None = None) -> list[Path]:
    """axis_star_figure, written as PNG and SVG."""
    return save(axis_star_figure(result, spec, answer), out)


def axis_star_figure(result: MethodResult, spec: FitSpec, answer: Trend | None) -> plt.Figure:
    """axis*(C) as the report reads it: at each budget every axis value within the noise of the top
    (`axis_star_set`: hollow markers joined by a line where it is a tie, one filled marker where one
    value wins), the bootstrap 90% band, the sigmoid law and its saturation where one was fitted,
    and the verdict in the title (verdict). A step through the top curve alone would draw a
    confident staircase where the report says the values are tied."""
    entry, star = result.entry, result.frames["axis_star"]
    fig, ax = plt.subplots(figsize=(6.5, 4.4), dpi=120)
    if "low" in star:
        ax.fill_between(
            star["compute"], star["low"], star["high"], step="mid", color="tab:blue", alpha=0.12, label="bootstrap 90%"
        )
    marks = star_marks(star)
    ties = marks[marks["tied"]]
    spans = ties.groupby("compute")["axis_value"].agg(["min", "max"])
    ax.vlines(spans.index, spans["min"], spans["max"], color="tab:blue", lw=1, alpha=0.6)
    ax.scatter(
        ties["compute"],
        ties["axis_value"],
        s=24,
        facecolors="white",
        edgecolors="tab:blue",
        zorder=3,
        label=f"{spec.axis}* tied within the noise",
    )
    alone = marks[~marks["tied"]]
    ax.scatter(
        alone["compute"], alone["axis_value"], s=24, color="tab:blue", zorder=3, label=f"{spec.axis}* (one value wins)"
    )
    if entry["params"]:
        c = np.geomspace(star["compute"].min(), star["compute"].max(), 200)
        ax.plot(c, np.exp2(sigmoid(np.log10(c), **entry["params"])), color="black", lw=2, label="sigmoid law")
        sat = entry["saturation"]
        if sat["within_data"]:
            ax.axvline(sat["compute"], color="grey", ls="--", lw=1, label=f"saturates at {sat['compute']:.3g}")
    ax.set(xscale="log", yscale="log", xlabel=spec.compute, ylabel=f"{spec.axis}*")
    said = verdict(entry, answer, spec.axis)
    ax.set_title(f"compute-optimal {spec.axis}*(C)" + (f"\n{said}" if said else ""), fontsize=9)
    plain_ticks(ax.yaxis)
    ax.legend(fontsize=7)
    return fig


def star_marks(star: pd.DataFrame) -> pd.DataFrame:
    """What axis_star_figure marks: one row per budget and member of its `axis_star_set` (compute,
    axis_value, tied: the set has more than one member)."""
    sets = star[["compute", "axis_star_set"]].explode("axis_star_set").rename(columns={"axis_star_set": "axis_value"})
    sizes = star["axis_star_set"].map(len)
    return sets.assign(
        axis_value=sets["axis_value"].astype(float), tied=sizes.loc[sets.index].to_numpy() > 1
    ).reset_index(drop=True)


def verdict(entry: dict, answer: Trend | None, axis: str) -> str:
    """The report's answer for a figure's title: the trend test's call and p (fit.json `n_star_trend`),
    on a line of its own what the data show where no move is called, and the budgets where axis* is
    a tie (the frontier's `budgets_tied` of `budgets`)."""
    parts = []
    if answer is not None:
        parts.append(
            f"trend test: {answer.call} (p = {answer.p_value:.2g})"
            if answer.p_value is not None
            else f"trend test: cannot tell ({answer.why})"
        )
    if entry.get("budgets_tied"):
        parts.append(f"{axis}* tied at {entry['budgets_tied']} of {entry['budgets']} budgets")
    said = "; ".join(parts)
    return f"{said}\n{answer.why}" if answer is not None and answer.p_value is not None and answer.why else said


def surface_plot(result: MethodResult, spec: FitSpec, out: Path) -> list[Path]:
    """Left: the eval points per axis value with the surface through them (other axes at the values
    run, each point's own fit). Right: axis*(C) and the value at the optimum, with bootstrap 90%
    bands, and the values tied with the optimum as a shaded range."""
    points, rows = result.frames["surface"], pd.DataFrame(result.entry["optimum"])
    axis = spec.axis
    colour = palette(points[axis].unique())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), dpi=120)
    for value, g in points.groupby(axis):
        left.scatter(g["compute"], g["value"], s=6, alpha=0.25, color=colour[value])
        line = g.groupby("compute")["fit"].mean()
        left.plot(line.index, line.to_numpy(), color=colour[value], lw=1.2, label=f"{axis}={plain(value)}")
    left.plot(rows["compute"], rows["value"], color="black", lw=2, label="value at the optimum")
    if "value_low" in rows:
        left.fill_between(rows["compute"], rows["value_low"], rows["value_high"], color="black", alpha=0.15)
    left.set(xscale="log", xlabel=spec.compute, ylabel=spec.metric, title="surface")
    left.legend(fontsize=7, ncol=2)
    tied = rows[
        f"{axis}_star_set"
    ]  # empty where no value run is within the noise of an optimum off the values run: nothing shaded
    right.fill_between(
        rows["compute"],
        [min(t, default=np.nan) for t in tied],
        [max(t, default=np.nan) for t in tied],
        color="grey",
        alpha=0.15,
        step="mid",
        label="within the noise",
    )
    if f"{axis}_star_low" in rows:
        right.fill_between(
            rows["compute"],
            rows[f"{axis}_star_low"],
            rows[f"{axis}_star_high"],
            color="tab:blue",
            alpha=0.25,
            label="bootstrap 90%",
        )
    right.plot(rows["compute"], rows[f"{axis}_star"], color="tab:blue", lw=2, label=f"{axis}*(C)")
    lo, hi = points[axis].min(), points[axis].max()
    right.set(
        xscale="log",
        yscale="log",
        xlabel=spec.compute,
        ylabel=f"{axis}*",
        title=f"{axis}*(C) from the surface",
        ylim=(lo / 2, hi * 2),
    )
    plain_ticks(right.yaxis)
    right.legend(fontsize=8)
    return save(fig, out)


def fixed_batch_plot(result: MethodResult, spec: FitSpec, out: Path) -> list[Path]:
    """The winning split per budget, one line per batch size."""
    best = result.frames["fixed_batch"]
    colour = palette(best["B"].unique())
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=120)
    for B, g in best.groupby("B"):
        ax.step(g["compute"], g["axis_star"], where="mid", color=colour[B], lw=1.5, label=f"B={B}")
        if "low" in g:
            ax.fill_between(g["compute"], g["low"], g["high"], step="mid", color=colour[B], alpha=0.12)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel=spec.compute,
        ylabel=f"best {spec.axis} at fixed B",
        title="fixed batch: the winning split",
    )
    plain_ticks(ax.yaxis)
    ax.legend(fontsize=8)
    return save(fig, out)


def slices_plot(result: MethodResult, spec: FitSpec, out: Path) -> list[Path]:
    """Left: the metric against the axis at each budget with its parabola and optimum. Right: the optima
    against compute with their bands, the power law and the sigmoid."""
    points, optima, entry = result.frames["slices"], result.frames["optima"], result.entry
    colour = palette(optima["compute"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), dpi=120)
    for row in optima.itertuples():
        pts = points[points["budget"] == row.compute]
        left.scatter(pts["axis_value"], pts["value"], s=14, color=colour[row.compute])
        x = np.linspace(pts["x"].min(), pts["x"].max(), 60)
        left.plot(
            np.exp2(x),
            row.c2 * x**2 + row.c1 * x + row.c0,
            color=colour[row.compute],
            lw=1.2,
            label=f"C={row.compute:.3g}",
        )
        if row.interior:
            xv = np.log2(row.optimum)
            left.scatter(
                [row.optimum],
                [row.c2 * xv**2 + row.c1 * xv + row.c0],
                marker="*",
                s=80,
                color=colour[row.compute],
                edgecolors="black",
                zorder=4,
            )
    left.set(xscale="log", xlabel=spec.axis, ylabel=spec.metric, title="isoFLOP slices")
    left.legend(fontsize=6, ncol=2)
    inner = optima[optima["interior"]]
    if "low" in inner:
        right.vlines(inner["compute"], inner["low"], inner["high"], color="tab:blue", alpha=0.5, label="bootstrap 90%")
    right.scatter(inner["compute"], inner["optimum"], color="tab:blue", zorder=3, label="optimum")
    c = np.geomspace(inner["compute"].min(), inner["compute"].max(), 200)
    p = entry["params"]
    right.plot(
        c, p["coef"] * c ** p["exponent"], color="black", lw=1.5, label=f"power law, exponent {p['exponent']:.3f}"
    )
    if entry["sigmoid"]:
        right.plot(
            c,
            np.exp2(sigmoid(np.log10(c), **entry["sigmoid"]["params"])),
            color="tab:red",
            lw=1.5,
            ls="--",
            label="sigmoid",
        )
    right.set(
        xscale="log",
        yscale="log",
        xlabel=spec.compute,
        ylabel=f"{spec.axis}*",
        title=f"optimum against compute (preferred: {entry['preferred']})",
    )
    right.legend(fontsize=7)
    plain_ticks(left.xaxis)
    plain_ticks(right.yaxis)
    return save(fig, out)


def curves_plot(curves: pd.DataFrame, spec: FitSpec, out: Path) -> list[Path]:
    """The study figure (study.mean_curves): per axis value the mean metric over its runs against
    compute, shaded ±1 sd between seeds where a cell has two or more; the base model leftmost."""
    axis = spec.axis
    colour = palette(curves[axis].unique())
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for value, g in curves.groupby(axis):
        ax.plot(g["compute"], g["mean"], marker="o", ms=3, color=colour[value], label=f"{axis}={plain(value)}")
        ax.fill_between(g["compute"], g["mean"] - g["sd"], g["mean"] + g["sd"], color=colour[value], alpha=0.15, lw=0)
    ax.set(
        xscale="log",
        xlabel=f"{spec.compute} (leftmost point: the base model)",
        ylabel=spec.metric,
        title=f"mean over runs per {axis}; band: ±1 sd between seeds",
    )
    ax.legend(fontsize=7, ncol=2)
    return save(fig, out)


def budget_slices_plot(points: pd.DataFrame, spec: FitSpec, out: Path) -> list[Path]:
    """isoFLOP slices of the runs (study.slice_points): the metric against the axis at each fixed
    budget, each run a point and the mean per axis value a line."""
    axis = spec.axis
    colour = palette(points["compute"].unique())
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for budget, g in points.groupby("compute"):
        ax.scatter(g[axis], g["value"], s=10, alpha=0.35, color=colour[budget])
        mean = g.groupby(axis)["value"].mean()
        ax.plot(mean.index, mean.to_numpy(), marker="o", ms=4, color=colour[budget], label=f"C={budget:,.4g}")
    ax.set(
        xlabel=axis,
        ylabel=spec.metric,
        title=f"{spec.metric} against {axis} at fixed {spec.compute}: runs and their mean",
    )
    ax.set_xscale("log", base=2)
    plain_ticks(ax.xaxis)
    ax.legend(fontsize=7)
    return save(fig, out)


def scalerl_plot(result: MethodResult, spec: FitSpec, out: Path) -> list[Path]:
    """Mean metric per compute and the fitted ScaleRL curve per axis value; held-out points hollow."""
    frame = result.frames["scalerl"]
    colour = palette(frame["axis_value"].unique())
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for value, g in frame.groupby("axis_value"):
        fit, held = g[~g["held_out"]], g[g["held_out"]]
        ax.scatter(fit["compute"], fit["value"], s=14, color=colour[value])
        ax.scatter(held["compute"], held["value"], s=18, facecolors="none", edgecolors=colour[value])
        ax.plot(g["compute"], g["fit"], color=colour[value], lw=1.5, label=f"{spec.axis}={plain(value)}")
    ax.set(
        xscale="log",
        xlabel=spec.compute,
        ylabel=spec.metric,
        title="ScaleRL fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)",
    )
    ax.legend(fontsize=7, ncol=2)
    return save(fig, out)


def parametric_plot(result: MethodResult, out: Path) -> list[Path]:
    """Observed against fitted loss, coloured by model size."""
    frame = result.frames["parametric"]
    fig, ax = plt.subplots(figsize=(5.5, 4.8), dpi=120)
    sc = ax.scatter(frame["fit"], frame["loss"], c=np.log10(frame["N"]), s=14, cmap="viridis")
    lim = [min(frame["fit"].min(), frame["loss"].min()), max(frame["fit"].max(), frame["loss"].max())]
    ax.plot(lim, lim, color="black", lw=1)
    fig.colorbar(sc, ax=ax, label="log10 N")
    p = result.entry["params"]
    ax.set(
        xlabel="fitted L(N, D)",
        ylabel="observed loss",
        title=f"E={p['E']:.3g}, A={p['A']:.4g}, B={p['B']:.4g}, alpha={p['alpha']:.3f}, beta={p['beta']:.3f}",
    )
    ax.title.set_fontsize(8)
    return save(fig, out)


BANDS = {  # pass-rate bands of a validation problem at one eval point
    "never right": lambda r: r == 0,
    "below 0.5": lambda r: (r > 0) & (r < 0.5),
    "0.5 and up": lambda r: (r >= 0.5) & (r < 1),
    "always right": lambda r: r == 1,
}


def interference_plot(result: MethodResult, spec: FitSpec, out: Path) -> list[Path]:
    """Per axis value, how the validation problems' pass rates spread over training (the share of
    problems in each pass-rate band at each compute, over its runs), and the shares that rose and
    regressed (by the binomial test, at equal compute) against the axis, with their bootstrap intervals."""
    rates = result.frames["rates"]
    values = sorted(rates[spec.axis].unique())
    fig, axes = plt.subplots(1, len(values) + 1, figsize=(3.4 * (len(values) + 1), 3.4), dpi=120, squeeze=False)
    colours = ["#c44e52", "#dd8452", "#8fbf7f", "#2f7f4f"]
    for ax, value in zip(axes[0], values):
        sub = rates[rates[spec.axis] == value]
        by_compute = sub.groupby(spec.compute)["rate"]
        shares = np.array([[test(g).mean() for test in BANDS.values()] for _, g in by_compute])
        compute = np.array(sorted(sub[spec.compute].unique()), float)
        x = np.maximum(
            compute, compute[compute > 0].min() / 2 if (compute > 0).any() else 1.0
        )  # the base point left of the first
        ax.stackplot(x, shares.T, colors=colours, labels=list(BANDS))
        ax.set(xscale="log", ylim=(0, 1), title=f"{spec.axis}={plain(value)}", xlabel=spec.compute)
    axes[0][0].set_ylabel("share of validation problems")
    axes[0][0].legend(fontsize=7, loc="lower left")
    ax = axes[0][-1]
    per_value = result.entry["per_value"]
    xs = np.array([v[spec.axis] for v in per_value], float)
    for share, colour in (("rose", "#2f7f4f"), ("regressed", "#c44e52")):
        ys = np.array([v[share] for v in per_value], float)
        err = np.array(
            [
                [y - (v[f"{share}_interval90"] or [y, y])[0], (v[f"{share}_interval90"] or [y, y])[1] - y]
                for y, v in zip(ys, per_value)
            ]
        ).T
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colour, label=share)
    ax.set(
        xscale="log",
        xlabel=spec.axis,
        ylabel="share of problems (binomial test)",
        title=f"up to {spec.compute} {result.entry['compute_upto']:.3g}",
    )
    plain_ticks(ax.xaxis)
    ax.legend(fontsize=7)
    return save(fig, out)


def coverage_plot(table: pd.DataFrame, spec: FitSpec, out: Path) -> list[Path]:
    """Per axis value against compute: zero_var_frac (left), validation best@k (solid) and worst@k
    (dashed) (right): coverage is the solid lines rising, sharpening the dashed ones."""
    axis, compute = spec.axis, spec.compute
    colour = palette(table[axis].unique())
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    for value, c in colour.items():
        rows = table[(table[axis] == value) & (table[compute] > 0)].sort_values(compute)
        left.plot(rows[compute], rows["zero_var_frac"], marker="o", ms=3, color=c, label=f"{axis}={value:g}")
        right.plot(rows[compute], rows["val_best@k"], marker="o", ms=3, color=c, label=f"{axis}={value:g} best@k")
        right.plot(
            rows[compute], rows["val_worst@k"], marker="o", ms=3, color=c, ls="--", label=f"{axis}={value:g} worst@k"
        )
    left.set(xscale="log", xlabel=compute, ylabel="zero_var_frac (groups with no signal)", ylim=(-0.02, 1.02))
    right.set(xscale="log", xlabel=compute, ylabel="validation best@k (solid), worst@k (dashed)", ylim=(-0.02, 1.02))
    left.legend(fontsize=7)
    return save(fig, out)
