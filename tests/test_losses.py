import itertools
import math

import pytest
import torch

from isoflop_cli.recipe.losses import (
    cispo_pg,
    clipped_pg,
    gae,
    group_advantages,
    kl_k3,
    learned_first,
    token_weights,
    truncated_is,
    value_loss,
    whiten,
)


def test_group_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    adv = group_advantages(rewards, eps=0.0)
    # group 1: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 * sqrt(3)
    assert adv[0].tolist() == pytest.approx([math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2])
    # group 2: mean 0.25, unbiased std 0.5 -> 1.5 and -0.5
    assert adv[1].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_equal_rewards_give_zero_advantage():
    for value in (0.0, 1.0):
        adv = group_advantages(torch.full((3, 5), value), eps=1e-6)
        assert torch.equal(adv, torch.zeros(3, 5))
    assert torch.equal(group_advantages(torch.tensor([[1.0], [0.0]]), eps=1e-6), torch.zeros(2, 1))


def test_clipped_pg_hand_computed():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[0.5, 1.1, 1.5, 0.9]]))  # ratios 0.5, 1.1, 1.5, 0.9
    loss, clipped = clipped_pg(logp, old, torch.tensor([1.0]), clip_low=0.2, clip_high=0.28)
    # A > 0: -min(r, clip(r, 0.8, 1.28)) -> -0.5, -1.1, -1.28, -0.9
    assert loss[0].tolist() == pytest.approx([-0.5, -1.1, -1.28, -0.9])
    assert clipped[0].tolist() == [0.0, 0.0, 1.0, 0.0]
    loss, clipped = clipped_pg(logp, old, torch.tensor([-2.0]), clip_low=0.2, clip_high=0.28)
    # A < 0: -min(-2r, -2 clip(r)) = 2 max(r, clip(r)) -> 1.6, 2.2, 3.0, 1.8
    assert loss[0].tolist() == pytest.approx([1.6, 2.2, 3.0, 1.8])
    assert clipped[0].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_kl_k3_and_token_mean():
    logp = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.25]))
    # d = ref - logp = log 0.5, 0: exp(d) - d - 1 = 0.5 + log 2 - 1, 0
    assert kl_k3(logp, ref).tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, mask, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)


def test_dr_grpo_advantages_are_only_mean_centred():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    adv = group_advantages(rewards, eps=1e-6, scale=False)
    assert adv.flatten().tolist() == pytest.approx(
        [0.5, -0.5, -0.5, 0.5, 0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]
    )


def aggregate(x, mask, mode, max_len=0):
    return (x * token_weights(mask, mode, max_len)).sum()


def test_aggregations_hand_computed():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(x, mask, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)
    assert aggregate(x, mask, "seq-mean-token-mean").item() == pytest.approx(((1 + 2) / 2 + 4) / 2)
    assert aggregate(x, mask, "constant", max_len=5).item() == pytest.approx((1 + 2 + 4) / (2 * 5))
    # a row with no tokens (a filtered group) does not count as a sequence
    empty = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert aggregate(x, empty, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert aggregate(x, torch.zeros(2, 3), "seq-mean-token-mean").item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "constant"])
def test_split_rows_sum_to_the_whole_batch_loss(mode):
    """Ranks and micro-batches each take some rows; the weights of the whole mini-batch make their sum exact."""
    torch.manual_seed(0)
    x, mask = torch.randn(6, 5), (torch.rand(6, 5) > 0.3).float()
    w = token_weights(mask, mode, max_len=5)
    parts = sum((x[rows] * w[rows]).sum() for rows in torch.arange(6).tensor_split(4))
    assert parts.item() == pytest.approx(aggregate(x, mask, mode, 5).item())


def test_truncated_importance_weight():
    learner = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    sampler = torch.log(torch.tensor([[0.5, 0.3, 0.4]]))
    # ratios 1, 3, 0.5; capped at 2
    assert truncated_is(learner, sampler, cap=2.0)[0].tolist() == pytest.approx([1.0, 2.0, 0.5])
    assert not truncated_is(learner.requires_grad_(True), sampler, cap=2.0).requires_grad


