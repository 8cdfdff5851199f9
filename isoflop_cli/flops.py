"""The compute ledger: matmul FLOPs of the work a run actually does, from the model's HF config.

Convention (the one `torch.utils.flop_counter` uses, so a measurement can check the ledger): 2
FLOPs per multiply-accumulate of every matrix product: the linear layers, the attention products
(QK^T and AV, over the full key length each query sees), and the LM head for the positions whose
logits are computed. Norms, activations, softmax and embedding lookups are not counted.

The shapes are the ones the kernels compute, padding included: a left-padded batch of prompts is
prefilled at its padded width, and a row that finished early keeps decoding pad tokens until the
batch ends. That is the work done, so that is the compute spent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from isoflop_cli import hub
from isoflop_cli.algorithms import passes
from isoflop_cli.tasks.arith import ALPHABET, SPECIALS

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class UnsupportedModel(ValueError):
    """An architecture the ledger cannot count: an error, never a silent zero."""


@dataclass(frozen=True)
class Shape:
    """What the ledger needs of a dense decoder, and of the LoRA adapters on it when it has them."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False  # the LM head is the input embedding (one matrix): the memory model counts it once
    lora_rank: int = 0  # 0: full fine-tuning
    lora_targets: tuple[str, ...] = ()  # projections with an adapter (names in PROJECTIONS)

    def with_lora(self, rank: int, targets: tuple[str, ...] | list[str]) -> Shape:
        return replace(self, lora_rank=rank, lora_targets=tuple(targets) if rank else ())

    @classmethod
    def from_config(cls, config) -> Shape:
        """From a transformers config object or a config.json dict."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        model_type = get("model_type")
        if model_type not in SUPPORTED:
            raise UnsupportedModel(
                f"the FLOP ledger does not support model_type '{model_type}' (supported: {', '.join(SUPPORTED)})"
            )
        needed = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")

        def count(v) -> bool:  # JSON's true is a Python int too
            return isinstance(v, int) and not isinstance(v, bool) and v > 0

        missing = [k for k in needed if not count(get(k))]
        if missing:
            raise UnsupportedModel(
                f"its config ({model_type}) lacks {', '.join(missing)} (a positive integer each): the FLOP ledger "
                "counts a decoder from them"
            )
        odd = [k for k in ("num_key_value_heads", "head_dim") if get(k) is not None and not count(get(k))]
        if odd:
            raise UnsupportedModel(
                f"its config ({model_type}) has {odd[0]}={get(odd[0])!r}: a "
                "positive integer (or absent) the FLOP ledger counts with"
            )
        heads = get("num_attention_heads")
        return cls(
            layers=get("num_hidden_layers"),
            hidden=get("hidden_size"),
            intermediate=get("intermediate_size"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            vocab=get("vocab_size"),
            tied=bool(get("tie_word_embeddings", False)),  # absent: the supported families' default, untied
        )

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of one layer's projections: attention q, k, v, o and a gated MLP."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def linear_macs(self) -> int:
        """Multiply-accumulates per token of one layer's projections."""
        return sum(i * o for i, o in self.projections.values())

    def adapter_macs(self, names: tuple[str, ...] | None = None) -> int:
        """Per token of one layer: x A (in x r) then (x A) B (r x out), for each adapted projection."""
        names = self.lora_targets if names is None else [n for n in names if n in self.lora_targets]
        return sum(self.lora_rank * (self.projections[n][0] + self.projections[n][1]) for n in names)

    def attention_macs(self, key_len: int) -> int:
        """Per query token of one layer: QK^T and AV over `key_len` keys, every query head."""
        return 2 * self.heads * self.head_dim * key_len


@dataclass(frozen=True)
class Pass:
    """FLOPs of one forward pass split by kind, so backward passes can scale each kind."""

    linear: float
    attention: float
    head: float
    adapter: float = 0.0

    @property
    def total(self) -> float:
        return self.linear + self.attention + self.head + self.adapter


def forward(shape: Shape, rows: int, query_len: int, key_len: int, logit_positions: int) -> Pass:
    """One forward of `rows` sequences: `query_len` new tokens each attending to `key_len` keys."""
    tokens = rows * query_len
    return Pass(
        linear=2.0 * shape.layers * tokens * shape.linear_macs,
        attention=2.0 * shape.layers * tokens * shape.attention_macs(key_len),
        head=2.0 * rows * logit_positions * shape.hidden * shape.vocab,
        adapter=2.0 * shape.layers * tokens * shape.adapter_macs(),
    )


