import math

import pytest

from isoflop_cli import config
from isoflop_cli.config import ConfigError
from isoflop_cli.grid import eval_budgets, expand, learning_rate, plan_run


def load(*overrides):
    return config.load(None, list(overrides))


def test_expand_and_feasibility():
    cfg = load("grid.n=[2,4,8]", "grid.B_p=[4,16]", "grid.seed=[0,1]", "grid.budgets=[256,1024]", "grid.max_batch=64")
    cells = expand(cfg)
    assert len(cells) == 12
    infeasible = [c for c in cells if not c.feasible]
    assert {(c.axes["n"], c.axes["B_p"]) for c in infeasible} == {(8, 16)}  # B = 128 > 64
    assert all("max_batch" in c.reason for c in infeasible)
    by_axes = {(c.axes["n"], c.axes["B_p"], c.axes["seed"]): c for c in cells if c.feasible}
    assert by_axes[(2, 4, 0)].plan.M == 1024 // 8
    assert by_axes[(4, 16, 1)].plan.M == 1024 // 64
    # C = B_p * n * M never exceeds the largest budget; seeds differ only in their run id.
    assert all(c.plan.rollouts <= 1024 for c in by_axes.values())
    assert by_axes[(2, 4, 0)].run_id != by_axes[(2, 4, 1)].run_id


def test_m_rounds_down_and_min_steps():
    assert plan_run(load("n=3", "B_p=5", "grid.budgets=[100]")).M == 6  # floor(100 / 15)
    cells = expand(load("grid.n=[8,2]", "grid.B_p=[8]", "grid.budgets=[100]", "grid.min_steps=2"))
    assert [c.feasible for c in cells] == [False, True]  # 100 // 64 = 1 < 2; 100 // 16 = 6
    assert "min_steps" in cells[0].reason


def test_eval_steps_cover_every_budget():
    cfg = load("grid.n=[4]", "grid.B_p=[4]", "grid.budgets=[64,256,1024]", "grid.eval_points=4")
    plan = expand(cfg)[0].plan
    assert plan.eval_steps[0] == 0 and plan.eval_steps[-1] == plan.M == 64
    for budget in (64, 256, 1024):
        assert budget // 16 in plan.eval_steps  # every budget's slice is an exact eval point
    assert eval_budgets(cfg.grid) == [64.0, 128.0, 256.0, 512.0, 1024.0]  # 1024 halved 3 times, plus 64


@pytest.mark.parametrize("scaling,expected", [("sqrt", 1e-3 * math.sqrt(4)), ("linear", 4e-3), ("constant", 1e-3)])
def test_learning_rate_scaling(scaling, expected):
    cfg = load(f"algo.lr_scaling={scaling}", "algo.base_lr=1e-3", "algo.ref_batch=16")
    assert learning_rate(cfg.algo, 64) == pytest.approx(expected)


def test_extra_axes_plain_and_group():
    overrides = ["grid.n=[4]", "grid.B_p=[4]", "+grid.axes={algo.kl_coef:[0.0,0.1],model:[tiny-arith]}"]
    cfg = load(*overrides)
    cells = expand(cfg, recompose=lambda extra: config.load(None, overrides + extra))
    assert [c.cfg.algo.kl_coef for c in cells] == [0.0, 0.1]
    assert all(c.cfg.model.name == "tiny-arith" for c in cells)
    assert cells[0].run_id != cells[1].run_id


def test_run_id_tracks_content():
    a = expand(load("grid.n=[4]", "grid.B_p=[4]"))[0]
    b = expand(load("grid.n=[4]", "grid.B_p=[4]"))[0]
    c = expand(load("grid.n=[4]", "grid.B_p=[4]", "algo.base_lr=1e-4"))[0]
    d = expand(load("grid.n=[4]", "grid.B_p=[4]", "grid.budgets=[512]"))[0]
    assert a.run_id == b.run_id and len({a.run_id, c.run_id, d.run_id}) == 3


def test_no_feasible_cell_is_a_config_error():
    with pytest.raises(ConfigError, match="no feasible cell"):
        expand(load("grid.max_batch=4"))


