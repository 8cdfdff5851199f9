"""Continuing a sweep's runs to a larger budget instead of starting them over.

A run is a trajectory (what it computes step by step: `trajectory`) taken to a budget. The
learning rate is constant after warm-up and evaluation draws from its own RNG stream, so the run to
2C records the run to C's points and goes on. A run id hashes the budget too, so a sweep whose
budgets grew plans new run ids; each new cell whose trajectory an earlier cell of the sweep dir ran,
and left a checkpoint of (paused by the adaptive schedule, stopped, or finished with
`checkpoint.keep_final`), takes over that run's directory and resumes from its checkpoint.

The takeover is crash-safe in three steps, each repeated harmlessly by a rerun: the manifest names
the new cell and what it `continues` (the old cell leaves it); the old run, if finished, is marked
paused where it ended; its directory is renamed to the new run id.

A single run (`isoflop run`) given a dir that holds its finished self continues it the same way
where it kept its state at its end and is planned further (`sealed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import OmegaConf

from isoflop_cli import grid
from isoflop_cli.config import identity
from isoflop_cli.store import FINISHED, PAUSED, Manifest, RunFiles, SweepDir


@dataclass(frozen=True)
class Continuation:
    old: str  # the earlier cell's run id
    new: str  # the cell of this sweep that continues it
    reached: float  # where the earlier run's eval points end, on the budget column


def trajectory(cfg) -> str:
    """The trajectory of the run `cfg` (`identity.trajectory`): its content, the ledger column its
    budgets are in and its learning rate."""
    return identity.trajectory(cfg, grid.budget_column(cfg.grid), grid.learning_rate(cfg.algo, cfg.n * cfg.B_p))


def sealed(files: RunFiles, plan: grid.RunPlan) -> list[dict] | None:
    """The eval points of the finished run in `files`, which stays as it is (a stale job, a requeue
    that came late, a user rerunning it), unless it kept its state at its end (checkpoint.keep_final)
    and `plan` goes further: then, as when it is not finished, None (the run runs, from its checkpoint)."""
    finished = files.finished_rows()
    if finished and (plan.reached_by(finished) or not files.has_checkpoint()):
        return finished
    return None


def find(sweep_dir: SweepDir, cells: list[grid.Cell]) -> list[Continuation]:
    """The cells of `cells` that continue a run the sweep dir holds under another id: same trajectory,
    a checkpoint left, and not past the new cell's budget (the furthest such run where several are)."""
    before = sweep_dir.manifest().cells
    new_ids = {c.run_id for c in cells if c.feasible}
    runs: dict[str, tuple[float, str]] = {}  # trajectory -> (reached, old run id)
    for rid in before:
        files = sweep_dir.run(rid)
        if rid in new_ids or not files.has_checkpoint() or not files.config.exists():
            continue
        cfg = OmegaConf.load(files.config)
        rows = files.read_metrics()
        reached = float(rows[-1][grid.budget_column(cfg.grid)]) if rows else 0.0
        key = trajectory(cfg)
        if key not in runs or reached > runs[key][0]:
            runs[key] = (reached, rid)
    if not runs:
        return []
    found = []
    for cell in cells:
        if not cell.feasible or cell.run_id in before or sweep_dir.run(cell.run_id).dir.exists():
            continue
        key = trajectory(cell.cfg)
        if key in runs and runs[key][0] <= cell.plan.limit:
            found.append(Continuation(old=runs[key][1], new=cell.run_id, reached=runs[key][0]))
            del runs[key]
    return found


def restarted(sweep_dir: SweepDir, cells: list[grid.Cell], gone: list[str]) -> int:
    """How many of the cells `gone` from the sweep dir's grid this grid would run again from the
    start: the same trajectory, without a checkpoint to continue from."""
    keys = {trajectory(c.cfg) for c in cells if c.feasible}
    return sum(
        1
        for rid in gone
        if sweep_dir.run(rid).config.exists() and trajectory(OmegaConf.load(sweep_dir.run(rid).config)) in keys
    )


def take_over(sweep_dir: SweepDir, manifest: Manifest) -> None:
    """Move each run the manifest's cells continue into their own directories (after the manifest
    records it: see the module's docstring)."""
    for rid, cell in manifest.cells.items():
        if cell.continues is None:
            continue
        old, new = sweep_dir.run(cell.continues), sweep_dir.run(rid)
        if new.dir.exists() or not old.dir.exists():
            continue
        status = old.status()
        if status.state == FINISHED:  # finished at the smaller budget: paused short of this one
            rows = old.read_metrics()
            column = grid.budget_column(OmegaConf.load(old.config).grid)
            old.set_status(
                PAUSED, step=rows[-1]["step"], M=status.M, paused_at=rows[-1][column], **{column: rows[-1][column]}
            )
        old.dir.rename(new.dir)
