"""Check the FLOP ledger against torch's FlopCounterMode on the kernels a GPU runs, and time them.

On a GPU: a Qwen2.5-0.5B-shaped model (random weights, bf16, the attention kernels torch picks),
full fine-tuning and LoRA, the learning pass in both layouts (plain rows, prompt tree). On CPU: a
small shape, float32 (what the tests check too). Prints, per part, measured and analytic FLOPs,
their ratio, the time and the achieved TFLOP/s.

    python scripts/gpu_ledger_check.py            # needs torch and transformers (peft for LoRA)
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, Qwen2Config

import isoflop_cli.recipe.measure  # noqa: F401  (the CPU attention formulas)
from isoflop_cli import flops
from isoflop_cli.recipe.learner import Actor, Layout

QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)
SMALL = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    tie_word_embeddings=False,
)


def timed(device: str, fn) -> tuple[float, float, object]:
    """(measured FLOPs, seconds, result) of fn: FLOPs from one counted call, time from a second."""
    with FlopCounterMode(display=False) as counter:
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return counter.get_total_flops(), time.perf_counter() - start, out


GROUP = 4  # rows per prompt: the learning pass is checked in both layouts, plain rows and the prompt tree


def check(model, shape: flops.Shape, device: str, rows: int, prompt: int, new: int, label: str) -> list[tuple]:
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows // GROUP, prompt), device=device).repeat_interleave(GROUP, 0)
    mask = torch.ones_like(ids)

    def search():
        return model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
            eos_token_id=1,
        )

    measured, seconds, out = timed(device, search)
    rows_out = [(label, "search", measured, flops.generate(shape, rows, prompt, out.shape[1] - prompt), seconds)]
    attention = torch.ones_like(out)
    layouts = {"plain": Layout.plain(out, attention, prompt), "tree": Layout.tree(out, attention, prompt, GROUP)}
    for name, layout in layouts.items():

        def learning(layout=layout):  # timed calls it within this iteration; bound all the same
            model.zero_grad(set_to_none=True)
            Actor(model)(layout, 1.0).logp.float().sum().backward()

        measured, seconds, _ = timed(device, learning)
        work = (
            flops.plain_work(*out.shape)
            if name == "plain"
            else flops.tree_work(rows // GROUP, GROUP, prompt, out.shape[1], layout.input_ids.numel())
        )
        analytic = flops.learning(shape, *work, logits=rows * (out.shape[1] - prompt))
        rows_out.append((label, f"learn/{name}", measured, analytic, seconds))
    return rows_out


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    sizes, (rows, prompt, new) = (QWEN25_05B, (64, 64, 64)) if device == "cuda" else (SMALL, (8, 8, 8))
    config = Qwen2Config(**sizes, pad_token_id=0, eos_token_id=1)
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=dtype)
    shape = flops.Shape.from_config(model.config)
    results = check(model, shape, device, rows, prompt, new, "full")
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        print("peft is not installed: LoRA not checked")
    else:
        lora = get_peft_model(
            model, LoraConfig(r=16, lora_alpha=32, target_modules=list(flops.PROJECTIONS), lora_dropout=0.0)
        )
        results += check(lora, shape.with_lora(16, flops.PROJECTIONS), device, rows, prompt, new, "lora r=16")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"device {name}, {dtype}, Qwen2 hidden {sizes['hidden_size']} x {sizes['num_hidden_layers']} layers, "
        f"{rows} rows, prompt {prompt}, {new} new tokens"
    )
    print(f"{'model':10} {'part':13} {'measured':>12} {'analytic':>12} {'ratio':>7} {'seconds':>8} {'TFLOP/s':>8}")
    for label, part, measured, analytic, seconds in results:
        print(
            f"{label:10} {part:13} {measured:12.4g} {analytic:12.4g} "
            f"{analytic / measured:7.4f} {seconds:8.3f} {measured / seconds / 1e12:8.2f}"
        )


if __name__ == "__main__":
    main()