def test_flop_budgets_plan_and_calibration(tmp_path):
    import json

    from isoflop_cli.grid import step_flops
    from isoflop_cli.store import FINISHED, SweepDir

    cfg = load("grid.n=[2,32]", "grid.B_p=[4]", "grid.budget.unit=flops", "grid.budgets=[1e9,4e9]")
    cells = expand(cfg)
    small, large = cells
    per_step = sum(step_flops(small.cfg))
    assert small.plan.M == int(4e9 // per_step) and small.plan.column == "flops_total"
    assert small.plan.eval_at == (0.0, *eval_budgets(cfg.grid))
    assert small.plan.predicted_flops["flops_total"] <= 4e9
    assert not large.feasible and "FLOPs (upper bound)" in large.reason  # B = 128: one step bounds above 4e9
    with pytest.raises(ConfigError, match="no feasible cell"):
        expand(load("grid.n=[64]", "grid.B_p=[64]", "grid.budget.unit=flops", "grid.budgets=[1e6]"))

    # A finished run that spent half its upper bound halves the predictions, not the run id.
    sweep = SweepDir(tmp_path)
    sweep.write_manifest({"cells": {"r": {"columns": {"model": "tiny-arith"}, "step_flops": [3.0, 1.0]}}})
    files = sweep.run("r")
    files.dir.mkdir(parents=True)
    files.append_metrics({"step": 10, "flops_total": 20.0})
    files.set_status(FINISHED)
    assert sweep.flops_scale() == {"tiny-arith": 0.5}
    scaled = expand(cfg, flops_scale=sweep.flops_scale())
    assert scaled[0].run_id == small.run_id
    assert scaled[0].plan.M == int(4e9 // (per_step * 0.5))
    assert json.loads(json.dumps(scaled[0].plan.predicted_flops))["rho"] == pytest.approx(small.plan.predicted_flops["rho"])


def test_updates_per_batch_raise_rho_at_fixed_budget():
    overrides = ["grid.n=[4]", "grid.B_p=[4]", "+grid.axes={algo.epochs:[1,2,4]}"]
    cells = expand(load(*overrides))
    rhos = [c.plan.predicted_flops["rho"] for c in cells]
    assert rhos == sorted(rhos) and rhos[0] < rhos[-1]
    assert len({c.plan.M for c in cells}) == 1  # rollout budget: same steps, more learning each
    with pytest.raises(ConfigError, match="B_p = 2 prompts do not fill algo.minibatches = 8"):
        expand(load("grid.n=[2]", "grid.B_p=[2]", "algo.minibatches=8"))
    with pytest.raises(ConfigError, match="x learner.world_size = 2 .each rank trains on whole prompt groups"):
        expand(load("grid.n=[2]", "grid.B_p=[2]", "algo.minibatches=2", "learner.world_size=2"))


def test_recipe_presets_and_seed_sweeps(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, '
                                          '"intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064}')
    (tmp_path / "model.safetensors").touch()  # a checkpoint has its weights; planning reads only the config
    easy, hard = load("recipe=easy"), load("recipe=hard")
    assert (easy.algo.kl_coef, easy.algo.entropy_coef) == (0.001, 0.001) and (hard.algo.kl_coef, hard.algo.entropy_coef) == (0, 0)
    for name, kl, max_batch in (("seed-easy", 0.001, 65536), ("seed-hard", 0.0, 16384)):
        cfg = config.load(name, [f"model.path={tmp_path}"])
        assert (cfg.algo.kl_coef, cfg.grid.max_batch, cfg.algo.base_lr, cfg.algo.ref_batch) == (kl, max_batch, 1e-6, 1024)
        cells = expand(cfg)
        assert len(cells) == 54 and list(cfg.grid.B_p) == [2**i for i in range(5, 11)] and list(cfg.grid.n) == [2**i for i in range(3, 12)]
        assert all(c.feasible == (c.axes["n"] * c.axes["B_p"] <= max_batch) for c in cells)
