"""A sweep from its cells to its results: what the `sweep`, `race-pilot`, `calibrate` and `doctor`
commands do between parsing their options and printing.

    load -> check -> continuations -> run: lock the dir, prepare it (the manifest and each run's
    config), then drive the unfinished cells as jobs on a launcher and collect results.parquet

Each step refuses what it cannot do with a ConfigError (one line, exit 2) before it writes anything;
a lost head is a LauncherError (errors.py), Ctrl-C a KeyboardInterrupt, both leaving the dir resumable. What a
caller shows while jobs run is its `View`. Nothing here imports torch: the runs are jobs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from isoflop_cli import config as config_mod
from isoflop_cli import continuation, launchers, provenance
from isoflop_cli import grid as grid_mod
from isoflop_cli.config import identity
from isoflop_cli.config.schema import Schedule
from isoflop_cli.dispatch import Dispatcher, nothing_to_run, sweep_lock
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import FINISHED, PAUSED, CellState, Infeasible, Manifest, SweepDir, SweepSchedule, on_disk

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_ROOT = Path("isoflop-runs")  # where sweeps live, as ROOT/<name>, unless --root names another
EXTEND_HINT = "rerun with --extend to add this grid's cells to them, or "


def load(config: str | None, overrides: list[str], out: Path) -> tuple[Any, list[grid_mod.Cell]]:
    """The config and its cells; FLOP predictions are scaled by the sweep's finished runs in OUT, if
    any, else by the response lengths calibrate measured on the problem set, if it did."""
    cfg = config_mod.load(config, overrides)
    scale = SweepDir(out / cfg.name).flops_scale()
    if cfg.model.name not in scale and (calibrated := grid_mod.calibrated_scale(cfg)):
        scale[cfg.model.name] = calibrated
    cells = grid_mod.expand(cfg, recompose=lambda extra: config_mod.load(config, overrides + extra), flops_scale=scale)
    return cfg, cells


def check(out: Path, cfg, cells: list[grid_mod.Cell]) -> SweepDir:
    """Before anything is written: every run's config can run, the cluster can take its jobs,
    OUT/<name> is a writable directory whose tree holds no link (`SweepDir.check_tree`), and the
    records its run dirs hold are of their cells (`check_records`); the sweep dir returned."""
    config_mod.check_runnable(grid_mod.run_configs(cells))
    launchers.of(cfg.cluster).check()
    SweepDir(out / cfg.name).check_tree()
    sweep_dir = SweepDir(config_mod.check_writable(out / cfg.name))
    check_records(sweep_dir, cells)
    return sweep_dir


def fingerprint(cell: grid_mod.Cell, cfg=None) -> str:
    """The cell's fingerprint, as its run computes it (`recipe.trainer.train`): what it computes,
    its ledger column and learning rate. `cfg`: the cell's config where made already."""
    return identity.trajectory(cfg or cell.cfg, cell.plan.column, cell.plan.lr)


def check_records(sweep_dir: SweepDir, cells: list[grid_mod.Cell]) -> None:
    """A run dir of this grid that holds records holds its cell's (status.json, metrics and problem
    rows): one copied from another cell or sweep is refused before prepare rewrites its config."""
    for cell in cells:
        if cell.feasible and sweep_dir.run(cell.run_id).status_file.exists():
            files = sweep_dir.run(cell.run_id, fingerprint(cell))
            files.status()
            files.read_metrics()
            files.read_problems()


def continuations(sweep_dir: SweepDir, cells: list[grid_mod.Cell], extend: bool) -> list[continuation.Continuation]:
    """The runs of the dir this grid continues to larger budgets, once `check_same_grid` has let the
    grid in (a run continued is not a cell gone)."""
    continued = continuation.find(sweep_dir, cells)
    check_same_grid(sweep_dir, cells, extend, continued)
    return continued


