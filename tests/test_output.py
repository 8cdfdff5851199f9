"""Output that reads anywhere: where no terminal reads it (a SLURM log, CI, `| tee`) tables are not
cut to 80 columns, counts are whole numbers, every command that prints a table prints one JSON
object with --json (and nothing else on stdout), one name per thing (`run`, `--root`), and the
version and -h."""

import json
import os
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli import cli
from isoflop_cli.cli import app
from isoflop_cli.fit.report import fmt
from isoflop_cli.store import CellState, Manifest, SweepDir

runner = CliRunner()
LONG_RUN = "n16_bp64_s0_model-qwen2.5-7b-instruct_reward-sparse_algo.kl_coef-0.001_0123456789abcdef"
WIDE_PLAN = ["grid.n=[2,4]", "grid.B_p=[8]", "grid.budgets=[8192,32768]", "+grid.axes={algo.kl_coef:[0.001,0.0001]}"]


@pytest.fixture(autouse=True)
def narrow(monkeypatch):
    """A narrow COLUMNS, as a batch job may inherit, read when the consoles are made: it must not
    narrow output no terminal reads."""
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setattr(cli, "console", cli.report.Output())
    monkeypatch.setattr(cli, "err", cli.report.Output(stderr=True))


def status_sweep(tmp_path) -> SweepDir:
    """Two runs, one with a long id, 24,160 rollouts in its ledger (a float, as the learner keeps it)."""
    sweep = SweepDir(tmp_path / "default")
    sweep.path.mkdir(parents=True)
    cell = {"M": 2000, "columns": {"n": 16, "B_p": 64}}
    sweep.write_manifest(
        Manifest(
            cells={
                LONG_RUN: CellState(**cell, state="submitted"),
                "n2_bp2_s0_0123abcd": CellState(**cell, state="pending"),
            }
        )
    )
    files = sweep.run(LONG_RUN)
    files.dir.mkdir(parents=True)
    files.set_status("running", step=24, M=2000, rollouts=24160.0, pid=os.getpid(), started=1.0)
    files.append_metrics({"step": 24, "rollouts": 24160.0, "val_avg@k": 0.4567, "wall_s": 123.25})
    return sweep


def test_status_piped_keeps_the_run_ids_and_counts_whole(tmp_path):
    sweep = status_sweep(tmp_path)
    result = runner.invoke(app, ["status", str(sweep.path)])
    assert result.exit_code == 0, result.output
    assert LONG_RUN in result.output and "…" not in result.output
    assert "24,160" in result.output and "24160.0" not in result.output  # a count, not a float
    header = next(line for line in result.output.splitlines() if "status" in line and "rollouts" in line)
    assert re.search(r"\brun\b", header) and "cell" not in header  # the id `logs` takes is a run's
    assert runner.invoke(app, ["logs", str(sweep.path), LONG_RUN]).exit_code == 0


