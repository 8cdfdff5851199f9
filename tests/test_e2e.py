"""End to end through a real local Ray head, real torch training and real files."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest
from conftest import may_thaw, run_isoflop
from test_head import assert_all_gone, head_tree, job_procs, read_head, wait_for

pytestmark = pytest.mark.e2e

SMALL = [
    "grid.n=[2,4]",
    "grid.B_p=[2,4]",
    "grid.budgets=[64,256]",
    "grid.eval_points=4",
    "eval.problems=32",
    "eval.samples=4",
]
COLUMNS = [
    "run_id",
    "n",
    "B_p",
    "model",
    "reward",
    "algo",
    "seed",
    "lr",
    "step",
    "rollouts",
    "tokens_generated",
    "train_reward_mean",
    "val_avg@k",
    "val_best@k",
    "val_worst@k",
    "wall_s",
    "flops_search",
    "flops_learning",
    "flops_reward",
    "flops_total",
    "rho",
    "reward_cpu_s",
    "flops_eval",
]


def expected_rows(sweep_dir: Path) -> int:
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    return sum(len(c["eval_steps"]) for c in manifest["cells"].values())


def assert_head_stopped(sweep_dir: Path) -> None:
    assert not (sweep_dir / "ray-head.json").exists()
    out = subprocess.run(["pgrep", "-f", f"isoflop_cli.head .*{sweep_dir}"], capture_output=True, text=True).stdout
    assert not out.strip(), f"local head still running: {out}"


def assert_a_whole_sweep(sweep_dir: Path, stdout: str, top: float) -> None:
    """What a finished sweep (budgets up to `top` rollouts) holds and shows, however it got there:
    every eval point once, with the ledger's columns; per-problem records that add up to each
    point's avg@k; a training reward that rises in some cell; the frontier in the sweep's output and
    from `isoflop fit` (CSV, PNG, SVG); every cell finished in `isoflop status`."""
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert set(COLUMNS) <= set(df.columns)
    assert df["run_id"].nunique() == 4
    assert len(df) == expected_rows(sweep_dir)
    assert not df.duplicated(["run_id", "step"]).any()
    assert (df["rollouts"] == df["step"] * df["n"] * df["B_p"]).all()
    assert df.groupby("run_id")["rollouts"].max().le(top).all()
    trained = df[df["step"] > 0]
    assert (
        trained["flops_total"] == trained["flops_search"] + trained["flops_learning"] + trained["flops_reward"]
    ).all()
    assert trained["rho"].between(0, 1, inclusive="neither").all()
    for run_dir in (sweep_dir / "runs").iterdir():
        assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
        assert "Running entrypoint" in (run_dir / "job.log").read_text()
    assert "frontier" in stdout
    # Per-problem records beside the results: every eval point's 32 validation problems, adding up to its avg@k.
    problems = pd.read_parquet(sweep_dir / "problems.parquet")
    per_point = problems.groupby(["run_id", "step"]).agg(
        count=("problem_id", "size"), correct=("correct", "sum"), samples=("samples", "sum")
    )
    assert len(per_point) == len(df) and (per_point["count"] == 32).all()
    joined = df.set_index(["run_id", "step"]).join(per_point)
    assert (joined["correct"] / joined["samples"] - joined["val_avg@k"]).abs().max() < 1e-12
    rewards = df.dropna(subset=["train_reward_mean"])
    assert any(
        g["train_reward_mean"].iloc[1:].max() > g["train_reward_mean"].iloc[0] for _, g in rewards.groupby("run_id")
    )

    result = isoflop("fit", str(sweep_dir))
    assert result.exit_code == 0, result.output
    front = pd.read_csv(sweep_dir / "fit" / "frontier.csv")
    assert list(front.columns) == ["compute", "value", "axis_star"]
    assert front["value"].is_monotonic_increasing and set(front["axis_star"]) <= {2, 4}
    assert front["compute"].max() == pytest.approx(top)
    for ext in ("png", "svg"):
        assert (sweep_dir / "fit" / f"frontier.{ext}").stat().st_size > 1000
    status = isoflop("status", str(sweep_dir))
    assert status.exit_code == 0 and status.stdout.count("finished") >= 4


def isoflop(*args: str):
    """A command that reads a sweep dir (fit, status, logs), run in this process: what it proves is the
    same as from a process of its own (the sweeps stay subprocesses), without one more interpreter
    importing torch and pandas."""
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    return CliRunner().invoke(app, list(args))


def finished_runs(sweep_dir: Path) -> dict[str, tuple[float, str]]:
    out = {}
    for status in (sweep_dir / "runs").glob("*/status.json"):
        if json.loads(status.read_text())["state"] == "finished":
            metrics = status.parent / "metrics.jsonl"
            out[status.parent.name] = (metrics.stat().st_mtime_ns, metrics.read_text())
    return out


def running_run(sweep_dir: Path, past_step: int = 1, steps_left: int = 0) -> str | None:
    """A run whose process runs now (not a status a killed run left), past `past_step`, with at
    least `steps_left` steps to go."""
    for path in (sweep_dir / "runs").glob("*/status.json"):
        status = json.loads(path.read_text())
        if (
            status["state"] == "running"
            and status.get("step", 0) >= past_step
            and status.get("M", 0) - status.get("step", 0) >= steps_left
            and psutil.pid_exists(status.get("pid", -1))
        ):
            return path.parent.name
    return None


def log_streamed_while_running(sweep_dir: Path) -> bool:
    """Some run is running and its run dir already holds its current job's log."""
    cells = json.loads((sweep_dir / "manifest.json").read_text())["cells"]
    for run_id, cell in cells.items():
        run_dir = sweep_dir / "runs" / run_id
        if (run_dir / "status.json").exists() and json.loads((run_dir / "status.json").read_text())[
            "state"
        ] == "running":
            log = run_dir / "job.log"
            if (
                "submission_id" in cell
                and log.exists()
                and f"Running entrypoint for job {cell['submission_id']}" in log.read_text()
            ):
                return True
    return False