def check_same_grid(
    sweep_dir: SweepDir,
    cells: list[grid_mod.Cell],
    extend: bool,
    continued: list[continuation.Continuation] = (),
    hint: str = EXTEND_HINT,
) -> None:
    """A sweep dir is never silently narrowed: cells it holds that this grid lacks (and does not
    continue) refuse the sweep unless `extend` keeps them beside the new ones."""
    if extend:
        return
    old = sweep_dir.manifest().cells
    new = {c.run_id for c in cells if c.feasible} | {c.old for c in continued}
    gone = [rid for rid in old if rid not in new]
    if gone:
        twins = continuation.restarted(sweep_dir, cells, gone)
        why = (
            (
                f"; {twins} of them are runs of this grid to a smaller budget, finished without a checkpoint to "
                "continue from (checkpoint.keep_final=true keeps one)"
            )
            if twins
            else ""
        )
        raise ConfigError(
            f"{sweep_dir.path} holds a different grid: {len(gone)} of its {len(old)} cells are not in this one "
            f"(e.g. {gone[0]}){why}; {hint}use another --root or name="
        )


def run_columns(cell: grid_mod.Cell) -> dict[str, Any]:
    """The axis columns of a run's result rows: n, B_p, model, reward, algo, seed, lr and any extra
    axis; and its provenance (the checkpoint, isoflop's version and commit: `provenance`)."""
    cfg = cell.cfg
    columns = {
        "n": cfg.n,
        "B_p": cfg.B_p,
        "model": cfg.model.name,
        "reward": cfg.reward.name,
        "algo": cfg.algo.name,
        "seed": cfg.seed,
        "lr": cell.plan.lr,
        **provenance.columns(cfg.model),
    }
    for key, value in cell.axes.items():
        columns.setdefault(key, value)
    return columns


def schedule_entry(cfg, cells: list[grid_mod.Cell]) -> SweepSchedule:
    """The manifest's schedule: what the dispatcher needs to run it (adaptive: the budgets it decides
    at, the margin and indifference, the ledger column and metric the rule reads)."""
    if cfg.grid.schedule != Schedule.adaptive:
        return SweepSchedule(name=Schedule.full.value)
    column = next(c.plan.column for c in cells if c.feasible)
    return SweepSchedule(
        name=Schedule.adaptive.value,
        budgets=sorted(float(b) for b in cfg.grid.budgets),
        margin=float(cfg.grid.margin),
        column=column,
        metric="val_avg@k",
        indifference=float(cfg.grid.indifference),
    )


def prepare(
    sweep_dir: SweepDir, cfg, cells: list[grid_mod.Cell], continued: list[continuation.Continuation] = ()
) -> None:
    """Write the sweep config, the manifest and each run's config, keeping what earlier runs recorded
    and every cell the dir already held (`check_same_grid` has refused an unasked merge); the cells
    that continue an earlier run take over its directory."""
    old = sweep_dir.manifest().cells
    sweep_dir.write_config(config_mod.to_yaml(cfg))
    continues = {c.new: c.old for c in continued}
    manifest = Manifest(
        name=cfg.name,
        schedule=schedule_entry(cfg, cells),
        cells={rid: cell for rid, cell in old.items() if rid not in continues.values()},
    )
    configs = {}  # run id -> its config.yaml, written once the manifest names the cell
    for cell in cells:
        if not cell.feasible:
            manifest.infeasible.append(Infeasible(axes=cell.axes, reason=cell.reason))
            continue
        if cell.run_id in old:
            before = old[cell.run_id]
        else:
            before = (
                CellState(state=PAUSED, continues=continues[cell.run_id]) if cell.run_id in continues else CellState()
            )
        run_cfg = cell.cfg
        configs[cell.run_id] = config_mod.to_yaml(run_cfg)
        manifest.cells[cell.run_id] = CellState(
            axes=cell.axes,
            columns=run_columns(cell),
            M=cell.plan.M,
            eval_steps=list(cell.plan.eval_steps),
            step_flops=list(cell.plan.step_bound),
            state=before.state,
            fingerprint=fingerprint(cell, run_cfg),
            submission_id=before.submission_id,
            attempts=before.attempts,
            failures=before.failures,
            continues=before.continues,
        )
    sweep_dir.write_manifest(manifest)
    continuation.take_over(sweep_dir, manifest)
    for run_id, text in configs.items():
        sweep_dir.run(run_id).write_config(text)


