"""Per-token log-probabilities (and entropies) of rollouts under a model."""

from __future__ import annotations

import torch


def token_logprobs(model, sequences, attention_mask, temperature: float, with_entropy: bool = False):
    """log pi(x_t | x_<t) for t >= 1 at the sampling temperature: [R, L - 1] (and entropy [R, L - 1])."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, :-1].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    taken = logprobs.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return taken, None
    entropy = -(logprobs.exp() * logprobs).sum(-1)
    return taken, entropy
