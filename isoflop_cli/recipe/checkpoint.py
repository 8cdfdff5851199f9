"""Where a run's base model comes from: a local Hugging Face checkpoint, or the embedded tiny model.

The embedded model (a small Qwen2 with a character tokenizer) is built on first use by a short
supervised warm start on the task, saved with `save_pretrained` into a cache keyed by its recipe,
and from then on loaded exactly like any checkpoint. Concurrent runs wait on a file lock while one
of them builds it.

The default recipe's model ships with the package (`isoflop_cli/models/`, 4 MB, written by
`scripts/ship_embedded.py`): a warm start on another CPU (another instruction set, another BLAS)
gives other weights, and the embedded study's figures moved with them (base 0.689 on one machine,
0.578 on another). Every machine starts from the same bytes, and `make sweep` skips the build.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

from isoflop_cli import hub, tasks
from isoflop_cli.config.schema import cache_dir
from isoflop_cli.recipe.distributed import device
from isoflop_cli.tasks.arith import ALPHABET, SPECIALS, ArithTask

PAD, EOS, UNK = SPECIALS


def load(model_cfg: DictConfig, task_cfg: DictConfig, dtype: torch.dtype = torch.float32, meta: bool = False):
    """(tokenizer, model) for a run; builds the embedded model first if it is not cached. With
    `meta` the model is the checkpoint's architecture on the meta device, no weights read and no
    storage: what a rank > 0 of a sharded learner starts from (`distributed.shard` fills it)."""
    path = model_path(model_cfg, task_cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # SDPA: the learner's Actor adds its prompt-tree attention to it (`learner.TREE_ATTENTION`).
    if not meta:
        return tokenizer, AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(path), dtype=dtype, attn_implementation="sdpa"
        )
    return tokenizer, model.eval()  # as from_pretrained leaves it


def activation_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant, as FSDP2 needs).
    transformers renamed the switch within the range this project accepts: 5.16-5.19 have only
    `gradient_checkpointing_enable` (seen on a GPU image with 5.17), later ones call that name a
    deprecated alias of `activation_checkpointing_enable`."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def scorer(model_class, path: Path | str):
    """A model that only scores (a PRM, a judge) from its checkpoint, on the run's device: in bf16 on
    a GPU (where the learner computes in bf16 by default), in fp32 on the CPU."""
    here = device()
    return (
        model_class.from_pretrained(path, dtype=torch.bfloat16 if here.type == "cuda" else torch.float32)
        .to(here)
        .eval()
    )


def model_path(model_cfg: DictConfig, task_cfg: DictConfig) -> Path:
    """The checkpoint directory: the configured path (a Hub id's snapshot in this node's Hugging
    Face cache), or the embedded model (built on first use)."""
    if not model_cfg.path:
        return ensure_embedded(model_cfg, task_cfg)
    return hub.checkpoint(model_cfg.path, "model.path", model_cfg.get("download", False))


def ensure_embedded(model_cfg: DictConfig, task_cfg: DictConfig) -> Path:
    """The embedded model, warm-started on the run's arithmetic task; for any other task (problems
    from a file, in the embedded model's characters) on the default arithmetic."""
    task = warm_start_task(task_cfg)
    return cached(model_cfg.name, embedded_recipe(model_cfg, task_cfg), lambda out: build(model_cfg.build, task, out))


def embedded_recipe(model_cfg: DictConfig, task_cfg: DictConfig) -> dict:
    """What the embedded warm start learns from; sampling limits (max_new_tokens) do not change the model."""
    task = warm_start_task(task_cfg)
    return {
        "name": model_cfg.name,
        "build": OmegaConf.to_container(model_cfg.build),
        "task": {"name": "arith", **asdict(task)},
        "vocab": ALPHABET,
    }


def warm_start_task(task_cfg: DictConfig) -> ArithTask:
    kind = tasks.task_class(task_cfg.name)
    return kind.from_config(task_cfg) if issubclass(kind, ArithTask) else ArithTask()


SHIPPED = Path(__file__).resolve().parent.parent / "models"  # built models that ship with the package


def recipe_dir_name(name: str, recipe: dict) -> str:
    """A built model's directory name: its name and a digest of everything it is built from."""
    return f"{name}-{hashlib.sha1(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]}"


def cached(name: str, recipe: dict, build_fn: Callable[[Path], None]) -> Path:
    """The directory of a locally built model, keyed by its recipe: the one shipped with the package
    if there is one, else built once, under a file lock, into a temporary directory renamed into
    place (a crash leaves no half-built model)."""
    shipped = SHIPPED / recipe_dir_name(name, recipe)
    if (shipped / "config.json").is_file():
        return shipped
    target = cache_dir() / "models" / shipped.name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
            try:
                build_fn(tmp)
                (tmp / "isoflop_recipe.json").write_text(json.dumps(recipe, indent=2))
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate([*SPECIALS, *ALPHABET])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def qwen2_config(b: DictConfig, tokenizer, **extra) -> Qwen2Config:
    """The embedded family's architecture at the sizes in `b` (a model.build section)."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=b.hidden_size,
        intermediate_size=b.intermediate_size,
        num_hidden_layers=b.num_layers,
        num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_kv_heads,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        **extra,
    )


def supervised(
    model, b: DictConfig, task: ArithTask, batch_loss: Callable[[list], torch.Tensor], what: str, log_every: int = 100
) -> None:
    """A seeded supervised loop: AdamW, short warm-up then cosine decay, clipped gradients. `task`
    is anything whose `stream("train", seed)` gives the examples `batch_loss` takes (the lookup's
    warm start draws key indices)."""
    opt = torch.optim.AdamW(model.parameters(), lr=b.lr, weight_decay=0.0)
    warmup = max(1, b.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, b.steps) / max(1, b.steps)))
        ),  # steps 0: the model as initialised
    )
    stream = task.stream("train", seed=b.seed)
    start = time.time()
    model.train()
    for step in range(b.steps):
        loss = batch_loss([next(stream) for _ in range(b.batch_size)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % log_every == 0:
            print(f"[{what}] step {step + 1}/{b.steps} loss {loss.item():.4f} ({time.time() - start:.0f}s)", flush=True)
    model.eval()


def build(b: DictConfig, task: ArithTask, out: Path) -> None:
    """Seeded Qwen2 + supervised warm start (loss on the solution tokens only, some followed by a
    stray digit: model.build.stray), saved in HF format."""
    torch.manual_seed(b.seed)
    tokenizer = char_tokenizer()
    model = AutoModelForCausalLM.from_config(qwen2_config(b, tokenizer))

    strays = random.Random(f"stray-{b.seed}")

    def batch_loss(problems: list) -> torch.Tensor:
        input_ids, labels = _sft_batch(tokenizer, problems, strays, b.stray)
        return model(
            input_ids=input_ids, attention_mask=(input_ids != tokenizer.pad_token_id).long(), labels=labels
        ).loss

    supervised(model, b, task, batch_loss, "warm start")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _sft_batch(tokenizer, problems, rng: random.Random, stray: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt+answer+eos ids, a `stray` share of answers followed by a random digit
    (model.build.stray); labels only on the answer and eos (-100 elsewhere)."""
    rows, labels = [], []
    for p in problems:
        prompt = tokenizer.encode(p.prompt)
        extra = str(rng.randrange(10)) if rng.random() < stray else ""
        answer = tokenizer.encode(p.solution + extra) + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    return ids, lab
