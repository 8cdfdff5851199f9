"""The learner's model: the policy, and for PPO a value head, as one module FSDP2 can shard."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Outputs:
    logp: torch.Tensor  # [R, L - 1]: log pi(x_t | x_<t) for t >= 1, at the sampling temperature
    entropy: torch.Tensor | None  # [R, L - 1]
    values: torch.Tensor | None  # [R, L - 1]: the value head's estimate before each next token


class Actor(nn.Module):
    """A Hugging Face causal LM (LoRA adapters or not) with an optional value head on its last hidden state.

    One `forward` gives everything a loss needs, so that FSDP's hooks on this module gather every
    parameter the step uses, the value head's included.
    """

    def __init__(self, policy: nn.Module, value_head: bool = False):
        super().__init__()
        self.policy = policy
        self.value_head = nn.Linear(policy.config.hidden_size, 1, bias=False) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)  # V = 0 at first: the first advantages are the returns

    def forward(self, sequences: torch.Tensor, attention_mask: torch.Tensor, temperature: float, with_entropy: bool = False) -> Outputs:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.policy(input_ids=sequences, attention_mask=attention_mask, position_ids=position_ids,
                          output_hidden_states=self.value_head is not None)
        logprobs = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)
        logp = logprobs.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
        entropy = -(logprobs.exp() * logprobs).sum(-1) if with_entropy else None
        values = self.value_head(out.hidden_states[-1]).squeeze(-1)[:, :-1].float() if self.value_head is not None else None
        return Outputs(logp, entropy, values)
