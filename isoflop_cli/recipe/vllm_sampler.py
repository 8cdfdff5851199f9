"""`sampler=vllm`: a vLLM engine colocated with the learner on the run's GPUs.

The same contract as `sampler.HFSampler`: `sample(prompts, n, temperature, top_p, max_new_tokens)`
returns `Rollouts` (the sampler's own log-probs included, for truncated importance sampling), and
`load_weights(state_dict)` takes the learner's new weights after each update: full weights are
loaded into the engine's model in place; LoRA weights become a fresh adapter the next requests use.
Between steps the engine sleeps (weights offloaded, KV cache freed) so the learner has the GPU.

vLLM is an optional extra (`pip install 'isoflop[vllm]'`), imported only here. This adapter is thin
on purpose: the packing of vLLM's outputs into `Rollouts` is `sampler.pack`, which the tests check
against the HF sampler's layout on CPU; the engine calls themselves need a GPU.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig

from isoflop_cli.recipe.sampler import Rollouts, pack


class VllmSampler:
    def __init__(self, path: Path | str, sampler_cfg: DictConfig, lora_cfg: DictConfig, tokenizer, seed: int):
        try:
            from vllm import LLM
        except ImportError as e:
            raise RuntimeError("sampler=vllm needs vLLM on the node: pip install 'isoflop[vllm]' (or use sampler=hf)") from e

        self.path = str(path)
        self.tokenizer = tokenizer
        self.lora = lora_cfg
        self.sleeps = sampler_cfg.sleep
        self.adapters = Path(tempfile.mkdtemp(prefix="isoflop-lora-"))
        self.adapter: tuple[int, str] | None = None  # (id, directory) of the newest adapter
        self.llm = LLM(
            model=self.path,
            tensor_parallel_size=sampler_cfg.tensor_parallel,
            gpu_memory_utilization=sampler_cfg.gpu_memory_utilization,
            enable_sleep_mode=sampler_cfg.sleep,
            enable_lora=bool(lora_cfg.rank),
            max_lora_rank=max(lora_cfg.rank, 8),
            enable_prefix_caching=True,  # a prompt's n samples share its prefill
            logprobs_mode="processed_logprobs",  # log softmax(logits / T): what the learner computes
            seed=seed,
        )
        self._sleep()

    def sample(self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        self._wake()
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0)
        lora = LoRARequest(f"step-{self.adapter[0]}", self.adapter[0], self.adapter[1]) if self.adapter else None
        outputs = self.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
        self._sleep()
        completions, logprobs = [], []
        for out in outputs:  # in prompt order, each with its n samples
            for sample in out.outputs:
                completions.append(list(sample.token_ids))
                logprobs.append([step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)])
        return pack([list(out.prompt_token_ids) for out in outputs], completions, logprobs, n, self.tokenizer)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full weights: loaded into the engine's model on every worker. LoRA: saved as a new adapter."""
        if self.lora.rank:
            self._new_adapter(state_dict)
            return
        self._wake()
        self.llm.collective_rpc(_load_weights, args=(list(state_dict.items()),))
        self.llm.reset_prefix_cache()  # cached prompt states were computed with the old weights
        self._sleep()

    def _new_adapter(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The adapter in peft's on-disk format: its config, and its weights without the adapter's name."""
        from peft import LoraConfig
        from safetensors.torch import save_file

        number = self.adapter[0] + 1 if self.adapter else 1
        directory = self.adapters / f"step-{number}"
        LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, target_modules=list(self.lora.targets),
                   base_model_name_or_path=self.path).save_pretrained(directory)
        save_file({k.replace(".default", ""): v.contiguous() for k, v in state_dict.items()}, directory / "adapter_model.safetensors")
        self.adapter = (number, str(directory))

    def _sleep(self) -> None:
        if self.sleeps:
            self.llm.sleep(level=1)

    def _wake(self) -> None:
        if self.sleeps:
            self.llm.wake_up()


def _load_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on each vLLM worker: its model's loader shards full weights for tensor parallelism."""
    worker.model_runner.model.load_weights(weights=weights)
