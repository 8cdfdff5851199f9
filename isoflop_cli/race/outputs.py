"""What RACE writes and prints: regime.json for tools, race.md and race.png/svg for people, and a
rich summary for the terminal. Each states that the pilot identifies a regime and does not
guarantee a held-out gain. Before it runs, the pilot's design and predicted cost: a line under its
plan table, or one JSON object (`--dry-run --json`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from isoflop_cli import report as report_mod
from isoflop_cli.fit.outputs import jsonable
from isoflop_cli.fit.plots import palette, save
from isoflop_cli.fit.report import fmt
from isoflop_cli.race.analysis import CURVES, Data, predict, rho_of
from isoflop_cli.race.pilot import SEEDS, Pilot, PilotSpec
from isoflop_cli.store import atomic_write, write_json

CAVEAT = (
    "The pilot identifies a regime; it does not guarantee a held-out gain. It reads small budgets of a few runs: "
    "confirm at full scale before relying on it."
)


def write(report: dict, data: Data, out: Path) -> list[Path]:
    write_json(out / "regime.json", jsonable(report))
    plots = plot(report, data, out / "race")
    atomic_write(out / "race.md", markdown(report, [p.name for p in plots if p.suffix == ".png"]))
    return [out / "regime.json", out / "race.md", *plots]


def plot(report: dict, data: Data, out: Path) -> list[Path]:
    """Target against rho per reward system: points coloured by budget, the chosen curve per slice."""
    entries = report["regimes"]
    fig, axes = plt.subplots(1, len(entries), figsize=(5 * len(entries), 4), dpi=120, squeeze=False, sharey=True)
    order = data.points.drop_duplicates("slice").sort_values(["budget", "slice"])["slice"]
    colour = dict(zip(order, palette(range(len(order))).values()))
    for ax, entry in zip(axes[0], entries):
        pts = data.points[data.points["reward"] == entry["reward"]]
        for name, g in pts.groupby("slice", sort=False):
            ax.scatter(g["rho"], g["y"], s=20, color=colour[name], label=f"C={name}")
            params = (entry.get("params") or {}).get(name)
            if params:
                x = np.linspace(g["x"].min(), g["x"].max(), 50)
                ax.plot([rho_of(v) for v in x], predict(np.array(params["coef"]), x), color=colour[name], lw=1.4)
        if entry.get("optimum_rho") is not None:
            if entry.get("optimum_interval90"):
                ax.axvspan(*entry["optimum_interval90"], color="0.85", zorder=0, label="optimum, 90%")
            ax.axvline(entry["optimum_rho"], color="k", ls="--", lw=1, label=f"optimum rho {entry['optimum_rho']:.2f}")
        ax.set(
            xscale="logit",
            xlabel="rho = C_learning / C_total (log-odds scale, as fitted)",
            title=f"{entry['reward']}: {entry['regime']} ({entry['curve']})",
        )
        for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
            axis(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.2f}"))
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(data.metric)
    fig.suptitle("RACE pilot: a regime, not a guaranteed held-out gain", fontsize=9)
    return save(fig, out)


def markdown(report: dict, plots: list[str]) -> str:
    rec = report["recommendation"]
    lines = [
        "# RACE pilot",
        "",
        f"**{CAVEAT}**",
        "",
        f"Target `{report['target']}` (column `{report['metric']}`), read at budgets "
        f"{', '.join(f'{b:.3g}' for b in report['budgets'])} FLOPs from {report['runs']} runs. Curves of the target "
        "against x = log2(rho / (1 - rho)) per reward system and budget "
        f"({', '.join(CURVES)}), chosen by leave-one-out error with the one-standard-error rule; effects with 90% "
        f"intervals from {report['bootstrap']} bootstrap resamples over runs. A regime is named only when the constant "
        "curve is beaten "
        "by more than the noise and the interval excludes 0; `interior` when the quadratic is chosen and the 90% "
        "interval of its peak (the optimum rho) lies strictly inside the pilot's rho range; the optimum also in rho "
        "without reward FLOPs and in the "
        "lever's units (algo.epochs: updates per rollout batch; n), read off the pilot's levels around it.",
        "",
        "| reward | regime | basis | curve | effect | 90% interval | optimum rho | 90% interval | optimum in other "
        "units [90%] | rho regime | runs | why |",
        "| --- | --- | --- | --- | ---: | --- | ---: | --- | --- | --- | ---: | --- |",
    ]
    for e in report["regimes"]:
        lines.append(
            f"| {e['reward']} | **{e['regime']}** | {e['basis']} | {e['curve']} | {fmt(e['effect'])} | "
            f"{_interval(e['interval90'])} | {fmt(e.get('optimum_rho'))} | {_interval(e.get('optimum_interval90'))} | "
            f"{_units(e.get('optimum_units'))} "
            f"| {e['rho_regime']} | {e['runs']} | {e['why']} |"
        )
    if any(e["reward"] == "prm_proxy" for e in report["regimes"]):
        lines += [
            "",
            "`prm_proxy` checks solution steps by rule (no model FLOPs): it is not the second seed study's proxy PRM, "
            "which is a model; that is `prm` with a small scorer.",
        ]
    lines += [
        "",
        "The effect is the fitted change of the target from the lowest to the highest rho of the pilot (basis rho), "
        "or the model-based reward's mean minus the best rule-based mean at equal compute (basis reward).",
        "",
    ]
    lines += [f"![target against rho]({p})" for p in plots] + [""]
    lines += [
        "## Leave-one-out errors",
        "",
        "| reward | curve | LOO MSE | SE of the difference to the best |",
        "| --- | --- | ---: | ---: |",
    ]
    for e in report["regimes"]:
        for curve, v in (e.get("loo") or {}).items():
            lines.append(f"| {e['reward']} | {curve} | {v['loo_mse']:.3g} | {v['se_vs_best']:.3g} |")
    gaps = [e for e in report["regimes"] if e.get("reward_gap")]
    if gaps:
        lines += [
            "",
            "## Model-based against rule-based rewards",
            "",
            "At equal compute: the model-based reward's mean target minus the best rule-based mean, per budget, "
            "averaged.",
            "",
            "| reward | against | effect | 90% interval | LOO MSE one mean / apart | beats rule-based |",
            "| --- | --- | ---: | --- | --- | --- |",
        ]
        for e in gaps:
            g = e["reward_gap"]
            loo = " / ".join(f"{v['loo_mse']:.3g}" for v in g["loo"].values())
            lines.append(
                f"| {e['reward']} | {', '.join(g['against'])} | {fmt(g['effect'])} | {_interval(g['interval90'])} | "
                f"{loo} | {g['beats_rule_based']} |"
            )
    v = report["validation"]
    full = v.get("full_scale")
    lines += [
        "",
        "## Validation",
        "",
        f"Same-regime rate against full-scale results: {_rate(report['same_regime_rate'])}"
        + (
            f" (full-scale calls: {', '.join(f'{r} {g}' for r, g in full['full_regimes'].items())}"
            + (f"; {full['why']}" if full.get("why") else "")
            + ")"
            if full
            else " (no full-scale results: `--validate-with PATH`)"
        ),
        "",
        f"Leave-one-out same-regime rate: {_rate(report['loo_same_regime_rate'])}"
        + (f" ({v['why']})" if v.get("why") else "")
        + " — the decision repeated with each budget (and each model, where there are several) left out: "
        "stability within the pilot.",
        "",
        "Both rates count a pair of calls only where at least one side names a regime: `undetermined` twice is no "
        f"regime found, not one confirmed (left out: {v['both_undetermined']} leave-one-out pairs"
        + (f", {full['both_undetermined']} full-scale" if full else "")
        + ").",
        "",
    ]
    for s in v["subsets"]:
        lines.append(
            f"- without {', '.join(f'{k} {fmt(x)}' for k, x in s['left_out'].items())}: "
            + ", ".join(f"{r} {g}" for r, g in s["regimes"].items())
        )
    share = report["pilot_share"]
    of_full = (
        f", {share:.1%} of the full sweep's predicted {report['full_flops']:.3g}"
        if share is not None
        else " (from a results file)"
    )
    lines += ["", "## Cost", "", f"Pilot FLOPs: {report['pilot_flops']:.3g}{of_full}.", ""]
    lines += [
        "## Recommendation",
        "",
        f"- reward: `{rec['reward']}` ({rec['reward_why']})",
        f"- allocation: {rec['allocation']}"
        + (f": algo.epochs {rec['algo.epochs']}" if rec.get("algo.epochs") else "")
        + f" (pilot rho {rec['rho_range'][0]:.3f} to {rec['rho_range'][1]:.3f})",
    ]
    if rec.get("command"):
        lines += [
            f"- predicted: {rec['predicted_flops']:.3g} FLOPs over {rec['cells']} cells",
            "",
            "```bash",
            rec["command"],
            "```",
        ]
    for key in ("n_note", "note", "error"):
        if rec.get(key):
            lines.append(f"- {key.removeprefix('n_')}: {rec[key]}")
    return "\n".join(lines) + "\n"


def summary(report: dict) -> Group:
    table = Table(
        title=f"RACE regimes: target {report['target']} ({report['metric']}); curves in race.md", caption=CAVEAT
    )
    for col in ("reward", "regime", "effect [90%]", "optimum rho [90%]", "runs"):
        table.add_column(col, justify="right" if col in ("runs",) else "left", overflow="fold")
    style = {"undetermined": "yellow"}
    short = lambda v: f"{v:.2g}" if v is not None else "-"  # noqa: E731
    span = lambda lo_hi: f" [{short(lo_hi[0])}, {short(lo_hi[1])}]" if lo_hi else ""  # noqa: E731
    for e in report["regimes"]:
        units = ", ".join(f"{unit} {short(u['value'])}" for unit, u in (e.get("optimum_units") or {}).items())
        optimum = (
            f"{short(e['optimum_rho'])}{span(e['optimum_interval90'])} ({units})"
            if e.get("optimum_rho") is not None
            else "-"
        )
        table.add_row(
            e["reward"],
            f"[{style.get(e['regime'], 'bold green')}]{e['regime']}[/]",
            f"{short(e['effect'])}{span(e['interval90'])}",
            optimum,
            str(e["runs"]),
        )
    rec = report["recommendation"]
    share = report["pilot_share"]
    lines = [
        Text(
            f"same-regime rate {_rate(report['same_regime_rate'])} against full scale, "
            f"{_rate(report['loo_same_regime_rate'])} leaving a budget out; pilot {report['pilot_flops']:.3g} FLOPs"
            + (f" = {share:.1%} of the full sweep" if share is not None else "")
        ),
        Text(
            f"recommend: reward {rec['reward']} ({rec['reward_why']}); {rec['allocation']}"
            + (f" (algo.epochs {rec['algo.epochs']})" if rec.get("algo.epochs") else "")
            + (f"; {rec['n_note']}" if rec.get("n_note") else "")
        ),
    ]
    if rec.get("command"):
        lines.append(Text(f"  {rec['command']}  # {rec['predicted_flops']:.3g} FLOPs predicted", style="cyan"))
    return Group(table, *lines)


def _units(units: dict | None) -> str:
    """An optimum's other units as `unit value [low, high]`, one after another."""
    return (
        "; ".join(f"{unit} {fmt(u['value'])} {_interval(u['interval90'])}" for unit, u in (units or {}).items()) or "-"
    )


