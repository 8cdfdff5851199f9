"""Rollouts with Hugging Face `generate`: n completions per prompt, grouped by prompt."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollouts:
    sequences: torch.Tensor  # [R, P + T]: left-padded prompt, then the completion
    attention_mask: torch.Tensor  # [R, P + T]: prompt tokens and completion tokens up to its eos
    completion_mask: torch.Tensor  # [R, P + T]: completion tokens (eos included) only
    texts: list[str]  # decoded completions, R = len(prompts) * n, each prompt's n together
    prompt_width: int  # the padded prompt length every row was prefilled at

    @property
    def generated_width(self) -> int:
        """Decode steps the batch ran (rows that finished early decoded padding until the end)."""
        return self.sequences.shape[1] - self.prompt_width

    @property
    def tokens_generated(self) -> int:
        return int(self.completion_mask.sum())


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    out = model.generate(
        **enc,
        do_sample=True,
        temperature=temperature,
        top_p=top_p,
        top_k=0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=n,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    width = enc.input_ids.shape[1]
    completion = out[:, width:]
    is_eos = (completion == tokenizer.eos_token_id).long()
    keep = (is_eos.cumsum(-1) - is_eos) == 0  # up to and including the first eos
    prompt_mask = enc.attention_mask.repeat_interleave(n, dim=0)
    completion_mask = torch.cat([torch.zeros_like(prompt_mask), keep.long()], dim=1)
    texts = tokenizer.batch_decode(torch.where(keep, completion, tokenizer.pad_token_id), skip_special_tokens=True)
    return Rollouts(
        sequences=out,
        attention_mask=torch.cat([prompt_mask, keep.long()], dim=1),
        completion_mask=completion_mask,
        texts=texts,
        prompt_width=width,
    )
