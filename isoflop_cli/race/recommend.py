"""Step 6 of RACE: what to run at full scale, as `isoflop sweep` overrides with predicted FLOPs.

The reward system: a reward-heavy one if the pilot found one, else the rule-based reward with the
highest mean target at the largest budget (rule-based rewards are not tested against each other).
The allocation levels follow that reward's rho regime: the fewest of the pilot's updates per
rollout batch (algo.epochs) when search-heavy, the most and one doubling beyond when update-heavy,
the levels whose rho brackets the fitted optimum when interior, and the sweep's own allocation when
undetermined (no evidence to move compute). At full scale n stays the sweep's own axis (the pilot
held it at N; the full sweep measures it), but only at the n where each recommended level keeps the
pilot's rho, by the plan's prediction within RHO_SPREAD in log-odds of its rho at N. A level is a
share of a group, and its rho moves with n: a fraction u learns from u n completions, rounded up
where u n is not whole (1/16 at n = 2 learns from one of two), and a group's prompt is learned from
once whatever its share (on the embedded model 1/4 of a group is rho 0.51 at n = 16, 0.54 at 8,
0.58 at 4 and 0.69 at 2). The other n are left out of the recommended sweep, and said to be
(`n_left_out`, with each n's rho in `rho_by_n`).
"""

from __future__ import annotations

import shlex

import numpy as np

from isoflop_cli.errors import ConfigError
from isoflop_cli.race import pilot as pilot_mod
from isoflop_cli.race.analysis import INTERIOR, REWARD, SEARCH, UPDATE, Data, log_odds

AXES_OVERRIDES = ("grid.axes", "+grid.axes", "++grid.axes", "reward=", "+reward=", "algo.epochs=")
RHO_SPREAD = 0.5  # log-odds of rho: a quarter of the default pilot's spacing between levels


def choose_reward(entries: list[dict], data: Data) -> tuple[str, str]:
    heavy = [e for e in entries if e["regime"] == REWARD]
    if heavy:
        best = max(heavy, key=lambda e: e["effect"])
        return best["reward"], f"{best['reward']} beats rule-based feedback at equal compute"
    top = data.points[data.points["budget"] == max(data.budgets)]
    means = top.groupby("reward")["y"].mean()
    rule = means.drop(labels=[r for r in data.model_based if r in means.index])
    pool = rule if not rule.empty else means
    reward = str(pool.idxmax())
    why = f"highest mean {data.metric} at the largest budget" + (
        " among rule-based rewards" if not rule.empty and len(means) > len(rule) else ""
    )
    for e in entries:
        gap = e.get("reward_gap")
        if gap and gap["interval90"]:
            low, high = gap["interval90"]
            verdict = "worse than" if high < 0 else "no better than"
            why += (
                f"; {e['reward']} is {verdict} the best rule-based reward at equal compute ({gap['effect']:+.3g}, "
                f"90% [{low:+.3g}, {high:+.3g}])"
            )
    return reward, why


def choose_epochs(
    regime: str, pilot_epochs: list[float], rho_of: dict[float, float] | None = None, optimum: float | None = None
) -> list[float] | None:
    """The epoch levels to sweep at full scale; `rho_of` (each level's median rho) and the optimum
    place an interior regime's levels: the nearest level below the optimum and the nearest above."""
    levels = sorted(pilot_mod.level(e) for e in pilot_epochs)
    if regime == SEARCH:
        return levels[:2]
    if regime == UPDATE:
        return sorted({*levels[-2:], 2 * levels[-1]})
    if regime == INTERIOR and rho_of and optimum is not None:
        below = [e for e in levels if rho_of[e] <= optimum]
        above = [e for e in levels if rho_of[e] >= optimum]
        return sorted(
            {*(below and [max(below, key=lambda e: rho_of[e])]), *(above and [min(above, key=lambda e: rho_of[e])])}
        )
    return None


def keeping_rho(cells: list, epochs: list[float]) -> tuple[list[int], list[int], dict[str, dict[str, float]]]:
    """(the n at which every level of `epochs` has the rho it has at the largest n, within
    RHO_SPREAD in log-odds by the plan, the other n, each level's planned rho at each n)."""
    rho: dict[tuple[int, float], list[float]] = {}
    for c in cells:
        if c.feasible and c.axes.get("algo.epochs") in epochs:
            rho.setdefault((int(c.axes["n"]), c.axes["algo.epochs"]), []).append(c.plan.predicted_flops["rho"])
    mean = {k: float(np.mean(v)) for k, v in rho.items()}
    ns = sorted({n for n, _ in mean})
    top = ns[-1]
    kept = [
        n
        for n in ns
        if all((n, e) in mean and abs(log_odds(mean[n, e]) - log_odds(mean[top, e])) <= RHO_SPREAD for e in epochs)
    ]
    table = {str(pilot_mod.level(e)): {str(n): mean[n, e] for n in ns if (n, e) in mean} for e in epochs}
    return kept, [n for n in ns if n not in kept], table


