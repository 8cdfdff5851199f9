"""`isoflop`: a thin Typer layer over config -> grid -> dispatch -> run -> store -> fit.

Commands take Hydra overrides as arguments (`grid.n=[4,8,16] model=tiny-arith`), call `sweep.py`
(or the recipe, the fit, the race) and print. Bad input is one line on stderr and exit code 2,
before anything starts. This module never imports torch: `run` hands the resolved config to the
recipe.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.live import Live
from rich.text import Text

from isoflop_cli import config as config_mod
from isoflop_cli import continuation, launchers, report
from isoflop_cli import cost as cost_mod
from isoflop_cli import grid as grid_mod
from isoflop_cli import sweep as sweep_mod
from isoflop_cli.config import identity
from isoflop_cli.config.schema import DEFAULT_INDIFFERENCE, DEFAULT_MARGIN
from isoflop_cli.dispatch import EXIT_WITH_PARENT, Dispatcher, sweep_lock, watched
from isoflop_cli.errors import ConfigError, LauncherError
from isoflop_cli.processes import die_with_parent
from isoflop_cli.store import (
    FAILED,
    FINISHED,
    PAUSED,
    STOPPED,
    LeaseLost,
    RunFiles,
    SweepDir,
    disk_full_message,
    is_disk_full,
    no_world_writes,
)
from isoflop_cli.sweep import DEFAULT_ROOT

app = typer.Typer(
    help="IsoFLOP sweeps of LLM RL post-training: plan a grid, run it as Ray jobs, fit the frontier.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # click hands them down to every command
)
console = report.Output()
err = report.Output(stderr=True)

OVERRIDES = typer.Argument(None, help="Hydra overrides, e.g. grid.n=[4,8,16] grid.budgets=[512,2048] model=tiny-arith")
CONFIG = typer.Option(
    None, "--config", "-c", help="A ready-made sweep in sweeps/ (by name) or a YAML path (default: default)"
)
OLD_OUT = typer.Option(None, "--out", "-o", hidden=True, help="The old spelling (deprecated).")
MAX_GPU_HOURS = typer.Option(
    None,
    "--max-gpu-hours",
    help="Refuse (exit 2) a sweep predicted to cost more than this many GPU-hours "
    "(CPU-hours on a cluster without GPUs), before any compute.",
)


def version() -> str:
    """isoflop's version and, where it runs from a git checkout, the commit (marked `modified` with
    uncommitted changes to tracked files): a checkout's version number alone does not say which code ran."""
    try:
        text = f"isoflop {importlib.metadata.version('isoflop')}"
    except importlib.metadata.PackageNotFoundError:
        text = "isoflop (not installed)"
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return text
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        changed = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):  # no git here: the version is what can be said
        return text
    if commit.returncode != 0:
        return text
    return f"{text} (commit {commit.stdout.strip()}{', modified' if changed.stdout.strip() else ''})"


def _print_version(asked: bool) -> None:
    if asked:
        print(version())
        raise typer.Exit()


@app.callback()
def _options(
    _version: bool = typer.Option(
        False,
        "--version",
        help="Print isoflop's version (and the git commit it runs from) and exit.",
        is_eager=True,
        callback=_print_version,
    ),
) -> None:
    # The app's own options; each command's are its own.
    pass


def root_option(what: str) -> typer.Option:
    """--root: the output root every sweep lives in, as ROOT/<name> (`what`: what this command does there)."""
    return typer.Option(
        None, "--root", help=f"Output root; the sweep lives in ROOT/<name> (default: {DEFAULT_ROOT}). {what}"
    )


def renamed(new, old, name: str, default=None):
    """An option given by its new name, or by its old spelling `--out` (which meant another thing in
    each command: the output root, a run dir): the old one still works, with one line on stderr."""
    if old is None:
        return default if new is None else new
    if new is not None:
        raise ConfigError(f"--out and {name} are one option (--out is its old spelling): give {name} only")
    err.print(
        Text.assemble(("warning: ", "bold yellow"), f"--out is deprecated here: it is now {name}"), soft_wrap=True
    )
    return old


def print_json(obj) -> None:
    """What `--json` prints: one JSON object, alone on stdout (NaN as null, numpy numbers as numbers);
    warnings and progress go to stderr."""
    from isoflop_cli.fit.outputs import jsonable

    print(json.dumps(jsonable(obj), indent=1))


def print_written(document: dict, table, written: list[Path], as_json: bool) -> None:
    """A command's result: its table and the files it wrote or, with --json, its document with the
    files written as one JSON object."""
    if as_json:
        print_json({**document, "written": list(map(str, written))})
        return
    console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in written)}", soft_wrap=True)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as e:
        err.print(Text.assemble(("error: ", "bold red"), str(e)), soft_wrap=True)
        raise typer.Exit(2) from None