def test_status_json_is_what_its_table_shows(tmp_path):
    sweep = status_sweep(tmp_path)
    result = runner.invoke(app, ["status", "--json", str(sweep.path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    runs = {r["run"]: r for r in data["runs"]}
    assert set(runs) == {LONG_RUN, "n2_bp2_s0_0123abcd"}
    assert (
        runs[LONG_RUN] | {"rollouts": 24160, "step": 24, "M": 2000, "val_avg@k": 0.4567, "wall_s": 123.25}
        == runs[LONG_RUN]
    )
    assert runs["n2_bp2_s0_0123abcd"]["rollouts"] is None and runs["n2_bp2_s0_0123abcd"]["state"] == "pending"
    assert (
        data["totals"]["runs"] == 2
        and data["totals"]["rollouts"] == 24160
        and data["totals"]["states"] == {"running": 1, "pending": 1}
    )
    table = runner.invoke(app, ["status", str(sweep.path)]).output
    for r in data["runs"]:
        assert f"{r['step']}/{r['M']}" in table
    assert data["cost"] in table


def test_plan_piped_keeps_every_value_whole():
    """A plan wider than 80 columns, printed where no terminal reads it: every run's numbers as
    `plan --json` has them, none cut."""
    result = runner.invoke(app, ["plan", *WIDE_PLAN])
    assert result.exit_code == 0, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) > 80
    cells = json.loads(runner.invoke(app, ["plan", "--json", *WIDE_PLAN]).stdout)["cells"]
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert len(rows) == len(cells)
    for row, cell in zip(rows, cells):
        words = row.replace("│", " ").split()
        assert (
            f"{cell['rollouts']:,}" in words and str(cell["M"]) in words and str(cell["axes"]["algo.kl_coef"]) in words
        )


def test_race_pilot_dry_run_json_is_its_plan():
    shown = runner.invoke(app, ["race-pilot", "--dry-run"])
    result = runner.invoke(app, ["race-pilot", "--dry-run", "--json"])
    assert shown.exit_code == 0 and result.exit_code == 0, shown.output + result.output
    assert "…" not in shown.output
    data = json.loads(result.stdout)
    feasible = [c for c in data["cells"] if c["feasible"]]
    assert data["totals"]["cells"] == len(data["cells"]) and data["totals"]["rollouts"] == sum(
        c["rollouts"] for c in feasible
    )
    rows = [line for line in shown.output.splitlines() if line.startswith("│")]
    assert [f"{c['rollouts']:,}" for c in feasible] == [line.replace("│", " ").split()[7] for line in rows]
    assert ", ".join(f"n={v['n']} x {v['updates']}" for v in data["pilot"]["levels"]) in shown.output


def test_fit_json_is_fit_json_with_its_frontier(tmp_path):
    from test_fit_cli import results

    results().to_csv(tmp_path / "r.csv", index=False)
    args = ["fit", str(tmp_path / "r.csv"), "--method", "frontier", "--bootstrap", "0", "--out", str(tmp_path / "fit")]
    shown = runner.invoke(app, args)
    result = runner.invoke(app, [*args, "--json"])
    assert shown.exit_code == 0 and result.exit_code == 0, shown.output + result.output
    data = json.loads(result.stdout)
    assert {k: v for k, v in data.items() if k not in ("answer", "frontier_csv", "written")} == json.loads(
        (tmp_path / "fit" / "fit.json").read_text()
    )
    pd.testing.assert_frame_equal(
        pd.DataFrame(data["frontier_csv"]), pd.read_csv(tmp_path / "fit" / "frontier.csv"), check_dtype=False
    )
    for value in data["frontier"]["params"].values():  # the method table's estimates
        assert fmt(value) in shown.output
    assert "…" not in shown.output


def test_replay_json_is_replay_json_and_its_table(tmp_path):
    from test_fit_cli import results

    # One B_p of test_fit_cli's grid (n 2 to 32; 4 of its 5 cells stop): a third of the whole grid's replay time.
    results().query("B_p == 4").to_csv(tmp_path / "r.csv", index=False)
    args = ["replay", str(tmp_path / "r.csv"), "--out", str(tmp_path / "replay")]
    shown = runner.invoke(app, args)
    result = runner.invoke(app, [*args, "--json"])
    assert shown.exit_code == 0 and result.exit_code == 0, shown.output + result.output
    data = json.loads(result.stdout)
    assert {k: v for k, v in data.items() if k != "written"} == json.loads(
        (tmp_path / "replay" / "replay.json").read_text()
    )
    assert data["stopped_cells"], "a replay that stops no cell shows no count worth checking"
    assert (
        f"{data['compute_share']:.1%} of the full grid's" in shown.output
        and str(len(data["stopped_cells"])) + " cells stopped" in shown.output
    )


def test_calibrate_json_is_its_bands(tmp_path, monkeypatch):
    """The calibration's jobs stubbed: what it prints of the summary they make."""
    from isoflop_cli import calibrate

    summary = {
        "rows": 1200,
        "calibrated": 1100,
        "left_out": 100,
        "samples": 16,
        "spread": None,
        "bands": [
            {
                "name": "easy",
                "range": [0.3, 0.6],
                "problems": 412,
                "mean_response_tokens": 211.5,
                "sweep_flops_bound": 3.2e18,
                "sweep_flops_measured": 1.1e18,
            }
        ],
    }
    monkeypatch.setattr(calibrate, "check", lambda cfg: None)
    monkeypatch.setattr(calibrate, "run", lambda *a: (summary, {}))
    shown = runner.invoke(app, ["calibrate", "--root", str(tmp_path)])
    result = runner.invoke(app, ["calibrate", "--root", str(tmp_path), "--json"])
    assert shown.exit_code == 0 and result.exit_code == 0, shown.output + result.output
    data = json.loads(result.stdout)
    assert data["bands"] == summary["bands"] and data["calibrated"] == 1100 and data["failed"] == {}
    assert all(str(tmp_path) in p for p in data["written"])
    assert "1,100 of 1,200" in shown.output and "412" in shown.output


def test_version_and_h():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and re.fullmatch(
        r"isoflop \S+( \(commit [0-9a-f]{12}(, modified)?\))?\n", result.output
    ), result.output
    assert runner.invoke(app, ["-h"]).output == runner.invoke(app, ["--help"]).output
    for name in ("plan", "status", "logs", "race-pilot"):
        short = runner.invoke(app, [name, "-h"])
        assert short.exit_code == 0 and short.output == runner.invoke(app, [name, "--help"]).output


def test_logs_names_its_argument_a_run():
    assert (
        "RUN" in runner.invoke(app, ["logs", "--help"]).output
        and "RUN_ID" not in runner.invoke(app, ["logs", "--help"]).output
    )


@pytest.mark.parametrize(
    "command, new",
    [
        ("plan", "--root"),
        ("sweep", "--root"),
        ("doctor", "--root"),
        ("calibrate", "--root"),
        ("race-pilot", "--root"),
        ("run", "--run-dir"),
    ],
)
def test_the_old_out_still_works_with_one_line_on_stderr(tmp_path, command, new):
    old = runner.invoke(app, [command, "--out", str(tmp_path), "grid.n=[0]"])  # refused after the option is read
    assert old.exit_code == 2
    assert old.stderr.splitlines()[0] == f"warning: --out is deprecated here: it is now {new}"
    both = runner.invoke(app, [command, "--out", str(tmp_path), new, str(tmp_path)])
    assert both.exit_code == 2 and f"give {new} only" in both.output


def test_a_view_prints_where_it_is_told():
    """--json sends a sweep's progress to stderr: the view prints on the console it is given."""
    assert cli.Terminal(cli.err).out is cli.err and cli.Terminal().out is cli.console
