"""One GRPO run in-process: deterministic on CPU, and its files."""

import json

from typer.testing import CliRunner

from isoflop_cli.cli import app

ARGS = ["n=4", "B_p=2", "grid.budgets=[32]", "grid.eval_points=2", "eval.problems=8", "eval.samples=4"]


def read(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_run_is_deterministic_and_writes_its_files(tmp_path):
    runner = CliRunner()
    for name in ("a", "b"):
        result = runner.invoke(app, ["run", *ARGS, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    a, b = read(tmp_path / "a"), read(tmp_path / "b")
    assert a == b
    assert [r["step"] for r in a] == [0, 2, 4]  # M = 32 // 8; eval points at 16 and 32 rollouts
    assert a[-1]["rollouts"] == 32 and a[-1]["tokens_generated"] > 0
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "finished"
