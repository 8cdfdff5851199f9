"""`sampler=vllm`: vLLM engines inside the run's own processes, on their GPUs or (vLLM's CPU build) the CPU.

The same contract as `sampler.HFSampler`: `sample(prompts, n, temperature, top_p, max_new_tokens)`
returns `Rollouts`, with the engine's own log-prob of every sampled token for truncated importance
sampling, and `load_weights(weights)` takes the learner's new weights after each update.

How each part is done, and why:
- Placement (as verl and TRL's colocate mode): every rank of a run builds an engine in its own
  process, and `sampler.tensor_parallel` consecutive ranks share one (the external launcher: each
  rank's worker joins the torch.distributed group the run already has, so no rank waits in a group
  creation the others never join). Without a process group (one plain process) the engine is
  vLLM's single in-process worker. Either way the model is in this process: weights go straight
  from memory, and sampling draws from this process's generator.
- Rank 0 alone decides what to sample (`sample`); the other ranks `serve` its requests meanwhile.
  Each engine samples a contiguous share of the request's prompts (whole prompt groups), and rank
  0 packs their outputs in prompt order: the Rollouts one engine would return for those tokens.
- Seeding: one seed per request, drawn from rank 0's torch generator (which the run seeds and its
  checkpoints restore), so a run and its resumed self sample the same tokens. Engine e of E seeds
  this process's generator with seed * E + e right before generating (restored after): engines
  draw differently, the ranks of one tensor-parallel engine alike (they must, to stay in step),
  and vLLM keeps its batched sampler (a per-request `seed` would send every row through its
  one-generator-per-row loop). The draws then depend on the engine's schedule, so the prefix cache
  is dropped before each request: a request's tokens depend on it and its seed alone, not on what
  the engine ran before (a resumed run's engine is a fresh one). Evaluation gives a seed per prompt
  (`evaluate.stream_seeds`, paired across runs): each prompt then gets its own `SamplingParams`
  with that seed (vLLM gives its i-th sample seed + i), so its completions depend on the prompt's
  seed alone, not on the engine or the batch. Kept on purpose, though vLLM's per-row path is slower:
  one batch-level seed is deterministic for a fixed engine and request, but the batched sampler
  draws a row's noise by its place in the batch, which moves as other rows finish, with the engine
  count (each engine's share) and the prompts beside it. Two runs, whose policies end their rows at
  other steps, would then meet a problem with other draws, and evaluation would no longer be paired
  (a test shows both on the CPU build). What the per-row path costs on a GPU (read, not measured):
  one `exponential_` kernel per seeded row per decode step (vLLM's `random_sample` loop), and
  FlashInfer's top-k/top-p kernel replaced by the sorting one where top_p < 1; only evaluation
  takes it, training's requests are batch-seeded.
- Log-probs are vLLM's `processed_logprobs`: log softmax(logits / T) of the sampled token, what the
  learner computes. With top_p < 1 they are renormalised over the nucleus (the distribution the
  tokens were really drawn from); the HF sampler's are not.
- Full weights stream in one tensor at a time (`distributed.stream_weights`) through vLLM's
  in-place reload (`reload_weights` with an iterator: each layer's weights loaded and processed as
  they arrive, in the learner's layer order); a tied head is never sent (it is the embedding, which
  the model's loader fills once), and what vLLM derives from it is derived again. No file; the
  prefix cache, dropped before each request, holds no prompt state of the old weights.
- LoRA: one adapter directory and one adapter slot, overwritten each update and reloaded in place by
  the next request (`load_inplace`). vLLM 0.32 loads adapters only from a path (`LoRARequest`
  has no tensors; verl's in-memory adapters replace the worker's private loader), so the adapter,
  small beside the model, still goes through the directory.
- Sleep mode on GPUs (the CPU build has none), in verl's order: the learner's cached blocks freed,
  the weights woken and loaded, the KV cache woken, the step's sampling, sleep (level 2 with full
  weights, which the next push replaces; level 1 with LoRA, whose base weights wait in host
  memory), the cache freed again.

vLLM is imported only here: `pip install 'isoflop[vllm]'` on GPU nodes, `make setup-vllm` for the
CPU build this project tests with. Both are vLLM `vllm_pin.VLLM_VERSION`, whose internals (the external
launcher, `reload_weights`, `processed_logprobs`, in-place adapter reloads) the engine relies on:
another version is refused before any compute where the CLI can see the runs' Python
(`config.machine.check_vllm`: exit 2) or each node type's (the preflight's probe), and as the engine
starts (`check_version`), before it fails somewhere inside.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from isoflop_cli import vllm_pin
from isoflop_cli.errors import ConfigError
from isoflop_cli.recipe.distributed import Group
from isoflop_cli.recipe.rollouts import Rollouts, pack, sampler_dtype

ADAPTER_ID = 1  # the one LoRA slot the run's adapter lives in
CPU_KV_CACHE_GIB = (
    1.0  # the CPU build's KV cache when sampler.kv_cache_gib is null (its memory-share default fails at start)
)
LORA_RANKS = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    320,
    512,
)  # the max_lora_rank values vLLM accepts (its LoRAConfig refuses others)


@dataclass(frozen=True)
class Request:
    """What rank 0 asks every engine to sample: n completions of each prompt, from `seed`, or from
    each prompt's own of `seeds`."""

    prompts: list[str]
    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    seeds: list[int] | None = None


