"""The learner's model: the policy, and for PPO a value head, as one module FSDP2 can shard."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache


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

    def forward(self, sequences: torch.Tensor, attention_mask: torch.Tensor, temperature: float, with_entropy: bool = False,
                group_size: int = 1, prompt_width: int = 0) -> Outputs:
        """Log-probs (and entropies, values) of every next token; zero over the prompt.

        Rows in consecutive groups of `group_size` share a prompt (left-padded to `prompt_width`):
        the prompt's first `prompt_width - 1` tokens then run once per group and their KV cache is
        repeated over the group, gradients included; each row runs its own last prompt token and
        completion against it. The log-probs are those of a full pass (to float rounding).
        """
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.value_head is not None
        shared = prompt_width - 1 if group_size > 1 and prompt_width > 1 else 0
        cache = None
        if shared:
            first = torch.arange(0, sequences.shape[0], group_size, device=sequences.device)
            cache = DynamicCache(config=self.policy.config)
            self.policy(input_ids=sequences[first, :shared], attention_mask=attention_mask[first, :shared],
                        position_ids=position_ids[first, :shared], cache=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(group_size)
        out = self.policy(input_ids=sequences[:, shared:], attention_mask=attention_mask, position_ids=position_ids[:, shared:],
                          cache=cache, use_cache=bool(shared), output_hidden_states=hidden)
        logprobs = torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)
        logp = _pad(logprobs.gather(-1, sequences[:, shared + 1 :].unsqueeze(-1)).squeeze(-1), shared)
        entropy = _pad(-(logprobs.exp() * logprobs).sum(-1), shared) if with_entropy else None
        values = _pad(self.value_head(out.hidden_states[-1]).squeeze(-1)[:, :-1].float(), shared) if hidden else None
        return Outputs(logp, entropy, values)


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zeros for the first `width` positions (a shared prompt's, which predict nothing trained)."""
    return torch.nn.functional.pad(x, (width, 0)) if width else x
