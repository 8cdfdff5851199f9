"""GRPO at a real model's shape on one GPU: tokens/s of sampling and the learner's MFU.

Builds a Qwen2.5-0.5B-shaped checkpoint from its config (random weights, no download; a
character tokenizer padded with filler tokens to the model's vocabulary), saves it in Hugging Face
format, and runs a few GRPO steps on it through `isoflop run`: FSDP2 on one GPU, bf16, the HF
sampler or (`--sampler vllm`) a vLLM engine with sleep mode between generation and learning and
`--tensor-parallel` GPUs. Random weights never say eos, so every completion runs to
max_new_tokens: a steady decode load. The figures come from the run's own ledger and timers
(metrics.jsonl); with vLLM also the engine's own offline throughput on a batch of the same size
(the sampler alone, no learner), against which its in-step generation is a share (target >= 70%).

    python scripts/gpu_check.py --out /tmp/gpu-check [--peak-tflops 989] [--sampler vllm --tensor-parallel 2]
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
    parser.add_argument("--sampler", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="vllm: GPUs per engine")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA GPU")
    path = build(args.out)
    run_dir = args.out / f"run-{args.sampler}-tp{args.tensor_parallel}"
    batch = args.n * args.B_p
    gpus = args.tensor_parallel if args.sampler == "vllm" else 1
    overrides = [
        "model=local", f"model.path={path}", f"n={args.n}", f"B_p={args.B_p}", f"grid.budgets=[{batch * args.steps}]",
        "grid.eval_points=1", "eval.problems=8", "eval.samples=4", f"task.max_new_tokens={args.max_new_tokens}",
        "learner.fsdp=true", "learner.bf16=true", f"cluster.gpus_per_run={gpus}", "checkpoint.every=0",
        f"flops.peak_tflops={args.peak_tflops}", "flops.utilization=0.4", f"sampler={args.sampler}",
    ]
    if args.sampler == "vllm":
        overrides += ["sampler.sleep=true", f"sampler.tensor_parallel={args.tensor_parallel}"]
    subprocess.run([sys.executable, "-m", "isoflop_cli", "run", *overrides, "--out", str(run_dir)], check=True)
    last = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    peak = args.peak_tflops * 1e12
    search_s, learning_s = last["time_search_s"], last["time_learning_s"]
    print(f"{torch.cuda.get_device_name()}: sampler={args.sampler} (tensor parallel {gpus}), {last['step']} steps of {batch} rollouts, "
          f"{args.max_new_tokens} new tokens each")
    print(f"  sampling  {last['tokens_generated'] / search_s:10.0f} tokens/s   {last['flops_search'] / search_s / 1e12:7.1f} TFLOP/s"
          f"   MFU {last['flops_search'] / search_s / peak:6.1%}")
    print(f"  learning  {last['tokens_generated'] / learning_s:10.0f} tokens/s   {last['flops_learning'] / learning_s / 1e12:7.1f} TFLOP/s"
          f"   MFU {last['flops_learning'] / learning_s / peak:6.1%}")
    print(f"  rho {last['rho']:.3f}; step time split: search {search_s:.1f}s, reward {last['time_reward_s']:.1f}s, learning {learning_s:.1f}s, "
          f"sync {last.get('time_sync_s', 0.0):.1f}s")
    if args.sampler == "vllm":
        offline = offline_tokens_per_s(overrides, args.steps)
        print(f"  vLLM offline {offline:10.0f} tokens/s on the same batch size: in the step at {last['tokens_generated'] / search_s / offline:.0%} (target >= 70%)")


def offline_tokens_per_s(overrides: list[str], rounds: int) -> float:
    """The run's vLLM engine alone (same model, batch, sampling and engine knobs): tokens/s over
    `rounds` batches after a warm-up batch."""
    import itertools
    import time

    from isoflop_cli import config, tasks
    from isoflop_cli.recipe import checkpoint
    from isoflop_cli.recipe.sampler import make_sampler

    cfg = config.load(None, overrides)
    tokenizer, model = checkpoint.load(cfg.model, cfg.task)
    task = tasks.make(cfg.task)
    task.prepare(tokenizer)
    sampler = make_sampler(cfg, model, tokenizer, task.max_prompt_tokens)
    prompts = [p.prompt for p in itertools.islice(task.stream("train", seed=cfg.seed), cfg.B_p * (rounds + 1))]
    batches = [prompts[i * cfg.B_p:(i + 1) * cfg.B_p] for i in range(rounds + 1)]
    sample = (cfg.n, cfg.algo.temperature, cfg.algo.top_p, cfg.task.max_new_tokens)
    sampler.sample(batches[0], *sample)
    start, tokens = time.perf_counter(), 0
    for batch in batches[1:]:
        tokens += sampler.sample(batch, *sample).tokens_generated
    return tokens / (time.perf_counter() - start)


if __name__ == "__main__":
    main()
