"""Advantages and policy losses of GRPO and its relatives, on plain tensors (tested against
hand-computed values).

- grpo: group-normalised advantages, clipped ratio loss (separate low and high clip).
- dr_grpo: mean-centred advantages (no std division), the same clipped loss, and a constant length
  normaliser instead of the token count.
- cispo: a clipped, stop-gradient importance weight times advantage times log-prob.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, eps: float, scale: bool = True) -> torch.Tensor:
    """(r - mean) / (std + eps) within each prompt's group (r - mean without `scale`); rewards are [B_p, n].

    std is the unbiased sample std; a group whose rewards are all equal gets zero advantage.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    return centred / (rewards.std(dim=1, keepdim=True) + eps) if scale else centred


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean over the whole batch (every completion token weighs the same)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int = 0) -> torch.Tensor:
    """Per-token losses [R, T] to one number.

    token-mean: every completion token weighs the same. seq-mean-token-mean: each sequence's token
    mean, then the mean over sequences (every sequence weighs the same). constant: the token sum
    over R * max_len, a normaliser that does not depend on the completions' lengths (Dr. GRPO).
    """
    if mode == "token-mean":
        return masked_mean(x, mask)
    if mode == "seq-mean-token-mean":
        per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq[mask.sum(-1) > 0].mean() if (mask.sum(-1) > 0).any() else per_seq.sum() * 0
    if mode == "constant":
        return (x * mask).sum() / (x.shape[0] * max_len)
    raise ValueError(f"unknown loss aggregation '{mode}'")


def clipped_pg(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) and whether it clipped.

    `advantages` is per sequence [R] and broadcasts over tokens [R, T].
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def cispo_pg(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token -sg(clip(r, 1 - clip_low, 1 + clip_high)) A log pi and whether the weight clipped.

    The importance weight is clipped and carries no gradient, so every token keeps its gradient
    through log pi (no token is dropped by clipping, unlike the PPO-style ratio).
    """
    ratio = torch.exp(logp - old_logp).detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    return -weight * advantages.unsqueeze(-1) * logp, (weight != ratio).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference): exp(d) - d - 1, d = ref - policy, >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1
