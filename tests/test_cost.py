"""The sweep's price (`cost.py`): a 7B cell's GPU-hours against a hand computation, --max-gpu-hours,
`plan --json`'s totals, calibration from finished runs, `status`'s spent-against-planned line, and
(slow) the wall time of a tiny sweep's remaining runs predicted from its finished ones on the CPU."""

import json

import pytest
from typer.testing import CliRunner

from isoflop_cli import config, cost
from isoflop_cli import sweep as sweep_mod
from isoflop_cli.cli import app
from isoflop_cli.grid import expand
from isoflop_cli.store import FINISHED, CellState, SweepDir

runner = CliRunner()


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory):
    """Qwen2.5-7B's config.json (no weights) and a small problem file for task=dataset."""
    from transformers import Qwen2Config

    from isoflop_cli.recipe.checkpoint import char_tokenizer

    path = tmp_path_factory.mktemp("qwen2.5-7b")
    Qwen2Config(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ).save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    problems = path.parent / "problems.jsonl"
    problems.write_text(
        "".join(
            f'{{"prompt": "What is {i} + 1?", "reward_model": {{"ground_truth": "{i + 1}"}}}}\n' for i in range(200)
        )
    )
    return [
        f"model.path={path}",
        f"task.train={problems}",
        "eval.problems=16",
        "sampler.tensor_parallel=1",
        "learner.max_tokens_per_micro_batch=32768",
        "task.max_prompt_tokens=1024",
        "task.max_new_tokens=2048",
    ]


def test_7b_cell_gpu_hours_by_hand(qwen7b, tmp_path):
    """seed-easy on a node of 8 H200s, n = 16, B_p = 64 (M = 4,194,304 / 1,024 = 4,096 steps): eight
    vLLM engines (TP 1) sample 128 rows each, the prompt prefilled once per group (8 rows each)."""
    cfg = config.load("seed-easy", [*qwen7b, "grid.n=[16]", "grid.B_p=[64]"])
    cells = expand(cfg)
    price = cost.price(cfg, cells, SweepDir(tmp_path / "none"))
    (cell,), (got,) = cells, price.cells
    assert cell.plan.M == 4096 and price.device.name == "H200"
    bw, peak, mfu = 4.8e12 * 0.7, 989e12 * 0.3, 0.3
    # One layer's projection weights: q and o 3584^2, k and v 3584 x 512 (4 kv heads x 128), gate,
    # up, down 3584 x 18944.
    layer = 2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944
    assert layer == 233_046_016
    weights = (28 * layer + 3584 * 152064) * 2  # + the LM head, bf16: 14,140,571,648 bytes read every decode step
    kv = 2 * 28 * 4 * 128 * 2  # K and V of one position, 28 layers, bf16: 57,344 bytes
    steps = 2047  # new tokens - 1: the prefill gives the first
    context = steps * 1024 + steps * 2048 // 2  # one row's positions summed over the decode steps: 4,192,256
    decode_bytes = steps * weights + 128 * context * kv  # 2.89e13 + 3.08e13 bytes per engine
    assert decode_bytes == pytest.approx(5.971e13, rel=1e-3)
    prefill = (
        2 * 28 * 8 * 1024 * layer + 2 * 28 * 8 * 1024 * (2 * 28 * 128 * 1024) + 2 * 8 * 3584 * 152064
    )  # 8 rows x 1,024 tokens
    search = prefill / peak + decode_bytes / bw + steps * 2e-3  # + vLLM's assumed 2 ms a decode step
    # Learning over prompt trees: a group of 16 x 2,048 + 1,024 > 32,768 tokens splits into 2 trees of
    # <= 15 completions, so 128 trees: 128 x 1,024 prompt + 64 x 16 x 2,048 completion positions.
    tokens, logits = 128 * 1024 + 64 * 16 * 2048, 64 * 16 * 2048
    pairs = 128 * 1024**2 + 64 * 16 * 2048 * 3072
    linear, attention, head = 2 * 28 * tokens * layer, 2 * 28 * (2 * 28 * 128) * pairs, 2 * logits * 3584 * 152064
    learning_flops = (
        3 * (linear + head) + 3.5 * attention + (linear + attention + head)
    )  # forward + backward, and the KL reference's forward
    assert cell.plan.step_bound.learning == pytest.approx(learning_flops, rel=1e-9)
    assert learning_flops == pytest.approx(1.373e17, rel=1e-3)
    learning = learning_flops / (8 * peak)
    reward = 1024 * 1e-3  # a rule: 1 ms a completion on rank 0's CPU
    step = search + learning + reward  # 22.2 + 57.9 + 1.0 s
    assert step == pytest.approx(81.1, abs=0.1)
    # Eval: 16 problems x 16 samples, 32 rows an engine, 2 prompts prefilled each, at every eval point.
    eval_prefill = 2 * 28 * 2 * 1024 * layer + 2 * 28 * 2 * 1024 * (2 * 28 * 128 * 1024) + 2 * 2 * 3584 * 152064
    per_eval = eval_prefill / peak + (steps * weights + 32 * context * kv) / bw + steps * 2e-3
    wall = 4096 * step + len(cell.plan.eval_steps) * per_eval
    assert got.wall_s == pytest.approx(wall, rel=1e-9)
    assert (
        got.hours == pytest.approx(wall * 8 / 3600, rel=1e-9) == pytest.approx(738.9, abs=0.1)
    )  # GPU-hours on 8 H200s
    assert mfu == price.device.mfu