@app.command()
def plan(
    overrides: list[str] | None = OVERRIDES,
    config: str | None = CONFIG,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    root: Path | None = root_option("Its finished runs there refine the FLOP predictions."),
    old_out: Path | None = OLD_OUT,
    replayed: Path | None = typer.Option(
        None,
        "--replay",
        help=(
            "A replay.json of a similar sweep (isoflop replay): the share of the full grid an adaptive schedule "
            "spent there."
        ),
    ),
    max_gpu_hours: float | None = MAX_GPU_HOURS,
    noise_from: Path | None = typer.Option(
        None,
        "--noise-from",
        help="Results of a pilot or a similar sweep (a sweep dir, parquet or CSV): where they hold two or more seeds "
        "of every cell, the power analysis simulates the cells as the pilot shows them, with the pilot's own "
        "uncertainty as a range; else it reads only their noise (else power.seed_sd, power.eval_sd).",
    ),
) -> None:
    """The grid as a table: every cell, its steps M, eval points, rollouts, predicted FLOPs (search,
    learning, reward, rho), wall time and GPU-hours; infeasible cells and why; the schedule's worst
    case, the sweep's cost, and its power: how likely fit is to answer whether n* rises with compute,
    and the seeds per cell that make it 80%. No compute."""
    with user_errors():
        root = renamed(root, old_out, "--root", DEFAULT_ROOT)
        cfg, cells = sweep_mod.load(config, list(overrides or []), root)
        share = None
        if replayed:  # fit/replay.py draws its plots with matplotlib: loaded only when asked
            from isoflop_cli.fit.replay import replayed_share

            share = replayed_share(replayed)
        price = _priced(cfg, cells, root, max_gpu_hours)
        power = _powered(cfg, cells, noise_from)
    if as_json:
        print(json.dumps({**report.plan_json(cells, price), "power": power.entry()}, indent=1))
    else:
        console.print(report.plan_table(cfg, cells, price))
        console.print(report.schedule_line(cfg, cells, share, replayed), soft_wrap=True)
        console.print(report.cost_line(price), soft_wrap=True)
        console.print(power.line(), soft_wrap=True)


def _powered(cfg, cells: list[grid_mod.Cell], noise_from: Path | None = None):
    """The sweep's power analysis (power.py), with a warning before any compute where it is below
    one in two: such a sweep will most likely end without an answer."""
    from isoflop_cli import power

    found = power.of_sweep(cfg, cells, noise_from)
    if found.trend is not None and found.trend < power.WARN_BELOW:
        more = (
            f"{found.seeds_for_80} seeds per cell (grid.seed) reach {power.TARGET:.0%}"
            if found.seeds_for_80 is not None
            else f"not even {power.MAX_SEEDS} seeds per cell reach {power.TARGET:.0%}: widen the grid's budgets or n"
        )
        err.print(
            Text.assemble(
                ("warning: ", "bold yellow"),
                f"this sweep has a {found.trend:.0%} chance to show a rising n* when {found.effect}; {more}",
            ),
            soft_wrap=True,
        )
    return found


def _priced(cfg, cells: list[grid_mod.Cell], root: Path, max_hours: float | None) -> cost_mod.Price:
    """The sweep's predicted cost (calibrated by its finished runs in ROOT/<name>); refused (ConfigError)
    above `max_hours`, naming the total and the costliest cells."""
    if max_hours is not None and not (math.isfinite(max_hours) and max_hours > 0):
        raise ConfigError(f"--max-gpu-hours must be a finite number > 0, got {max_hours}")
    price = cost_mod.price(cfg, cells, SweepDir(root / cfg.name))
    if max_hours is not None and price.hours > max_hours:
        top = ", ".join(f"{rid} {hours:.3g}" for rid, hours in price.costliest(cells))
        raise ConfigError(
            f"the sweep is predicted to cost {price.hours:.3g} {price.unit}, above --max-gpu-hours={max_hours:g} "
            f"(costliest: {top}; {price.source})"
        )
    return price