@dataclass(frozen=True)
class StepBatch:
    """The sizes one step's compute depends on: measured from its rollouts in a run, their bounds in
    `plan` (every prompt at the widest, every completion at task.max_new_tokens)."""

    prompts: int  # B_p
    n: int  # completions sampled per prompt
    prompt_width: int  # padded prompt positions
    generated_width: int  # decode steps the batch ran
    prefill_rows: int  # rows whose prompt was prefilled: B_p when shared over its group, else B_p * n
    n_learn: int  # completions per prompt the updates learn from (below n with a fractional algo.epochs)
    tree_tokens: int  # positions of the learned rows as prompt trees: each prompt once, then its completions
    learned_tokens: int  # completion tokens the updates learn from: their logit positions
    decode_rows: tuple[int, ...] | None = None  # rows still running at each decode step; None: all (the bound)
    trees: int | None = (
        None  # prompt trees the learning passes lay out: `prompts`, more when a token budget splits groups
    )


@dataclass(frozen=True)
class StepCost:
    """One step's FLOPs per ledger part. Iterates as (search, learning, reward), the order the
    manifest records a cell's per-step bound in."""

    search: float
    learning: float
    reward: float

    def __iter__(self) -> Iterator[float]:
        return iter((self.search, self.learning, self.reward))

    def scaled(self, factor: float) -> StepCost:
        return StepCost(self.search * factor, self.learning * factor, self.reward * factor)

    @property
    def total(self) -> float:
        return self.search + self.learning + self.reward


@dataclass
class Ledger:
    """Training FLOPs by part, added up step by step: what a run has spent (its metrics columns) or
    what a plan predicts for it. The total and rho = learning / total are defined here alone; the
    evaluation's FLOPs are not training compute and stay out of both."""

    search: float = 0.0
    learning: float = 0.0
    reward: float = 0.0

    @classmethod
    def of(cls, columns: Mapping[str, float]) -> Ledger:
        """The ledger a run's metrics (or its running ledger) hold in their flops_* columns."""
        return cls(columns["flops_search"], columns["flops_learning"], columns["flops_reward"])

    def add(self, cost: StepCost, steps: float = 1) -> Ledger:
        self.search += steps * cost.search
        self.learning += steps * cost.learning
        self.reward += steps * cost.reward
        return self

    @property
    def total(self) -> float:
        return self.search + self.learning + self.reward

    @property
    def rho(self) -> float | None:
        """The update ratio C_learning / C_total; None before anything is spent."""
        return self.learning / self.total if self.total else None

    def columns(self) -> dict[str, float | None]:
        return {
            "flops_search": self.search,
            "flops_learning": self.learning,
            "flops_reward": self.reward,
            "flops_total": self.total,
            "rho": self.rho,
        }


def step_cost(shape: Shape, algo, batch: StepBatch, shared_prompt: bool, reward: float = 0.0) -> StepCost:
    """One step's FLOPs per ledger part. `plan` calls it at the batch's bounds and a run at its
    measured sizes, so predicted and spent compute are assembled the same way. `shared_prompt`:
    the learner's passes run over prompt trees (`learner.shared_prompt`), else over padded rows.
    `reward`: the reward model's FLOPs (`reward_model`), 0 for a rule."""
    search = generate(
        shape, batch.prompts * batch.n, batch.prompt_width, batch.generated_width, batch.prefill_rows, batch.decode_rows
    )
    width = batch.prompt_width + batch.generated_width
    if shared_prompt:
        work = tree_work(batch.prompts, batch.n_learn, batch.prompt_width, width, batch.tree_tokens, batch.trees)
    else:
        work = plain_work(batch.prompts * batch.n_learn, width)
    return StepCost(search, learning(shape, *work, logits=batch.learned_tokens, **asdict(passes(algo))), reward)


def reward_model(shape: Shape, rows: int, width: int) -> float:
    """A reward model (or judge) scoring `rows` padded sequences of `width` tokens: one forward with
    a score at every position."""
    return forward(shape, rows, width, width, width).total


