"""The lookup study's problems and base model: a table of keys with random values, and a small model
warm-started on it with skewed exposure, so that what the model knows differs from problem to problem.

Sums share one algorithm: RL that fixes it fixes every problem at once, and nothing interferes or
needs coverage (the embedded arithmetic study shows RL sharpening one shared behaviour). A lookup
shares nothing: each key's value is a skill of its own, learnt only from that key's rewards and
competing with the other keys for a ~1M-parameter model's capacity. The warm start shows key i
with a probability proportional to 1 / (i + 1)^zipf, so after it some keys are known, some half
known, and some answered right once in many samples: the mixed difficulty that `isoflop calibrate`
cuts into the seed's easy and hard sets. On a hard key a group of n samples holds a success with
probability 1 - (1 - p)^n, which is where larger n should earn its cost.

The pool is written as verl-style parquet (`prompt`, `reward_model.ground_truth`), so calibrate
and the sweeps read it as a user's own problem file (`task=dataset`). Validation asks the same
keys: a lookup has nothing to generalise to, and what is measured is how much of the table RL
recovered. The model is built once per recipe (one thread; the cache of `checkpoint.cached`) or
taken from the package where it ships.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from isoflop_cli.recipe import checkpoint
from isoflop_cli.tasks.arith import ALPHABET

NAME = "tiny-lookup"
TABLE = {"keys": 512, "key_digits": 3, "value_digits": 3, "seed": 0}
# The embedded family's architecture (conf/model/tiny-arith.yaml), a warm start of 600 steps.
BUILD = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "steps": 600,
    "batch_size": 64,
    "lr": 3e-3,
    "seed": 0,
    "zipf": 1.0,
}


def table(keys: int, key_digits: int, value_digits: int, seed: int) -> list[tuple[str, str]]:
    """(prompt, answer) per key, in exposure order: `keys` distinct keys `ddd=`, each a random value."""
    rng = random.Random(f"lookup-{seed}")
    drawn = rng.sample(range(10**key_digits), keys)
    return [(f"{k:0{key_digits}d}=", f"{rng.randrange(10**value_digits):0{value_digits}d}") for k in drawn]


def recipe() -> dict:
    return {"name": NAME, "table": TABLE, "build": BUILD, "vocab": ALPHABET}


def build(out: Path) -> None:
    """Warm start: AdamW with a short warm-up and cosine decay, loss on the value and eos only,
    key i drawn with weight 1 / (i + 1)^zipf. One thread, so a build is the same wherever it runs
    on one instruction set."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _build(out)
    finally:
        torch.set_num_threads(threads)


class _Exposure:
    """The warm start's draws for `checkpoint.supervised`: key indices, key i with weight
    1 / (i + 1)^zipf, drawn a batch at a time from a seeded generator."""

    def __init__(self, keys: int, zipf: float, batch_size: int):
        self.weights = torch.tensor([(i + 1) ** -zipf for i in range(keys)])
        self.batch_size = batch_size

    def stream(self, split: str, seed: int) -> Iterator[int]:
        draws = torch.Generator().manual_seed(seed)
        while True:
            yield from torch.multinomial(self.weights, self.batch_size, replacement=True, generator=draws).tolist()


def _build(out: Path) -> None:
    from omegaconf import OmegaConf

    b = OmegaConf.create(BUILD)
    rows = table(**TABLE)
    tokenizer = checkpoint.char_tokenizer()
    torch.manual_seed(b.seed)
    model = AutoModelForCausalLM.from_config(checkpoint.qwen2_config(b, tokenizer))
    ids = torch.tensor(
        [tokenizer.encode(p) + tokenizer.encode(a) + [tokenizer.eos_token_id] for p, a in rows]
    )  # [keys, T]
    labels = ids.clone()
    labels[:, : len(rows[0][0])] = -100  # the prompt `ddd=` is given, not learnt

    def batch_loss(idx: list[int]) -> torch.Tensor:
        return model(input_ids=ids[idx], labels=labels[idx]).loss

    checkpoint.supervised(model, b, _Exposure(len(rows), b.zipf, b.batch_size), batch_loss, "lookup warm start")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def model_dir() -> Path:
    """The warm-started model's directory: shipped with the package, else built once into the cache."""
    return checkpoint.cached(NAME, recipe(), build)


def write_pool(path: Path) -> None:
    """Every key as a verl-style problem row, in exposure order (`exposure_rank` 0: the most seen)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"prompt": p, "reward_model": {"ground_truth": a}, "exposure_rank": i}
        for i, (p, a) in enumerate(table(**TABLE))
    ]
    pd.DataFrame(rows).to_parquet(path, index=False)
