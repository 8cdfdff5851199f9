"""GRPO's advantage and loss terms, on plain tensors (tested against hand-computed values)."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, eps: float) -> torch.Tensor:
    """(r - mean) / (std + eps) within each prompt's group; rewards are [B_p, n].

    std is the unbiased sample std; a group whose rewards are all equal gets zero advantage.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean over the whole batch (every completion token weighs the same)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def clipped_pg(logp, old_logp, advantages, clip_low: float, clip_high: float):
    """Per-token -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) and whether it clipped.

    `advantages` is per sequence [R] and broadcasts over tokens [R, T].
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference): exp(d) - d - 1, d = ref - policy, >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1
