"""GRPO at a real model's shape on one GPU: tokens/s of sampling and the learner's MFU.

Builds a Qwen2.5-0.5B-shaped checkpoint from its config (random weights, no download; a
character tokenizer padded with filler tokens to the model's vocabulary), saves it in Hugging Face
format, and runs a few GRPO steps on it through `isoflop run`: HF sampler, FSDP2 on one GPU, bf16.
Random weights never say eos, so every completion runs to max_new_tokens: a steady decode load.
The figures come from the run's own ledger and timers (metrics.jsonl).

    python scripts/gpu_check.py --out /tmp/gpu-check [--peak-tflops 989]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from gpu_ledger_check import QWEN25_05B
from isoflop_cli.tasks.arith import ALPHABET, SPECIALS


def build(out: Path) -> Path:
    path = out / "qwen2.5-0.5b-shaped"
    if (path / "config.json").is_file():
        return path
    vocab = {t: i for i, t in enumerate([*SPECIALS, *ALPHABET])}
    vocab.update({f"<x{i}>": i for i in range(len(vocab), QWEN25_05B["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[2]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIALS[0], eos_token=SPECIALS[1], unk_token=SPECIALS[2])
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN25_05B, max_position_embeddings=4096, rope_theta=1e6, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100/H200 SXM: 989)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--B-p", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA GPU")
    path = build(args.out)
    run_dir = args.out / "run"
    batch = args.n * args.B_p
    overrides = [
        "model=local", f"model.path={path}", f"n={args.n}", f"B_p={args.B_p}", f"grid.budgets=[{batch * args.steps}]",
        "grid.eval_points=1", "eval.problems=8", "eval.samples=4", f"task.max_new_tokens={args.max_new_tokens}",
        "learner.fsdp=true", "learner.bf16=true", "cluster.gpus_per_run=1", "checkpoint.every=0",
        f"flops.peak_tflops={args.peak_tflops}", "flops.utilization=0.4",
    ]
    subprocess.run([sys.executable, "-m", "isoflop_cli", "run", *overrides, "--out", str(run_dir)], check=True)
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    peak = args.peak_tflops * 1e12
    search_s, learning_s = last["time_search_s"], last["time_learning_s"]
    print(f"{torch.cuda.get_device_name()}: {last['step']} steps of {batch} rollouts, {args.max_new_tokens} new tokens each")
    print(f"  sampling  {last['tokens_generated'] / search_s:10.0f} tokens/s   {last['flops_search'] / search_s / 1e12:7.1f} TFLOP/s"
          f"   MFU {last['flops_search'] / search_s / peak:6.1%}")
    print(f"  learning  {last['tokens_generated'] / learning_s:10.0f} tokens/s   {last['flops_learning'] / learning_s / 1e12:7.1f} TFLOP/s"
          f"   MFU {last['flops_learning'] / learning_s / peak:6.1%}")
    print(f"  rho {last['rho']:.3f}; step time split: search {search_s:.1f}s, reward {last['time_reward_s']:.1f}s, learning {learning_s:.1f}s")


if __name__ == "__main__":
    main()
