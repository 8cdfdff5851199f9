import math

import pytest

from isoflop_cli import config, sweep
from isoflop_cli.config.compose import ROOT
from isoflop_cli.config.validate import EMBEDDED_MAX_POSITIONS
from isoflop_cli.errors import ConfigError
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


def test_each_load_is_its_own_config():
    """Loads share one schema built per process (compose._schema): a change to one loaded config
    (a schema default, a file's value) reaches no other load."""
    first = config.load()
    first.algo.base_lr, first.grid.n = 0.5, [3]
    second = config.load()
    assert second.algo.base_lr != 0.5 and list(second.grid.n) != [3]
    assert second == config.load()


def test_no_feasible_cell_is_a_config_error():
    with pytest.raises(ConfigError, match="no feasible cell"):
        expand(load("grid.max_batch=4"))


def test_flop_budgets_plan_and_calibration(tmp_path):
    import json

    from isoflop_cli.grid import step_flops
    from isoflop_cli.store import FINISHED, CellState, Manifest, SweepDir

    cfg = load("grid.n=[2,32]", "grid.B_p=[4]", "grid.budget.unit=flops", "grid.budgets=[1e9,4e9]")
    cells = expand(cfg)
    small, large = cells
    per_step = sum(step_flops(small.cfg))
    assert int(4e9 // per_step) == small.plan.M and small.plan.column == "flops_total"
    assert small.plan.eval_at == (0.0, *eval_budgets(cfg.grid))
    assert small.plan.predicted_flops["flops_total"] <= 4e9
    assert not large.feasible and "FLOPs (upper bound)" in large.reason  # B = 128: one step bounds above 4e9
    with pytest.raises(ConfigError, match="no feasible cell"):
        expand(load("grid.n=[64]", "grid.B_p=[64]", "grid.budget.unit=flops", "grid.budgets=[1e6]"))

    # A finished run that spent half its upper bound halves the predictions, not the run id.
    sweep = SweepDir(tmp_path)
    sweep.write_manifest(Manifest(cells={"r": CellState(columns={"model": "tiny-arith"}, step_flops=[3.0, 1.0])}))
    files = sweep.run("r")
    files.dir.mkdir(parents=True)
    files.append_metrics({"step": 10, "flops_total": 20.0})
    files.set_status(FINISHED)
    assert sweep.flops_scale() == {"tiny-arith": 0.5}
    scaled = expand(cfg, flops_scale=sweep.flops_scale())
    assert scaled[0].run_id == small.run_id
    assert int(4e9 // (per_step * 0.5)) == scaled[0].plan.M
    assert json.loads(json.dumps(scaled[0].plan.predicted_flops))["rho"] == pytest.approx(
        small.plan.predicted_flops["rho"]
    )


def test_updates_per_batch_raise_rho_at_fixed_budget():
    overrides = ["grid.n=[4]", "grid.B_p=[4]", "+grid.axes={algo.epochs:[1,2,4]}"]
    cells = expand(load(*overrides))
    rhos = [c.plan.predicted_flops["rho"] for c in cells]
    assert rhos == sorted(rhos) and rhos[0] < rhos[-1]
    assert len({c.plan.M for c in cells}) == 1  # rollout budget: same steps, more learning each
    with pytest.raises(ConfigError, match=r"B_p = 2 prompts do not fill algo\.minibatches = 8"):
        expand(load("grid.n=[2]", "grid.B_p=[2]", "algo.minibatches=8"))
    with pytest.raises(ConfigError, match=r"x learner\.world_size = 2 \(each rank trains on whole prompt groups"):
        expand(load("grid.n=[2]", "grid.B_p=[2]", "algo.minibatches=2", "learner.world_size=2"))


def test_recipe_presets_and_seed_sweeps(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, '
        '"intermediate_size": 18944, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064}'
    )
    easy, hard = load("recipe=easy"), load("recipe=hard")
    assert (easy.algo.kl_coef, easy.algo.entropy_coef) == (0.001, 0.001) and (
        hard.algo.kl_coef,
        hard.algo.entropy_coef,
    ) == (0, 0)
    problems = tmp_path / "problems.jsonl"  # a calibrated set, as `isoflop calibrate` writes one
    problems.write_text(
        "".join(
            f'{{"prompt": "What is {i} + 1?", "reward_model": {{"ground_truth": "{i + 1}"}}}}\n' for i in range(3000)
        )
    )
    for name, kl, max_batch in (("seed-easy", 0.001, 65536), ("seed-hard", 0.0, 16384)):
        # Planning reads only config.json; memory unchecked here (the memory model's cells: test_memory).
        cfg = config.load(name, [f"model.path={tmp_path}", f"task.train={problems}", "cluster.gpu_memory_gib=null"])
        assert (cfg.algo.kl_coef, cfg.grid.max_batch, cfg.algo.base_lr, cfg.algo.ref_batch) == (
            kl,
            max_batch,
            1e-6,
            1024,
        )
        cells = expand(cfg)
        assert (
            len(cells) == 54
            and list(cfg.grid.B_p) == [2**i for i in range(5, 11)]
            and list(cfg.grid.n) == [2**i for i in range(3, 12)]
        )
        assert all(c.feasible == (c.axes["n"] * c.axes["B_p"] <= max_batch) for c in cells)


def test_run_ids_are_pinned():
    # A sweep dir planned before must resume: the same config gives the same run ids (the hash covers
    # what a run computes; planning's internals do not enter it).
    first = expand(load("grid.n=[4]", "grid.B_p=[4]"))[0]
    assert first.run_id == "n4_bp4_s0_31305c42"
    # Its fingerprint too: its records and checkpoint carry it (a changed one reads as another run's).
    assert sweep.fingerprint(first) == "0bcb336ba0bdce52a3ef2f3effafe24b24e166f1"
    cells = expand(load("grid.n=[4]", "grid.B_p=[4]", "+grid.axes={algo.kl_coef:[0.0,0.1]}"))
    assert [c.run_id for c in cells] == ["n4_bp4_s0_kl_coef-0.0_31305c42", "n4_bp4_s0_kl_coef-0.1_dc586af1"]
    # The embedded default before its warm start had stray digits (and before its larger eval set and
    # budgets), set explicitly: its sweep dirs keep their ids.
    before = (
        "model.build.steps=400",
        "model.build.stray=0",
        "eval.problems=128",
        "grid.budgets=[256,512,1024,2048,4096]",
    )
    cells = expand(load("grid.n=[4]", "grid.B_p=[4]", "+grid.axes={algo.kl_coef:[0.0,0.1]}", *before))
    assert [c.run_id for c in cells] == ["n4_bp4_s0_kl_coef-0.0_88933495", "n4_bp4_s0_kl_coef-0.1_8426bcb3"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["grid.n=[2,4]", "grid.B_p=[4,8]", "grid.seed=[0,3]", "+grid.axes={algo.kl_coef:[0,0.1],algo.epochs:[1,2]}"],
        ["grid.n=[4]", "grid.B_p=[4]", "+grid.axes={model:[tiny-arith,tiny-arith-s],task.ops:[[+],[+,-]]}"],
        ["grid.n=[2,32]", "grid.B_p=[4]", "grid.budget.unit=flops", "grid.budgets=[1e9,4e9]", "lora.rank=4"],
        [
            "task=arith-steps",
            "reward=prm",
            "grid.n=[4]",
            "grid.B_p=[2,4]",
            "+grid.axes={task.digits:[[1,2],[2]],model.build.hidden_size:[64,128]}",
        ],
    ],
)
def test_planning_shortcuts_match_the_per_cell_path(overrides):
    """expand hashes, plans and types each cell from its combination's plain dict: the same run ids,
    plans and step FLOPs as the public per-config functions on the cell's own config."""
    from isoflop_cli.config.identity import run_id
    from isoflop_cli.grid import step_flops

    cfg = load(*overrides)
    cells = expand(cfg, recompose=lambda extra: config.load(None, overrides + extra))
    assert any(c.feasible for c in cells) and all(c.cfg is None for c in cells if not c.feasible)
    for c in (c for c in cells if c.feasible):
        run_cfg = c.cfg
        assert (run_cfg.n, run_cfg.B_p, run_cfg.seed) == (c.axes["n"], c.axes["B_p"], c.axes["seed"])
        assert c.run_id == run_id(c.axes, run_cfg, c.plan.key)
        assert c.plan == plan_run(run_cfg) and c.plan.step_flops == step_flops(run_cfg)
    assert "cfg" not in vars(cells[0])  # a cell holds no config of its own: made on demand


def test_axis_values_that_make_the_same_run_are_refused():
    with pytest.raises(ConfigError, match=r"calibrate.shard=256 and calibrate.shard=512 are the same run"):
        expand(load("grid.n=[4]", "grid.B_p=[4]", "+grid.axes={calibrate.shard:[256,512]}"))


def test_a_large_grid_plans_in_seconds(tmp_path):
    """10^4 cells: was ~9 ms and ~0.13 MB a cell (90 s); scripts/bench_plan.py has the figures."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'scripts'); import bench_plan; r = bench_plan.one(10000); "
        "assert r['peak_mb'] < 200, r; print(r)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_embedded_context_matches_the_recipe():
    from isoflop_cli.recipe.checkpoint import char_tokenizer, qwen2_config

    cfg = load()
    assert qwen2_config(cfg.model.build, char_tokenizer()).max_position_embeddings == EMBEDDED_MAX_POSITIONS


def test_a_large_plan_table_lists_seeds_together():
    import io

    from rich.console import Console

    from isoflop_cli.report import PLAN_ROWS, plan_table

    seeds = ",".join(str(s) for s in range(100))
    cfg = load("grid.n=[2,4,8]", "grid.B_p=[4,8]", f"grid.seed=[{seeds}]", "grid.max_batch=32")
    cells = expand(cfg)
    assert len(cells) == 600 > PLAN_ROWS
    out = io.StringIO()
    Console(file=out, width=200).print(plan_table(cfg, cells))
    text = out.getvalue()
    assert "500 feasible cells of 600" in text and text.count(" 0-99 ") == 6
    assert text.count("infeasible n=8 B_p=8 seed=0-99: B_p*n = 64 exceeds grid.max_batch = 32") == 1
