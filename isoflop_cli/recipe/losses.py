"""Advantage estimators and policy losses of GRPO and its relatives, on plain tensors (tested
against hand-computed values), each registered under the name an `algorithms.Algorithm` spec uses.

- advantages "group" (grpo, dr_grpo, cispo): each completion's reward against its group's mean,
  divided by the group's std unless the spec's std_norm is off (Dr. GRPO).
- advantages "gae" (ppo): per-token advantages from a value head, whitened over the batch.
- policy loss "clipped": the PPO-style clipped ratio (separate low and high clip).
- policy loss "cispo": a clipped, stop-gradient importance weight times advantage times log-prob.

Per-token losses become one number through `token_weights`: a loss is sum(x * w). The weights are
computed on a whole mini-batch, so any split of its rows (data-parallel ranks, micro-batches) sums
to exactly the same loss and gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

ADVANTAGES: dict[str, Callable[..., Advantages]] = {}
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def register(registry: dict, name: str) -> Callable:
    """Add an estimator or loss under `name`; a second one of the same name is a mistake, refused."""

    def add(fn: Callable) -> Callable:
        if name in registry:
            raise ValueError(f"'{name}' is registered twice")
        registry[name] = fn
        return fn

    return add


@dataclass
class AdvantageInputs:
    """What an estimator may read about one rollout batch; R = B_p * n_learn rows learned from."""

    rewards: torch.Tensor  # [B_p, n] every sampled completion's reward, by prompt group
    n_learn: int  # the first n_learn completions of each group are learned from (`learned_first`)
    mask: torch.Tensor  # [R, T] the completion tokens learned from
    mine: torch.Tensor  # [R] bool: the rows this process trains on
    values: torch.Tensor  # [R, T] the value head's estimates at sampling time (zeros without a value head)
    reduce: Callable[[torch.Tensor], torch.Tensor]  # sums over the processes of a sharded learner


@dataclass
class Advantages:
    advantages: torch.Tensor  # [R] one per completion, or [R, T] one per token
    returns: torch.Tensor | None = None  # [R, T] the value head's targets


@register(ADVANTAGES, "group")
def group_estimator(batch: AdvantageInputs, algo, spec) -> Advantages:
    """Each group's advantages from all n of its rewards, kept for the completions learned from."""
    return Advantages(
        group_advantages(batch.rewards, algo.adv_eps, scale=spec.std_norm)[:, : batch.n_learn]
        .flatten()
        .to(batch.mask.device)
    )


@register(ADVANTAGES, "gae")
def gae_estimator(batch: AdvantageInputs, algo, spec) -> Advantages:
    """The outcome reward on each completion's last token, GAE against the value head, advantages
    whitened over the completion tokens of every process's rows."""
    mask = batch.mask
    R = mask.shape[0]
    last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(R), last] = batch.rewards[:, : batch.n_learn].flatten().to(mask.device) * mask.any(-1)
    token_adv, returns = gae(token_rewards, batch.values, mask, algo.gamma, algo.lam)
    return Advantages(whiten(token_adv, mask * batch.mine[:, None], reduce=batch.reduce), returns)


