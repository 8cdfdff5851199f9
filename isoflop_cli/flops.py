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
from dataclasses import dataclass
from pathlib import Path

from isoflop_cli.tasks.arith import ALPHABET, SPECIALS

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


class UnsupportedModel(ValueError):
    """An architecture the ledger cannot count: an error, never a silent zero."""


@dataclass(frozen=True)
class Shape:
    """What the ledger needs of a dense decoder."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> "Shape":
        """From a transformers config object or a config.json dict."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        model_type = get("model_type")
        if model_type not in SUPPORTED:
            raise UnsupportedModel(f"the FLOP ledger does not support model_type '{model_type}' (supported: {', '.join(SUPPORTED)})")
        heads = get("num_attention_heads")
        return cls(
            layers=get("num_hidden_layers"),
            hidden=get("hidden_size"),
            intermediate=get("intermediate_size"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            vocab=get("vocab_size"),
        )

    @property
    def linear_macs(self) -> int:
        """Multiply-accumulates per token of one layer's projections: q, k, v, o and a gated MLP."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate

    def attention_macs(self, key_len: int) -> int:
        """Per query token of one layer: QK^T and AV over `key_len` keys, every query head."""
        return 2 * self.heads * self.head_dim * key_len


@dataclass(frozen=True)
class Pass:
    """FLOPs of one forward pass split by kind, so backward passes can scale each kind."""

    linear: float
    attention: float
    head: float

    @property
    def total(self) -> float:
        return self.linear + self.attention + self.head


def forward(shape: Shape, rows: int, query_len: int, key_len: int, logit_positions: int) -> Pass:
    """One forward of `rows` sequences: `query_len` new tokens each attending to `key_len` keys."""
    tokens = rows * query_len
    return Pass(
        linear=2.0 * shape.layers * tokens * shape.linear_macs,
        attention=2.0 * shape.layers * tokens * shape.attention_macs(key_len),
        head=2.0 * rows * logit_positions * shape.hidden * shape.vocab,
    )


def generate(shape: Shape, rows: int, prompt_len: int, new_tokens: int) -> float:
    """Sampling with a KV cache: a prefill at the padded prompt width (logits of its last position),
    then one decode step per further token, each attending to the growing context."""
    if new_tokens <= 0:
        return 0.0
    flops = forward(shape, rows, prompt_len, prompt_len, 1).total
    for step in range(1, new_tokens):
        flops += forward(shape, rows, 1, prompt_len + step, 1).total
    return flops


def train_step(shape: Shape, rows: int, seq_len: int, reference: bool) -> float:
    """A forward and backward over the trained sequences (logits at every position), full fine-tuning,
    plus a reference-model forward when the KL term is on.

    Backward: a linear layer (and the LM head) computes the input gradient and the weight gradient,
    2x its forward each; attention recomputes its scores and takes four more products, 2.5x.
    """
    fwd = forward(shape, rows, seq_len, seq_len, seq_len)
    flops = fwd.total + 2 * (fwd.linear + fwd.head) + 2.5 * fwd.attention
    if reference:
        flops += fwd.total
    return flops


def model_shape(model) -> Shape:
    """The shape of a configured model without loading it: its config.json, or the embedded build."""
    if model.path:
        return Shape.from_config(json.loads((Path(model.path).expanduser() / "config.json").read_text()))
    b = model.build
    return Shape(
        layers=b.num_layers, hidden=b.hidden_size, intermediate=b.intermediate_size, heads=b.num_heads,
        kv_heads=b.num_kv_heads, head_dim=b.hidden_size // b.num_heads, vocab=len(SPECIALS) + len(ALPHABET),
    )