@dataclass(frozen=True)
class Share:
    """One engine's part of a request: its prompts' token ids and each completion with its log-probs."""

    prompt_ids: list[list[int]]
    completions: list[list[int]]
    logprobs: list[list[float]]


class VllmSampler:
    """This rank's engine (shared with its tensor-parallel group) and its part in the run's sampling."""

    def __init__(
        self,
        path: Path | str,
        sampler_cfg: DictConfig,
        lora_cfg: DictConfig,
        tokenizer,
        seed: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        group: Group = Group(),
    ):
        # In-process engine core: start-up in seconds rather than a minute, and the model in this process.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        check_version(vllm_pin.installed_version())
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        tp = sampler_cfg.tensor_parallel
        self.group, self.tokenizer, self.lora = group, tokenizer, lora_cfg
        self.engine, self.engines, self.leads = group.rank // tp, group.world_size // tp, group.rank % tp == 0
        # The run's ranks (`distributed.launch`): a process group and the torchrun-style variables the
        # external launcher reads. (A group alone may be an earlier in-process engine's own.)
        self.joined = dist.is_initialized() and "LOCAL_RANK" in os.environ
        self.sleep_level = (1 if lora_cfg.rank else 2) if sampler_cfg.sleep and on_gpu else 0
        self.asleep: set[str] = set()  # "weights", "kv_cache": what sleep released and no wake has brought back
        self.weights_lost = False  # level 2 dropped the weights, and no push has replaced them yet
        self.scratch = Path(tempfile.mkdtemp(prefix="isoflop-vllm-"))  # the adapter: overwritten, never added to
        weakref.finalize(self, shutil.rmtree, self.scratch, True)
        self.adapter_ready = False  # an adapter has been written (before the first update the policy is the base model)
        self.adapter_fresh = False  # written since the engine last loaded it
        kv_gib = (
            sampler_cfg.kv_cache_gib if sampler_cfg.kv_cache_gib is not None else (None if on_gpu else CPU_KV_CACHE_GIB)
        )
        eager = sampler_cfg.enforce_eager if sampler_cfg.enforce_eager is not None else not on_gpu
        with (
            _kept_rng()
        ):  # the engine reseeds the process's generators as it starts: the run's streams stay where they were
            self.llm = LLM(
                model=str(path),
                dtype=dtype,
                seed=seed,
                max_model_len=max_len,
                tensor_parallel_size=tp,
                distributed_executor_backend="external_launcher" if self.joined else "uni",
                enforce_eager=eager,
                enable_prefix_caching=True,  # a prompt's n samples share its prefill
                logprobs_mode="processed_logprobs",
                enable_sleep_mode=bool(self.sleep_level),
                enable_lora=bool(lora_cfg.rank),
                max_lora_rank=max_lora_rank(lora_cfg.rank),
                max_loras=1,
                **(
                    {"kv_cache_memory_bytes": int(kv_gib * 2**30)}
                    if kv_gib
                    else {"gpu_memory_utilization": sampler_cfg.gpu_memory_utilization}
                ),
            )

    @classmethod
    def from_config(cls, cfg, policy, tokenizer, max_prompt_tokens: int, own_copy: bool, group: Group) -> VllmSampler:
        """The engine reads the run's checkpoint itself (`policy` is not used)."""
        from isoflop_cli.recipe import checkpoint

        return cls(
            checkpoint.model_path(cfg.model, cfg.task),
            cfg.sampler,
            cfg.lora,
            tokenizer,
            seed=cfg.seed,
            max_len=max_prompt_tokens + cfg.task.max_new_tokens,
            dtype=sampler_dtype(cfg),
            group=group,
        )

    # Sampling: rank 0 asks, every engine samples its share.

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seeds: list[int] | None = None,
    ) -> Rollouts:
        """n completions of each prompt (rank 0, while the other ranks `serve`)."""
        request = Request(
            list(prompts), n, temperature, top_p, max_new_tokens, seed=int(torch.randint(2**31 - 1, ())), seeds=seeds
        )
        shares = self._take(self.group.broadcast(request))
        ids, completions, logprobs = (
            [x for share in shares for x in getattr(share, f)] for f in ("prompt_ids", "completions", "logprobs")
        )
        return pack(ids, completions, logprobs, n, self.tokenizer)

    def serve(self) -> None:
        """Ranks > 0: sample their engine's share of each of rank 0's requests until it calls `release`."""
        while (request := self.group.broadcast(None)) is not None:
            self._take(request)

    def release(self) -> None:
        """Rank 0: the other ranks leave `serve`."""
        self.group.broadcast(None)

    def _take(self, request: Request) -> list[Share]:
        """This engine's share of the request, sampled; on rank 0 every engine's share, in prompt order."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        mine = torch.arange(len(request.prompts)).tensor_split(self.engines)[self.engine].tolist()
        prompt_ids = [self.tokenizer.encode(request.prompts[i]) for i in mine]
        completions, logprobs = [], []
        if prompt_ids:
            common = dict(
                n=request.n,
                temperature=request.temperature,
                top_p=request.top_p,
                max_tokens=request.max_new_tokens,
                logprobs=0,
                stop_token_ids=[self.tokenizer.eos_token_id],
            )
            params = (
                SamplingParams(**common)
                if request.seeds is None
                else [SamplingParams(**common, seed=request.seeds[i]) for i in mine]
            )
            if self.weights_lost:
                raise RuntimeError("the engine slept at level 2, dropping its weights, and no push has replaced them")
            self._wake()
            # the draws must not depend on what ran before, nor prompt states on old weights
            self.llm.reset_prefix_cache()
            with _kept_rng():
                torch.manual_seed(request.seed * self.engines + self.engine)
                outputs = self.llm.generate(
                    [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids],
                    params,
                    lora_request=self._adapter_request(),
                    use_tqdm=False,
                )
            for out in outputs:  # in prompt order, each with its n samples
                for sample in sorted(out.outputs, key=lambda s: s.index):
                    completions.append(list(sample.token_ids))
                    logprobs.append([step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)])
        shares = self.group.gather(Share(prompt_ids, completions, logprobs) if self.leads else None)
        return [share for share in shares if share is not None] if self.group.is_main else []

    # Weights and memory.

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The learner's new weights, every rank at once (the stream's gathers are collective). Full
        weights: streamed into the engine's model. LoRA: the adapter, overwritten on disk."""
        if self.lora.rank:
            self._write_adapter(dict(weights))
            return
        self._wake("weights")
        # In this process, so the stream is consumed here, tensor by tensor. vLLM's in-place reload
        # rather than the model's own `load_weights`: the CPU build repacks linear weights into kernel
        # layouts after loading (the loader is then gone), and reload redoes that layer by layer.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.apply_model(_rederive_tied_head)
        self.weights_lost = False

    def sleep(self) -> None:
        """The learner's turn (GPU, sampler.sleep): the engine's memory released until it samples again."""
        if self.sleep_level and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = {"weights", "kv_cache"}
            self.weights_lost = self.sleep_level == 2
            torch.cuda.empty_cache()

    def close(self) -> None:
        """The engine shut down, leaving the run's process group up. vLLM's shutdown (otherwise run at
        exit) ends by destroying torch.distributed's default group, which under the external launcher
        is the run's: `distributed._rank_main` still needs it for its last barrier, and ends it itself."""
        from vllm.distributed import parallel_state

        shutdown = self.llm.llm_engine.engine_core.shutdown
        if not self.joined:
            shutdown()
            return
        end = parallel_state.destroy_distributed_environment
        parallel_state.destroy_distributed_environment = lambda: None
        try:
            shutdown()
        finally:
            parallel_state.destroy_distributed_environment = end

    def _wake(self, *tags: str) -> None:
        """Bring back what sleep released (all of it: no tags), in verl's order: weights before the KV
        cache, the learner's cached blocks freed first so the engine can map the memory."""
        wanted = [t for t in ("weights", "kv_cache") if t in self.asleep and (not tags or t in tags)]
        if wanted:
            torch.cuda.empty_cache()
        for tag in wanted:
            self.llm.wake_up(tags=[tag])
            self.asleep.discard(tag)

    def _write_adapter(self, state_dict: dict[str, torch.Tensor]) -> None:
        """The adapter in peft's on-disk format: its config, and its weights without peft's adapter name."""
        from peft import LoraConfig
        from safetensors.torch import save_file

        if not self.adapter_ready:
            LoraConfig(
                r=self.lora.rank, lora_alpha=self.lora.alpha, target_modules=list(self.lora.targets)
            ).save_pretrained(self.scratch)
        save_file(
            {k.replace(".default", ""): v.contiguous() for k, v in state_dict.items()},
            self.scratch / "adapter_model.safetensors",
        )
        self.adapter_ready = self.adapter_fresh = True

    def _adapter_request(self):
        if not self.adapter_ready:
            return None
        from vllm.lora.request import LoRARequest

        request = LoRARequest("policy", ADAPTER_ID, str(self.scratch), load_inplace=self.adapter_fresh)
        self.adapter_fresh = False
        return request


