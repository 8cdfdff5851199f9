"""The learned process reward model: built locally, it tells right steps from wrong ones, and its
inference FLOPs are counted exactly."""

import random

import pytest
from torch.utils.flop_counter import FlopCounterMode

import isoflop_cli.recipe.measure  # noqa: F401  (registers the CPU attention formulas)
from isoflop_cli import config
from isoflop_cli.recipe import prm
from isoflop_cli.recipe.rewards import make_reward
from isoflop_cli.tasks.arith import ArithTask

pytestmark = pytest.mark.slow  # the embedded PRM, built on first use


@pytest.fixture(scope="module")
def scorer():
    cfg = config.load(None, ["reward=prm", "task=arith-steps", "reward.build.steps=250"])
    task = ArithTask.from_config(cfg.task)
    return make_reward(cfg.reward, task), task


def test_prm_prefers_right_steps_on_held_out_problems(scorer):
    model, task = scorer
    problems = task.validation_set(64)
    rng = random.Random(1)
    wrong = [prm._corrupted(p, rng)[0] for p in problems]
    right_scores, spent = model(problems, [p.solution for p in problems])
    wrong_scores, _ = model(problems, wrong)
    fully_wrong, _ = model(problems, [",".join(prm._other(s, rng) for s in p.steps) + ";" + prm._other(p.answer, rng) for p in problems])
    assert sum(right_scores) / 64 > 0.8
    assert sum(fully_wrong) / 64 < 0.3
    assert sum(right_scores) > sum(wrong_scores) > sum(fully_wrong)
    malformed, _ = model(problems[:3], ["", "abc", "1+1="])
    assert max(malformed) < 0.5
    assert spent > 0


def test_prm_flops_match_the_flop_counter(scorer):
    model, task = scorer
    problems = task.validation_set(8)
    with FlopCounterMode(display=False) as counter:
        _, spent = model(problems, [p.solution for p in problems])
    assert abs(spent - counter.get_total_flops()) / counter.get_total_flops() < 0.05


def test_plan_predicts_the_prms_flops_for_a_full_width_batch(scorer):
    from isoflop_cli.grid import step_flops

    model, task = scorer
    cfg = config.load(None, ["reward=prm", "task=arith-steps", "reward.build.steps=250", "n=2", "B_p=2"])
    longest = next(p for p in task.validation_set(64) if len(p.prompt) == task.max_prompt_tokens)
    _, spent = model([longest] * 4, ["9" * cfg.task.max_new_tokens] * 4)  # B_p * n completions at max_new_tokens
    assert step_flops(cfg).reward == spent
    assert step_flops(config.load(None, ["task=arith-steps", "n=2", "B_p=2"])).reward == 0  # a rule costs no FLOPs