def _interval(lo_hi: list[float] | None) -> str:
    return f"[{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]" if lo_hi else "-"


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def pilot_line(pilot: Pilot, spec: PilotSpec) -> str:
    """The pilot's design and predicted cost, in one line under its plan table."""
    steps = "; ".join("{}-{}".format(*pilot.steps(b)) for b in pilot.budgets)
    return (
        f"pilot: {len(pilot.rewards)} reward system(s) {pilot.rewards} x levels (n x updates per batch) "
        f"{', '.join(map(str, pilot.levels))} x {SEEDS} seeds, budgets {', '.join(f'{b:.3g}' for b in pilot.budgets)} "
        f"FLOPs ({steps} steps a cell at the plan's bound): {pilot.flops:.3g} FLOPs predicted, "
        f"{pilot.share:.1%} of the full sweep's {pilot.full_flops:.3g} (target {spec.share:.0%}, cap {spec.cap:.0%})"
        + (
            "; the full sweep's FLOPs are per-step upper bounds, so the share measured after the pilot is higher"
            if pilot.full_by_bound
            else ""
        )
    )


def pilot_json(pilot: Pilot, spec: PilotSpec) -> dict:
    """`race-pilot --dry-run --json`: the pilot's cells as `plan --json` lists them, its totals, and
    the design the pilot line says."""
    feasible = [c for c in pilot.cells if c.feasible]
    totals = {
        "cells": len(pilot.cells),
        "feasible": len(feasible),
        "rollouts": sum(c.plan.rollouts for c in feasible),
        "flops": pilot.flops,
    }
    design = {
        "rewards": list(pilot.rewards),
        "levels": [{"n": level.n, "updates": level.updates} for level in pilot.levels],
        "seeds": SEEDS,
        "budgets": list(pilot.budgets),
        "steps": [list(pilot.steps(b)) for b in pilot.budgets],
        "share": pilot.share,
        "full_flops": pilot.full_flops,
        "full_by_bound": pilot.full_by_bound,
        "target_share": spec.share,
        "cap": spec.cap,
    }
    return {"cells": report_mod.plan_records(pilot.cells), "totals": totals, "pilot": design}
