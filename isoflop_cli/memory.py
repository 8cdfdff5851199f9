"""The GPU memory model: the peak memory one GPU of a run holds, predicted from the model's shape
and the run's config, so that `plan` refuses a cell that cannot fit before any GPU is asked for.

The placement it models is verl's hybrid engine, colocated: every GPU of the run is one FSDP2
learner rank (`learner.world_size` = `cluster.gpus_per_run`), and vLLM engines span
`sampler.tensor_parallel` of the same GPUs each. A step has three phases that never overlap:

- sampling: the learner's resident state, and the sampler awake (its weights, its KV cache, vLLM's
  CUDA graphs); on rank 0 the buffers its gather of the engines' shares fills;
- scoring: the resident state, what the sampler keeps, rank 0's broadcast of the rollouts, and a
  reward model's forward (`reward.max_tokens_per_forward` positions; a rule: nothing);
- learning: the learner's resident state, the step's per-token tensors, and what one micro-batch's
  forward and backward hold (FSDP's gathered units, activations, one logit chunk). With
  `sampler.sleep` the engine has released its weights and KV cache by then (not its CUDA graphs);
  without, they stay.

The resident state is the learner's (weights, gradients, optimizer, KL reference) and a reward
model's weights (`recipe.checkpoint.scorer`: unsharded on every rank, bf16 on a GPU). The peak is
the largest phase, not their sum. Sizes are the bounds `plan` costs FLOPs at: every
prompt at the longest prompt's width (P), every completion at task.max_new_tokens (T). Each figure
is per GPU, for rank 0 where ranks differ (it takes the first share of a split, and with
sampler=hf it alone samples). Bytes: fp32 master weights, gradients and AdamW states (4 each);
the compute dtype c (bf16 with `learner.bf16`: 2, else 4) for what forward and backward compute,
for the KL reference and a LoRA backbone (frozen, so never updated in fp32), and for the sampler
(`recipe.sampler.make_sampler` samples in the learner's compute dtype).

Left out, as small beside what is counted (well under 1% of a 7B run's figure): norm weights and
biases, a value head, a classifier's head, RoPE tables, the attention kernels' log-sum-exp rows,
and the transient buffers of the optimizer's fused step and of the weight push into the engine
(streamed one parameter at a time, it holds the engine's weights and one parameter: less than
sampling does). Not counted: eval.judges' weights and forwards (rank 0, at eval points).
The reference and old-policy passes hold what the learning passes hold minus the gradients.

A CPU run (no GPU) is checked only for what it certainly holds, its learner state on every rank,
against its node's memory (`check_node`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from isoflop_cli import launchers
from isoflop_cli.algorithms import passes
from isoflop_cli.config.schema import sharded
from isoflop_cli.errors import ConfigError
from isoflop_cli.flops import Shape, epoch_plan, model_shape, piece_rows
from isoflop_cli.rewards import REWARDS
from isoflop_cli.samplers import SAMPLERS

GIB = 2**30
FP32 = 4  # bytes of the master weights, their gradients and each AdamW state
ADAM_STATES = 2  # exp_avg, exp_avg_sq
# A CPU rank's process before its tensors: Python with torch and transformers imported (0.44 GiB
# measured, max RSS, on x86-64 Linux).
PROCESS_GIB = 0.5
# A process's memory outside its tensors: the CUDA context and kernel images (~1 GiB on an H200),
# NCCL's communicator buffers, cuBLAS workspaces and the caching allocator's slack.
OVERHEAD_GIB = 2.0
# vLLM's activations and sampler buffers beside a KV cache sized in bytes (`sampler.kv_cache_gib`);
# a memory share (`gpu_memory_utilization`) holds them inside it.
ENGINE_WORKSPACE_GIB = 1.0
# The step's [B_p * n_learn, P + T - 1] fp32 tensors every rank holds whole while it learns: the
# loss mask, the token weights, the reference's, old policy's and old values' log-probs.
STEP_TENSORS = 5
# fp32 copies of one logit chunk's [tokens, vocab] alive in its backward: the logits (cast up),
# their log-softmax (kept for backward) and its gradient; the entropy bonus adds its exp (kept)
# and the gradient through it. In bf16 the head's own output and its gradient come on top.
LOGIT_COPIES, ENTROPY_COPIES = 3, 2
# A reward model's dtype on a GPU (`recipe.checkpoint.scorer` loads it in bf16 there).
SCORER_BYTES = 2
# vLLM's CUDA-graph pool per GPU. vLLM 0.32 keeps it through sleep (ModelConfig.
# sleep_mode_offload_cudagraph defaults to False: sleep releases weights and KV cache only, as
# vllm-project/vllm#56373 says of level 1) and, since v0.21, counts its profiled estimate inside
# gpu_memory_utilization's share (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1; gpu_worker.
# determine_available_memory), not beside kv_cache_memory_bytes. Size: 1.50e9 bytes captured per
# GPU in vllm-project/vllm#47654 (TP 8, max_num_seqs 256); the engine logs its own estimate at start.
VLLM_CUDA_GRAPH_GIB = 1.5
# Pickled bytes a token takes in a vLLM share gathered to rank 0 (`VllmSampler._take`, gather_object,
# which NCCL moves through device buffers): its id (pickle's BININT, at most 5) and its log-prob (BINFLOAT, 9).
PICKLED_ID, PICKLED_LOGPROB = 5, 9
# UTF-8 bytes of a decoded token in the completions' texts broadcast with the rollouts (about 4
# characters a token for English and math in BPE vocabularies such as Qwen2.5's).
TEXT_BYTES = 4
ROLLOUT_ID = 8  # bytes of an element of the rollouts' token and mask tensors (int64)


@dataclass(frozen=True)
class MicroBatch:
    """One forward and backward on rank 0 at the bound: its prompt groups, rows and positions."""

    groups: int
    rows: int  # groups * n_learn, or the rows of one group's piece (a token budget below one group)
    tokens: int  # positions fed to the model (`learner.Layout`: a prompt tree's each prompt once)
    keys: int  # key positions attention reads (each completion row over its whole row)
    logit_positions: int  # completion tokens: the positions whose logits the loss needs
    mask_bytes: int  # the boolean attention masks of the layout


@dataclass(frozen=True)
class Memory:
    """The predicted memory of one GPU of a run, in GiB per term, and the two phases they add up
    to. See the module docstring for the placement, each function below for its terms' formulas."""

    weights: float  # the learner's parameters, sharded (`_learner_state`)
    gradients: float
    optimizer: float
    reference: float  # the KL reference, a frozen copy sharded in the compute dtype (0 with LoRA or no KL)
    step_tensors: float  # the step's per-token tensors (`STEP_TENSORS`)
    gathered: float  # FSDP units gathered in forward and backward, with their unsharded gradients (`_gathered`)
    activations: float  # kept for backward of one micro-batch (`_activations`)
    logits: float  # one logit chunk (`_logits`)
    sampler_weights: float  # the sampler's own copy of the weights on this GPU (`_sampler`)
    kv_cache: float  # the sampler's KV cache (vLLM: the rest of its memory share)
    sampler_kept: float  # of the sampler's memory, what stays while the learner learns (and while it scores)
    engine_graphs: float  # vLLM's CUDA-graph pool outside the KV cache term (`_engine_graphs`)
    gather_buffers: float  # rank 0's buffers of the gather of the engines' shares, while sampling (`_transfers`)
    broadcast_buffers: float  # rank 0's buffers of the rollouts' broadcast, before scoring (`_transfers`)
    reward_weights: float  # a reward model's weights, on every rank (`_reward_model`)
    reward_forward: float  # one of its scoring forwards (`_reward_model`)
    overhead: float  # OVERHEAD_GIB
    micro_batch: MicroBatch

    @property
    def resident(self) -> float:
        """What a rank holds across a whole step (gradients stay allocated after the optimizer step)."""
        return self.weights + self.gradients + self.optimizer + self.reference + self.reward_weights + self.overhead

    @property
    def sampling(self) -> float:
        return self.resident + self.sampler_weights + self.kv_cache + self.engine_graphs + self.gather_buffers

    @property
    def scoring(self) -> float:
        return self.resident + self.sampler_kept + self.broadcast_buffers + self.reward_forward

    @property
    def learning(self) -> float:
        return self.resident + self.sampler_kept + self.step_tensors + self.gathered + self.activations + self.logits

    @property
    def peak(self) -> float:
        return max(self.sampling, self.scoring, self.learning)

    @property
    def phase(self) -> str:
        """The phase that peaks (learning first, then sampling, where two are equal)."""
        return max(("learning", "sampling", "scoring"), key=lambda name: getattr(self, name))

    def record(self) -> dict:
        """The breakdown as `plan --json` writes it."""
        out = {k: round(v, 3) for k, v in asdict(self).items() if isinstance(v, float)}
        return {
            **out,
            "sampling": round(self.sampling, 3),
            "scoring": round(self.scoring, 3),
            "learning": round(self.learning, 3),
            "phase": self.phase,
            "micro_batch_tokens": self.micro_batch.tokens,
        }


