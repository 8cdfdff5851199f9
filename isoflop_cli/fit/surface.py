"""Method `surface`: one model of the metric over (log2 n, log2 B_p, log10 C), in two families.

Chinchilla's third approach fits loss over N and D at once; this fits the metric over the
allocation and the budget at once, so n*(C) is read off one law with a handful of parameters
instead of cell by cell, and can be carried to budgets not yet run. The shared family:

    y = U - (U - L) * exp(-(C_eff / C0)^a)
    log10 C_eff = log10 C - k_n (log2 n - s_n(C))^2 - k_B (log2 B_p - s_B(C))^2
    s_n(C) = b0_n + b1_n (log10 C - log10 C_ref)   (and s_B likewise)

A run's metric saturates in its compute (a Weibull-type rise from L to U, as RL reward curves do);
a misallocated run spends its compute less effectively, by a factor that grows with the square of
its distance (in doublings) from the optimum, as an isoFLOP slice is near-parabolic in log n at its
top; and the optimum moves linearly in log C. Since y rises with C_eff and C_eff <= C with equality
at log2 n = s_n(C), the optimum at budget C is n*(C) = 2^s_n(C) exactly, for every C, and the
value there is U - (U - L) exp(-(C / C0)^a): an interior optimum that moves with C, read in closed
form. k_n = 0 says n does not matter (then s_n is not placed by the data, and n* is flagged as
not determined).

The per-axis family (`family: "per-axis"`; the axis is n unless --axis says otherwise) is the same
with a ceiling that moves with the axis:

    U(n) = upper + upper_slope_n (log2 n - log2 n_ref), held within [0, 1]

log2 n_ref the middle of the values run. It is for sweeps where n sets the ceiling itself: larger
n reach a higher plateau more slowly (the coverage reading, the lookup study's mechanism). There
the shared family can only say how soon each n reaches the one U, every allocation tends to it,
and its n* at held-out budgets falls 1.3 to 1.7 doublings short (tests/test_fit_surface.py). The
ceiling is linear in log2 n, one parameter more, not one U per n value: a U per value is placed
only by that value's own runs, and the large n that the question is about have not reached their
plateau within the budgets run, so their ceilings would sit at a bound or trade against C0, and
n* between the values run would have no law; one slope is placed by every run together and is
continuous in n. Its cost: a ceiling that flattens in log n is overshot where the line is carried
past the runs that reached theirs (on the tests' coverage grids the value at the held-out budgets
is 0.03 to 0.17 too high while n* is placed within 0.3 of a doubling); the holdout's value
errors say so. With U rising in n the optimum is no longer s_n(C): a higher ceiling pulls it up,
so n* is searched (`optimum`).

The family is chosen by prediction where it can be. With `--holdout K` both are fitted below the
K largest budgets and the per-axis family is taken when its n* error at the held-out budgets (mean
absolute log2 against the best cell observed) is smaller than the shared family's by more than
half a doubling; otherwise the shared one (`by_holdout` says why the value errors do not vote);
the chosen family is then fitted on all the data. The holdout's error reported (`holdout`) is
the whole procedure's, nested: the family chosen from the training budgets alone (by their own K
largest where there are K + 3 below them, else by BIC on the training points; `holdout.chosen_by`),
fitted on them and scored at the K held out. Reporting the error of the family the held-out budgets
chose would report the better of two draws of the error, too low by the choice. Without
`--holdout`, by BIC on the points discounted for their correlation within runs (`by_criterion`,
`design_effect`), the per-axis family needing a margin of 10. fit.json says `family` and
`family_choice` (how, and each family's held-out predictions and errors, or BIC). Measured on ten
grids of each truth, `--holdout 2`: per-n ceilings (U and the time scale rising with n): the
per-axis family chosen on 10, n* within one doubling of the truth on 10 (but the training budgets
alone choose the shared family on 6, so the procedure's held-out n* error is 1.25-1.82 doublings
there); a shared ceiling (n sets only the speed): the shared family kept
on 9, n* within one doubling on 10. The choice is about n*: on tests/test_fit_cli.py's grid,
whose sigmoids top out higher for larger n and whose held-out n* is its largest n, both families
place n* alike (half a doubling) and the shared one is kept, its value 0.075 low where the
per-axis family's is 0.008 (BIC, without `--holdout`, takes the per-axis family there).

Points: every run's raw eval points at positive compute, not its running best. The surface is a
model of what a run at (n, B_p) reaches in expectation at C; raw points are unbiased, independent
measurements of it, where the running best carries the maximum of the noise so far (its bias
depends on how often a run was evaluated, not on n or C), and the family is already monotone in C,
so dips are read as the noise they are. The bootstrap resamples whole runs, so points of one run
are not taken for independent evidence. A run that collapses (its metric falls for good) is
outside both families; the `frontier` method, on running bests, is the one for such sweeps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize

from isoflop_cli.errors import ConfigError
from isoflop_cli.fit import bootstrap, holdout
from isoflop_cli.fit.curves import at_bound
from isoflop_cli.fit.data import RUN, FitSpec, MethodResult, plain, warn
from isoflop_cli.fit.evidence import TIE_SD
from isoflop_cli.fit.frontier import compute_grid

MIN_POINTS = 20
MIN_AXIS_VALUES = 3  # a parabola in log2 n needs three values to place its top
K_MAX = 2.0  # log10 C lost per squared doubling away from the optimum: beyond it one doubling costs a hundredfold
SLOPE_MAX = 3.0  # doublings of n* per decade of C
REACH = 3.0  # doublings beyond the values run an optimum may lie (b0's bounds; the per-axis family's search)
SHARED, PER_AXIS = "shared", "per-axis"
FAMILIES = (SHARED, PER_AXIS)
TIE_DOUBLINGS = 0.5  # held-out n* errors closer than this (half a grid step) do not tell the families apart
BIC_MARGIN = 10.0  # very strong evidence (Kass and Raftery): the per-axis ceiling moves n* at budgets not run


@dataclass(frozen=True)
class Data:
    """The eval points in the model's coordinates, and each point's run for bootstrap weights."""

    z: np.ndarray  # log10 compute
    u: np.ndarray  # (points, axes) log2 of each allocation axis
    y: np.ndarray
    run: np.ndarray
    z_ref: float
    u_ref: float  # log2 of the axis at the middle of its values run: where a per-axis ceiling is `upper`
    axes: list[str]


@dataclass
class SurfaceFit:
    family: str
    params: dict[str, float]
    converged: bool
    sse: float
    at_bound: list[str]


def names(axes: list[str], family: str) -> list[str]:
    shared = ["lower", "upper", "log10_C0", "a"] + [f"{p}_{a}" for a in axes for p in ("k", "b0", "b1")]
    return shared + ([f"upper_slope_{axes[0]}"] if family == PER_AXIS else [])


def model(theta: np.ndarray, z: np.ndarray, u: np.ndarray, d: Data) -> np.ndarray:
    """The metric at log10 C = z and log2 allocation u (points, axes)."""
    lower, upper, m, a = theta[:4]
    k, b0, b1 = theta[4 : 4 + 3 * len(d.axes)].reshape(-1, 3).T
    star = b0 + b1 * (z[:, None] - d.z_ref)
    return rise(z - ((u - star) ** 2 * k).sum(1), lower, ceiling(upper, slope(theta, d), u[:, 0], d.u_ref), m, a)


def jacobian(theta: np.ndarray, z: np.ndarray, u: np.ndarray, d: Data) -> np.ndarray:
    """d model / d theta at each point, (points, parameters), by the chain rule through `model`:
    least squares then asks for one of these per iteration instead of a model evaluation per
    parameter (a finite difference's), and a clipped exponent or ceiling has its true zero slope.
    tests/test_fit_surface.py checks it against central differences."""
    lower, upper, m, a = theta[:4]
    k, b0, b1 = theta[4 : 4 + 3 * len(d.axes)].reshape(-1, 3).T
    dz = z - d.z_ref
    off = u - (b0 + b1 * dz[:, None])  # (points, axes): doublings from each axis's optimum
    z_eff = z - (off**2 * k).sum(1)
    w = a * (z_eff - m)
    P = np.power(10.0, np.clip(w, -30, 30))
    E = np.exp(-P)
    s = slope(theta, d)
    U = ceiling(upper, s, u[:, 0], d.u_ref)
    level = upper + s * (u[:, 0] - d.u_ref)
    inside = (level >= 0) & (level <= 1)  # where `ceiling` does not hold U at 0 or 1
    dw = np.where(np.abs(w) < 30, (U - lower) * E * P * np.log(10.0), 0.0)  # d model / d w
    dzeff = a * dw  # d model / d log10 C_eff
    columns = [E, inside * (1 - E), -a * dw, (z_eff - m) * dw]
    for j in range(len(d.axes)):
        columns += [-(off[:, j] ** 2) * dzeff, 2 * k[j] * off[:, j] * dzeff, 2 * k[j] * off[:, j] * dz * dzeff]
    if theta.size > 4 + 3 * len(d.axes):
        columns.append(inside * (1 - E) * (u[:, 0] - d.u_ref))
    return np.column_stack(columns)


def slope(theta: np.ndarray, d: Data) -> float:
    """The ceiling's change per doubling of the axis: the per-axis family's last parameter, 0 in the shared family."""
    return float(theta[-1]) if theta.size > 4 + 3 * len(d.axes) else 0.0


def ceiling(upper: float, per_doubling: float, x: np.ndarray, u_ref: float) -> np.ndarray | float:
    """The plateau at log2 axis x: `upper` at the middle of the values run, moving by
    `per_doubling` away from it, held within [0, 1] (a per-axis ceiling read beyond the values run)."""
    return np.clip(upper + per_doubling * (x - u_ref), 0.0, 1.0) if per_doubling else upper


def rise(z_eff: np.ndarray, lower: float, upper: np.ndarray | float, log10_C0: float, a: float) -> np.ndarray:
    """The metric at effective compute log10 C_eff = z_eff: U - (U - L) exp(-(C_eff / C0)^a)."""
    return upper - (upper - lower) * np.exp(-np.power(10.0, np.clip(a * (z_eff - log10_C0), -30, 30)))


def optimum(theta: np.ndarray, d: Data, z: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per axis its optimum on log10 C = z, and the value there. With a shared ceiling every optimum
    is 2^s(C), where C_eff = C (closed form). With a per-axis ceiling the other axes still sit at
    2^s(C) (the ceiling does not move with them), and the axis is searched on a grid of 0.01
    doublings within REACH doublings of the values run: a ceiling rising with the axis pulls its
    optimum above s(C), the further the nearer C comes to the plateau."""
    z = np.asarray(z, float)
    _, b0, b1 = theta[4 : 4 + 3 * len(d.axes)].reshape(-1, 3).T
    s = b0 + b1 * (z[:, None] - d.z_ref)
    stars = {a: np.exp2(s[:, j]) for j, a in enumerate(d.axes)}
    if not slope(theta, d):
        return stars, rise(z, *theta[:4])
    x = np.arange(d.u[:, 0].min() - REACH, d.u[:, 0].max() + REACH + 0.005, 0.01)
    u = np.repeat(s, x.size, axis=0)
    u[:, 0] = np.tile(x, z.size)
    y = model(theta, np.repeat(z, x.size), u, d).reshape(z.size, x.size)
    stars[d.axes[0]] = np.exp2(x[y.argmax(1)])
    return stars, y.max(1)


def bounds(d: Data, family: str) -> tuple[np.ndarray, np.ndarray]:
    """The box the fit may search, each edge a statement the data cannot overrule (so a parameter
    at one is reported, not believed): plateaus within [0, 1]; C0 within 3 decades of the budgets
    run; a rise no flatter than a = 0.05 nor steeper than 5; a penalty k from none to K_MAX; an
    optimum within REACH doublings of the values run at log10 C_ref, moving at most SLOPE_MAX
    doublings per decade; a per-axis ceiling moving by at most the whole [0, 1] across the values run."""
    lo, hi = [0.0, 0.0, d.z.min() - 3, 0.05], [1.0, 1.0, d.z.max() + 3, 5.0]
    for j in range(len(d.axes)):
        lo += [0.0, d.u[:, j].min() - REACH, -SLOPE_MAX]
        hi += [K_MAX, d.u[:, j].max() + REACH, SLOPE_MAX]
    if family == PER_AXIS:
        span = 1.0 / max(1.0, np.ptp(d.u[:, 0]))
        lo, hi = lo + [-span], hi + [span]
    return np.array(lo), np.array(hi)


def starts(d: Data, family: str) -> list[np.ndarray]:
    """A small grid: the optimum low, mid or high in the axis's values and still or rising, a mild
    or a sharp penalty, the rise early or late; a second axis starts mild, at its median, still; a
    per-axis ceiling starts flat."""
    lower, upper = np.quantile(d.y, [0.02, 0.98])
    rest = [v for j in range(1, len(d.axes)) for v in (0.05, float(np.median(d.u[:, j])), 0.0)]
    slope = [0.0] if family == PER_AXIS else []
    return [
        np.array([lower, upper, m, 1.0, k, b0, b1, *rest, *slope])
        for m, k, b0, b1 in itertools.product(
            np.quantile(d.z, [0.5, 0.9]), [0.05, 0.5], np.quantile(d.u[:, 0], [0.1, 0.5, 0.9]), [0.0, 0.5]
        )
    ]


def fit(
    d: Data, family: str, w: np.ndarray | None = None, start: np.ndarray | None = None
) -> tuple[SurfaceFit, np.ndarray]:
    """Weighted least squares from each start (or from `start` alone); the lowest cost wins."""
    sw = np.sqrt(np.ones(d.y.size) if w is None else np.asarray(w, float))
    lo, hi = bounds(d, family)
    best = None
    for p0 in [start] if start is not None else starts(d, family):
        p0 = np.clip(p0, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))
        res = optimize.least_squares(
            lambda p: sw * (model(p, d.z, d.u, d) - d.y),
            p0,
            jac=lambda p: sw[:, None] * jacobian(p, d.z, d.u, d),
            bounds=(lo, hi),
            method="trf",
            x_scale="jac",
        )
        if best is None or res.cost < best.cost:
            best = res
    params = dict(zip(names(d.axes, family), map(float, best.x)))
    edges = dict(zip(names(d.axes, family), zip(lo, hi)))
    return SurfaceFit(family, params, bool(best.success), float(2 * best.cost), at_bound(params, edges)), best.x