def check_version(installed: str | None) -> None:
    """Refuse a node without vLLM, or with another version than `VLLM_VERSION` (a build's local tag,
    +cpu or +cu129, aside), in one line naming both (`vllm_pin.mismatch`): the engine's own check,
    for a node that `config.machine.check_vllm` did not see (a Ray or SLURM node)."""
    if problem := vllm_pin.mismatch(installed, "the node"):
        raise RuntimeError(problem)


def max_lora_rank(rank: int) -> int:
    """The engine's max_lora_rank for an adapter of `rank`: the smallest value vLLM accepts that holds
    it (vLLM refuses a rank outside `LORA_RANKS` at start-up, 4 among them)."""
    fitting = [r for r in LORA_RANKS if r >= rank]
    if not fitting:
        raise ConfigError(
            f"lora.rank={rank} is above the largest LoRA rank vLLM serves "
            f"({LORA_RANKS[-1]}): lower lora.rank or use sampler=hf"
        )
    return fitting[0]


def _rederive_tied_head(model: torch.nn.Module) -> None:
    """A tied head shares the embedding's tensor, which the reload refreshed; but it is never loaded
    itself, so what vLLM derived from it at load time stays stale (on the CPU build, a packed copy
    for its GEMM: the engine then samples through the old head). Derived again here; on GPUs the
    head computes from the tensor and this does nothing."""
    head = getattr(model, "lm_head", None)
    if head is not None and getattr(model.config, "tie_word_embeddings", False):
        head.quant_method.process_weights_after_loading(head)


@contextmanager
def _kept_rng() -> Iterator[None]:
    """The process's torch (CPU and this GPU) and Python generators as they were before the block."""
    state = random.getstate()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        yield
    random.setstate(state)