@app.command()
def sweep(
    overrides: list[str] | None = OVERRIDES,
    config: str | None = CONFIG,
    root: Path | None = root_option(""),
    old_out: Path | None = OLD_OUT,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and stop."),
    extend: bool = typer.Option(
        False,
        "--extend",
        help="Add this grid's cells to a sweep dir that holds other cells (they are kept, and run if unfinished).",
    ),
    max_gpu_hours: float | None = MAX_GPU_HOURS,
) -> None:
    """Expand the grid, run every cell as a Ray job, watch, collect results.parquet, print the frontier.

    Rerunning with the same --root resumes: finished runs are kept, running jobs reattached, lost ones resubmitted.
    With larger budgets, runs left with a checkpoint (paused, stopped, or checkpoint.keep_final) continue from it.
    A sweep dir holding other cells (a changed grid) is refused unless --extend merges the two.
    """
    with user_errors():
        root = renamed(root, old_out, "--root", DEFAULT_ROOT)
        cfg, cells = sweep_mod.load(config, list(overrides or []), root)
        price = _priced(cfg, cells, root, max_gpu_hours)
        if not dry_run:
            sweep_dir = sweep_mod.check(root, cfg, cells)
            continued = sweep_mod.continuations(sweep_dir, cells, extend)
        power = _powered(cfg, cells)  # warned of once the sweep is known to run
    console.print(report.plan_table(cfg, cells, price))
    console.print(report.cost_line(price), soft_wrap=True)
    console.print(power.line(), soft_wrap=True)
    if dry_run:
        return
    with user_errors(), sweep_lock(sweep_dir.path):  # only the sweep that owns the dir writes what it plans to spend
        cost_mod.write(sweep_dir, cells, price)
    if continued:
        console.print(
            f"{len(continued)} runs continue from where an earlier, smaller budget left them (their checkpoints)"
        )
    outcome = _run_sweep(sweep_dir, cfg, cells, continued)
    if not outcome.results.empty:
        compute = "flops_total" if cfg.grid.budget.unit == "flops" else "rollouts"
        console.print(report.frontier_table(outcome.results, metric="val_avg@k", axis="n", compute=compute))
    if outcome.failed:
        raise typer.Exit(1)


@contextlib.contextmanager
def dispatch_errors() -> Iterator[None]:
    """While jobs run: Ctrl-C or SIGTERM (`kill` stops the jobs like Ctrl-C does) leaves the work
    resumable and exits 130; a lost Ray head is one line and exit 1."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    except KeyboardInterrupt:
        err.print("interrupted: jobs stopped; rerun the same command to resume")
        raise typer.Exit(130) from None
    except LauncherError as e:
        err.print(Text.assemble(("error: ", "bold red"), str(e)), soft_wrap=True)
        raise typer.Exit(1) from None


class Terminal(sweep_mod.View):
    """A sweep as the terminal shows it: the sweep dir, a spinner while the preflight probes, then
    the live table of its cells; on `out` (stderr where stdout carries JSON)."""

    def __init__(self, out: report.Output | None = None) -> None:
        self.out = out or console

    def prepared(self, sweep_dir: SweepDir) -> None:
        self.out.print(f"sweep dir: {sweep_dir.path}")

    def probing(self) -> contextlib.AbstractContextManager:
        return self.out.status("preflight: probing the cluster's nodes")

    @contextlib.contextmanager
    def watching(self, dispatcher: Dispatcher) -> Iterator[None]:
        table = lambda: report.sweep_table(dispatcher.sweep)  # noqa: E731
        with Live(table(), console=self.out, refresh_per_second=2) as live:
            dispatcher.on_poll = lambda: live.update(table())
            yield


class LogLines(Terminal):
    """A sweep where no terminal shows it (`make sweep > log`, nohup, CI, a SLURM batch script):
    no live table, which draws only on a terminal, but one line per event (report.events) and a
    summary line every SUMMARY_EVERY_S, each stamped with the time."""

    SUMMARY_EVERY_S = 60.0

    def probing(self) -> contextlib.AbstractContextManager:
        self._line("preflight: probing the cluster's nodes")
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def watching(self, dispatcher: Dispatcher) -> Iterator[None]:
        seen = report.snapshot(dispatcher.sweep)
        self._line(report.summary_line(seen))
        last_summary = time.monotonic()

        def poll() -> None:
            nonlocal seen, last_summary
            now = report.snapshot(dispatcher.sweep)
            for line in report.events(seen, now):
                self._line(line)
            seen = now
            if time.monotonic() - last_summary >= self.SUMMARY_EVERY_S:
                self._line(report.summary_line(now))
                last_summary = time.monotonic()

        dispatcher.on_poll = poll
        try:
            yield
        finally:
            poll()
            self._line(report.summary_line(seen))

    def _line(self, text: str) -> None:
        self.out.print(f"{time.strftime('%H:%M:%S')} {text}", soft_wrap=True, highlight=False)


def _view(out: report.Output | None = None) -> Terminal:
    """The live table on a terminal, one line per event elsewhere (on stdout unless `out` is given)."""
    out = out or console
    return Terminal(out) if out.is_terminal else LogLines(out)


def _run_sweep(
    sweep_dir: SweepDir, cfg, cells: list[grid_mod.Cell], continued=(), out: report.Output | None = None
) -> sweep_mod.Outcome:
    """`sweep.run` under a live table, then how many runs finished and why the others did not
    (on stdout unless `out` is given). Ctrl-C or SIGTERM stops the jobs and exits 130 (rerunning
    resumes); a second sweep on the dir is refused (exit 2); a lost Ray head is one line (exit 1)."""
    out = out or console
    with dispatch_errors(), user_errors():
        outcome = sweep_mod.run(sweep_dir, cfg, cells, continued, _view(out))
    out.print()
    out.print(
        f"{outcome.finished}/{len(outcome.states)} runs finished"
        + (
            f", {outcome.paused} stopped by the adaptive schedule (paused at their checkpoints; grid.schedule=full or "
            "larger grid.budgets continue them)"
            if outcome.paused
            else ""
        )
        + f"; {len(outcome.results)} eval points in {sweep_dir.results_file}",
        soft_wrap=True,
    )
    for rid, why in outcome.failed.items():
        err.print(Text.assemble(("failed ", "red"), f"{rid}: {why}"), soft_wrap=True)
    return outcome


@app.command()
def doctor(
    overrides: list[str] | None = OVERRIDES,
    config: str | None = CONFIG,
    root: Path | None = root_option("The shared-dir check writes there."),
    old_out: Path | None = OLD_OUT,
) -> None:
    """The sweep's preflight alone: on a node of each type, isoflop and Python as the CLI's, the sweep
    dir shared, the model and data readable, vLLM importable (sampler=vllm); and a node with the
    CPUs and GPUs a run asks for. One line per problem, exit 2; nothing is run. The grid is expanded
    and every cell's config checked first, as `sweep` does."""
    with user_errors():
        root = renamed(root, old_out, "--root", DEFAULT_ROOT)
        cfg, cells = sweep_mod.load(config, list(overrides or []), root)
        sweep_dir = sweep_mod.check(root, cfg, cells)
        nodes = sweep_mod.doctor(sweep_dir, cfg, _view())
    for n in nodes:
        console.print(
            f"node {n.host}{f' x{n.count}' if n.count > 1 else ''}: {n.cpus:g} CPU, {n.gpus:g} GPU, isoflop "
            f"{n.version}, Python {n.python}, "
            "sweep dir shared, run files readable" + (", vLLM imports" if n.vllm else ""),
            soft_wrap=True,
        )
    console.print(
        f"ready: a run asks for {cfg.cluster.cpus_per_run:g} CPU and {cfg.cluster.gpus_per_run:g} GPU", soft_wrap=True
    )


