"""The Trainer's step wired as each algorithm's spec says, on real batches sampled from the embedded
model: rewards are set by hand, then the step's own parts (arrange, pre-passes, advantages, loss)
run as in a run."""

import itertools
import json

import pytest
import torch
from typer.testing import CliRunner

from isoflop_cli import algorithms, config
from isoflop_cli.cli import app
from isoflop_cli.recipe.distributed import Group
from isoflop_cli.recipe.trainer import Budget, Trainer
from isoflop_cli.store import RunFiles

pytestmark = pytest.mark.slow  # a Trainer on the embedded model

REWARDS = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]]  # B_p = 2 groups of n = 4
# By hand: means 0.25 and 0.75, unbiased stds 0.5 and 0.5.
CENTRED = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25]
SCALED = [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, -1.5, 0.5]


def make_trainer(tmp_path, *overrides) -> Trainer:
    cfg = config.load(None, ["n=4", "B_p=2", "eval.problems=4", "eval.samples=4", *overrides])
    return Trainer(Group(), cfg, Budget("rollouts", 32, (32,), 4), lr=1e-4, files=RunFiles(tmp_path), pause_at=None)


def sampled(trainer: Trainer, rewards=REWARDS):
    """One step's batch up to its advantages, with these rewards in place of the reward system's."""
    problems = [next(trainer.prompts) for _ in range(trainer.B_p)]
    batch = trainer.score(problems, trainer.sample(problems))
    batch.rewards = torch.tensor(rewards)
    trainer.arrange(batch)
    trainer.pre_passes(batch)
    trainer.estimate_advantages(batch)
    return batch


@pytest.mark.parametrize(
    "overrides, expected",
    [([], SCALED), (["algo=dr_grpo"], CENTRED), (["algo.std_norm=false"], CENTRED), (["algo=cispo"], SCALED)],
)
def test_group_advantages_divide_by_the_group_std_only_where_the_spec_says(tmp_path, overrides, expected):
    batch = sampled(make_trainer(tmp_path, *overrides))
    assert torch.allclose(batch.advantages.advantages, torch.tensor(expected), atol=1e-5)
    assert batch.advantages.returns is None


@pytest.mark.parametrize(
    "overrides, agg",
    [
        ([], "token-mean"),
        (["algo=dr_grpo"], "constant"),
        (["algo.loss_agg=seq-mean-token-mean"], "seq-mean-token-mean"),
        (["algo=dr_grpo", "algo.loss_agg=token-mean"], "token-mean"),
    ],
)
def test_token_weights_follow_the_spec_and_its_knob(tmp_path, overrides, agg):
    trainer = make_trainer(tmp_path, *overrides)
    batch = sampled(trainer)
    mask, T = batch.mask, trainer.cfg.task.max_new_tokens
    expected = {
        "token-mean": mask / mask.sum(),
        "constant": mask / (8 * T),  # R * task.max_new_tokens, whatever the completions' lengths
        "seq-mean-token-mean": mask / mask.sum(-1, keepdim=True) / 8,
    }[agg]
    assert torch.allclose(batch.weights, expected)


def test_cispo_keeps_the_gradient_on_tokens_the_clipped_ratio_zeroes(tmp_path):
    """Old log-probs 5 nats below the policy's put every ratio at e^5, above 1 + clip_high; with a
    positive advantage PPO-clip's loss is then constant (no gradient anywhere) while CISPO's clipped,
    stop-gradient weight still multiplies log pi."""
    grads = {}
    for name in ("grpo", "cispo"):
        trainer = make_trainer(
            tmp_path / name, f"algo={name}", "algo.epochs=2", "algo.tis_cap=null"
        )  # epochs 2: the loss reads old log-probs
        assert trainer.passes.old_policy
        batch = sampled(trainer)
        batch.old_logp = batch.old_logp - 5 * batch.mask
        batch.advantages.advantages = batch.advantages.advantages.abs() + 0.1
        trainer.optimizer.zero_grad(set_to_none=True)
        terms = trainer.loss_terms(batch, torch.arange(8))
        assert terms["clip_frac"].item() == pytest.approx(1.0)  # every token clipped, in both
        grads[name] = sum(p.grad.abs().sum().item() for p in trainer.trainable if p.grad is not None)
    assert grads["grpo"] == 0 and grads["cispo"] > 0