def generate(
    shape: Shape,
    rows: int,
    prompt_len: int,
    new_tokens: int,
    prefill_rows: int | None = None,
    decode_rows: Sequence[int] | None = None,
) -> float:
    """Sampling with a KV cache: a prefill at the padded prompt width (logits of its last position),
    then one decode step per further token, each attending to the growing context.

    With a shared prefill (`prefill_rows` < rows: each distinct prompt once, its cache and logits
    repeated over its group) the prefill runs `prefill_rows` rows. `decode_rows`: the rows still running
    at each decode step 1 .. new_tokens - 1 (`Rollouts.decode_rows`; a row that said eos leaves the
    batch); None: every row at every step, the bound `plan` uses.
    """
    if new_tokens <= 0:
        return 0.0
    flops = forward(shape, rows if prefill_rows is None else prefill_rows, prompt_len, prompt_len, 1).total
    steps = new_tokens - 1
    if steps <= 0:
        return flops
    fixed = forward(shape, 1, 1, 0, 1).total  # one row's decode step without its attention
    if decode_rows is None:  # rows x the steps' keys in closed form, so a long bound costs no loop
        row_steps, keys = rows * steps, rows * (steps * prompt_len + steps * (steps + 1) // 2)
    else:  # step t attends over prompt_len + t keys
        if len(decode_rows) != steps:
            raise ValueError(f"decode_rows has {len(decode_rows)} steps, new_tokens - 1 = {steps}")
        row_steps, keys = sum(decode_rows), sum(r * (prompt_len + t) for t, r in enumerate(decode_rows, start=1))
    return flops + row_steps * fixed + 2.0 * shape.layers * shape.attention_macs(keys)


def learning(
    shape: Shape,
    tokens: int,
    pairs: int,
    epochs: int = 1,
    reference: bool = False,
    old_policy: bool = False,
    value_head: bool = False,
    logits: int | None = None,
) -> float:
    """One rollout batch's updates: per epoch a forward and backward over every trained position
    (`tokens` of them, their attention over `pairs` query-key pairs, from `plain_work` or
    `tree_work`; mini-batches split the rows, not the work), with logits at `logits` positions
    (default: all); plus one forward each for the reference model (KL on; with LoRA, the base with
    adapters off) and the old policy (batch reused). A value head (PPO) adds a hidden -> 1
    projection at each logit position of the policy's passes: 2x its forward in backward (input
    and weight gradients).

    Backward, full fine-tuning: a linear layer (and the LM head) computes the input gradient and
    the weight gradient, 2x its forward each; attention recomputes its scores and takes four more
    products, 2.5x. With LoRA see `_lora_backward`; the frozen LM head computes its input gradient.

    Recomputation done only to save memory is not in the ledger (model FLOPs, as MFU counts them):
    activation checkpointing's second forward of each layer, and the LM head's second forward over
    each logit chunk when a micro-batch holds more than `learner.logit_chunk_tokens` completion
    tokens (`learner.token_logprobs`). A measurement (`flops.measure`) sees both.
    """
    positions = tokens if logits is None else logits
    fwd = Pass(
        linear=2.0 * shape.layers * tokens * shape.linear_macs,
        attention=2.0 * shape.layers * shape.attention_macs(pairs),  # macs per query and key, times the pairs
        head=2.0 * positions * shape.hidden * shape.vocab,
        adapter=2.0 * shape.layers * tokens * shape.adapter_macs(),
    )
    if shape.lora_rank:
        backward = _lora_backward(shape, tokens, fwd.attention / shape.layers) + fwd.head
    else:
        backward = 2 * (fwd.linear + fwd.head) + 2.5 * fwd.attention
    value = value_head * 2.0 * positions * shape.hidden
    return (
        epochs * (fwd.total + backward + 3 * value)
        + reference * (fwd.total - fwd.adapter)
        + old_policy * (fwd.total + value)
    )


def plain_work(rows: int, width: int) -> tuple[int, int]:
    """(positions, attention query-key pairs) of a pass over padded rows (`learner.Layout.plain`):
    every position against the whole row, as the kernels compute the masked square."""
    return rows * width, rows * width * width


def tree_work(
    prompts: int, n: int, prompt_width: int, width: int, tokens: int, trees: int | None = None
) -> tuple[int, int]:
    """(positions, attention query-key pairs) of a pass over prompt trees (`learner.Layout.tree`):
    `tokens` positions (each prompt once per tree, then its completions, no padding); each tree's
    `prompt_width` prompt slots against themselves (`trees`: `prompts`, or more when a token budget
    splits a group into pieces, each with its prompt), and each completion's `width - prompt_width`
    slots against its whole row of `width`."""
    trees = prompts if trees is None else trees
    return tokens, trees * prompt_width * prompt_width + prompts * n * (width - prompt_width) * width


def piece_rows(budget: int, shared: int, per_row: int, k: int) -> int:
    """Rows a micro-batch of one group holds at the bound (each row `per_row` positions, the group's
    `shared` positions once: a tree's prompt, 0 for plain rows) under a token budget
    (`learner.max_tokens_per_micro_batch`; 0: none): all k when the group fits, else as many as
    fit beside the shared positions, at least one (`learner.pieces` splits a group so)."""
    if not budget or shared + k * per_row <= budget:
        return k
    return min(k, max(1, (budget - shared) // per_row))


def epoch_plan(epochs: float, n: int) -> tuple[int, int]:
    """(passes over the rollout batch, completions per group the updates learn from). Whole epochs
    >= 1 are passes over every completion; a fraction below 1 is one pass over that share of each
    group's n completions (at least one; their advantages still come from all n): fewer updates per
    sampled token, so rho falls below one epoch's (RACE's lever on the search-heavy side)."""
    if epochs >= 1:
        return int(epochs), n
    return 1, max(1, min(n, math.ceil(epochs * n - 1e-9)))


def model_shape(model) -> Shape:
    """The shape of a configured model without loading it: its config.json, or the embedded build."""
    if model.path:
        return Shape.from_config(
            json.loads((hub.checkpoint(model.path, "model.path", model.download) / "config.json").read_text())
        )
    b = model.build
    return Shape(
        layers=b.num_layers,
        hidden=b.hidden_size,
        intermediate=b.intermediate_size,
        heads=b.num_heads,
        kv_heads=b.num_kv_heads,
        head_dim=b.hidden_size // b.num_heads,
        vocab=len(SPECIALS) + len(ALPHABET),
        tied=True,
    )


def reward_model_shape(reward) -> Shape:
    """A process reward model's shape: a token classifier, its head `num_labels` wide (the embedded one: 1)."""
    if reward.path:
        config = json.loads((Path(reward.path).expanduser() / "config.json").read_text())
        labels = config.get("num_labels") or len(config.get("id2label") or {0: 0, 1: 1})
        return replace(Shape.from_config(config), vocab=labels)
    return replace(model_shape(reward), vocab=1)


def _lora_backward(shape: Shape, tokens: int, attention_per_layer: float) -> float:
    """Backward FLOPs of the decoder layers with frozen weights and LoRA adapters.

    A frozen matrix computes only its input gradient (1x its forward), and nothing where its input
    needs no gradient; an adapter computes its two weight gradients and its input gradients (2x its
    forward), less the input gradient where the input needs none. Gradients start at the first
    adapter: the first layer reads the frozen embeddings, so what precedes its first adapted
    projection has no backward at all.
    """
    proj, r, targets = shape.projections, shape.lora_rank, shape.lora_targets

    def cost(name: str, input_grad: bool) -> float:
        fan_in, fan_out = proj[name]
        frozen = 2.0 * tokens * fan_in * fan_out if input_grad else 0.0
        adapter = 4.0 * tokens * r * (fan_in + fan_out) - (0.0 if input_grad else 2.0 * tokens * r * fan_in)
        return frozen + (adapter if name in targets else 0.0)

    total, grad = 0.0, False  # grad: whether the layer's input needs a gradient
    for _ in range(shape.layers):
        total += sum(cost(n, grad) for n in ("q_proj", "k_proj", "v_proj"))
        attention = grad or any(n in targets for n in ("q_proj", "k_proj", "v_proj"))
        total += 2.5 * attention_per_layer * attention + cost("o_proj", attention)
        mlp_in = attention or "o_proj" in targets
        total += cost("gate_proj", mlp_in) + cost("up_proj", mlp_in)
        down_in = mlp_in or "gate_proj" in targets or "up_proj" in targets
        total += cost("down_proj", down_in)
        grad = down_in or "down_proj" in targets
    return total
