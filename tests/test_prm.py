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
    fully_wrong, _ = model(
        problems, [",".join(prm._other(s, rng) for s in p.steps) + ";" + prm._other(p.answer, rng) for p in problems]
    )
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


def _tiny(tmp_path, model_class, **extra):
    """A randomly initialised scorer of the embedded family, saved with its tokenizer (no training)."""
    import torch
    from omegaconf import OmegaConf

    from isoflop_cli.recipe.checkpoint import char_tokenizer, qwen2_config

    torch.manual_seed(0)
    tokenizer = char_tokenizer()
    b = OmegaConf.create(
        {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}
    )
    model_class.from_config(qwen2_config(b, tokenizer, **extra)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def _forwards(model) -> list[tuple[int, int]]:
    """Each forward's input shape, as the model runs."""
    shapes = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes


def test_a_prm_scored_in_micro_batches_gives_the_scores_of_one_forward(tmp_path):
    """Completions of 0 to 30 characters and one of 40 under a budget of 120 padded positions: the
    rows go in forwards of 120 // 49 = 2 rows (49: the batch's width), each cut to its longest row.
    The scores are those of one forward over the whole batch (to float rounding), and the FLOPs the
    padded positions each forward ran, fewer than one forward's."""
    from transformers import AutoModelForTokenClassification

    task = ArithTask.from_config(config.load(None, ["task=arith-steps"]).task)
    path = _tiny(tmp_path, AutoModelForTokenClassification, num_labels=1)
    problems = task.validation_set(12)
    completions = [p.solution[: 3 * i] if i < 11 else "1" * 40 for i, p in enumerate(problems)]
    whole, parts = prm.ProcessRewardModel(path, task), prm.ProcessRewardModel(path, task, max_tokens=120)
    seen = _forwards(parts.model)
    one, split = whole.score(problems, completions), parts.score(problems, completions)
    width = max(len(p.prompt) + len(c) + 1 for p, c in zip(problems, completions))
    print(f"widths per forward {seen}; FLOPs {parts.last_flops:.3g} against one forward's {whole.last_flops:.3g}")
    assert split == pytest.approx(one, abs=1e-5)
    assert width == 49 and [rows for rows, _ in seen] == [2] * 6
    assert all(rows * w <= 120 for rows, w in seen) and seen[-1][1] == width
    assert parts.last_flops < whole.last_flops


def test_a_judge_scored_in_micro_batches_gives_the_score_of_one_forward(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from isoflop_cli.recipe.evaluate import Judge

    path = _tiny(tmp_path, AutoModelForSequenceClassification, num_labels=1)
    prompts, completions = [f"{i}+{i}=" for i in range(9)], ["1" * i for i in range(9)]
    whole, parts = Judge(str(path)), Judge(str(path), max_tokens=30)
    seen = _forwards(parts.model)
    (one, one_flops), (split, split_flops) = whole(prompts, completions), parts(prompts, completions)
    assert split == pytest.approx(one, abs=1e-6) and len(seen) > 2 and split_flops < one_flops
