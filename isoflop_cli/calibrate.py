"""`isoflop calibrate`: the first seed study's easy and hard sets, cut by the base model's pass rate.

The problem file (`task.train`) is split into slices of `calibrate.shard` rows; each slice is a Ray
job (`isoflop calibrate-shard`, see `recipe/calibrate.py`) like a sweep's runs, so a rerun keeps
finished slices and submits the rest. The results are then merged into `DIR/<name>/`:
- `calibration.parquet`: problem_id (the row in the file), prompt, answer, pass_rate, samples,
  mean_response_tokens;
- `easy.parquet`, `hard.parquet`: the file's own rows (verl's schema as it came) whose pass rate is
  in `calibrate.easy` / `calibrate.hard` (bounds included), plus `calibrated_response_tokens` (the
  base model's mean response length on each), from which `plan` predicts a sweep's FLOPs on them;
- `calibration.png` / `.svg`: the histogram of pass rates with both bands;
- the summary: problems per band, their mean response length, and the predicted FLOPs of the
  sweep on each set (at the config's length bounds, and at the measured mean response length).
Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from isoflop_cli import config as config_mod
from isoflop_cli import grid as grid_mod
from isoflop_cli import hub, sweep
from isoflop_cli.config import identity
from isoflop_cli.dispatch import sweep_lock
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import CALIBRATION, FINISHED, CellState, Manifest, SweepDir, atomic_write, write_json
from isoflop_cli.tasks.dataset import CALIBRATED, read_rows, records

RESULT = "calibration.parquet"


@dataclass(frozen=True)
class Band:
    name: str
    low: float
    high: float

    def holds(self, rates: pd.Series) -> pd.Series:
        return rates.between(self.low, self.high)


@dataclass(frozen=True)
class Spread:
    """Whether the problems differ in difficulty beyond what sampling alone gives. With m samples a
    problem's pass rate is binomial around its true rate, so problems of one shared rate still fill
    every band of a histogram (at m = 16 and a rate of 0.1, a third of them land at 1/16 and a
    fifth at 0). Easy and hard sets cut from such a spread are one set cut by chance, and both
    evaluate at the shared rate.

    `difficulty_sd` is the sd of the true per-problem rates by the method of moments (the pass
    rates' variance less the binomial part); `dispersion` their variance over the binomial one
    at the mean rate (1 under one shared rate); `p_value` the chi-square test of one shared rate."""

    mean: float
    difficulty_sd: float
    dispersion: float | None  # None: every sample alike (or one problem), nothing to compare
    p_value: float

    @property
    def shared(self) -> bool:
        """Nothing tells the problems apart: one shared rate is not rejected at the 1% level."""
        return self.p_value >= 0.01


def spread(rates: pd.Series, samples: pd.Series) -> Spread:
    """The Spread of per-problem pass rates, each from its own number of samples."""
    from scipy import stats

    m = samples.to_numpy(float)
    right = rates.to_numpy(float) * m
    mean = right.sum() / m.sum()
    if len(m) < 2 or mean in (0.0, 1.0):  # one problem, or every sample alike: nothing varies
        return Spread(mean=float(mean), difficulty_sd=0.0, dispersion=None, p_value=1.0)
    chi2 = float((((right - m * mean) ** 2) / (m * mean * (1 - mean))).sum())
    inv = float((1 / m).mean())
    between = (float(rates.var(ddof=1)) - mean * (1 - mean) * inv) / (1 - inv)
    return Spread(
        mean=float(mean),
        difficulty_sd=math.sqrt(max(0.0, between)),
        dispersion=chi2 / (len(m) - 1),
        p_value=float(stats.chi2.sf(chi2, len(m) - 1)),
    )


def check(cfg: DictConfig) -> None:
    """What calibration needs, before anything is written."""
    c = cfg.calibrate
    if cfg.task.name != "dataset":
        raise ConfigError("calibrate reads the problems of a file: use task=dataset task.train=PATH")
    if c.samples < 1 or c.shard < 1:
        raise ConfigError(f"calibrate.samples and calibrate.shard must be >= 1, got {c.samples} and {c.shard}")
    for name in ("easy", "hard"):
        band = list(c[name])
        if len(band) != 2 or not 0 <= band[0] <= band[1] <= 1:
            raise ConfigError(f"calibrate.{name} must be [low, high] with 0 <= low <= high <= 1, got {band}")


def slices(rows: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]


def prepare(cfg: DictConfig, dest: SweepDir) -> Manifest:
    """The manifest: one cell per slice of rows, its config with `calibrate.rows` set; finished
    slices of an earlier call are kept as they are. A slice is named by its rows and the digest of
    the file's content: a task.train changed in place (same rows or not) is calibrated anew, never
    merged from the pass rates of its old content."""
    old = dest.manifest().cells
    rows = len(read_rows(cfg.task.train, "task.train", cfg.task.prompt_key, cfg.task.answer_key))
    digest = identity.data_digest(cfg.task.train, "task.train")[:8]
    dest.write_config(config_mod.to_yaml(cfg))
    manifest = Manifest(name=cfg.name, kind=CALIBRATION)
    for start, stop in slices(rows, cfg.calibrate.shard):
        rid = f"rows-{start:07d}-{stop:07d}_{digest}"
        part = cfg.copy()
        part.calibrate.rows = [start, stop]
        dest.run(rid).write_config(config_mod.to_yaml(part))
        before = old.get(rid, CellState())
        manifest.cells[rid] = CellState(
            rows=[start, stop], state=before.state, submission_id=before.submission_id, attempts=before.attempts
        )
    dest.write_manifest(manifest)
    return manifest


def total_rows(manifest: Manifest) -> int:
    """The rows of task.train a calibration's slices cover (all of them: `slices`)."""
    return max((cell.rows[1] for cell in manifest.cells.values()), default=0)


def run(
    cfg: DictConfig, dest: SweepDir, config: str | None, overrides: list[str], view: sweep.View
) -> tuple[dict, dict[str, str]]:
    """Slice task.train, run every unfinished slice as a job (`isoflop calibrate-shard`, no
    preflight), merge the finished ones: the summary, and the slices that did not finish with why.
    The dir has one owner, as a sweep's."""
    with sweep_lock(dest.path):
        prepare(cfg, dest)
        view.prepared(dest)
        states = sweep.drive(dest, cfg, view, command="calibrate-shard", probe=False)
        summary = merge(cfg, dest, config, overrides)
    cells = dest.manifest().cells
    return summary, {rid: cells[rid].error or "" for rid, state in states.items() if state != FINISHED}


def merge(cfg: DictConfig, dest: SweepDir, config: str | None, overrides: list[str]) -> dict:
    """calibration.parquet, easy.parquet, hard.parquet, the histogram and the summary (also written
    as summary.json), from the finished slices."""
    manifest = dest.manifest()
    rows = total_rows(manifest)
    parts = [pd.read_parquet(dest.run(rid).dir / RESULT) for rid in manifest.cells if dest.run(rid).finished()]
    df = (
        pd.concat(parts, ignore_index=True).sort_values("problem_id").reset_index(drop=True)
        if parts
        else pd.DataFrame()
    )
    atomic_write(dest.path / RESULT, df.to_parquet(index=False))
    source = records(hub.data_file(cfg.task.train, "task.train"), "task.train")
    summary = {
        "rows": rows,
        "calibrated": len(df),
        "left_out": rows - len(df),
        "samples": cfg.calibrate.samples,
        "spread": asdict(spread(df["pass_rate"], df["samples"])) if not df.empty else None,
        "bands": [],
    }
    for band in (Band("easy", *cfg.calibrate.easy), Band("hard", *cfg.calibrate.hard)):
        chosen = df[band.holds(df["pass_rate"])] if not df.empty else df
        path = dest.path / f"{band.name}.parquet"
        subset = pd.DataFrame([source[i] for i in chosen["problem_id"]]).assign(
            **{CALIBRATED: chosen["mean_response_tokens"].to_numpy()}
        )
        atomic_write(path, subset.to_parquet(index=False) if len(chosen) else pd.DataFrame().to_parquet())
        tokens = float(chosen["mean_response_tokens"].mean()) if len(chosen) else None
        summary["bands"].append(
            {
                "name": band.name,
                "range": [band.low, band.high],
                "problems": len(chosen),
                "path": str(path),
                "mean_response_tokens": tokens,
                **_sweep_flops(config, overrides, path, tokens),
            }
        )
    write_json(dest.path / "summary.json", summary)
    if not df.empty:
        _histogram(df, summary, dest.path / "calibration")
    return summary


def _sweep_flops(config: str | None, overrides: list[str], path: Path, tokens: float | None) -> dict:
    """Predicted FLOPs of the sweep on this set: at the config's bounds, and with task.max_new_tokens
    at the measured mean response length; or why it cannot be planned (too few problems ...)."""
    out = {}
    for key, extra in (
        ("sweep_flops_bound", []),
        ("sweep_flops_measured", [f"task.max_new_tokens={max(1, math.ceil(tokens or 1))}"]),
    ):
        try:
            cfg = config_mod.load(config, [*overrides, f"task.train={path}", "task.val=null", *extra])
            cells = grid_mod.expand(
                cfg,
                recompose=lambda more, e=extra: config_mod.load(
                    config, [*overrides, f"task.train={path}", "task.val=null", *e, *more]
                ),
            )
            out[key] = sum(c.plan.predicted_flops["flops_total"] for c in cells if c.feasible)
        except ConfigError as e:
            out[key], out["why_not"] = None, str(e)
    return out


def _histogram(df: pd.DataFrame, summary: dict, stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from isoflop_cli.fit.plots import write_figure

    samples = summary["samples"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    edges = [(i - 0.5) / samples for i in range(samples + 2)]  # one bar per possible count of correct samples
    ax.hist(df["pass_rate"], bins=edges, color="#4c72b0")
    if summary["spread"] and (df["samples"] == samples).all():
        from scipy import stats

        counts = range(samples + 1)
        ax.plot(
            [k / samples for k in counts],
            len(df) * stats.binom.pmf(counts, samples, summary["spread"]["mean"]),
            "k.--",
            lw=1,
            label=f"one shared rate ({summary['spread']['mean']:.3f}): sampling alone",
        )
    for band, color in zip(summary["bands"], ("#55a868", "#c44e52")):
        low, high = band["range"]
        ax.axvspan(
            low - 0.5 / samples,
            high + 0.5 / samples,
            color=color,
            alpha=0.15,
            label=f"{band['name']} [{low:g}, {high:g}]: {band['problems']}",
        )
    ax.set_xlabel(f"base model pass rate (avg@{samples})")
    ax.set_ylabel("problems")
    ax.legend(fontsize=8)
    ax.set_title(f"{summary['calibrated']} problems calibrated")
    write_figure(fig, stem)


def finished_slices(dest: SweepDir) -> int:
    return sum(dest.run(rid).status().state == FINISHED for rid in dest.manifest().cells)