def prepare(df: pd.DataFrame, spec: FitSpec, runs: pd.Index, note: bool = True) -> Data:
    """Positive-compute eval points of `df` in log coordinates; the allocation axes those with
    three values or more (`note`: say which were left out; the holdout's fit does not repeat it)."""
    d = df[df[spec.compute] > 0]
    lo, hi = d[spec.metric].min(), d[spec.metric].max()
    if lo < 0 or hi > 1:
        raise ConfigError(f"surface: the model is bounded to [0, 1]; {spec.metric} ranges {lo:.3g}..{hi:.3g}")
    axes = [a for a in holdout.cells(d, spec) if d[a].nunique() >= MIN_AXIS_VALUES]
    few = [a for a in holdout.cells(d, spec) if a != spec.axis and 1 < d[a].nunique() < MIN_AXIS_VALUES]
    if few and note:
        warn(
            f"surface: {few[0]} has {d[few[0]].nunique()} values, too few to place its "
            f"optimum ({MIN_AXIS_VALUES} needed): left out of the model, its cells pooled"
        )
    if spec.axis not in axes or len(d) < MIN_POINTS or (d[axes].to_numpy(float) <= 0).any():
        raise ConfigError(
            f"surface: needs {MIN_POINTS} eval points at {MIN_AXIS_VALUES} or more positive values of {spec.axis} "
            f"(have {len(d)} points, {d[spec.axis].nunique()} values)"
        )
    z, u = np.log10(d[spec.compute].to_numpy(float)), np.log2(d[axes].to_numpy(float))
    return Data(
        z,
        u,
        d[spec.metric].to_numpy(float),
        runs.get_indexer(d[RUN]),
        float((z.min() + z.max()) / 2),
        float((u[:, 0].min() + u[:, 0].max()) / 2),
        axes,
    )


