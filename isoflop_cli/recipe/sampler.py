"""Rollouts from a Hugging Face model: n completions per prompt, grouped by prompt, sampled by a
short decode loop over the model's forward with a KV cache (what `generate` does for plain
sampling, without its per-step machinery).

At n > 1 each distinct prompt is prefilled once and its KV cache and next-token logits repeated
across its group (`shared_prefill`); the loop then runs only the decode steps.
Given a seed per prompt (evaluation's paired streams) each row draws its tokens by the inverse of
its distribution's CDF at uniforms of its own stream, not by `torch.multinomial` over the batch:
a row's tokens then depend on its prompt's seed and its own distributions alone (not on the other
rows, nor on when they finish), and two policies that put similar probabilities on the next token
draw the same one (common random numbers).
The sampler also records the log-prob of every sampled token under its own forward passes (the
temperature-scaled distribution, as the learner defines it), which truncated importance sampling
compares with the learner's.

This is `sampler=hf`, a `rollouts.Sampler`; `vllm_sampler.VllmSampler` is the other.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import replace

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache

from isoflop_cli.recipe.distributed import Group, device
from isoflop_cli.recipe.rollouts import Rollouts, sampler_dtype

# transformers 5.24 renamed `past_key_values` to `cache` (the old name warns); vLLM's CPU build pins
# transformers < 5.20, so the sampler runs in both environments and passes the name each knows.
CACHE = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"


class HFSampler:
    """Samples with a Hugging Face causal LM.

    Given the learner's own model it samples with it directly (one process, no copy). Given
    `own_copy=True` it keeps an unsharded copy (on the run's device, in `dtype`, e.g. bf16 on GPU)
    that `load_weights` refreshes after each update, as a separate engine would: that is what a
    sharded (FSDP) learner uses.
    """

    def __init__(
        self, model, tokenizer, shared_prefill: bool = True, own_copy: bool = False, dtype: torch.dtype | None = None
    ):
        self.model = (
            copy.deepcopy(model).to(device=device(), dtype=dtype).eval().requires_grad_(False) if own_copy else model
        )  # a sharded learner's policy waits in host memory
        self.tokenizer = tokenizer
        self.shared_prefill = shared_prefill

    @classmethod
    def from_config(cls, cfg, policy, tokenizer, max_prompt_tokens: int, own_copy: bool, group: Group) -> HFSampler:
        return cls(
            policy, tokenizer, shared_prefill=cfg.sampler.shared_prefill, own_copy=own_copy, dtype=sampler_dtype(cfg)
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """New policy weights, one tensor at a time: all of them, or only the adapter's (LoRA)."""
        own = self.model.state_dict()  # views of the copy's tensors, a tied one under each of its names
        with torch.no_grad():
            for name, tensor in weights:
                own[name].copy_(tensor)

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seeds: list[int] | None = None,
    ) -> Rollouts:
        training = self.model.training  # the learner's own model samples in eval mode, then goes back
        self.model.eval()
        uniforms = None if seeds is None else streams(seeds, n, max_new_tokens).to(self.model.device)
        try:
            with torch.inference_mode():  # less per-op bookkeeping than no_grad: sampling -6 to -8% on the tiny model
                out = self._sample(prompts, n, temperature, top_p, max_new_tokens, uniforms)
        finally:
            self.model.train(training)
        # Inference tensors cannot enter autograd (the learner indexes with them): ordinary copies.
        return replace(
            out, **{k: getattr(out, k).clone() for k in ("sequences", "attention_mask", "completion_mask", "logprobs")}
        )

    def _sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        uniforms: torch.Tensor | None,
    ) -> Rollouts:
        tok = self.tokenizer
        enc = tok(prompts, padding=True, return_tensors="pt").to(self.model.device)
        width = enc.input_ids.shape[1]
        input_ids = enc.input_ids.repeat_interleave(n, dim=0)
        prompt_mask = enc.attention_mask.repeat_interleave(n, dim=0)
        shared = self.shared_prefill and n > 1
        if shared:  # each prompt once; its KV cache and next-token logits repeated over its group
            logits, cache = self._prompt(enc.input_ids, enc.attention_mask)
            logits = logits.repeat_interleave(n, dim=0)
            cache.batch_repeat_interleave(n)
        else:
            logits, cache = self._prompt(input_ids, prompt_mask)
        completion, chosen = self._decode(logits, prompt_mask, cache, temperature, top_p, max_new_tokens, uniforms)
        is_eos = (completion == tok.eos_token_id).long()
        keep = (is_eos.cumsum(-1) - is_eos) == 0  # up to and including the first eos
        logprobs = torch.zeros(completion.shape[0], width + completion.shape[1] - 1, device=completion.device)
        logprobs[:, width - 1 :] = chosen * keep
        texts = tok.batch_decode(torch.where(keep, completion, tok.pad_token_id), skip_special_tokens=True)
        return Rollouts(
            sequences=torch.cat([input_ids, completion], dim=1),
            attention_mask=torch.cat([prompt_mask, keep.long()], dim=1),
            completion_mask=torch.cat([torch.zeros_like(prompt_mask), keep.long()], dim=1),
            logprobs=logprobs,
            texts=texts,
            prompt_width=width,
            prefill_rows=len(prompts) if shared else completion.shape[0],
        )

    def _prompt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, DynamicCache]:
        """The prefill: the prompts' KV cache and the logits of the token after each [rows, V]."""
        cache = DynamicCache(config=self.model.config)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **{CACHE: cache},
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        return logits, cache

    def _decode(
        self,
        logits: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: DynamicCache,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        uniforms: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample up to max_new_tokens per row from softmax(logits / T) (within the top-p nucleus),
        starting from the prefill's `logits` [R, V] and its `cache`. A row that says eos leaves the
        batch (its KV cache rows dropped; it takes padding from there), so each decode step runs
        only the rows still going. Returns the tokens [R, T] and each one's log softmax(logits / T)
        [R, T]: the distribution the learner computes, with nothing else in between (a
        checkpoint's generation_config, which `generate` would apply, has no say). Until the first
        row finishes it draws exactly what `generate` draws (do_sample, top_k=0); after, from the
        same distribution with fewer rows. With `uniforms` [R, max_new_tokens] row r's t-th token is
        `inverse_cdf` at uniforms[r, t] instead."""
        R = logits.shape[0]
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        mask = attention_mask
        positions = mask.sum(-1, keepdim=True)  # [R, 1]: the first completion token's position
        running = torch.arange(R, device=mask.device)  # the rows in the batch, by index into R
        tokens = torch.full((R, max_new_tokens), pad, dtype=torch.long, device=mask.device)
        chosen = torch.zeros(R, max_new_tokens, device=mask.device)
        for t in range(max_new_tokens):
            logits = logits.float() / temperature
            logp = torch.log_softmax(logits, dim=-1)
            if top_p < 1:  # the smallest set of tokens whose probability reaches top_p (at least one)
                ascending, order = logits.sort(dim=-1)
                outside = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
                outside[:, -1] = False
                logits = logits.masked_fill(outside.scatter(1, order, outside), float("-inf"))
            probs = logits.softmax(dim=-1)
            token = (
                torch.multinomial(probs, 1).squeeze(1) if uniforms is None else inverse_cdf(probs, uniforms[running, t])
            )
            tokens[running, t] = token
            chosen[running, t] = logp.gather(-1, token[:, None]).squeeze(-1)
            going = token != eos
            if not going.any():
                return tokens[:, : t + 1], chosen[:, : t + 1]
            if not going.all():
                running, token, mask, positions = running[going], token[going], mask[going], positions[going]
                cache.batch_select_indices(going.nonzero().squeeze(1))
            if t + 1 < max_new_tokens:  # the drawn tokens through the model: the next logits
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                logits = self.model(
                    input_ids=token[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    **{CACHE: cache},
                    use_cache=True,
                    logits_to_keep=1,
                ).logits[:, -1]
                positions = positions + 1
        return tokens, chosen


def streams(seeds: list[int], n: int, steps: int) -> torch.Tensor:
    """[len(seeds) * n, steps] uniforms: prompt i's n rows from a generator seeded with seeds[i]."""
    return torch.cat([torch.rand(n, steps, generator=torch.Generator().manual_seed(seed)) for seed in seeds])


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of probs [R, V], the token at which its CDF first exceeds u [R] (of the row's total):
    a draw from the row's distribution. Where rounding puts u * total at the total, the search can
    land past the last token with any probability: that row takes its most likely token instead."""
    cdf = probs.cumsum(dim=-1)
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)
    return torch.where(probs.gather(-1, token[:, None]).squeeze(1) > 0, token, probs.argmax(dim=-1))
