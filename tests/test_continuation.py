"""A sweep whose budgets grew continues its runs from their checkpoints: which runs continue which,
and the takeover of their directories, including after a crash in the middle of it."""

import json

import pytest
from omegaconf import OmegaConf
from typer.testing import CliRunner

from isoflop_cli import config, continuation, grid
from isoflop_cli.cli import app
from isoflop_cli.continuation import trajectory
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import CHECKPOINT_STATE, FINISHED, PAUSED, RunFiles, SweepDir
from isoflop_cli.sweep import check_same_grid, prepare

runner = CliRunner()
ARGS = ["grid.n=[2,4]", "grid.B_p=[2]", "eval.problems=8"]


def sweep_to(tmp_path, budgets: str, *extra: str):
    cfg = config.load(None, [*ARGS, f"grid.budgets={budgets}", *extra])
    return cfg, grid.expand(cfg), SweepDir(tmp_path / cfg.name)


def ran(sweep: SweepDir, cell, until: int, state: str, checkpoint: bool) -> None:
    """Record `cell` as run to `until` rollouts (its eval points, its state, a checkpoint or not)."""
    files = sweep.run(cell.run_id)
    batch = cell.plan.batch
    rows = [
        {"step": s, "rollouts": s * batch, "flops_total": 1e9 * s, "val_avg@k": 0.1 * s}
        for s in range(0, until // batch + 1, 4)
    ]
    for row in rows:
        files.append_metrics(row)
    if state == FINISHED:
        files.finish(rows, step=rows[-1]["step"], M=cell.plan.M)
    else:
        files.set_status(state, step=rows[-1]["step"], paused_at=rows[-1]["rollouts"], rollouts=rows[-1]["rollouts"])
    if checkpoint:
        (files.checkpoint).mkdir()
        (files.checkpoint / CHECKPOINT_STATE).write_bytes(b"state")


def test_a_trajectory_is_the_run_id_less_its_budget():
    small, large = (grid.expand(config.load(None, [*ARGS, f"grid.budgets={b}"])) for b in ("[64,128]", "[64,256]"))
    assert [c.run_id for c in small] != [c.run_id for c in large]
    assert [trajectory(c.cfg) for c in small] == [trajectory(c.cfg) for c in large]
    assert trajectory(small[0].cfg) != trajectory(small[1].cfg)  # another n
    for other in ("algo.base_lr=2e-4", "algo.lr_scaling=linear", "grid.budget.unit=flops"):
        changed = grid.expand(
            config.load(None, [*ARGS, "grid.budgets=[1e11]" if "flops" in other else "grid.budgets=[64,128]", other])
        )
        assert trajectory(changed[1].cfg) != trajectory(small[1].cfg), other
    # Keeping the final checkpoint changes what a run leaves, not what it computes (nor its id).
    kept = grid.expand(config.load(None, [*ARGS, "grid.budgets=[64,128]", "checkpoint.keep_final=true"]))
    assert [c.run_id for c in kept] == [c.run_id for c in small]
    # A run's config.yaml, read back as plain YAML, names the same trajectory as its cell.
    cell = small[1]
    assert trajectory(OmegaConf.create(config.to_yaml(cell.cfg))) == trajectory(cell.cfg)


def test_runs_left_with_a_checkpoint_continue_to_a_larger_budget(tmp_path):
    cfg, cells, sweep = sweep_to(tmp_path, "[64,128]")
    prepare(sweep, cfg, cells)
    n2, n4 = cells
    ran(sweep, n2, 64, PAUSED, checkpoint=True)  # stopped by the adaptive schedule at 64
    ran(sweep, n4, 128, FINISHED, checkpoint=True)  # checkpoint.keep_final
    new_cfg, new_cells, _ = sweep_to(tmp_path, "[64,128,256]")
    found = continuation.find(sweep, new_cells)
    assert {(c.old, c.new, c.reached) for c in found} == {
        (n2.run_id, new_cells[0].run_id, 64.0),
        (n4.run_id, new_cells[1].run_id, 128.0),
    }
    check_same_grid(sweep, new_cells, extend=False, continued=found)  # nothing is gone: both are continued
    rows = {c.run_id: sweep.run(c.run_id).read_metrics() for c in cells}
    prepare(sweep, new_cfg, new_cells, found)
    manifest = sweep.manifest().cells
    assert set(manifest) == {c.run_id for c in new_cells}
    for old, new in zip(cells, new_cells):
        assert manifest[new.run_id].continues == old.run_id and manifest[new.run_id].state == PAUSED
        files = sweep.run(new.run_id)
        assert not sweep.run(old.run_id).dir.exists() and files.has_checkpoint()
        assert files.read_metrics() == rows[old.run_id]  # its eval points so far, kept
        assert files.status().state == PAUSED and files.status().paused_at == rows[old.run_id][-1]["rollouts"]
        assert OmegaConf.load(files.config).grid.budgets == [64, 128, 256]  # the new plan
    assert set(sweep.collect()["run_id"]) == {
        c.run_id for c in new_cells
    }  # paused points are results, under the new ids
    assert continuation.find(sweep, new_cells) == []  # a rerun finds nothing more to take over


def test_a_takeover_cut_short_is_finished_by_the_rerun(tmp_path):
    cfg, cells, sweep = sweep_to(tmp_path, "[64,128]")
    prepare(sweep, cfg, cells)
    for cell in cells:
        ran(sweep, cell, 128, FINISHED, checkpoint=True)
    new_cfg, new_cells, _ = sweep_to(tmp_path, "[64,128,256]")
    found = continuation.find(sweep, new_cells)

    def killed(*_):
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(
            continuation, "take_over", killed
        )  # killed after the manifest named the takeovers, before any rename
        prepare(sweep, new_cfg, new_cells, found)
    assert all(sweep.run(c.run_id).status().state == FINISHED for c in cells)
    found = continuation.find(sweep, new_cells)  # the rerun: the manifest already holds the new cells
    assert found == []
    check_same_grid(sweep, new_cells, extend=False, continued=found)
    prepare(sweep, new_cfg, new_cells, found)
    for old, new in zip(cells, new_cells):
        assert not sweep.run(old.run_id).dir.exists()
        assert sweep.run(new.run_id).status().state == PAUSED and sweep.run(new.run_id).has_checkpoint()


def test_what_cannot_continue_is_said(tmp_path):
    cfg, cells, sweep = sweep_to(tmp_path, "[64,256]")
    prepare(sweep, cfg, cells)
    ran(sweep, cells[0], 256, FINISHED, checkpoint=False)  # sealed without a checkpoint
    ran(sweep, cells[1], 256, PAUSED, checkpoint=True)
    _, smaller, _ = sweep_to(tmp_path, "[64,128]")  # below where the paused run already is
    assert continuation.find(sweep, smaller) == []
    _, larger, _ = sweep_to(tmp_path, "[64,512]")
    found = continuation.find(sweep, larger)
    assert [(c.old, c.new) for c in found] == [(cells[1].run_id, larger[1].run_id)]
    with pytest.raises(
        ConfigError,
        match=r"1 of its 2 cells are not in this one .*1 of them are runs of this grid to a smaller "
        r"budget, finished without a checkpoint to continue from \(checkpoint.keep_final=true",
    ):
        check_same_grid(sweep, larger, extend=False, continued=found)
    result = runner.invoke(app, ["sweep", *ARGS, "grid.budgets=[64,512]", "--root", str(tmp_path)])
    assert result.exit_code == 2 and "checkpoint.keep_final=true" in result.output
    assert json.loads(sweep.manifest_file.read_text())["cells"].keys() == {c.run_id for c in cells}  # untouched


@pytest.mark.slow
def test_a_run_kept_at_its_end_continues_to_a_larger_flop_budget(tmp_path):
    """checkpoint.keep_final: a run to a FLOP budget keeps its state after its last eval point, and the
    same run to twice the budget in that directory resumes there, keeping every row it had."""
    args = [
        "grid.n=[2]",
        "grid.B_p=[2]",
        "n=2",
        "B_p=2",
        "grid.budget.unit=flops",
        "grid.eval_points=2",
        "eval.problems=8",
        "eval.samples=4",
        "checkpoint.keep_final=true",
        "--run-dir",
        str(tmp_path),
    ]
    first = runner.invoke(app, ["run", *args, "grid.budgets=[1e9]"])
    assert first.exit_code == 0, first.output
    files = RunFiles(tmp_path)
    rows = files.read_metrics()
    assert files.status().state == FINISHED and files.has_checkpoint() and rows[-1]["flops_total"] >= 1e9
    second = runner.invoke(app, ["run", *args, "grid.budgets=[2e9]"])
    assert second.exit_code == 0, second.output
    assert f"resumed from the checkpoint at step {rows[-1]['step']}" in second.output
    longer = files.read_metrics()
    assert longer[: len(rows)] == rows and longer[-1]["flops_total"] >= 2e9 > longer[-2]["flops_total"]