def surface_method(df: pd.DataFrame, spec: FitSpec) -> MethodResult:
    """Both families, one chosen (by `--holdout K`'s predictions where given, else by BIC), then the
    chosen one's parameters, n*(C), B_p*(C) and the value at the optimum on a grid of C over the
    data with bootstrap intervals, and with `--holdout K` its predictions at the K largest budgets."""
    runs = pd.Index(df[RUN].unique())
    d = prepare(df, spec, runs)
    if spec.holdout:
        held = {family: surface_holdout(df, spec, runs, family) for family in FAMILIES}
        family, choice = by_holdout(held)
        best, x = fit(d, family)
        honest = nested_holdout(df, spec, runs, held)
    else:
        fits = {family: fit(d, family) for family in FAMILIES}
        family, choice = by_criterion(fits, d)
        best, x = fits[family]
    grid = np.log10(compute_grid(df[df[spec.compute] > 0], spec.compute, spec.points))
    strata = df.drop_duplicates(RUN).set_index(RUN).loc[runs, spec.axis].to_numpy()
    draws, curves = [], []
    for weights in bootstrap.run_weights(spec.bootstrap, strata, spec.seed):
        refit, theta = fit(d, family, weights[d.run], x)
        if refit.converged:
            draws.append({**refit.params, "_at_bound": refit.at_bound})
            stars, value = optimum(theta, d, grid)
            curves.append(np.vstack([*stars.values(), value]))
    median, interval = bootstrap.summarise(draws, names(d.axes, family))
    sigma = float(np.sqrt(best.sse / max(1, d.y.size - x.size)))
    rows = _optimum_rows(x, d, grid, np.array(curves), df, sigma)
    determined = _determined(best, rows, d, spec)
    entry = {
        "family": family,
        "family_choice": choice,
        "params": best.params,
        "median": median,
        "interval90": interval,
        "converged": best.converged,
        "at_bound": best.at_bound,
        "sse": best.sse,
        "noise_sd": sigma,
        "tie_within": TIE_SD * sigma,
        "points": int(d.y.size),
        "runs": int(runs.size),
        "axes": d.axes,
        "log10_C_ref": d.z_ref,
        f"log2_{spec.axis}_ref": d.u_ref,
        "axis_star_determined": determined,
        "optimum": rows,
        "bootstrap": {
            "resamples": spec.bootstrap,
            "converged": len(draws),
            "at_bound_share": {k: sum(k in dr["_at_bound"] for dr in draws) / len(draws) for k in names(d.axes, family)}
            if draws
            else {},
        },
    }
    if not best.converged:
        warn("surface: least squares did not converge")
    if spec.holdout:
        entry["holdout"] = honest
    frame = pd.DataFrame(
        {
            "compute": 10**d.z,
            "value": d.y,
            **{a: np.exp2(d.u[:, j]) for j, a in enumerate(d.axes)},
            "fit": model(x, d.z, d.u, d),
        }
    )
    return MethodResult(entry, {"surface": frame, "optimum": pd.DataFrame(rows)})