class View:
    """What a caller shows of a sweep while it runs (the CLI: a spinner, a live table or a progress
    bar); this one shows nothing."""

    def prepared(self, sweep_dir: SweepDir) -> None:
        """The dir is prepared: the manifest names every cell."""

    def probing(self) -> contextlib.AbstractContextManager:
        """Around the preflight probe."""
        return contextlib.nullcontext()

    def watching(self, dispatcher: Dispatcher) -> contextlib.AbstractContextManager:
        """Around the dispatch; it may set `dispatcher.on_poll`."""
        return contextlib.nullcontext()


def preflight(dispatcher: Dispatcher, cfg, view: View, asked: bool = False) -> list:
    """The preflight probe before any run is submitted (unless cluster.preflight=false and not
    `asked` by doctor): the node types it saw; its problems are one ConfigError (exit 2)."""
    if not (asked or cfg.cluster.preflight):
        return []
    with view.probing():
        nodes, problems = dispatcher.preflight(cfg)
    if problems:
        raise ConfigError(
            f"preflight found {len(problems)} problem(s) before any run started:\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    return nodes


def drive(sweep_dir: SweepDir, cfg, view: View, command: str = "run", probe: bool = True) -> dict[str, str]:
    """Every cell of the prepared manifest to the end of its schedule, each attempt a job running
    `isoflop COMMAND` on its run dir (after the preflight, where `probe`); run id -> final state.
    Where every cell is finished already, no launcher starts."""
    launcher = launchers.of(cfg.cluster)
    states = nothing_to_run(sweep_dir, launcher.keeps_logs(sweep_dir.path))
    if states is not None:
        return states
    with launcher.open(sweep_dir.path) as address:
        dispatcher = Dispatcher(sweep_dir, cfg.cluster, address, command=command)
        if probe:
            preflight(dispatcher, cfg, view)
        with view.watching(dispatcher):
            return dispatcher.run()


@dataclass(frozen=True)
class Outcome:
    states: dict[str, str]  # run id -> its final state
    results: pd.DataFrame  # results.parquet, as collected
    failed: dict[str, str]  # the runs that did not finish (nor pause), and why

    @property
    def paused(self) -> int:
        return sum(s == PAUSED for s in self.states.values())

    @property
    def finished(self) -> int:
        return sum(s == FINISHED for s in self.states.values())


def run(
    sweep_dir: SweepDir,
    cfg,
    cells: list[grid_mod.Cell],
    continued: list[continuation.Continuation] = (),
    view: View = View(),
) -> Outcome:
    """Prepare the sweep dir, run every unfinished cell as a job, collect results.parquet. One sweep
    dir has one owner: a second sweep on it while this one runs is refused (ConfigError)."""
    with sweep_lock(sweep_dir.path):
        prepare(sweep_dir, cfg, cells, continued)
        view.prepared(sweep_dir)
        states = drive(sweep_dir, cfg, view)
        results = sweep_dir.collect()
        manifest = sweep_dir.manifest()
    failed = {rid: manifest.cells[rid].error or "" for rid, s in states.items() if s not in (FINISHED, PAUSED)}
    return Outcome(states, results, failed)


def doctor(sweep_dir: SweepDir, cfg, view: View) -> list:
    """The preflight alone, on the sweep's launcher (a local head started for it where none is
    named): the node types it saw; its problems are one ConfigError."""
    with sweep_lock(sweep_dir.path), launchers.of(cfg.cluster).open(sweep_dir.path) as address:
        return preflight(Dispatcher(sweep_dir, cfg.cluster, address), cfg, view, asked=True)


def existing(path: Path) -> SweepDir:
    """A sweep dir that `status` and `logs` read: it exists and holds a readable manifest."""
    with on_disk(path, "read"):  # a name too long, a directory it may not enter: said as that
        there = path.is_dir()
    if not there:
        raise ConfigError(f"no such sweep directory: {path}")
    sweep_dir = SweepDir(path)
    if not sweep_dir.manifest_file.exists():
        raise ConfigError(f"{path} is not a sweep directory (no manifest.json)")
    sweep_dir.manifest()  # refused here, in one line, where it cannot be read
    return sweep_dir