def predict(shape: Shape, cfg, n: int, B_p: int, prompt: int) -> Memory | None:
    """The memory of one GPU of the run `cfg` describes at `n`, `B_p` (`cfg` a config or planning's
    plain view of one; `prompt`: the padded prompt width). None on CPU (cluster.gpus_per_run = 0),
    and where vLLM's KV cache is a share of a device whose size is not given
    (cluster.gpu_memory_gib and sampler.kv_cache_gib both null). Raises ConfigError when vLLM's
    share cannot hold its own weights."""
    if not cfg.cluster.gpus_per_run:
        return None
    s = cfg.sampler
    if SAMPLERS[s.name].own_engine and s.kv_cache_gib is None and cfg.cluster.gpu_memory_gib is None:
        return None
    c = 2 if cfg.learner.bf16 else FP32
    _, k = epoch_plan(cfg.algo.epochs, n)
    micro = micro_batch(cfg, k, B_p, prompt, cfg.task.max_new_tokens)
    weights, gradients, optimizer, reference = _learner_state(shape, cfg, c)
    sampler_weights, kv_cache, graphs, kept = _sampler(shape, cfg, c, n * B_p, prompt + cfg.task.max_new_tokens)
    step = STEP_TENSORS * B_p * k * (prompt + cfg.task.max_new_tokens - 1) * FP32
    gathered = _gathered(shape, c, bool(shape.lora_rank)) if sharded(cfg) else 0
    gather, broadcast = _transfers(cfg, n, B_p, prompt, cfg.task.max_new_tokens)
    reward_weights, reward_forward = _reward_model(cfg, n, B_p, prompt + cfg.task.max_new_tokens + 1)
    return Memory(
        weights=weights / GIB,
        gradients=gradients / GIB,
        optimizer=optimizer / GIB,
        reference=reference / GIB,
        step_tensors=step / GIB,
        gathered=gathered / GIB,
        activations=_activations(shape, micro, c, bool(cfg.learner.activation_checkpointing)) / GIB,
        logits=_logits(shape, micro, c, cfg.learner.logit_chunk_tokens, cfg.algo.entropy_coef > 0) / GIB,
        sampler_weights=sampler_weights / GIB,
        kv_cache=kv_cache / GIB,
        sampler_kept=kept / GIB,
        engine_graphs=graphs / GIB,
        gather_buffers=gather / GIB,
        broadcast_buffers=broadcast / GIB,
        reward_weights=reward_weights / GIB,
        reward_forward=reward_forward / GIB,
        overhead=OVERHEAD_GIB,
        micro_batch=micro,
    )


