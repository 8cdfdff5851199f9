"""`sampler=vllm`: a vLLM engine beside the learner, on its GPUs or (vLLM's CPU build) its CPU.

The same contract as `sampler.HFSampler`: `sample(prompts, n, temperature, top_p, max_new_tokens)`
returns `Rollouts`, with the engine's own log-prob of every sampled token for truncated importance
sampling, and `load_weights(state_dict)` takes the learner's new weights after each update.

How each part is done, and why:
- Prompts go in as token ids from the run's tokenizer, so the engine and the learner see the same
  tokens (no second tokenization that could add or drop a BOS).
- Log-probs are vLLM's `processed_logprobs`: log softmax(logits / T) of the sampled token, what the
  learner computes. With top_p < 1 they are renormalised over the nucleus (the distribution the
  tokens were really drawn from); the HF sampler's are not.
- Sampling is seeded per call from torch's global generator, which the run seeds and its checkpoints
  restore: the same run samples the same tokens, resumed or not. vLLM gives a request's n samples
  seeds seed, seed + 1, ...
- Full weights are reloaded in place (`reload_weights`, then the prefix cache is dropped: cached
  prompt states came from the old weights). With an in-process engine of one worker the tensors go
  straight from memory; otherwise (tensor parallel, a multiprocess engine) through one safetensors
  file that each push overwrites, since tensors do not cross vLLM's RPC intact.
- LoRA: one adapter directory and one adapter slot, overwritten each update and reloaded in place by
  the next request (`load_inplace`); nothing accumulates on disk.
- Sleep mode (weights offloaded, KV cache freed while the learner trains) exists on GPUs only; on
  the CPU build it is refused, so there the engine stays awake.

vLLM is imported only here: `pip install 'isoflop[vllm]'` on GPU nodes, `make setup-vllm` for the
CPU build this project tests with.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from omegaconf import DictConfig

from isoflop_cli.recipe.sampler import Rollouts, pack

ADAPTER_ID = 1  # the one LoRA slot the run's adapter lives in
CPU_KV_CACHE_GIB = 1.0  # the CPU build's KV cache when sampler.kv_cache_gib is null (its memory-share default fails at start)


class VllmSampler:
    def __init__(self, path: Path | str, sampler_cfg: DictConfig, lora_cfg: DictConfig, tokenizer, seed: int, max_len: int,
                 dtype: torch.dtype = torch.float32):
        # In-process engine core: start-up in seconds rather than a minute, and weights pushed from memory.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as e:
            raise RuntimeError("sampler=vllm needs vLLM on the node: pip install 'isoflop[vllm]', or `make setup-vllm` "
                               "for the CPU build (or use sampler=hf)") from e

        on_gpu = torch.cuda.is_available()
        self.tokenizer = tokenizer
        self.lora = lora_cfg
        self.sleeps = sampler_cfg.sleep and on_gpu
        self.scratch = Path(tempfile.mkdtemp(prefix="isoflop-vllm-"))  # the adapter, or pushed weights: overwritten, never added to
        weakref.finalize(self, shutil.rmtree, self.scratch, True)
        self.adapter_ready = False  # an adapter has been written (before the first update the policy is the base model)
        self.adapter_fresh = False  # written since the engine last loaded it
        kv_gib = sampler_cfg.kv_cache_gib if sampler_cfg.kv_cache_gib is not None else (None if on_gpu else CPU_KV_CACHE_GIB)
        eager = sampler_cfg.enforce_eager if sampler_cfg.enforce_eager is not None else not on_gpu
        self.llm = LLM(
            model=str(path),
            dtype=dtype,
            seed=seed,
            max_model_len=max_len,
            tensor_parallel_size=sampler_cfg.tensor_parallel,
            enforce_eager=eager,
            enable_prefix_caching=True,  # a prompt's n samples share its prefill
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleeps,
            enable_lora=bool(lora_cfg.rank),
            max_lora_rank=max(lora_cfg.rank, 8),
            max_loras=1,
            **({"kv_cache_memory_bytes": int(kv_gib * 2**30)} if kv_gib else {"gpu_memory_utilization": sampler_cfg.gpu_memory_utilization}),
        )
        self.in_memory_push = sampler_cfg.tensor_parallel == 1 and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        self._sleep()

    def sample(self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt_ids = [self.tokenizer.encode(p) for p in prompts]
        seed = int(torch.randint(2**31 - 1, ()))
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0, seed=seed,
                                stop_token_ids=[self.tokenizer.eos_token_id])
        self._wake()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params,
                                    lora_request=self._adapter_request(), use_tqdm=False)
        self._sleep()
        completions, logprobs = [], []
        for out in outputs:  # in prompt order, each with its n samples
            for sample in sorted(out.outputs, key=lambda s: s.index):
                completions.append(list(sample.token_ids))
                logprobs.append([step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)])
        return pack(prompt_ids, completions, logprobs, n, self.tokenizer)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Full weights: reloaded into the engine's model in place. LoRA: the adapter, overwritten on disk."""
        if self.lora.rank:
            self._write_adapter(state_dict)
            return
        self._wake()
        if self.in_memory_push:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state_dict.items())})
        else:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in state_dict.items()}, self.scratch / "model.safetensors")
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.scratch)})
        self.llm.reset_prefix_cache()  # cached prompt states were computed with the old weights
        self._sleep()

    def _write_adapter(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The adapter in peft's on-disk format: its config, and its weights without peft's adapter name."""
        from peft import LoraConfig
        from safetensors.torch import save_file

        if not self.adapter_ready:
            LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, target_modules=list(self.lora.targets)).save_pretrained(self.scratch)
        save_file({k.replace(".default", ""): v.contiguous() for k, v in state_dict.items()}, self.scratch / "adapter_model.safetensors")
        self.adapter_ready = self.adapter_fresh = True

    def _adapter_request(self):
        if not self.adapter_ready:
            return None
        from vllm.lora.request import LoRARequest

        request = LoRARequest("policy", ADAPTER_ID, str(self.scratch), load_inplace=self.adapter_fresh)
        self.adapter_fresh = False
        return request

    def _sleep(self) -> None:
        if self.sleeps:
            self.llm.sleep(level=1)

    def _wake(self) -> None:
        if self.sleeps:
            self.llm.wake_up()