@app.command("preflight-probe", hidden=True)
def preflight_probe(
    spec: str = typer.Argument(..., help="The checks, as preflight.check encodes them."),
    here: bool = typer.Option(
        False,
        "--here",
        help="Check this node only (SLURM chose it), instead of a node of each type of the Ray cluster.",
    ),
) -> None:
    """The preflight's probe job (what `doctor` and `sweep` submit)."""
    from isoflop_cli import preflight

    if os.environ.get(EXIT_WITH_PARENT):
        _exit_with_parent()  # a head lost while it probes takes the probe with it
    if here:
        preflight.probe_here(spec)
    else:
        preflight.probe(spec)


@app.command()
def run(
    overrides: list[str] | None = OVERRIDES,
    config: str | None = CONFIG,
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help=f"The run's directory (default: {DEFAULT_ROOT}/single/<run id>)."
    ),
    old_out: Path | None = OLD_OUT,
    pause_at: float | None = typer.Option(
        None,
        "--pause-at",
        help=(
            "Stop at the first step whose ledger reaches this budget, keeping a checkpoint; a later run continues "
            "(adaptive sweeps)."
        ),
    ),
) -> None:
    """One GRPO run in this process: what each Ray job executes, and how to debug a single cell (n=..., B_p=...).
    A run dir that holds a finished run is left as it is (exit 0)."""
    with user_errors():
        if pause_at is not None and not (math.isfinite(pause_at) and pause_at > 0):
            raise ConfigError(f"--pause-at must be a finite budget > 0, got {pause_at}")
        run_dir = renamed(run_dir, old_out, "--run-dir")
        cfg = config_mod.load(config, list(overrides or []))
        config_mod.check_runnable([cfg])
        plan = grid_mod.plan_run(cfg)
        axes = {"n": cfg.n, "B_p": cfg.B_p, "seed": cfg.seed}
        run_dir = config_mod.check_writable(run_dir or DEFAULT_ROOT / "single" / identity.run_id(axes, cfg, plan.key))
        finished = continuation.sealed(RunFiles(run_dir), plan)
    if finished:
        console.print(
            f"{run_dir} holds a finished run: nothing to do (give another --run-dir to run it again)", soft_wrap=True
        )
        console.print(report.metrics_table(finished))
        return
    console.print(
        f"run: n={cfg.n} B_p={cfg.B_p} seed={cfg.seed} M={plan.M} lr={plan.lr:.3g}, to {plan.limit:.4g} {plan.column} "
        f"-> {run_dir}"
    )
    if os.environ.get(EXIT_WITH_PARENT):
        _exit_with_parent()
    from isoflop_cli.recipe.trainer import Budget, train

    try:
        with user_errors():  # what the run finds wrong with the input (a reward function's scores): exit 2, not retried
            rows = train(cfg, Budget(plan.column, plan.limit, plan.eval_at, plan.M), plan.lr, run_dir, pause_at)
    except LeaseLost as e:  # a newer attempt of this run writes its dir now: this one stands down
        err.print(Text.assemble(("stopped: ", "bold yellow"), str(e)), soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(report.metrics_table(rows))


@app.command()
def calibrate(
    overrides: list[str] | None = OVERRIDES,
    config: str | None = CONFIG,
    root: Path | None = typer.Option(
        None, "--root", help=f"Output root: results go to ROOT/<name>/ (default: {DEFAULT_ROOT / 'calibration'})."
    ),
    old_out: Path | None = OLD_OUT,
    as_json: bool = typer.Option(
        False, "--json", help="Print the bands of the table as one JSON object (progress on stderr)."
    ),
) -> None:
    """The first seed study's easy and hard sets: sample calibrate.samples completions per problem of
    task.train from the base model (the sweep's model, sampler and verifier), as Ray jobs of
    calibrate.shard problems (a rerun keeps finished ones), then write calibration.parquet,
    easy.parquet and hard.parquet (the file's own rows, by pass-rate band), a histogram and a summary."""
    from isoflop_cli import calibrate as cal

    overrides = list(overrides or [])
    with user_errors():
        root = renamed(root, old_out, "--root", DEFAULT_ROOT / "calibration")
        cfg = config_mod.load(config, overrides, evaluation=False)
        config_mod.check_runnable([cfg])
        cal.check(cfg)
        launchers.of(cfg.cluster).check()
        dest = SweepDir(config_mod.check_writable(root / cfg.name))
    with dispatch_errors(), user_errors():
        summary, failed = cal.run(cfg, dest, config, overrides, CalibrationProgress(cfg, err if as_json else console))
    written = [
        dest.path / name
        for name in (cal.RESULT, "easy.parquet", "hard.parquet", "calibration.png", "calibration.svg", "summary.json")
    ]
    if as_json:
        print_json({**summary, "written": list(map(str, written)), "failed": failed})
    else:
        console.print(report.calibration_table(summary))
        console.print(f"wrote {', '.join(map(str, written))}", soft_wrap=True)
    for rid, why in failed.items():
        err.print(Text.assemble(("failed ", "red"), f"{rid}: {why}"), soft_wrap=True)
    if failed:
        raise typer.Exit(1)


class CalibrationProgress(sweep_mod.View):
    """A calibration as the terminal shows it: its slices, then a progress bar of finished ones."""

    def __init__(self, cfg, out: report.Output) -> None:
        self.cfg = cfg
        self.out = out  # stderr where stdout carries JSON

    def prepared(self, dest: SweepDir) -> None:
        from isoflop_cli import calibrate as cal

        manifest, c = dest.manifest(), self.cfg.calibrate
        self.out.print(
            f"calibrating {cal.total_rows(manifest):,} problems of {self.cfg.task.train}: {c.samples} samples each, "
            f"{len(manifest.cells)} job(s) of {c.shard} -> {dest.path}",
            soft_wrap=True,
        )

    @contextlib.contextmanager
    def watching(self, dispatcher: Dispatcher) -> Iterator[None]:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from isoflop_cli import calibrate as cal

        dest = dispatcher.sweep
        with Progress(
            TextColumn("jobs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self.out
        ) as progress:
            bar = progress.add_task("calibrate", total=len(dest.manifest().cells), completed=cal.finished_slices(dest))
            dispatcher.on_poll = lambda: progress.update(bar, completed=cal.finished_slices(dest))
            yield


@app.command("calibrate-shard", hidden=True)
def calibrate_shard(
    config: str | None = CONFIG,
    run_dir: Path | None = typer.Option(None, "--run-dir", help="The job's directory (required)."),
    old_out: Path | None = OLD_OUT,
) -> None:
    """One calibration job (what `calibrate` submits): its rows of task.train, in this process."""
    with user_errors():
        run_dir = renamed(run_dir, old_out, "--run-dir")
        if run_dir is None:
            raise ConfigError("calibrate-shard needs --run-dir, the job's directory")
        cfg = config_mod.load(config, [], evaluation=False)
        if cfg.calibrate.rows is None:
            raise ConfigError("calibrate-shard needs calibrate.rows=[start,stop] (isoflop calibrate sets it per job)")
    if os.environ.get(EXIT_WITH_PARENT):
        _exit_with_parent()
    from isoflop_cli.recipe.calibrate import calibrate as calibrate_rows

    df = calibrate_rows(cfg, run_dir)
    console.print(f"rows {cfg.calibrate.rows}: {len(df)} problems, mean pass rate {df['pass_rate'].mean():.3f}")


@app.command()
def status(
    path: Path = typer.Argument(..., help="A sweep directory (ROOT/<name>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the runs and their totals as one JSON object."),
) -> None:
    """The runs of a sweep: each run's id (what `isoflop logs` takes), state, step/M, rollouts so
    far, latest validation metric; runs per state, and the device-hours spent against the plan's."""
    with user_errors():
        sweep_dir = sweep_mod.existing(path)
        data = report.sweep_status(sweep_dir)  # a run's status file that cannot be read is one line
    spent = cost_mod.status_line(sweep_dir)  # device-hours spent against the plan's
    if as_json:
        print_json({**data, "cost": spent})
        return
    console.print(report.status_table(data))
    console.print(spent, soft_wrap=True)


DONE_WITH = (FINISHED, FAILED, STOPPED, PAUSED)  # a cell in these states gets no more log from the sweep


@app.command()
def logs(
    path: Path = typer.Argument(..., help="A sweep directory (ROOT/<name>)."),
    run_id: str = typer.Argument(
        ..., metavar="RUN", help="A run's id, as `isoflop status` lists them in its run column."
    ),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing as the log grows, until the sweep is done with the run."
    ),
) -> None:
    """A run's job log, as the sweep copies it into the run dir (every cluster.log_every_s while the
    job runs, and whole when it ends). --follow shows it live while a sweep is watching the run."""
    with user_errors():
        sweep_dir = sweep_mod.existing(path)
        if run_id not in sweep_dir.manifest().cells:
            raise ConfigError(f"no run '{run_id}' in {path}: `isoflop status {path}` lists its runs")
    with user_errors():  # a log that cannot be read (permissions, a directory in its place) is one line
        shown = _show_log(sweep_dir, run_id, follow)
    if not shown:
        console.print(f"no log yet for {run_id}: its job has not started, or no sweep has watched it", style="dim")


def _show_log(sweep_dir: SweepDir, run_id: str, follow: bool) -> str:
    """Print the run's job.log (with `follow`, as it grows while a sweep watches the run); returns what was shown."""
    files, shown = sweep_dir.run(run_id), ""
    while True:
        text = files.read_log()
        if not text.startswith(shown):  # a retry's job: its own log from the start
            console.print(f"--- {run_id}: a new attempt's log ---", style="dim")
            shown = ""
        sys.stdout.write(text[len(shown) :])
        sys.stdout.flush()
        shown = text
        if not follow or sweep_dir.manifest().cells[run_id].state in DONE_WITH:
            return shown
        if not watched(sweep_dir.path):  # no sweep copies it any more (ended or killed): what is there is all
            console.print(f"--- no sweep is watching {sweep_dir.path}; rerun the sweep to go on ---", style="dim")
            return shown
        time.sleep(0.5)


@app.command()
def fit(
    paths: list[Path] = typer.Argument(
        ..., help="Sweep directories, results parquets or CSVs with the same columns (concatenated)."
    ),
    method: list[str] | None = typer.Option(
        None,
        "--method",
        "-m",
        help="frontier, fixed-batch, scalerl, isoflop-slices, surface, parametric or interference; "
        "repeat for several (default: what the data supports).",
    ),
    metric: str = typer.Option("val_avg@k", help="Metric column (the loss column for parametric)."),
    axis: str = typer.Option(
        "n", help="Grid axis whose compute-optimal value is fitted (n, B_p, model size, rho ...)."
    ),
    compute: str = typer.Option("rollouts", help="Compute column: rollouts or flops_total."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output dir (default: <sweep>/fit, or fit/ beside the file)."
    ),
    size_col: str | None = typer.Option(None, help="parametric: the parameter-count column N."),
    tokens_col: str | None = typer.Option(None, help="parametric: the training-token column D."),
    compute_col: str | None = typer.Option(None, help="parametric: a FLOPs column C, with D = C / (6 N)."),
    holdout: int = typer.Option(
        0,
        help="frontier, surface, scalerl: fit on all but the K largest budgets (distinct compute values of "
        "the eval points) and report the error of axis* and of the value predicted at them.",
    ),
    holdout_frac: float = typer.Option(
        0.0, help="scalerl: hold out this top share of the log-compute range and report the extrapolation error."
    ),
    drop_early: float = typer.Option(
        0.0, help="scalerl: leave out eval points below this fraction of the largest compute."
    ),
    bootstrap: int = typer.Option(200, help="Bootstrap resamples over runs for the 90% intervals (0: none)."),
    seed: int = typer.Option(0, help="Bootstrap seed."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help=(
            "Print one JSON object: fit.json's, with the answer's lines, frontier.csv's rows (frontier_csv) and the "
            "files written."
        ),
    ),
) -> None:
    """Fit frontiers and allocation laws with bootstrap intervals: fit.json, frontier.csv, plots, report.md."""
    from isoflop_cli.fit.command import fit as run_fit
    from isoflop_cli.fit.data import FitSpec

    spec = FitSpec(
        metric=metric,
        axis=axis,
        compute=compute,
        size_col=size_col,
        tokens_col=tokens_col,
        compute_col=compute_col,
        holdout=holdout,
        holdout_frac=holdout_frac,
        drop_early=drop_early,
        bootstrap=bootstrap,
        seed=seed,
    )
    with user_errors():
        fitted = run_fit(paths, spec, list(method or []), out)
    if as_json:
        document = json.loads(next(p for p in fitted.written if p.name == "fit.json").read_text())
        front = fitted.frontier.to_dict("records") if fitted.frontier is not None else None
        print_json(
            {"answer": fitted.answer, **document, "frontier_csv": front, "written": list(map(str, fitted.written))}
        )
    else:
        for line in fitted.answer:
            console.print(line, soft_wrap=True)
        for table in fitted.tables:
            console.print(table)
    for note in fitted.warnings:  # beside the result they qualify
        err.print(Text.assemble(("warning: ", "bold yellow"), note), soft_wrap=True)
    if not as_json:
        console.print(f"wrote {', '.join(str(p) for p in fitted.written)}", soft_wrap=True)


@app.command()
def replay(
    path: Path = typer.Argument(..., help="A recorded full grid: a sweep directory, results parquet or CSV."),
    schedule: str = typer.Option("adaptive", help="The schedule to simulate: adaptive or full."),
    margin: float = typer.Option(
        DEFAULT_MARGIN,
        help="adaptive: how far a cell may trail the frontier, in sd of the metric's noise (grid.margin).",
    ),
    indifference: float = typer.Option(
        DEFAULT_INDIFFERENCE,
        help=(
            "adaptive: a cell that could beat the frontier by no more than this stops, in the metric's units "
            "(grid.indifference)."
        ),
    ),
    budgets: str | None = typer.Option(
        None,
        help="Stage budgets, comma-separated (default: the largest compute halved down to every run's first point).",
    ),
    metric: str = typer.Option("val_avg@k", help="Metric column."),
    axis: str = typer.Option("n", help="Grid axis whose compute-optimal value is compared."),
    compute: str = typer.Option("rollouts", help="Compute column: rollouts or flops_total."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Output dir (default: <sweep>/replay, or replay/ beside the file)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: replay.json's, with the files written."),
) -> None:
    """Simulate a schedule on a recorded full grid (no compute): which cells it stops and when, the
    share of the full grid's compute it spends, and how its frontier and axis*(C) compare: replay.json, plots."""
    from isoflop_cli.fit import replay as replay_mod

    options = replay_mod.ReplayOptions(schedule, margin, indifference, budgets, metric, axis, compute)
    with user_errors():
        replayed = replay_mod.run(path, options, out)
    for note in replayed.notes:
        err.print(Text.assemble(("warning: ", "bold yellow"), note), soft_wrap=True)
    document = json.loads(replayed.written[0].read_text())
    print_written(document, report.replay_table(replayed.result, axis), replayed.written, as_json)


@app.command("race-pilot")
def race_pilot(
    overrides: list[str] | None = OVERRIDES,
    config: str | None = CONFIG,
    root: Path | None = typer.Option(
        None,
        "--root",
        help=(
            f"Output root; the pilot lives in ROOT/<name>-pilot, its analysis in race/ there (default: {DEFAULT_ROOT})."
        ),
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="With --from-results: the output dir (default: race/ beside the results). "
        "Without, the old spelling of --root (deprecated).",
    ),
    target: str = typer.Option(
        "native",
        help=(
            "native (val_native: validation scored by the training reward), downstream (a held-out set's "
            "downstream_*_pass@1, else val_avg@k) or judge (judge_*)."
        ),
    ),
    metric: str | None = typer.Option(None, help="The target column itself (default: the target's column)."),
    from_results: Path | None = typer.Option(
        None, "--from-results", help="Analyse this results file or sweep dir (steps 3-6): no compute."
    ),
    validate_with: Path | None = typer.Option(
        None,
        "--validate-with",
        help=(
            "Full-scale results (a sweep dir or results file): same_regime_rate compares the pilot's call with the "
            "call on them."
        ),
    ),
    force: bool = typer.Option(False, "--force", help="Run a pilot that costs more than --cap of the full sweep."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the pilot plan and its cost, and stop."),
    updates: str = typer.Option(
        "0.0625,0.25,1,4",
        help="Allocation levels: updates per rollout batch (algo.epochs), every level at n = N rollouts "
        "per prompt (N: the sweep's largest n). A whole count u is u passes over the batch; a fraction u < 1 "
        "learns from the u N of each group whose rewards vary the most (rollout down-sampling). rho rises with "
        "updates at the same FLOPs.",
    ),
    budgets: int = typer.Option(3, help="At most this many FLOP budgets (1-3), read off the same runs."),
    share: float = typer.Option(0.10, help="Target pilot cost as a share of the full sweep's predicted FLOPs."),
    cap: float = typer.Option(0.25, help="Refuse a pilot above this share of the full sweep (unless --force)."),
    bootstrap: int = typer.Option(200, help="Bootstrap resamples over runs for the 90% intervals."),
    seed: int = typer.Option(0, help="Bootstrap seed."),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object: the pilot's cells and totals (--dry-run), else regime.json's "
        "with the files written; the pilot's progress on stderr.",
    ),
) -> None:
    """RACE: diagnose the allocation regime (search-, update- or reward-heavy) from a cheap pilot grid
    before the full sweep. Derives the pilot from the sweep's config: levels that trade search
    against learning at the same FLOPs, each N rollouts per prompt learned from `updates` times per
    batch, below one update from a share of each group (--updates 0.0625,0.25,1,4 at N = 16:
    learning from 1, 4 and 16 of each group's 16, and from all 16 four times). Runs it like
    `isoflop sweep` (resumable), fits the target against the log-odds of rho per reward system, and
    recommends what to run at full scale. The pilot identifies a regime; it does not guarantee a
    held-out gain."""
    from isoflop_cli.race import command as race
    from isoflop_cli.race.outputs import pilot_json, pilot_line, summary

    question = race.Question(target, metric, config, list(overrides or []), bootstrap, seed, validate_with)
    with user_errors():
        question = question.checked()
        if from_results is not None:
            result, written = race.from_results(from_results, question, out)
            print_written(result, summary(result), written, as_json)
            return
        root = renamed(root, out, "--root")
        planned = race.plan(question, race.PilotOptions(updates, budgets, share, cap, force), root, dry_run)
    pilot = planned.pilot
    if not as_json:  # its object holds what they show
        console.print(report.plan_table(pilot.cfg, pilot.cells))
        console.print(pilot_line(pilot, planned.spec), soft_wrap=True)
    for note in pilot.notes:
        err.print(Text.assemble(("note: ", "bold yellow"), note), soft_wrap=True)
    if dry_run:
        if as_json:
            print_json(pilot_json(pilot, planned.spec))
        return
    outcome = _run_sweep(planned.sweep_dir, pilot.cfg, pilot.cells, out=err if as_json else console)
    if outcome.failed:
        err.print("the pilot is incomplete: rerun the same command to resume it")
        raise typer.Exit(1)
    with user_errors():
        result, written = race.conclude(planned, outcome.results)
    print_written(result, summary(result), written, as_json)


def main() -> None:
    """The `isoflop` command: the app, with a full disk said as one line wherever it strikes (exit 1;
    partial files are removed where they were written, finished work is kept)."""
    no_world_writes()
    try:
        app(prog_name="isoflop")
    except OSError as e:
        if not is_disk_full(e):
            raise
        err.print(Text.assemble(("error: ", "bold red"), disk_full_message(e)), soft_wrap=True)
        raise SystemExit(1) from None


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _exit_with_parent() -> None:
    """End with the Ray job supervisor that started this run: it ends when the job is stopped or lost."""
    die_with_parent()
    if os.getppid() == 1:  # the parent died before we asked
        raise SystemExit(1)