def test_gae_hand_computed():
    # one completion of 3 tokens at positions 1..3, reward 1 on its last token
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[9.0, 0.5, 0.25, 0.75, 9.0]])  # values off the completion are ignored
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # deltas: t3 = 1 - 0.75 = 0.25; t2 = 0 + 0.75 - 0.25 = 0.5; t1 = 0 + 0.25 - 0.5 = -0.25
    # A3 = 0.25; A2 = 0.5 + 0.5 * 0.25 = 0.625; A1 = -0.25 + 0.5 * 0.625 = 0.0625
    assert adv[0].tolist() == pytest.approx([0.0, 0.0625, 0.625, 0.25, 0.0])
    assert ret[0].tolist() == pytest.approx([0.0, 0.5625, 0.875, 1.0, 0.0])
    # lam = 1, gamma = 1: every token's advantage is the return minus its value
    adv, _ = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0, 1:4].tolist() == pytest.approx([0.5, 0.75, 0.25])


def test_whiten_and_value_loss_hand_computed():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert whiten(x, mask)[0].tolist() == pytest.approx([-1.0, 1.0, 0.0])  # mean 2, std 1; masked out -> 0
    # a rank holding half the batch, its reduce adding the other half (here an identical half),
    # whitens as the whole batch does
    rows = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    whole = whiten(torch.cat([rows, rows]), torch.ones(4, 2))[:2]
    assert torch.allclose(whiten(rows, torch.ones(2, 2), reduce=lambda t: 2 * t), whole)
    values, old, returns = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.9]), torch.tensor([0.0, 0.0])
    # t0: unclipped 0.5 * 1 = 0.5; clipped 0 + 0.2 -> 0.5 * 0.04 = 0.02; max 0.5
    # t1: V - V_old = 0.1 within the clip: 0.5 both
    assert value_loss(values, old, returns, clip=0.2).tolist() == pytest.approx([0.5, 0.5])
    # clipping binds when it makes the loss larger: V moved away from the return past the clip
    assert value_loss(
        torch.tensor([0.5]), torch.tensor([2.0]), torch.tensor([3.0]), clip=0.2
    ).tolist() == pytest.approx([0.5 * 6.25])


def test_cispo_hand_computed_and_stop_gradient():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[0.5, 1.1, 1.5, 0.9]])).requires_grad_(True)  # ratios 0.5, 1.1, 1.5, 0.9
    loss, clipped = cispo_pg(logp, old, torch.tensor([2.0]), clip_low=0.2, clip_high=0.28)
    weight = torch.tensor([0.8, 1.1, 1.28, 0.9])  # clip(r, 0.8, 1.28)
    assert loss[0].tolist() == pytest.approx((-weight * 2.0 * logp[0].detach()).tolist())
    assert clipped[0].tolist() == [1.0, 0.0, 1.0, 0.0]
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx((-weight * 2.0).tolist())  # every token keeps a gradient


def test_equal_reward_groups_give_no_policy_gradient_in_any_algorithm():
    rewards = torch.ones(2, 4)
    logp = torch.log(torch.full((8, 3), 0.5)).requires_grad_(True)
    for scale in (True, False):
        adv = group_advantages(rewards, 1e-6, scale=scale).flatten()
        for policy_loss in (clipped_pg, cispo_pg):
            loss, _ = policy_loss(logp, logp.detach(), adv, 0.2, 0.28)
            assert torch.equal(loss, torch.zeros_like(loss))


def test_a_fractional_epoch_learns_from_the_completions_whose_rewards_vary_most():
    """learned_first against every k-subset (brute force) on binary and continuous groups: its first
    k have the largest reward variance of any k; a group's lone success is kept; equal rewards keep
    their order; each row is a permutation with the learned ones, then the rest, in sampled order."""
    g = torch.Generator().manual_seed(0)
    groups = [
        torch.tensor([[0.0, 0, 0, 0, 0, 1, 0, 0], [1.0, 1, 1, 1, 1, 1, 1, 1], [1.0, 0, 1, 1, 0, 0, 1, 0]]),
        torch.rand(6, 8, generator=g),
        torch.randint(0, 2, (6, 8), generator=g).float(),
    ]
    for rewards in groups:
        for k in (1, 2, 3, 5):
            order = learned_first(rewards, k)
            assert (order.sort(1).values == torch.arange(8)).all()
            for r, o in zip(rewards, order):
                best = max(r[list(c)].var(correction=0).item() for c in itertools.combinations(range(8), k))
                assert r[o[:k]].var(correction=0).item() == pytest.approx(best, abs=1e-7), (r, k)
                assert (o[:k].diff() > 0).all() and (o[k:].diff() > 0).all()
    first = learned_first(groups[0], 2)
    assert 5 in first[0, :2].tolist() and first[1, :2].tolist() == [0, 1]
