"""Samplers by `sampler.name`, with what planning, config checks and preflight need to know of each
without building one (and without torch): whether it runs an engine of its own, whether it prefills
a prompt once for its group, what package it needs where runs start. The recipe builds the class
the entry names (`recipe/rollouts.py`'s `Sampler` protocol is what it must do). No module compares
sampler names: a new sampler is one class and one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplerSpec:
    engine: str  # "module:Class" of the recipe's sampler (built by `recipe.rollouts.make_sampler`)
    # An engine beside the learner on every rank (or tensor-parallel group): its own copy of the
    # weights and a KV cache (the memory model; weights pushed after each update), its own kernels
    # (which FlopCounterMode cannot see), sleep/wake, and the vLLM knobs sampler.* sets.
    own_engine: bool
    always_shares_prefill: bool  # prefills each prompt once for its group whatever sampler.shared_prefill says
    package: str | None = None  # what must import where the runs start (check_runnable, the node probe)

    def shares_prefill(self, sampler_cfg, n: int) -> bool:
        """Whether a step prefills each distinct prompt once (B_p rows) rather than once per completion."""
        return (self.always_shares_prefill or bool(sampler_cfg.shared_prefill)) and n > 1


SAMPLERS: dict[str, SamplerSpec] = {
    # Hugging Face decode loop in the learner's process (sampler.shared_prefill: the prompt's KV
    # cache shared by its group).
    "hf": SamplerSpec(engine="isoflop_cli.recipe.sampler:HFSampler", own_engine=False, always_shares_prefill=False),
    # vLLM engines (GPU, or the CPU build), prefix caching: each prompt prefilled once for its group.
    "vllm": SamplerSpec(
        engine="isoflop_cli.recipe.vllm_sampler:VllmSampler",
        own_engine=True,
        always_shares_prefill=True,
        package="vllm",
    ),
}