def tiny(*more):
    return ["grid.n=[2,4,8]", "grid.B_p=[4,8]", "grid.budgets=[256]", *more]


def plan_json(*args):
    result = runner.invoke(app, ["plan", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # the JSON is stdout's; warnings go to stderr


def test_max_gpu_hours_refuses_naming_the_costliest_cells(tmp_path):
    out = ["--out", str(tmp_path)]
    data = plan_json(*tiny(), *out)
    total = data["totals"]["cpu_hours"]
    ranked = sorted(data["cells"], key=lambda c: -c["predicted"]["cpu_hours"])
    for command in (["plan"], ["sweep", "--dry-run"]):
        refused = runner.invoke(app, [*command, *tiny(), *out, "--max-gpu-hours", f"{total * 0.99:.6g}"])
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert refused.exit_code == 2 and len(lines) == 1 and not refused.stdout, refused.output
        assert "predicted to cost" in lines[0] and "CPU-h, above --max-gpu-hours" in lines[0]
        named = lines[0].split("costliest: ")[1]
        assert [c["run_id"] for c in ranked[:3]] == [part.split()[0] for part in named.split(";")[0].split(", ")]
        assert ranked[3]["run_id"] not in lines[0]
        passed = runner.invoke(app, [*command, *tiny(), *out, "--max-gpu-hours", f"{total * 1.01:.6g}"])
        assert passed.exit_code == 0, passed.output
    assert runner.invoke(app, ["plan", *tiny(), "--max-gpu-hours", "-1"]).exit_code == 2


def test_json_totals_are_the_cells_sum_and_the_parallel_makespan(tmp_path):
    one = plan_json(*tiny("cluster.max_concurrent=1"))
    cells = [c["predicted"] for c in one["cells"]]
    totals = one["totals"]
    assert {"cells", "totals"} <= set(one) and totals["parallel_runs"] == 1
    assert totals["cpu_hours"] == pytest.approx(sum(c["cpu_hours"] for c in cells))
    assert totals["gpu_hours"] == 0.0 and all(c["gpu_hours"] == 0.0 for c in cells)
    assert totals["flops"] == pytest.approx(sum(c["flops_total"] for c in cells))
    assert totals["wall_s"] == pytest.approx(sum(c["wall_s"] for c in cells), abs=0.01)  # one run at a time
    every = plan_json(*tiny("cluster.max_concurrent=100"))["totals"]
    assert every["parallel_runs"] == 6 and every["wall_s"] == pytest.approx(max(c["wall_s"] for c in cells), abs=0.01)
    for c in cells:
        assert c["wall_s"] == pytest.approx(
            sum(c[f"{p}_s"] for p in ("search", "learning", "reward", "eval", "other")), abs=0.01
        )
    table = runner.invoke(app, ["plan", *tiny()], terminal_width=200)
    assert (
        "wall" in table.output
        and "CPU-h" in table.output
        and "cost: " in table.output
        and "CPU defaults" in table.output
    )


def finish_run(sweep: SweepDir, cell, row: dict) -> None:
    """A finished run of `cell` in `sweep`: an eval point at each of its plan's eval steps, the last `row`."""
    manifest = sweep.manifest()
    manifest.cells[cell.run_id] = CellState(
        columns={"model": cell.cfg.model.name}, step_flops=list(cell.plan.step_bound), M=cell.plan.M
    )
    sweep.write_manifest(manifest)
    files = sweep.run(cell.run_id)
    files.dir.mkdir(parents=True)
    for step in cell.plan.eval_steps[:-1]:
        files.append_metrics({"step": step, "rollouts": step * cell.plan.batch, "flops_total": 0.0})
    files.append_metrics(row)
    files.set_status(FINISHED)


def test_calibration_from_a_finished_run_scales_each_part_as_measured(tmp_path):
    """One run that did its bound's work in 2x the defaults' search seconds, 3x learning, 5x eval,
    and 0.01 s a step besides: the other cells' predictions move by exactly those factors."""
    cfg = config.load(None, tiny())
    cells = expand(cfg)
    sweep = SweepDir(tmp_path / cfg.name)
    before = cost.price(cfg, cells, sweep)
    done, p = cells[0], before.cells[0].seconds
    bound, M = done.plan.step_bound, done.plan.M
    wall = 2 * p.search + 3 * p.learning + p.reward + 5 * p.eval + 0.01 * M
    finish_run(
        sweep,
        done,
        {
            "step": M,
            "rollouts": done.plan.rollouts,
            "flops_search": bound.search * M,
            "flops_learning": bound.learning * M,
            "flops_reward": 0.0,
            "flops_total": (bound.search + bound.learning) * M,
            "time_search_s": 2 * p.search,
            "time_learning_s": 3 * p.learning,
            "time_reward_s": p.reward,
            "time_eval_s": 5 * p.eval,
            "wall_s": wall,
        },
    )
    after = cost.price(cfg, cells, sweep)
    assert after.calibration.runs == 1 and after.source.startswith("calibrated from 1 finished run")
    assert before.source.startswith("CPU defaults")
    for cell, old, new in zip(cells[1:], before.cells[1:], after.cells[1:]):
        assert new.seconds.search == pytest.approx(2 * old.seconds.search)
        assert new.seconds.learning == pytest.approx(3 * old.seconds.learning)
        assert new.seconds.eval == pytest.approx(5 * old.seconds.eval)
        assert new.seconds.other == pytest.approx(0.01 * cell.plan.M)
    assert after.cells[0].wall_s == pytest.approx(wall)  # the finished run itself, predicted as it ran


def test_status_shows_device_hours_spent_against_planned(tmp_path):
    cfg = config.load(None, tiny())
    cells = expand(cfg)
    sweep = SweepDir(tmp_path)
    price = cost.price(cfg, cells, sweep)
    cost.write(sweep, cells, price)
    assert cost.status_line(sweep).startswith(f"cost: 0 CPU-h spent of {price.hours:.3g} planned")
    finish_run(
        sweep,
        cells[0],
        {"step": cells[0].plan.M, "rollouts": cells[0].plan.rollouts, "flops_total": 1.0, "wall_s": 36.0},
    )
    assert cost.status_line(sweep) == f"cost: 0.01 CPU-h spent of {price.hours:.3g} planned ({0.01 / price.hours:.0%})"
    (tmp_path / cost.PLAN_FILE).write_text("[1]")
    assert "no readable cost.json" in cost.status_line(sweep)


@pytest.mark.slow
def test_a_plan_after_finished_runs_predicts_the_remaining_runs_wall_time(tmp_path):
    """A tiny CPU sweep (embedded model): two of its four cells run (one small, one large), then a plan
    calibrated by them predicts the other two's wall time; they run, and take within 30% of it."""
    from isoflop_cli.recipe.trainer import Budget, train

    args = [
        "grid.n=[4,8]",
        "grid.B_p=[4,8]",
        "grid.budgets=[1024]",
        "grid.eval_points=3",
        "eval.problems=16",
        "eval.samples=4",
    ]
    cfg, cells = sweep_mod.load(None, args, tmp_path)
    sweep = SweepDir(tmp_path / cfg.name)
    sweep_mod.prepare(sweep, cfg, cells)

    def run(cell, where=None) -> None:
        plan = cell.plan
        train(
            cell.cfg,
            Budget(plan.column, plan.limit, plan.eval_at, plan.M),
            plan.lr,
            where or sweep.run(cell.run_id).dir,
            None,
        )

    first, rest = [cells[0], cells[3]], [cells[1], cells[2]]
    run(first[0], tmp_path / "warm-up")  # the process's first run pays torch's warm-up, which later runs do not
    for cell in first:
        run(cell)
    _, replanned = sweep_mod.load(None, args, tmp_path)
    price = cost.price(cfg, replanned, sweep)
    assert price.calibration.runs == 2
    predicted = sum(p.wall_s for c, p in zip(replanned, price.cells) if c.run_id in {r.run_id for r in rest})
    for cell in rest:
        run(cell)
    spent = sum(cost.measured(sweep.run(c.run_id).finished_rows()).wall for c in rest)
    error = predicted / spent - 1
    print(f"remaining runs: predicted {predicted:.2f} s, took {spent:.2f} s ({error:+.1%})")
    assert abs(error) < 0.3