def frozen_run(sweep_dir: Path, past_step: int = 1, head: dict | None = None) -> tuple[str, psutil.Process] | None:
    """A run of this sweep's that runs now (on `head`'s Ray, if given), past `past_step`, frozen
    (SIGSTOP) with at least one step still to go: it stays mid-run, however long the test takes to
    act, until `thaw`. (A run that had ended, or reached its last step, by the time it stopped is let
    go: None.) This takes the place of budgets long enough for a kill to land mid-run by luck."""
    run = running_run(sweep_dir, past_step, steps_left=2)
    if run is None or (head is not None and read_head(sweep_dir) != head):
        return None
    path = sweep_dir / "runs" / run / "status.json"
    try:
        proc = psutil.Process(json.loads(path.read_text())["pid"])
        proc.suspend()
    except psutil.NoSuchProcess:
        return None
    status = json.loads(path.read_text())  # final while it is stopped: it writes one per step
    if status["state"] == "running" and status["pid"] == proc.pid and status["step"] < status["M"]:
        return run, proc
    proc.resume()
    return None


def thaw(proc: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.resume()


def test_kill_and_resume_loses_nothing_and_repeats_nothing(tmp_path):
    """kill -9 the CLI (its head and job run on; the rerun reattaches to that head); kill CLI and
    head together (jobs lost: resubmit); lose the head under a running CLI (one line, exit 1, no
    process left); Ctrl-C (jobs and head stopped) after a run saved a checkpoint; then a last rerun
    finishes the sweep, that run resuming from its checkpoint, and the sweep is whole
    (`assert_a_whole_sweep`: what a sweep run once holds). While a run goes, its job's log is in its
    run dir (`isoflop logs` prints it), not only once the job ends.
    Each kill lands mid-run: the run it targets is frozen (SIGSTOP) short of its end until the kill
    has reached it (`frozen_run`, `conftest.may_thaw`), so short budgets do."""
    args = [
        sys.executable,
        "-m",
        "isoflop_cli",
        "sweep",
        "--root",
        str(tmp_path),
        *SMALL,
        "cluster.local_cpus=1",
        "checkpoint.every=4",
        "cluster.log_every_s=0.5",
    ]
    sweep_dir = tmp_path / "default"
    held: list[psutil.Process] = []  # frozen runs, continued whatever happens
    try:
        cli = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(
            lambda: (sweep_dir / "manifest.json").exists() and log_streamed_while_running(sweep_dir),
            300,
            "a running job's log in its run dir",
        )
        wait_for(lambda: len(finished_runs(sweep_dir)) >= 1, 300, "a first finished run")
        _, job = wait_for(lambda: frozen_run(sweep_dir), 300, "a run with steps to go")
        held.append(job)
        head = read_head(sweep_dir)
        cli.kill()
        cli.wait()
        assert job.is_running() and psutil.pid_exists(head["pid"]), "the head and its job outlive a killed CLI"
        first = finished_runs(sweep_dir)

        cli = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        thaw(job)
        wait_for(lambda: len(finished_runs(sweep_dir)) >= len(first) + 1, 300, "another finished run")
        assert read_head(sweep_dir) == head, "the rerun reattached to the running head"
        cli.kill()
        cli.wait()
        os.killpg(head["pid"], signal.SIGKILL)  # the machine loses the head and every job on it

        log = tmp_path / "lost.log"
        cli = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.PIPE, text=True)
        # A run on the rerun's own head (the crash left the old head's file), held short of its end.
        wait_for(lambda: (read_head(sweep_dir) or head)["pid"] != head["pid"], 300, "a new head")
        lost = read_head(sweep_dir)
        run, job = wait_for(lambda: frozen_run(sweep_dir, head=lost), 300, "a run on the new head")
        held.append(job)
        procs = {p.pid: p for p in head_tree(lost["pid"]) + job_procs(sweep_dir)}
        os.killpg(lost["pid"], signal.SIGKILL)  # the head (and every job on it) is lost under a running CLI
        wait_for(lambda: may_thaw(job), 60, "the lost head's run signalled")
        thaw(job)
        _, err = cli.communicate(timeout=120)
        assert cli.returncode == 1 and "Traceback" not in err + log.read_text(), err + log.read_text()[-3000:]
        lines = [
            line for line in err.strip().splitlines() if not line.startswith("warning: ")
        ]  # the plan's power warning (2 n values)
        assert (
            len(lines) == 1
            and lines[0].startswith(f"error: lost the Ray head at {lost['address']}")
            and lines[0].endswith("rerun the same command to resume")
        ), err
        assert_all_gone(procs, [sweep_dir], [lost["temp_dir"]])
        cells = json.loads((sweep_dir / "manifest.json").read_text())["cells"]
        assert cells[run]["state"] == "stopped" and cells[run]["submission_id"].startswith(f"isoflop-{run}-"), cells
        assert json.loads((sweep_dir / "runs" / run / "status.json").read_text())["state"] == "running"  # lost mid-run

        log = tmp_path / "interrupted.log"
        # SIGINT as a terminal's Ctrl-C delivers it: a suite started in the background (`make test &`)
        # ignores SIGINT, and its children would inherit that.
        cli = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        # A run of this CLI's (its process alive: the head's kill left runs marked running), past its
        # first checkpoint (step 4), held short of its end until the Ctrl-C's stop has reached it.
        interrupted, job = wait_for(lambda: frozen_run(sweep_dir, past_step=5), 300, "a run past its first checkpoint")
        held.append(job)
        cli.send_signal(signal.SIGINT)
        wait_for(lambda: may_thaw(job), 60, "the interrupted run signalled")
        thaw(job)
        assert cli.wait(timeout=120) == 130, log.read_text()[-3000:]
        assert_head_stopped(sweep_dir)
        assert not subprocess.run(["pgrep", "-f", f"isoflop_cli run .*{sweep_dir}"], capture_output=True).stdout
        manifest = json.loads((sweep_dir / "manifest.json").read_text())
        assert manifest["cells"][interrupted]["state"] == "stopped", manifest
        second = finished_runs(sweep_dir)
        assert interrupted not in second  # stopped mid-run
    finally:
        for job in held:
            thaw(job)
        if cli.poll() is None:
            cli.kill()
            cli.wait()

    result = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    final = finished_runs(sweep_dir)
    assert len(final) == 4
    for run_id, before in second.items():
        assert final[run_id] == before, f"finished run {run_id} was run again"
    assert "resumed from the checkpoint at step" in isoflop("logs", str(sweep_dir), interrupted).stdout
    assert not (sweep_dir / "runs" / interrupted / "checkpoint").exists()  # removed once the run finished
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    assert all(c["state"] == "finished" for c in manifest["cells"].values())
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(df) == expected_rows(sweep_dir)
    assert not df.duplicated(["run_id", "step"]).any()
    records = [
        json.loads(line)["step"]
        for line in (sweep_dir / "runs" / interrupted / "problems.jsonl").read_text().splitlines()
    ]
    assert (
        sorted(records) == sorted(set(records)) == sorted(df[df["run_id"] == interrupted]["step"])
    )  # per-problem records: none lost, none twice
    assert_head_stopped(sweep_dir)
    assert_a_whole_sweep(sweep_dir, result.stdout, 256)


