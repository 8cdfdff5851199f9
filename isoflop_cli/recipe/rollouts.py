"""What a sampler gives the recipe and what it must do: `Rollouts` (n completions per prompt, grouped
by prompt, with the sampler's log-probs), `pack` (Rollouts from token lists, as a separate engine
returns them), and the `Sampler` protocol both samplers follow (`sampler.HFSampler`,
`vllm_sampler.VllmSampler`). `make_sampler` builds the one `sampler.name` names from the registry
in `isoflop_cli/samplers.py`, so neither sampler module imports the other.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from isoflop_cli.recipe.distributed import Group
from isoflop_cli.samplers import SAMPLERS


@dataclass
class Rollouts:
    sequences: torch.Tensor  # [R, P + T]: left-padded prompt, then the completion
    attention_mask: torch.Tensor  # [R, P + T]: prompt tokens and completion tokens up to its eos
    completion_mask: torch.Tensor  # [R, P + T]: completion tokens (eos included) only
    logprobs: torch.Tensor  # [R, P + T - 1]: the sampler's log-prob of each next token (0 off the completion)
    texts: list[str]  # decoded completions, R = len(prompts) * n, each prompt's n together
    prompt_width: int  # the padded prompt length
    prefill_rows: int  # rows the prompt was prefilled for: len(prompts) when shared, else R

    @property
    def generated_width(self) -> int:
        """Decode steps the batch ran (rows that finished early decoded padding until the end)."""
        return self.sequences.shape[1] - self.prompt_width

    @property
    def tokens_generated(self) -> int:
        return int(self.completion_mask.sum())

    @property
    def decode_rows(self) -> tuple[int, ...]:
        """Rows running at each decode step 1 .. generated_width - 1: those whose completion (eos
        included) is longer than the step. Both samplers drop a row from the batch once it said eos."""
        lengths = self.completion_mask.sum(-1)
        return tuple(int((lengths > t).sum()) for t in range(1, self.generated_width))

    def select(self, rows: torch.Tensor) -> Rollouts:
        """These rows only, in this order, in the same layout (a fractional epoch's rows)."""
        return replace(
            self,
            sequences=self.sequences[rows],
            attention_mask=self.attention_mask[rows],
            completion_mask=self.completion_mask[rows],
            logprobs=self.logprobs[rows],
            texts=[self.texts[i] for i in rows.tolist()],
            prefill_rows=min(self.prefill_rows, len(rows)),
        )


class Sampler(Protocol):
    """What the recipe asks of a sampler. One built with `own_engine` (samplers.py) runs on every
    rank and also has `serve`, `release`, `sleep` and `close` (see `VllmSampler`)."""

    @classmethod
    def from_config(cls, cfg, policy, tokenizer, max_prompt_tokens: int, own_copy: bool, group: Group) -> Sampler: ...

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seeds: list[int] | None = None,
    ) -> Rollouts:
        """n completions of each prompt, each prompt's n together. With `seeds` (one per prompt, as
        evaluation gives) each prompt's completions are drawn from a random stream of its own seed,
        whatever else is in the batch; without, from the run's generators."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The learner's new weights (LoRA: the adapter's), one tensor at a time."""


def make_sampler(
    cfg, policy, tokenizer, max_prompt_tokens: int, own_copy: bool = False, group: Group = Group()
) -> Sampler:
    """The run's sampler (`sampler.name`, built from its registry entry): on `policy` (HF; `own_copy`:
    an unsharded copy of it), or an engine on each of the `group`'s ranks (vLLM)."""
    module, name = SAMPLERS[cfg.sampler.name].engine.split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls.from_config(cfg, policy, tokenizer, max_prompt_tokens, own_copy, group)


def sampler_dtype(cfg) -> torch.dtype:
    """The dtype the sampler's weights are held and pushed in: the learner's compute dtype (bf16 with learner.bf16)."""
    return torch.bfloat16 if cfg.learner.bf16 else torch.float32


def pack(
    prompt_ids: list[list[int]], completions: list[list[int]], logprobs: list[list[float]], n: int, tokenizer
) -> Rollouts:
    """`Rollouts` from token lists, as a separate engine returns them: each prompt (unpadded) and its
    n completions (up to and including eos) with each token's log-prob. Prompts are left-padded and
    completions right-padded, the layout `HFSampler` produces."""
    pad = tokenizer.pad_token_id
    width, new = max(map(len, prompt_ids)), max(1, max(map(len, completions)))
    rows = len(completions)
    sequences = torch.full((rows, width + new), pad, dtype=torch.long)
    attention = torch.zeros(rows, width + new, dtype=torch.long)
    completion_mask = torch.zeros_like(attention)
    token_logprobs = torch.zeros(rows, width + new - 1)
    for r, (tokens, lps) in enumerate(zip(completions, logprobs)):
        prompt = prompt_ids[r // n]
        sequences[r, width - len(prompt) : width] = torch.tensor(prompt)
        attention[r, width - len(prompt) : width] = 1
        sequences[r, width : width + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention[r, width : width + len(tokens)] = 1
        completion_mask[r, width : width + len(tokens)] = 1
        token_logprobs[r, width - 1 : width - 1 + len(tokens)] = torch.tensor(lps)
    return Rollouts(
        sequences=sequences,
        attention_mask=attention,
        completion_mask=completion_mask,
        logprobs=token_logprobs,
        texts=tokenizer.batch_decode(completions, skip_special_tokens=True),
        prompt_width=width,
        prefill_rows=len(prompt_ids) if n > 1 else rows,
    )