def sweep_overrides(
    config: str | None, overrides: list[str], reward: str, epochs: list[int] | None, ns: list[int] | None = None
) -> list[str]:
    """The user's overrides, with the reward axis narrowed to `reward`, the epoch levels as an axis
    and grid.n narrowed to `ns` where given; unchanged when that is the sweep already."""
    cfg, _ = pilot_mod.expand(config, overrides)
    narrowed = [f"grid.n=[{','.join(map(str, ns))}]"] if ns and ns != list(cfg.grid.n) else []
    before = {k: list(v) for k, v in cfg.grid.axes.items()}
    axes = {k: v for k, v in before.items() if k not in ("reward", "algo.epochs")}
    if "reward" in before or reward != cfg.reward.name:
        axes["reward"] = [reward]
    if epochs:
        axes["algo.epochs"] = epochs
    elif "algo.epochs" in before:
        axes["algo.epochs"] = before["algo.epochs"]
    kept = [o for o in overrides if not o.startswith(AXES_OVERRIDES + (("grid.n=",) if narrowed else ()))]
    if axes == before:
        return [*kept, *narrowed] if narrowed else list(overrides)
    return [
        *kept,
        *narrowed,
        "++grid.axes={" + ",".join(f"{k}:[{','.join(str(v) for v in vals)}]" for k, vals in axes.items()) + "}",
    ]


def recommend(
    entries: list[dict],
    data: Data,
    config: str | None,
    overrides: list[str],
    scale: dict[str, float] | None,
    out: str | None,
) -> dict:
    reward, reward_why = choose_reward(entries, data)
    entry = next(e for e in entries if e["reward"] == reward)
    regime = entry["rho_regime"]
    pilot_epochs = sorted({pilot_mod.level(e) for e in data.points["epochs"].dropna()})
    pts = data.points[data.points["reward"] == reward]
    rho_of = {pilot_mod.level(e): r for e, r in pts.dropna(subset=["epochs"]).groupby("epochs")["rho"].median().items()}
    epochs = choose_epochs(regime, pilot_epochs, rho_of, entry.get("optimum_rho")) if len(pilot_epochs) >= 2 else None
    chosen = pts[pts["epochs"].isin(epochs or [])] if epochs else pts
    rho = chosen["rho"] if not chosen.empty else pts["rho"]
    rec = {
        "reward": reward,
        "reward_why": reward_why,
        "regime": regime,
        "algo.epochs": epochs,
        "rho_range": [float(np.min(rho)), float(np.max(rho))],
        "optimum_rho": entry.get("optimum_rho"),
        "optimum_interval90": entry.get("optimum_interval90"),
        "optimum_units": entry.get("optimum_units"),
        "allocation": {
            SEARCH: "the low-rho end: fewer updates per rollout batch, more rollouts",
            UPDATE: "the high-rho end: more updates per rollout batch (and one doubling beyond the pilot)",
            INTERIOR: f"around the optimum rho {entry.get('optimum_rho') or 0:.2f}: the levels just below and above it",
        }.get(regime, "the sweep's own allocation: the pilot found no evidence to move compute"),
    }
    if regime in (SEARCH, UPDATE, INTERIOR) and not pilot_epochs:
        rec["note"] = "the results name no algo.epochs levels: run the full sweep at the rho range above"
    try:
        sweep = sweep_overrides(config, overrides, reward, epochs)
        _, cells = pilot_mod.expand(config, sweep, flops_scale=scale)
        if epochs:
            kept, rec["n_left_out"], rec["rho_by_n"] = keeping_rho(cells, epochs)
            if rec["n_left_out"]:
                rec["n_note"] = (
                    f"n = {', '.join(map(str, rec['n_left_out']))} left out: there algo.epochs "
                    f"{', '.join(map(str, epochs))} would not have the pilot's rho (rho_by_n)"
                )
                sweep = sweep_overrides(config, overrides, reward, epochs, kept)
                _, cells = pilot_mod.expand(config, sweep, flops_scale=scale)
    except ConfigError as e:
        rec.update(overrides=None, command=None, predicted_flops=None, error=str(e))
        return rec
    args = ["isoflop", "sweep", *(["--config", config] if config else []), *(["--root", out] if out else []), *sweep]
    rec.update(
        overrides=sweep,
        command=shlex.join(args),
        predicted_flops=pilot_mod.total_flops(cells),
        cells=sum(c.feasible for c in cells),
    )
    return rec
