"""Evaluation paired across runs: every cell evaluates the same problems from the same per-problem
streams, so a difference between cells is not evaluation noise drawn twice."""

import pytest
import torch

from isoflop_cli import config
from isoflop_cli.recipe.distributed import Group
from isoflop_cli.recipe.evaluate import stream_seeds
from isoflop_cli.recipe.sampler import HFSampler, inverse_cdf
from isoflop_cli.recipe.trainer import Budget, Trainer
from isoflop_cli.store import RunFiles

PROMPTS = ["12+34=", "5+6=", "71+9="]


def test_inverse_cdf_draws_from_the_distribution_and_never_an_excluded_token():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).repeat(40_000, 1)
    token = inverse_cdf(probs, torch.rand(40_000, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(token, minlength=4) / 40_000
    assert torch.allclose(freq, probs[0], atol=0.01) and freq[1] == 0  # 4 sd of a binomial share is <= 0.01
    edge = torch.tensor([[0.25, 0.75, 0.0]])  # u at the top of [0, 1): rounding may land on the last, excluded token
    assert inverse_cdf(edge, torch.tensor([1 - 2**-24])).item() == 1


def recording(sampler):
    """The sampler, its seeded `sample` calls' (evaluation's; training passes none) prompts and
    seeds kept in `.calls`."""
    calls, sample = [], sampler.sample

    def spy(prompts, n, *args, seeds=None):
        if seeds is not None:
            calls.append((list(prompts), n, list(seeds)))
        return sample(prompts, n, *args, seeds=seeds)

    sampler.sample, sampler.calls = spy, calls
    return sampler


@pytest.mark.slow
def test_two_cells_evaluate_the_same_problems_from_the_same_streams(tmp_path):
    """Two cells (other n, B_p and seed): their evaluations ask the sampler for the same problems
    with the same per-problem seeds (one per problem, all different), at the base and after an
    update; at the base (the same model) they measure exactly the same."""
    trainers = []
    for i, cell in enumerate((["n=4", "B_p=2", "seed=0"], ["n=2", "B_p=4", "seed=7"])):
        cfg = config.load(None, [*cell, "eval.problems=6", "eval.samples=4"])
        trainer = Trainer(
            Group(), cfg, Budget("rollouts", 32, (32,), 4), lr=1e-3, files=RunFiles(tmp_path / str(i)), pause_at=None
        )
        recording(trainer.sampler)
        trainers.append(trainer)
    base = [t.evaluator(t.sampler) for t in trainers]
    assert base[0].per_problem == base[1].per_problem and base[0].metrics == base[1].metrics
    trainers[1].step()  # one update: a different policy, the same streams
    trainers[1].evaluator(trainers[1].sampler)
    (a,), (b, later) = trainers[0].sampler.calls, trainers[1].sampler.calls
    assert a == b == later
    prompts, n, seeds = a
    assert n == 4 and len(set(seeds)) == len(seeds) == len(prompts) == 6
    assert seeds == stream_seeds(trainers[0].evaluator.problems)


@pytest.mark.slow
def test_a_prompts_completions_depend_on_its_seed_alone():
    """With seeds, a prompt's completions are the same sampled alone or beside other prompts (whose
    rows finish at other steps), whatever the run's generator holds; another seed draws others."""
    from isoflop_cli.recipe.checkpoint import load

    cfg = config.load()
    tokenizer, model = load(cfg.model, cfg.task)
    sampler = HFSampler(model.eval(), tokenizer)
    torch.manual_seed(0)
    together = sampler.sample(PROMPTS, 8, 1.0, 1.0, 6, seeds=[11, 22, 33])
    torch.manual_seed(1)
    alone = sampler.sample(PROMPTS[1:2], 8, 1.0, 1.0, 6, seeds=[22])
    other = sampler.sample(PROMPTS[1:2], 8, 1.0, 1.0, 6, seeds=[23])
    assert together.texts[8:16] == alone.texts
    assert other.texts != alone.texts and len(set(together.texts)) > 3  # sampling, not greedy