def group_advantages(rewards: torch.Tensor, eps: float, scale: bool = True) -> torch.Tensor:
    """(r - mean) / (std + eps) within each prompt's group (r - mean without `scale`); rewards are [B_p, n].

    std is the unbiased sample std; a group whose rewards are all equal gets zero advantage.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    return centred / (rewards.std(dim=1, keepdim=True) + eps) if scale else centred


def learned_first(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """[B_p, n] each group's completions reordered so that its first k are the ones a fractional
    epoch learns from: the k whose rewards vary the most (max-variance down-sampling: some i of the
    group's highest rewards and k - i of its lowest, for the i that gives the largest variance), in
    their sampled order, then the rest in theirs. Learning from k of a group means its other
    completions' gradient is lost; the informative ones are where the rewards differ: a binary
    group's one success among many failures is always kept where a uniform k would mostly drop it.
    A group whose rewards are all equal keeps its first k. Ties between subsets go to the one with
    the fewest highest rewards, so the choice is deterministic."""
    n = rewards.shape[1]
    ranked = torch.sort(rewards, dim=1, stable=True).indices  # [B_p, n] ascending, ties by position
    ordered = rewards.gather(1, ranked)
    spread = torch.stack(
        [torch.cat([ordered[:, : k - i], ordered[:, n - i :]], 1).var(1, correction=0) for i in range(k + 1)], 1
    )
    top = spread.argmax(1)  # [B_p] how many of the highest rewards the best subset takes (the first best)
    position = torch.arange(n).expand_as(rewards)
    rank_taken = (position < (k - top)[:, None]) | (position >= (n - top)[:, None])  # [B_p, n] by rank
    taken = torch.zeros_like(rank_taken).scatter(1, ranked, rank_taken)  # [B_p, n] by position
    return torch.sort((~taken).to(torch.int8), dim=1, stable=True).indices


def token_weights(mask: torch.Tensor, mode: str, max_len: int = 0) -> torch.Tensor:
    """Per-token weights [R, T] that turn per-token losses into one number: sum(x * w).

    token-mean: every completion token weighs the same. seq-mean-token-mean: each sequence's token
    mean, then the mean over sequences (every sequence weighs the same; empty rows do not count).
    constant: 1 / (R * max_len), a normaliser that does not depend on the completions' lengths (Dr. GRPO).
    """
    mask = mask.float()
    if mode == "token-mean":
        return mask / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(-1, keepdim=True)
        return mask / lengths.clamp(min=1) / (lengths > 0).sum().clamp(min=1)
    if mode == "constant":
        return mask / (mask.shape[0] * max_len)
    raise ValueError(f"unknown loss aggregation '{mode}'")


@register(POLICY_LOSSES, "clipped")
def clipped_pg(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) and whether it clipped.

    `advantages` is per sequence [R] (broadcast over tokens) or per token [R, T].
    """
    ratio = torch.exp(logp - old_logp)
    adv = _per_token(advantages)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


@register(POLICY_LOSSES, "cispo")
def cispo_pg(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi and whether the weight clipped.

    The importance weight is clipped and carries no gradient, so every token keeps its gradient
    through log pi (no token is dropped by clipping, unlike the PPO-style ratio).
    """
    ratio = torch.exp(logp - old_logp).detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    return -weight * _per_token(advantages) * logp, (weight != ratio).float()


def truncated_is(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_learner / pi_sampler, cap) per token, without gradient.

    The sampler (vLLM, or a KV-cached HF loop) and the learner compute slightly different
    probabilities for the same weights; weighting each token's policy gradient by this ratio makes
    the update unbiased for the learner's policy, and the cap bounds its variance.
    """
    return torch.exp(old_logp - sampler_logp).clamp(max=cap).detach()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference): exp(d) - d - 1, d = ref - policy, >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over completion tokens: (advantages, returns), both [R, T].

    rewards, values and mask are [R, T]: the reward each token receives (here the outcome reward on a
    completion's last token), the value head's estimate before it, and which tokens are the
    completion's. delta_t = r_t + gamma V_{t+1} - V_t and A_t = delta_t + gamma lam A_{t+1}, both
    stopping at the completion's end; returns = A + V are the value head's targets.
    """
    mask = mask.float()
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantages[:, t] = (delta + gamma * lam * next_adv) * mask[:, t]
        next_value = torch.where(mask[:, t] > 0, values[:, t], next_value)
        next_adv = torch.where(mask[:, t] > 0, advantages[:, t], next_adv)
    return advantages, (advantages + values) * mask


def whiten(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
) -> torch.Tensor:
    """(x - mean) / std over the masked tokens of the batch (PPO's advantage normalisation).

    `reduce` sums over the processes that each hold some rows of the batch (identity: one process).
    """
    count = reduce(mask.sum())
    mean = reduce((x * mask).sum()) / count
    var = reduce((((x - mean) * mask) ** 2).sum()) / count
    return (x - mean) / (var.sqrt() + eps) * mask


def value_loss(values, old_values, returns, clip: float) -> torch.Tensor:
    """Per-token 0.5 max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2): PPO's clipped value loss."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