def test_the_zero_variance_filter_leaves_all_equal_groups_out_of_the_loss(tmp_path):
    """Group 0's rewards are all equal: filtered, its rows weigh nothing and group 1's tokens share
    the whole weight, so the gradient (group 0 adds zero either way) grows by all tokens / group 1's."""
    rewards = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 1.0]]
    out = {}
    for on in ("false", "true"):
        trainer = make_trainer(tmp_path / on, f"algo.filter_zero_variance={on}")
        batch = sampled(trainer, rewards)
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.loss_terms(batch, torch.arange(8))
        out[on] = batch, torch.cat([p.grad.flatten() for p in trainer.trainable])
    (kept, grad_kept), (filtered, grad_filtered) = out["false"], out["true"]
    assert kept.weights[:4].sum() > 0 and filtered.weights[:4].sum() == 0
    assert filtered.weights.sum().item() == pytest.approx(1.0)
    assert torch.equal(kept.rollouts.sequences, filtered.rollouts.sequences)  # same seed, same batch
    tokens, group_1 = kept.mask.sum(), kept.mask[4:].sum()
    assert grad_kept.abs().sum() > 0
    torch.testing.assert_close(grad_filtered, grad_kept * tokens / group_1, rtol=1e-4, atol=1e-7)


def test_ppo_trains_a_value_head_on_whitened_per_token_advantages(tmp_path):
    trainer = make_trainer(tmp_path, "algo=ppo")
    assert trainer.actor.value_head is not None and trainer.passes.old_policy
    batch = sampled(trainer)
    adv, mask = batch.advantages.advantages, batch.mask.bool()
    assert adv.shape == mask.shape and batch.advantages.returns.shape == mask.shape
    assert adv[mask].mean().abs() < 1e-5 and adv[mask].std(correction=0) == pytest.approx(1.0, abs=1e-3)
    assert "value_loss" in trainer.loss_terms(batch, torch.arange(8))


def test_the_reference_pass_runs_where_kl_is_on(tmp_path):
    """A frozen copy for full fine-tuning, the adapters switched off with LoRA (no copy); its
    log-probs equal the policy's before any update, so the KL term starts at zero."""
    for overrides, copy in ((["algo.kl_coef=0.1"], True), (["algo.kl_coef=0.1", "lora.rank=4"], False), ([], False)):
        trainer = make_trainer(tmp_path / str(len(overrides)), *overrides)
        assert (trainer.reference is not None) == copy and trainer.passes.reference == bool(overrides)
        batch = sampled(trainer)
        if trainer.passes.reference:
            terms = trainer.loss_terms(batch, torch.arange(8))
            assert batch.ref_logp.abs().sum() > 0 and terms["kl"].item() == pytest.approx(0.0, abs=1e-6)


def test_a_new_algorithm_is_one_spec(tmp_path, monkeypatch):
    """Registered under a new name, a spec of existing parts passes the config checks and runs."""
    monkeypatch.setitem(
        algorithms.ALGORITHMS,
        "grpo_seq",
        algorithms.Algorithm(advantage="group", policy_loss="cispo", std_norm=False, loss_agg="seq-mean-token-mean"),
    )
    trainer = make_trainer(tmp_path, "algo.name=grpo_seq")
    batch = sampled(trainer)
    assert torch.allclose(batch.advantages.advantages, torch.tensor(CENTRED))
    assert torch.allclose(batch.weights, batch.mask / batch.mask.sum(-1, keepdim=True) / 8)


