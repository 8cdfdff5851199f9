"""Where each model of a run computes and which generator it draws from: the scoring models (PRM,
judges) and a calibration's sampler on the run's device, and evaluation, which reseeds, leaving the
training draws on that device as they were. On a CPU machine the run's device is the CPU; with a
GPU the same tests check the GPU's placement and its generator."""

import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from isoflop_cli import config
from isoflop_cli.recipe import prm
from isoflop_cli.recipe.checkpoint import char_tokenizer, qwen2_config
from isoflop_cli.recipe.distributed import Group, device
from isoflop_cli.recipe.evaluate import Judge
from isoflop_cli.recipe.trainer import Budget, Trainer
from isoflop_cli.store import RunFiles
from isoflop_cli.tasks.arith import ArithTask

pytestmark = pytest.mark.slow  # the embedded models, built on first use

SCORING_DTYPE = torch.bfloat16 if torch.cuda.is_available() else torch.float32


def test_evaluation_leaves_the_training_draws_as_they_were(tmp_path):
    """An eval point samples from its problems' own streams; the draws training makes after it, on
    the run's device (its GPU's generator when there is one), are those it would have made without it."""
    cfg = config.load(None, ["n=4", "B_p=2", "eval.problems=4", "eval.samples=4"])
    trainer = Trainer(Group(), cfg, Budget("rollouts", 16, (16,), 2), 1e-4, RunFiles(tmp_path), None)
    torch.manual_seed(7)
    without = torch.rand(4, device=device())
    torch.manual_seed(7)
    first = trainer.evaluator(trainer.sampler)
    after = torch.rand(4, device=device())
    assert torch.equal(after, without)
    torch.manual_seed(8)  # another training state: the eval point draws the same
    assert trainer.evaluator(trainer.sampler).per_problem == first.per_problem


def test_the_prm_and_a_judge_score_on_the_runs_device(tmp_path):
    """bf16 on a GPU, fp32 on the CPU; the scores come back as plain floats either way."""
    cfg = config.load(None, ["reward=prm", "task=arith-steps", "reward.build.steps=250"])
    task = ArithTask.from_config(cfg.task)
    scorer = prm.load(cfg.reward, task)
    problems = task.validation_set(4)
    judge_dir = tmp_path / "judge"
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(
        qwen2_config(cfg.reward.build, char_tokenizer(), num_labels=1)
    ).save_pretrained(judge_dir)
    char_tokenizer().save_pretrained(judge_dir)
    judge = Judge(str(judge_dir))
    for model in (scorer.model, judge.model):
        assert {(p.device, p.dtype) for p in model.parameters()} == {(device(), SCORING_DTYPE)}
    scores = scorer.score(problems, [p.solution for p in problems])
    assert all(0 <= s <= 1 for s in scores) and sum(scores) / 4 > 0.5  # right solutions score high
    mean, spent = judge([p.prompt for p in problems], [p.solution for p in problems])
    assert isinstance(mean, float) and spent > 0


def test_a_calibration_slice_samples_on_the_runs_device(tmp_path):
    """A calibration job without Ray: its model goes to the run's device (in bf16 with
    learner.bf16) and the slice's pass rates come back."""
    from isoflop_cli.recipe.calibrate import calibrate

    sums = tmp_path / "sums.parquet"
    pd.DataFrame(
        [
            {
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"ground_truth": str(a + b)[::-1]},
                "data_source": "sums",
                "extra_info": {"index": i},
            }
            for i, (a, b) in enumerate((a, b) for a in range(4) for b in range(4))
        ]
    ).to_parquet(sums)
    cfg = config.load(
        None,
        [
            "task=dataset",
            f"task.train={sums}",
            "task.max_new_tokens=6",
            "task.max_prompt_tokens=8",
            "eval.problems=4",
            "calibrate.samples=4",
            "calibrate.rows=[0,8]",
        ],
    )
    df = calibrate(cfg, tmp_path / "slice")
    assert list(df["problem_id"]) == list(range(8)) and (df["samples"] == 4).all()
    assert df["pass_rate"].between(0, 1).all() and df["pass_rate"].mean() > 0  # the embedded model adds small sums