def surface_holdout(df: pd.DataFrame, spec: FitSpec, runs: pd.Index, family: str) -> dict:
    """One family fitted below the K largest budgets, scored at them (holdout.py)."""
    train, held = holdout.split(df, spec, spec.holdout, "surface")
    d = prepare(train, spec, runs, note=False)
    law, theta = fit(d, family)

    def predict(computes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        stars, value = optimum(theta, d, np.log10(computes))
        return stars[spec.axis], value

    out = holdout.entry(spec.holdout, train, spec, holdout.score(df, spec, held, predict))
    out.update(family=family, params=law.params, converged=law.converged, at_bound=law.at_bound)
    return out


def nested_holdout(df: pd.DataFrame, spec: FitSpec, runs: pd.Index, held: dict[str, dict]) -> dict:
    """The procedure's held-out error: `held` (each family fitted below the K largest budgets and
    scored at them) for the family the training budgets choose without them: by the holdout of
    their own K largest where they have K + 3 budgets, else by BIC on the training points."""
    train, _ = holdout.split(df, spec, spec.holdout, "surface")
    if np.unique(train.loc[train[spec.compute] > 0, spec.compute]).size >= spec.holdout + 3:
        family = by_holdout({f: surface_holdout(train, spec, runs, f) for f in FAMILIES})[0]
        how = f"holdout of the {spec.holdout} largest training budgets"
    else:
        d = prepare(train, spec, runs, note=False)
        family = by_criterion({f: fit(d, f) for f in FAMILIES}, d)[0]
        how = "bic on the training points"
    return {**held[family], "chosen_by": how}


def by_holdout(held: dict[str, dict]) -> tuple[str, dict]:
    """The per-axis family where its held-out n* errors (mean absolute log2 over the held budgets)
    are smaller than the shared family's by more than TIE_DOUBLINGS, else the shared one. Smaller
    by less is a tie, as the observed n* is the best cell, a grid value read through the noise of
    cells near the top; a tie goes to the simpler law. The value errors are reported, not used:
    between the families they differ by about their noise where the ceiling is shared, and where
    it is not the per-axis family's linear ceiling overshoots a ceiling that flattens in log n
    (module docstring), so they would pick the family that misplaces n*."""
    scores = {f: _held_scores(h) for f, h in held.items()}
    n = [scores[f]["mean_abs_axis_star_log2_error"] for f in FAMILIES]
    shared, per = (np.inf if v is None else v for v in n)
    return (PER_AXIS if per < shared - TIE_DOUBLINGS else SHARED), {"by": "holdout", "scores": scores}


def _held_scores(h: dict) -> dict:
    """A family's held-out predictions and errors (holdout.HeldBudget per budget), the worst, and
    n*'s mean absolute error (what the family is chosen by)."""
    errors = [abs(b["axis_star_log2_error"]) for b in h["budgets"] if np.isfinite(b["axis_star_log2_error"])]
    return {
        "mean_abs_axis_star_log2_error": float(np.mean(errors)) if errors else None,
        "max_abs_axis_star_log2_error": h["max_abs_axis_star_log2_error"],
        "max_abs_value_error": h["max_abs_value_error"],
        "budgets": h["budgets"],
    }


def by_criterion(fits: dict[str, tuple[SurfaceFit, np.ndarray]], d: Data) -> tuple[str, dict]:
    """The per-axis family where its BIC is lower than the shared one's by more than BIC_MARGIN,
    on the points discounted for their correlation within runs: a run's eval points share its seed
    and its cell's misfit, so they count as points / design effect (design_effect), in the
    likelihood and in BIC's log of the sample size; counted as independent, every eval point
    would be evidence for the extra parameter. The margin: on tests/test_fit_surface.py's `grid`
    (one ceiling for every n, reached as a power law) the per-axis family is ahead by 3.4, taking
    the rise's misfit for a ceiling that falls with n, and would misplace n* by 0.6 doublings; on
    its coverage grids it is ahead by 40 to 280."""
    x_per = fits[PER_AXIS][1]
    n = d.y.size / design_effect(model(x_per, d.z, d.u, d) - d.y, d.run)
    bic = {f: float(n * np.log(max(law.sse, 1e-300) / d.y.size) + x.size * np.log(n)) for f, (law, x) in fits.items()}
    return (PER_AXIS if bic[SHARED] - bic[PER_AXIS] > BIC_MARGIN else SHARED), {
        "by": "bic",
        "margin": BIC_MARGIN,
        "effective_points": float(n),
        "design_effect": float(d.y.size / n),
        "scores": {f: {"bic": bic[f], "sse": law.sse, "parameters": int(x.size)} for f, (law, x) in fits.items()},
    }


def design_effect(resid: np.ndarray, run: np.ndarray) -> float:
    """1 + (m - 1) rho: how far m correlated points of a run fall short of m independent ones, rho
    the intraclass correlation of the residuals within runs (the one-way ANOVA estimator, held
    within [0, 1]) and m the runs' mean number of points."""
    groups, index, sizes = np.unique(run, return_inverse=True, return_counts=True)
    if groups.size < 2 or sizes.max() < 2:
        return 1.0
    means = np.bincount(index, resid) / sizes
    within = ((resid - means[index]) ** 2).sum() / (resid.size - groups.size)
    between = (sizes * (means - resid.mean()) ** 2).sum() / (groups.size - 1)
    m0 = (resid.size - (sizes**2).sum() / resid.size) / (groups.size - 1)
    rho = float(np.clip((between - within) / (between + (m0 - 1) * within), 0.0, 1.0)) if between + within > 0 else 0.0
    return 1 + (resid.size / groups.size - 1) * rho


def _optimum_rows(
    theta: np.ndarray, d: Data, grid: np.ndarray, curves: np.ndarray, df: pd.DataFrame, sigma: float
) -> list[dict]:
    """Per budget of the grid: each axis's optimum and the value there, with bootstrap median and
    5%-95% (`<axis>_star_low` ...), whether the optimum lies within the values run, and
    `<axis>_star_set`: the values run whose surface value (the other axes at their optimum) is
    within TIE_SD sd of the fit's residual noise of the optimum's, the frontier's rule for a tie:
    the data do not tell them apart."""
    stars, value = optimum(theta, d, grid)
    cols = [*(f"{a}_star" for a in d.axes), "value"]
    estimates = np.vstack([*stars.values(), value])
    band = np.quantile(curves, [0.5, 0.05, 0.95], axis=0) if curves.size else None
    rows = []
    for i, z in enumerate(grid):
        row = {"compute": float(10**z)}
        for j, col in enumerate(cols):
            row[col] = float(estimates[j, i])
            if band is not None:
                row.update(
                    {
                        f"{col}_median": float(band[0, j, i]),
                        f"{col}_low": float(band[1, j, i]),
                        f"{col}_high": float(band[2, j, i]),
                    }
                )
        for j, a in enumerate(d.axes):
            row[f"{a}_star_within_grid"] = bool(df[a].min() <= row[f"{a}_star"] <= df[a].max())
            run = np.unique(d.u[:, j])
            u = np.tile(np.log2(estimates[: len(d.axes), i]), (run.size, 1))
            u[:, j] = run
            y = model(theta, np.full(run.size, z), u, d)
            row[f"{a}_star_set"] = [plain(v) for v in np.exp2(run[y >= value[i] - TIE_SD * sigma])]
        rows.append(row)
    return rows


def _determined(best: SurfaceFit, rows: list[dict], d: Data, spec: FitSpec) -> bool:
    """Whether the data place axis*: not when its penalty k is pinned at 0 (with a shared ceiling
    the axis does not matter to the fit; with a per-axis one only the ceiling moves with it, so
    axis* runs to the edge of the search, wherever the ceiling is highest), nor when every value run
    is tied with the optimum at the largest budget, nor when axis*'s 90% interval at the largest
    budget spans every value run."""
    axis = spec.axis
    if f"k_{axis}" in best.at_bound and best.params[f"k_{axis}"] < K_MAX / 2:
        why = (
            f"{axis} does not matter to the fit"
            if best.family == SHARED
            else f"{axis} moves only the ceiling, so {axis}* is the edge of the search"
        )
        warn(f"surface: k_{axis} is pinned at 0: {why}, so {axis}*(C) is not determined")
        return False
    top = rows[-1]
    if len(top[f"{axis}_star_set"]) == np.unique(d.u[:, 0]).size:
        warn(
            f"surface: at the largest budget every {axis} run is within {TIE_SD:g} sd of the noise of the optimum: "
            f"{axis} does not matter there as far as the data tell, so {axis}*(C) is not determined"
        )
        return False
    lo, hi = top.get(f"{axis}_star_low"), top.get(f"{axis}_star_high")
    values = np.exp2(d.u[:, 0])
    if lo is not None and lo <= values.min() and hi >= values.max():
        warn(
            f"surface: {axis}*'s 90% interval at the largest budget ({lo:.3g}..{hi:.3g}) spans every {axis} run "
            f"({plain(values.min())}..{plain(values.max())}): {axis}*(C) is not determined"
        )
        return False
    return True
