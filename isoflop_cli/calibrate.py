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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from isoflop_cli import config as config_mod
from isoflop_cli import grid as grid_mod
from isoflop_cli import sweep
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
    atomic_write(dest.config_file, config_mod.to_yaml(cfg))
    manifest = Manifest(name=cfg.name, kind=CALIBRATION)
    for start, stop in slices(rows, cfg.calibrate.shard):
        rid = f"rows-{start:07d}-{stop:07d}_{digest}"
        part = cfg.copy()
        part.calibrate.rows = [start, stop]
        atomic_write(dest.run(rid).config, config_mod.to_yaml(part))
        before = old.get(rid, CellState())
        manifest.cells[rid] = CellState(rows=[start, stop], state=before.state, submission_id=before.submission_id, attempts=before.attempts)
    dest.write_manifest(manifest)
    return manifest


def total_rows(manifest: Manifest) -> int:
    """The rows of task.train a calibration's slices cover (all of them: `slices`)."""
    return max((cell.rows[1] for cell in manifest.cells.values()), default=0)


def run(cfg: DictConfig, dest: SweepDir, config: str | None, overrides: list[str], view: sweep.View) -> tuple[dict, dict[str, str]]:
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
    df = pd.concat(parts, ignore_index=True).sort_values("problem_id").reset_index(drop=True) if parts else pd.DataFrame()
    atomic_write(dest.path / RESULT, df.to_parquet(index=False))
    source = records(Path(cfg.task.train), "task.train")
    summary = {"rows": rows, "calibrated": len(df), "left_out": rows - len(df), "samples": cfg.calibrate.samples,
               "bands": []}
    for band in (Band("easy", *cfg.calibrate.easy), Band("hard", *cfg.calibrate.hard)):
        chosen = df[band.holds(df["pass_rate"])] if not df.empty else df
        path = dest.path / f"{band.name}.parquet"
        subset = pd.DataFrame([source[i] for i in chosen["problem_id"]]).assign(**{CALIBRATED: chosen["mean_response_tokens"].to_numpy()})
        atomic_write(path, subset.to_parquet(index=False) if len(chosen) else pd.DataFrame().to_parquet())
        tokens = float(chosen["mean_response_tokens"].mean()) if len(chosen) else None
        summary["bands"].append({"name": band.name, "range": [band.low, band.high], "problems": len(chosen), "path": str(path),
                                 "mean_response_tokens": tokens, **_sweep_flops(config, overrides, path, tokens)})
    write_json(dest.path / "summary.json", summary)
    if not df.empty:
        _histogram(df, summary, dest.path / "calibration")
    return summary


def _sweep_flops(config: str | None, overrides: list[str], path: Path, tokens: float | None) -> dict:
    """Predicted FLOPs of the sweep on this set: at the config's bounds, and with task.max_new_tokens
    at the measured mean response length; or why it cannot be planned (too few problems ...)."""
    out = {}
    for key, extra in (("sweep_flops_bound", []), ("sweep_flops_measured", [f"task.max_new_tokens={max(1, math.ceil(tokens or 1))}"])):
        try:
            cfg = config_mod.load(config, [*overrides, f"task.train={path}", "task.val=null", *extra])
            cells = grid_mod.expand(cfg, recompose=lambda more, e=extra: config_mod.load(config, [*overrides, f"task.train={path}", "task.val=null", *e, *more]))
            out[key] = sum(c.plan.predicted_flops["flops_total"] for c in cells if c.feasible)
        except ConfigError as e:
            out[key], out["why_not"] = None, str(e)
    return out


def _histogram(df: pd.DataFrame, summary: dict, stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = summary["samples"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    edges = [(i - 0.5) / samples for i in range(samples + 2)]  # one bar per possible count of correct samples
    ax.hist(df["pass_rate"], bins=edges, color="#4c72b0")
    for band, color in zip(summary["bands"], ("#55a868", "#c44e52")):
        low, high = band["range"]
        ax.axvspan(low - 0.5 / samples, high + 0.5 / samples, color=color, alpha=0.15, label=f"{band['name']} [{low:g}, {high:g}]: {band['problems']}")
    ax.set_xlabel(f"base model pass rate (avg@{samples})")
    ax.set_ylabel("problems")
    ax.legend(fontsize=8)
    ax.set_title(f"{summary['calibrated']} problems calibrated")
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(stem.with_suffix(suffix))
    plt.close(fig)


def finished_slices(dest: SweepDir) -> int:
    return sum(dest.run(rid).status().state == FINISHED for rid in dest.manifest().cells)