def check(memory: Memory | None, cfg) -> None:
    """Refuse a prediction above cluster.gpu_memory_gib (null: unchecked): the phase that peaks, its
    largest terms, and the knobs that shrink them."""
    limit = cfg.cluster.gpu_memory_gib
    if memory is None or limit is None or memory.peak <= limit:
        return
    terms = {
        "weights": memory.weights,
        "gradients": memory.gradients,
        "optimizer": memory.optimizer,
        "reference": memory.reference,
        "reward_weights": memory.reward_weights,
    }
    if memory.phase == "learning":
        terms.update(
            activations=memory.activations,
            logits=memory.logits,
            gathered=memory.gathered,
            step_tensors=memory.step_tensors,
        )
    elif memory.phase == "scoring":
        terms.update(reward_forward=memory.reward_forward, broadcast_buffers=memory.broadcast_buffers)
    else:
        terms.update(
            sampler_weights=memory.sampler_weights,
            kv_cache=memory.kv_cache,
            engine_graphs=memory.engine_graphs,
            gather_buffers=memory.gather_buffers,
        )
    if memory.phase != "sampling" and memory.sampler_kept:
        terms["sampler_kept"] = memory.sampler_kept
    largest = sorted(terms, key=terms.get, reverse=True)[:3]
    # The knobs of the terms that could make up the excess on their own (else the largest term's).
    enough = [t for t in largest if terms[t] >= memory.peak - limit] or largest[:1]
    knobs = list(dict.fromkeys(knob for term in enough for knob in _knobs(term, memory, cfg))) or [
        "more GPUs per run (cluster.gpus_per_run)"
    ]
    raise ConfigError(
        f"needs {memory.peak:.1f} GiB of cluster.gpu_memory_gib={limit:g} per GPU while {memory.phase} "
        f"({', '.join(f'{t} {terms[t]:.1f}' for t in largest)}): {', '.join(knobs)}"
    )