def test_reward_axis_prm_costs_reward_flops_and_lowers_rho(tmp_path, ray_address):
    """A sweep over reward=[sparse,prm] at equal budget and allocation: only the learned PRM spends
    reward FLOPs, so its rho is lower."""
    # FLOPs only: a short warm start for the policy, and test_prm's PRM (one build for both tests).
    result = run_isoflop(
        "sweep",
        "--root",
        str(tmp_path),
        f"cluster.address={ray_address}",
        "task=arith-steps",
        "grid.n=[4]",
        "grid.B_p=[4]",
        "grid.budgets=[64]",
        "grid.eval_points=2",
        "eval.problems=16",
        "eval.samples=4",
        "+grid.axes={reward:[sparse,prm]}",
        "model.build.steps=100",
        "reward.build.steps=250",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    df = pd.read_parquet(tmp_path / "default" / "results.parquet")
    last = df[df["step"] == df["step"].max()].set_index("reward")
    assert last.loc["sparse", "flops_reward"] == 0 and last.loc["prm", "flops_reward"] > 0
    assert last.loc["prm", "rho"] < last.loc["sparse", "rho"]
    assert last.loc["prm", "reward_cpu_s"] == 0 and last.loc["sparse", "reward_cpu_s"] > 0


def test_flop_budget_sweep_stops_every_run_within_one_step(tmp_path, ray_address):
    from isoflop_cli import config
    from isoflop_cli.grid import step_flops

    overrides = [
        "grid.n=[2,4]",
        "grid.B_p=[2]",
        "grid.budget.unit=flops",
        "grid.budgets=[1e9,2e9]",
        "grid.eval_points=2",
        "eval.problems=16",
        "eval.samples=4",
    ]
    result = run_isoflop("sweep", "--root", str(tmp_path), f"cluster.address={ray_address}", *overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    df = pd.read_parquet(tmp_path / "default" / "results.parquet")
    for n, run in df.groupby("n"):
        bound = sum(step_flops(config.load(None, [*overrides, f"n={n}", "B_p=2"])))  # one step, upper bound
        assert 2e9 <= run["flops_total"].max() < 2e9 + bound
        assert ((run["flops_total"] >= 1e9) & (run["flops_total"] < 1e9 + bound)).any()  # evaluated on the FLOP axis


def test_adaptive_sweep_pauses_cells_behind_the_frontier_and_a_larger_full_sweep_continues_them(tmp_path, ray_address):
    """Cells sampled at temperature 30 (evaluated there too) never draw a right answer, so no group
    has unequal rewards (zero_var_frac 1: no signal), while the others learn: the adaptive schedule
    stops them at a budget, paused at a checkpoint, exactly where its rule says (a learning cell may
    stop too, as a tie within the indifference);
    A later full sweep with a larger budget continues every cell from its checkpoint (the stopped
    ones and, with checkpoint.keep_final, the finished ones), rerunning none of their steps. (That a
    paused run continues as one uninterrupted run would is test_schedule's
    test_a_paused_run_continues_as_if_it_never_stopped; to a larger budget, test_continuation's.)"""
    from isoflop_cli.config.schema import DEFAULT_MARGIN
    from isoflop_cli.fit.data import RUN
    from isoflop_cli.fit.schedule import decide

    grid = [
        "grid.n=[2,4]",
        "grid.B_p=[2]",
        "grid.eval_points=6",
        "eval.problems=64",
        "eval.samples=4",
        "+grid.axes={algo.temperature:[0.6,30.0]}",
        "checkpoint.keep_final=true",
        f"cluster.address={ray_address}",
    ]
    # Two budgets: the rule decides once, at 128, where the noise can be read (eval points at 8 to 256 rollouts). A
    # first budget of 64 cost four jobs more and stopped nothing there, too few points to read the noise (MIN_DOF:
    # test_schedule's test_the_rule_by_hand holds that rule).
    result = run_isoflop("sweep", "--root", str(tmp_path), *grid, "grid.budgets=[128,256]", "grid.schedule=adaptive")
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / "default"
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    stopped = {rid: c for rid, c in manifest["cells"].items() if "stopped_at" in c}
    silent = {rid for rid in manifest["cells"] if "temperature-30.0" in rid}
    assert silent and silent <= set(stopped), manifest
    assert "stopped by the adaptive schedule" in result.stdout
    # The rule, replayed from the recorded points, stops exactly these cells at these budgets.
    df = pd.read_parquet(sweep_dir / "results.parquet").assign(**{RUN: lambda d: d["run_id"]})
    racing = set(df["run_id"])
    for budget in (128,):
        seen = df[df[RUN].isin(racing) & (df["rollouts"] <= budget * 1.1)]
        decisions = decide(seen, budget, [128, 256], DEFAULT_MARGIN)
        halted = {d.run for d in decisions if not d.go}
        assert all(not d.learns for d in decisions if d.run in silent)
        assert halted == {rid for rid, c in stopped.items() if c["stopped_at"] == budget}
        racing -= halted
    for rid, cell in stopped.items():
        run_dir = sweep_dir / "runs" / rid
        assert json.loads((run_dir / "status.json").read_text())["state"] == "paused"
        assert (run_dir / "checkpoint").is_dir()
        assert df[df["run_id"] == rid]["rollouts"].max() == cell["stopped_at"]  # its points are in the results
    assert all((sweep_dir / "runs" / rid / "checkpoint").is_dir() for rid in manifest["cells"])  # checkpoint.keep_final
    before = {rid: read(sweep_dir / "runs" / rid / "metrics.jsonl") for rid in manifest["cells"]}

    result = run_isoflop("sweep", "--root", str(tmp_path), *grid, "grid.budgets=[128,256,512]")  # grid.schedule=full
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 runs continue from where an earlier, smaller budget left them" in result.stdout
    cells = json.loads((sweep_dir / "manifest.json").read_text())["cells"]
    assert sorted(c["continues"] for c in cells.values()) == sorted(before)
    full = pd.read_parquet(sweep_dir / "results.parquet")
    assert set(full["run_id"]) == set(cells) and not full.duplicated(["run_id", "step"]).any()
    assert (full.groupby("run_id")["rollouts"].max() == 512).all()
    for rid, cell in cells.items():
        assert "resumed from the checkpoint" in (sweep_dir / "runs" / rid / "job.log").read_text()
        rows = read(sweep_dir / "runs" / rid / "metrics.jsonl")
        assert rows[: len(before[cell["continues"]])] == before[cell["continues"]]  # nothing rerun


def read(metrics: Path) -> list[dict]:
    """A run's metrics rows without the fields that time it."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if k not in ("wall_s", "reward_cpu_s") and not k.startswith("time_")} for r in rows
    ]