def test_dr_grpo_is_grpo_with_its_two_knobs(tmp_path):
    """The preset and the knobs run the same computation, row for row (their records' fingerprints
    differ: they are two configs)."""
    args = ["n=4", "B_p=2", "grid.budgets=[16]", "grid.eval_points=1", "eval.problems=8", "eval.samples=4"]
    rows = {}
    for name, extra in (("preset", ["algo=dr_grpo"]), ("knobs", ["algo.std_norm=false", "algo.loss_agg=constant"])):
        result = CliRunner().invoke(app, ["run", *args, *extra, "--run-dir", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        rows[name] = [
            {
                k: v
                for k, v in json.loads(line).items()
                if k not in ("wall_s", "fingerprint") and not k.startswith(("time_", "reward_cpu"))
            }
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
    assert rows["preset"] == rows["knobs"]


@pytest.mark.parametrize(
    "shared_prompt, budget",
    [(True, "two groups"), (True, "below any group"), (False, "two groups"), (False, "below any group")],
    ids=["tree", "tree-groups-split", "plain", "plain-groups-split"],
)
def test_token_budget_micro_batches_give_the_whole_mini_batch_gradient(tmp_path, shared_prompt, budget):
    """learner.max_tokens_per_micro_batch packs whole groups, in order, into forwards of at most that
    many layout positions (tree: each prompt once and its completions; plain: every row at the
    batch's width), and splits a group over it into pieces of its rows (a tree piece with its
    prompt): more forwards, the same summed gradients and losses as one forward over the mini-batch
    (the token weights are the mini-batch's)."""
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]
    common = [
        "B_p=4",
        f"learner.shared_prompt={str(shared_prompt).lower()}",
        "algo.kl_coef=0.1",
        "algo.entropy_coef=0.01",
        "algo.max_grad_norm=1e9",
    ]  # no clipping: the gradients after the update are the summed ones
    whole = make_trainer(tmp_path / "whole", *common)
    whole_batch = sampled(whole, rewards)
    r = whole_batch.rollouts
    P, width = r.prompt_width, r.sequences.shape[1]
    prompt = (
        r.attention_mask[:, :P].sum(-1).tolist() if shared_prompt else [0] * 16
    )  # each row's group's shared positions
    own = r.attention_mask[:, P:].sum(-1).tolist() if shared_prompt else [width] * 16  # each row's own positions
    tokens = [prompt[4 * g] + sum(own[4 * g : 4 * g + 4]) for g in range(4)]
    limit = tokens[0] + tokens[1] if budget == "two groups" else min(tokens) - 1
    split = make_trainer(tmp_path / "split", *common, f"learner.max_tokens_per_micro_batch={limit}")
    batch = sampled(split, rewards)
    assert torch.equal(batch.rollouts.sequences, r.sequences)  # same seed, same batch

    (micro,) = batch.chunks
    assert torch.equal(torch.cat(micro), torch.arange(16))  # every row once, in order
    for idx in micro:
        groups = set((idx // 4).tolist())
        held = sum(prompt[4 * g] for g in groups) + sum(own[i] for i in idx.tolist())
        assert len(idx) % 4 == 0 or len(groups) == 1  # whole groups, or a piece of one
        assert held <= limit or len(idx) == 1  # within the budget, or one row alone
    if budget == "two groups":
        assert len(micro[0]) == 8 and len(micro) > 1
    else:  # every group over the budget: pieces only, each full (the next row would not fit)
        assert all(len(idx) < 4 for idx in micro)
        for idx, after in itertools.pairwise(micro):
            if int(idx[0]) // 4 == int(after[0]) // 4:
                assert prompt[int(idx[0])] + sum(own[i] for i in idx.tolist()) + own[int(after[0])] > limit

    forwards, grads = {}, {}
    for name, trainer, b in (("whole", whole, whole_batch), ("split", split, batch)):
        calls = []
        forward = trainer.actor.forward
        trainer.actor.forward = lambda *args, _calls=calls, _forward=forward, **kwargs: (
            _calls.append(1) or _forward(*args, **kwargs)
        )
        trainer.update(b)
        forwards[name], grads[name] = len(calls), torch.cat([p.grad.flatten() for p in trainer.trainable])
    assert forwards == {"whole": 1, "split": len(micro)}
    assert grads["whole"].abs().max() > 0
    torch.testing.assert_close(grads["split"], grads["whole"], rtol=1e-4, atol=1e-7)
    for key in ("loss", "kl", "entropy", "clip_frac", "tis"):
        assert split.progress.since_eval[key] == pytest.approx(whole.progress.since_eval[key], abs=1e-6), key


@pytest.mark.parametrize(
    "gpus, lora, backbone",
    [(0, 4, torch.float32), (1, 4, torch.bfloat16), (1, 0, None)],
    ids=["cpu-lora", "gpu-lora", "gpu-full"],
)
def test_a_lora_backbone_is_held_in_the_compute_dtype_and_what_trains_in_fp32(gpus, lora, backbone):
    """With LoRA the frozen backbone is loaded in the compute dtype (bf16 where the run is, on GPUs;
    fp32 on the CPU) and the adapters train in fp32; full fine-tuning keeps fp32 master weights."""
    from isoflop_cli.recipe import checkpoint
    from isoflop_cli.recipe.trainer import policy_dtype, with_adapters

    cfg = config.load(None, [f"cluster.gpus_per_run={gpus}", f"lora.rank={lora}"])
    assert cfg.learner.bf16 == bool(gpus)
    _, policy = checkpoint.load(cfg.model, cfg.task, policy_dtype(cfg))
    if lora:
        policy = with_adapters(policy, cfg.lora)
    frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
    trained = {p.dtype for p in policy.parameters() if p.requires_grad}
    assert trained == {torch.float32} and frozen == ({backbone} if lora else set())