def check_node(shape: Shape, cfg) -> None:
    """A CPU run (cluster.gpus_per_run = 0) holds its learner in its node's memory: refuse one whose
    learner state alone, on every rank (`_learner_state` x learner.world_size) and with each rank's
    process (PROCESS_GIB), is above the node's memory (cluster.node_memory_gib, else this machine's
    where the runs run here, else unchecked). It counts only what the run certainly holds, before
    its first step: activations, logits and the sampler's cache come on top, so a run it passes may
    still not fit, but one it refuses would be killed for memory on every attempt. It is one run's
    need: runs that run at once on one node share its memory (cluster.max_concurrent bounds them)."""
    if cfg.cluster.gpus_per_run:
        return
    given = cfg.cluster.node_memory_gib
    limit = given if given is not None else this_machine_gib() if launchers.runs_here(cfg.cluster) else None
    c = 2 if cfg.learner.bf16 else FP32
    world = cfg.learner.world_size
    terms = dict(
        zip(
            ("weights", "gradients", "AdamW states", "KL reference"),
            (world * b / GIB for b in _learner_state(shape, cfg, c)),
        )
    )
    terms["processes"] = world * PROCESS_GIB
    need = sum(terms.values())
    if limit is None or need <= limit:
        return
    source = (
        f"the {given:g} GiB of cluster.node_memory_gib"
        if given is not None
        else f"the {limit:.1f} GiB of this machine's memory"
    )
    knobs = [
        *([] if shape.lora_rank else ["train LoRA adapters (lora.rank)"]),
        "a smaller model",
        "GPUs (cluster.gpus_per_run)",
    ]
    raise ConfigError(
        f"a CPU run's learner state alone needs {need:.1f} GiB, above {source} "
        f"({', '.join(f'{t} {v:.1f}' for t, v in terms.items() if v)}): {', '.join(knobs)}"
    )


@functools.cache
def this_machine_gib() -> float:
    """This machine's memory, or its memory cgroup's limit where that is lower (`cgroup_limit`)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(total, cgroup_limit(Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")) or total) / GIB


def cgroup_limit(own: Path, root: Path) -> int | None:
    """The memory limit in bytes of the cgroup `own` (/proc/self/cgroup) names, under the cgroup
    mount `root`, v2 (memory.max) or v1 (memory/memory.limit_in_bytes), or at the hierarchy's root,
    where a container sees its own cgroup; the smallest found. None where no file holds a number
    (v2's "max"); v1's "unlimited" is a number larger than any machine's memory, which the caller's
    minimum with the machine's leaves out."""
    limits = [root / "memory.max", root / "memory" / "memory.limit_in_bytes"]
    with contextlib.suppress(OSError):
        for line in own.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if not controllers:  # v2: one hierarchy
                limits.append(root / path.lstrip("/") / "memory.max")
            elif "memory" in controllers.split(","):
                limits.append(root / "memory" / path.lstrip("/") / "memory.limit_in_bytes")
    found = []
    for limit in limits:
        with contextlib.suppress(OSError, ValueError):  # absent, or "max": no limit
            found.append(int(limit.read_text()))
    return min(found, default=None)


def parameters(shape: Shape) -> tuple[int, int, int]:
    """(one decoder layer's, the rest's, one layer's LoRA adapter's) parameters: the layer's
    projections (`Shape.projections`); the embeddings and the LM head (one matrix when tied); an
    adapter's A (in x r) and B (r x out) per adapted projection, as many as its MACs per token."""
    return shape.linear_macs, shape.vocab * shape.hidden * (1 if shape.tied else 2), shape.adapter_macs()


def micro_batch(cfg, n_learn: int, B_p: int, prompt: int, new: int) -> MicroBatch:
    """Rank 0's largest micro-batch, as `Trainer.micro_batches` splits its share: mini-batches take
    ceil(B_p / algo.minibatches) prompt groups, rank 0 ceil(that / learner.world_size) of them, and
    a micro-batch whole groups up to `learner.max_tokens_per_micro_batch` positions (a group over
    it in pieces of its rows, each with the prompt once; a row over it alone), else
    `learner.micro_batch` rows (at least one group), else all of them.

    A prompt tree (`learner.shared_prompt`) feeds each group P + n_learn * T positions; its
    completions attend over their rows of P + T keys and its prompt over P; its masks are a
    [P, P] per group and a [T, P + T] per row. Plain rows feed and attend over P + T each, their
    mask [P + T, P + T] per row."""
    lrn = cfg.learner
    groups = math.ceil(math.ceil(B_p / cfg.algo.minibatches) / lrn.world_size)
    width = prompt + new
    per_group = prompt + n_learn * new if lrn.shared_prompt else n_learn * width
    budget = lrn.max_tokens_per_micro_batch
    rows = piece_rows(budget, prompt, new, n_learn) if lrn.shared_prompt else piece_rows(budget, 0, width, n_learn)
    if rows < n_learn:  # one piece of a group over the budget
        groups = 1
    else:
        if budget:
            groups = min(groups, max(1, budget // per_group))
        elif lrn.micro_batch:
            groups = min(groups, max(1, lrn.micro_batch // n_learn))
        rows = groups * n_learn
    if lrn.shared_prompt:
        keys, masks = groups * prompt + rows * width, groups * prompt * prompt + rows * new * width
    else:
        keys, masks = rows * width, rows * width * width
    tokens = groups * prompt + rows * new if lrn.shared_prompt else rows * width
    return MicroBatch(groups=groups, rows=rows, tokens=tokens, keys=keys, logit_positions=rows * new, mask_bytes=masks)


def _learner_state(shape: Shape, cfg, c: int) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, reference) bytes on one of W = learner.world_size ranks.

    Full fine-tuning: every parameter trains, FSDP2 keeps fp32 master weights, fp32 gradients
    (`reduce_dtype`) and two fp32 AdamW states, each sharded: 4 P / W each, 8 P / W the optimizer.
    LoRA: the backbone is frozen, held in the compute dtype (c P / W) with no gradient or state;
    only the adapter's A parameters train (4 A / W weights, 4 A / W gradients, 8 A / W states).
    The KL reference (algo.kl_coef > 0) is a frozen copy sharded in the compute dtype, c P / W;
    with LoRA there is none (the policy with its adapters off is the reference).
    Unsharded (one rank, fp32, no FSDP) W is 1 and the formulas hold as they are."""
    layer, rest, adapter = parameters(shape)
    world = cfg.learner.world_size
    P, A = shape.layers * layer + rest, shape.layers * adapter
    trained = A if shape.lora_rank else P
    weights = (c * P + FP32 * A if shape.lora_rank else FP32 * P) / world
    reference = c * P / world if passes(cfg.algo).reference and not shape.lora_rank else 0
    return weights, FP32 * trained / world, ADAM_STATES * FP32 * trained / world, reference


def _gathered(shape: Shape, c: int, lora: bool) -> float:
    """Bytes FSDP2 holds unsharded during a learning pass: each decoder layer is a unit and the
    rest (embeddings, LM head) is the root's.

    The root's parameters are gathered in the compute dtype through forward and backward (FSDP2
    does not reshard the root after forward), c R; two layers at a time, the one computing and the
    one prefetched, 2 c L. In backward a unit's gradients exist unsharded until reduce-scattered:
    the root's (the head's comes first, in the logits' backward, and waits for the embeddings' at
    the end), c R; one layer's, c L, cast to fp32 for the reduce-scatter when c is bf16's (4 L).
    With LoRA only the adapters have gradients: the root's none, a layer's its adapter's."""
    layer, rest, adapter = parameters(shape)
    params = c * (rest + 2 * (layer + adapter))
    grad_layer = adapter if lora else layer
    grads = (0 if lora else c * rest) + grad_layer * (c + (FP32 if c < FP32 else 0))
    return params + grads


def _activations(shape: Shape, micro: MicroBatch, c: int, checkpointing: bool) -> float:
    """Bytes kept for backward of one micro-batch (S positions, K key positions), the way Hugging
    Face's Llama / Qwen2 layer saves them under SDPA with a mask (the memory-efficient kernel: no
    [S, K] scores kept). Per position of one layer, h hidden, q = heads * head_dim, i intermediate:

    - two RMSNorms, each its fp32 input (HF upcasts) and its normalised output, 2 (4 h + c h);
    - the inputs of q/k/v and of gate/up, 2 c h;
    - the queries, the attention's output and o_proj's input (a copy in another layout), 3 c q;
    - the MLP's gate and up outputs, SiLU's output and their product (down_proj's input), 4 c i;

    and per key position the keys and values repeated to every query head (grouped-query
    attention: HF's `repeat_kv` and the prompt tree's `repeat_interleave` both materialise them),
    2 c q. With `learner.activation_checkpointing` a layer keeps only its input, c h per position,
    and one layer at a time recomputes its internals in backward. Besides the layers: the final
    norm (4 h + c h per position), the hidden states at the logit positions (c h each), the
    gradient flowing back through the residual stream and the one being formed (2 c h per
    position), and the layout's boolean masks."""
    h, S = shape.hidden, micro.tokens
    layer = _layer_bytes(shape, S, micro.keys, c)
    layers = shape.layers * c * h * S + layer if checkpointing else shape.layers * layer
    return layers + S * (4 * h + c * h) + micro.logit_positions * c * h + 2 * c * h * S + micro.mask_bytes


def _layer_bytes(shape: Shape, positions: int, keys: int, c: int) -> float:
    """What one layer keeps for backward at `positions` query and `keys` key positions (`_activations`)."""
    h, q, i = shape.hidden, shape.heads * shape.head_dim, shape.intermediate
    return positions * (2 * (4 * h + c * h) + 2 * c * h + 3 * c * q + 4 * c * i) + keys * 2 * c * q


def _logits(shape: Shape, micro: MicroBatch, c: int, chunk_tokens: int, entropy: bool) -> float:
    """One chunk's [tokens, vocab] while its backward runs (`learner.token_logprobs` recomputes one
    chunk at a time): min(learner.logit_chunk_tokens, the micro-batch's completion tokens) x vocab,
    LOGIT_COPIES fp32 copies (+ ENTROPY_COPIES with the entropy bonus), and in bf16 the head's
    output and its gradient (2 c)."""
    tokens = min(chunk_tokens, micro.logit_positions)
    per_element = FP32 * (LOGIT_COPIES + (ENTROPY_COPIES if entropy else 0)) + (2 * c if c < FP32 else 0)
    return tokens * shape.vocab * per_element


def _sampler(shape: Shape, cfg, c: int, rows: int, width: int) -> tuple[float, float, float, float]:
    """(the sampler's weights, its KV cache, its CUDA graphs, what of them stays while the learner
    learns) in bytes on the GPU that holds most.

    vLLM: each engine spans sampler.tensor_parallel GPUs, its weights (the adapter's slot included)
    split over them, c (P + A) / TP. Its KV cache is the rest of its memory share,
    sampler.gpu_memory_utilization x cluster.gpu_memory_gib less those weights and its CUDA graphs
    (VLLM_CUDA_GRAPH_GIB; vLLM sizes the cache that way; its activations come out of the share
    too), or sampler.kv_cache_gib and ENGINE_WORKSPACE_GIB, the graphs beside them. With
    sampler.sleep the engine gives weights and cache back while the learner learns, not its
    graphs; without, all of it stays.

    HF generate (rank 0 samples every row): a sharded learner's sampler keeps its own unsharded
    copy in the compute dtype, c P, which stays (`make_sampler(own_copy=True)`); an unsharded
    learner samples with its own weights, nothing more. Its KV cache holds every row at full
    width, rows x (P + T) x layers x 2 x kv_heads x head_dim x c, and each decode step the
    rows' last logits in c and fp32 (divided by the temperature, log-softmax, softmax), freed
    when sampling ends."""
    layer, rest, adapter = parameters(shape)
    P = shape.layers * (layer + adapter) + rest
    s = cfg.sampler
    if SAMPLERS[s.name].own_engine:
        weights = c * P / s.tensor_parallel
        graphs = 0 if s.enforce_eager else VLLM_CUDA_GRAPH_GIB * GIB  # null: eager on the CPU only, graphs on GPUs
        if s.kv_cache_gib is not None:
            kv = (s.kv_cache_gib + ENGINE_WORKSPACE_GIB) * GIB
        else:
            share = s.gpu_memory_utilization * cfg.cluster.gpu_memory_gib * GIB
            kv = share - weights - graphs
            if kv <= 0:
                raise ConfigError(
                    f"sampler.gpu_memory_utilization={s.gpu_memory_utilization:g} of "
                    f"cluster.gpu_memory_gib={cfg.cluster.gpu_memory_gib:g} ({share / GIB:.1f} GiB) does not "
                    f"hold the engine's weights and CUDA graphs ({weights / GIB:.1f} + {graphs / GIB:.1f} "
                    "GiB per GPU): raise sampler.gpu_memory_utilization or sampler.tensor_parallel"
                )
        return weights, kv, graphs, graphs if s.sleep else weights + kv + graphs
    weights = c * P if sharded(cfg) else 0
    kv = rows * width * shape.layers * 2 * shape.kv_heads * shape.head_dim * c + rows * shape.vocab * (c + 3 * FP32)
    return weights, kv, 0, weights


def _transfers(cfg, n: int, B_p: int, prompt: int, new: int) -> tuple[float, float]:
    """(rank 0's buffers while sampling, before scoring) in bytes: what `distributed.Group`'s
    collectives hold on rank 0's GPU (NCCL moves even pickled objects through device tensors). One
    rank: none.

    Sampling (vLLM): each of the E = W / sampler.tensor_parallel engines' shares, ceil(B_p / E)
    prompts, is pickled, PICKLED_ID bytes a prompt token and PICKLED_ID + PICKLED_LOGPROB a
    completion token, and gathered: rank 0 holds its own and a buffer of W of the largest, (W + 1)
    shares. Before scoring rank 0 broadcasts the rollouts (`broadcast_tensors`): the texts pickled,
    TEXT_BYTES a completion token, and the [B_p n, P + T] int64 tensors one after another, two
    alive at once (the next allocated before the last is let go)."""
    world = cfg.learner.world_size
    if world == 1:
        return 0, 0
    gather = 0
    if SAMPLERS[cfg.sampler.name].own_engine:
        prompts = math.ceil(B_p / (world // cfg.sampler.tensor_parallel))
        gather = (world + 1) * prompts * (prompt * PICKLED_ID + n * new * (PICKLED_ID + PICKLED_LOGPROB))
    rows = B_p * n
    return gather, rows * new * TEXT_BYTES + 2 * rows * (prompt + new) * ROLLOUT_ID


def _reward_model(cfg, n: int, B_p: int, width: int) -> tuple[float, float]:
    """(a reward model's weights, one of its scoring forwards) in bytes: 0 for a rule.

    The weights: SCORER_BYTES x (its layers' projections and its embeddings), unsharded on every
    rank. A forward (`recipe.prm.micro_batches`) takes rows = reward.max_tokens_per_forward //
    width rows of width P + T + 1 (prompt, completion, eos), at least one and at most this rank's
    share (ceil(B_p / W) groups of n); without gradients it holds at most one layer's tensors at a
    time, bounded by what a learning pass keeps of one layer (`_layer_bytes`, every key position
    a query position), with the residual stream and the layer's output (2 c h a position) and the
    padding mask (a boolean [width, width] a row)."""
    if not REWARDS[cfg.reward.name].model_based:
        return 0, 0
    shape = _reward_shape(cfg.reward)
    layer, rest, _ = parameters(shape)
    c = SCORER_BYTES
    share = math.ceil(B_p / cfg.learner.world_size) * n
    budget = cfg.reward.max_tokens_per_forward
    rows = min(share, max(1, budget // width)) if budget else share
    S = rows * width
    forward = _layer_bytes(shape, S, S, c) + 2 * c * shape.hidden * S + rows * width * width
    return c * (shape.layers * layer + rest), forward


def _reward_shape(reward) -> Shape:
    """A reward model's shape for its weights: its embeddings' vocabulary (`flops.reward_model_shape`
    gives the head's, its labels), one matrix (the classifier's head is its labels wide)."""
    if reward.path:
        return replace(
            Shape.from_config(json.loads((Path(reward.path).expanduser() / "config.json").read_text())), tied=True
        )
    return replace(model_shape(reward), tied=True)


def _knobs(term: str, memory: Memory, cfg) -> list[str]:
    """What shrinks a term, as the knob to turn."""
    lrn, s, micro = cfg.learner, cfg.sampler, memory.micro_batch
    if term == "activations":
        knobs = [] if lrn.activation_checkpointing else ["turn learner.activation_checkpointing on"]
        if lrn.max_tokens_per_micro_batch:
            knobs.append(
                f"one completion alone feeds {micro.tokens:,} positions: lower task.max_new_tokens"
                if micro.rows == 1
                else "lower learner.max_tokens_per_micro_batch"
            )
        elif lrn.micro_batch and micro.groups == 1:
            knobs.append(
                f"a prompt group alone feeds {micro.tokens:,} positions: "
                "set learner.max_tokens_per_micro_batch (it splits groups)"
            )
        else:
            knobs.append("lower learner.micro_batch" if lrn.micro_batch else "set learner.max_tokens_per_micro_batch")
        return knobs
    if term == "logits":
        return ["lower learner.logit_chunk_tokens"]
    if term == "kv_cache":
        if not SAMPLERS[s.name].own_engine:
            return ["use sampler=vllm (HF generate caches every row at once)"]
        return ["lower sampler.kv_cache_gib" if s.kv_cache_gib is not None else "lower sampler.gpu_memory_utilization"]
    if term == "sampler_weights":
        return ["raise sampler.tensor_parallel"] if SAMPLERS[s.name].own_engine else ["use sampler=vllm"]
    if term == "sampler_kept":
        return ["turn sampler.sleep on"] if SAMPLERS[s.name].own_engine else ["use sampler=vllm"]
    if term in ("step_tensors", "gather_buffers", "broadcast_buffers"):
        return ["fewer rollouts per step (grid.n, grid.B_p)"]
    if term == "reward_forward":
        return ["lower reward.max_tokens_per_forward"]
    if term == "reward_weights":
        return ["a smaller reward model (reward.path)"]
    if term == "engine_graphs":
        return ["sampler.enforce_eager=true (no CUDA graphs)"]
    if term in ("weights", "gradients", "optimizer", "reference"):
        return ["more GPUs per run (cluster.gpus_per_run)"] + ([] if cfg.lora.rank else ["or LoRA (lora.rank)"])
    return []
