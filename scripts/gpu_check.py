"""The checks only a GPU can make, one at a time, each a process of its own under its own time cap
(`scripts/gpu_check.sh` runs them in order and prints the table), so that a short window on a
lent GPU still returns rows. Designed for one GPU of a bare machine (the image's torch, no vLLM)
in under 8 minutes, 15 in all with the machine's start; first H200 run: one 4-step HF run 127 s.

Builds a Qwen2.5-0.5B-shaped checkpoint from its config (random weights, no download; a character
tokenizer padded with filler tokens to the model's vocabulary) and runs GRPO on it through
`isoflop run`: FSDP2, bf16, activation checkpointing, as `conf/engine/h200.yaml` lays a run out
(its token budget per micro-batch; vLLM where it imports, else the HF sampler). Random weights
never say eos, so every completion runs to max_new_tokens, and earn no reward, so the runs train
on the KL and entropy terms: the weights still move every step, which kill-and-resume needs.

The checks, in the order of what they teach (each appends its rows to OUT/rows.jsonl as they land):

- memory: the run's peak device memory (nvidia-smi every 100 ms, less what was in use before it)
  against `isoflop plan`'s `predicted.gpu_memory_gib` for the same config: within 15%.
- resume: the run killed (SIGKILL) once its first checkpoint is whole and started again, against
  the same run uninterrupted twice: every compared figure within max(1%, 3 x the two uninterrupted
  runs' difference) (bf16 kernels are not bitwise deterministic across processes).
- mfu: learner MFU and sampling tokens/s from a run's own synchronised timers.
- ranks (two GPUs or more): two NCCL ranks whose shares pack into different numbers of
  micro-batches (prompts of 4 and 40 characters under a 24-position budget, the scenario
  tests/test_ranks.py runs on gloo), against one process: it finishes, its losses beside one's.
- vllm-logprobs (where vLLM imports): the learner's weights moved and pushed into the engine, then
  the engine's log-probs of its own samples against the learner's: mean |delta logp| and the
  mean truncated importance ratio (1 where they agree).

`--cpu-dry-run` runs each check's tiny variant on the CPU (the embedded model, a few seconds each):
the same code paths, figures that mean nothing, no memory measured.

    python scripts/gpu_check.py --out DIR --check memory [--cpu-dry-run]; ... --table
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
from gpu_ledger_check import QWEN25_05B
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from isoflop_cli.store import CHECKPOINT_FILES
from isoflop_cli.tasks.arith import ALPHABET, SPECIALS

HERE = Path(__file__).resolve().parent
MEMORY_TOLERANCE = 0.15
RESUME_TOLERANCE = 0.01
LOGPROB_TARGET = (
    0.05  # mean |delta logp| between engine and learner after a push: bf16 kernels differ by ~1e-2 (verl's TIS reports)
)
COMPARED = ("rollouts", "tokens_generated", "flops_total", "train_loss", "kl", "entropy", "train_reward_mean")


@dataclass
class Row:
    step: str
    measured: str
    target: str
    ok: bool | None  # None: a figure with no target


def build(out: Path) -> Path:
    path = out / "qwen2.5-0.5b-shaped"
    if (path / "config.json").is_file():
        return path
    vocab = {t: i for i, t in enumerate([*SPECIALS, *ALPHABET])}
    vocab.update({f"<x{i}>": i for i in range(len(vocab), QWEN25_05B["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIALS[2]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=SPECIALS[0], eos_token=SPECIALS[1], unk_token=SPECIALS[2]
    )
    torch.manual_seed(0)
    config = Qwen2Config(
        **QWEN25_05B, max_position_embeddings=4096, rope_theta=1e6, pad_token_id=0, eos_token_id=1, bos_token_id=1
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class DeviceMemory:
    """The peak memory in use on GPU 0 while the block runs, less what was in use before it (GiB),
    polled by nvidia-smi: the whole device as the prediction claims it (learner, engine, CUDA
    contexts of every rank's process), not only torch's caching allocator."""

    def __enter__(self) -> DeviceMemory:
        self.before = self.used()
        self.peak = self.before
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.peak = max(self.peak, int(line) / 1024)

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.reader.join(timeout=5)

    @property
    def gib(self) -> float:
        return self.peak - self.before

    @staticmethod
    def used() -> float:
        out = subprocess.run(
            ["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return int(out.strip()) / 1024


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args, self.cpu = args, args.cpu_dry_run
        self.path = None if self.cpu else build(args.out)
        self.gpus = 0 if self.cpu else torch.cuda.device_count()
        self.total_gib = 0.0 if self.cpu else torch.cuda.get_device_properties(0).total_memory / 2**30

    def overrides(
        self,
        gpus: int = 1,
        n: int | None = None,
        B_p: int | None = None,
        steps: int | None = None,
        max_new_tokens: int | None = None,
    ) -> list[str]:
        """A run at conf/engine/h200.yaml's settings on `gpus` GPUs (the CPU dry run: the embedded model, tiny)."""
        a = self.args
        n, B_p, steps, new = n or a.n, B_p or a.B_p, steps or a.steps, max_new_tokens or a.max_new_tokens
        if self.cpu:
            n, B_p, steps, new = min(n, 4), min(B_p, 4), min(steps, 3), min(new, 6)
        out = [
            f"n={n}",
            f"B_p={B_p}",
            f"grid.budgets=[{n * B_p * steps}]",
            "grid.eval_points=1",
            "eval.problems=4",
            "eval.samples=4",
            f"task.max_new_tokens={new}",
            "checkpoint.every=2",
            "algo.kl_coef=0.01",
            "algo.entropy_coef=0.01",
        ]
        if self.cpu:
            return out
        return [
            *out,
            "engine=h200",
            "model=local",
            f"model.path={self.path}",
            f"cluster.gpus_per_run={gpus}",
            f"cluster.gpu_memory_gib={self.total_gib:.1f}",
            f"flops.peak_tflops={a.peak_tflops}",
            "flops.utilization=0.4",
            f"sampler={'vllm' if vllm_imports() else 'hf'}",
        ]

    def isoflop(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "isoflop_cli", *args], check=True)

    def predicted_gib(self, overrides: list[str]) -> float | None:
        """`plan`'s predicted peak per GPU for the run (None on the CPU: no GPU memory to predict)."""
        out = subprocess.run(
            [sys.executable, "-m", "isoflop_cli", "plan", "--json", *overrides],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        record = json.loads(out)["cells"][0]
        if not record["feasible"]:
            raise RuntimeError(f"plan calls the check's own cell infeasible: {record['reason']}")
        return record["predicted"].get("gpu_memory_gib")

    # The checks.

    def memory(self) -> list[Row]:
        overrides = self.overrides()
        predicted = self.predicted_gib(overrides)
        out = self.args.out / "run-memory"
        if self.cpu:
            self.isoflop("run", *overrides, "--run-dir", str(out))
            return [
                Row(
                    "memory: peak / GPU",
                    f"dry run: the run finished ({len(read_metrics(out))} rows), nothing measured",
                    "",
                    None,
                )
            ]
        with DeviceMemory() as memory:
            self.isoflop("run", *overrides, "--run-dir", str(out))
        error = memory.gib / predicted - 1
        return [
            Row(
                f"memory at engine=h200 ({overrides[-1]}): peak / GPU",
                f"{memory.gib:.1f} GiB, predicted {predicted:.1f} ({error:+.0%})",
                f"within {MEMORY_TOLERANCE:.0%}",
                abs(error) <= MEMORY_TOLERANCE,
            )
        ]

    def resume(self) -> list[Row]:
        """The run (checkpoint every 2 steps, --resume-tokens new tokens) twice uninterrupted and once
        killed when its first checkpoint is whole, then started again. The two uninterrupted runs
        give the floor: bf16 kernels with atomics differ between processes, and sampling from
        near-flat distributions turns the smallest difference into other tokens (first H200 run: 34
        of 131,072 tokens, kl 2.6% apart after a resume). A resume that lost or repeated a step
        moves rollouts and FLOPs by a quarter at least."""
        overrides = self.overrides(max_new_tokens=self.args.resume_tokens, n=4, B_p=8)
        base = self.args.out / "resume"
        for replicate in ("a", "b"):
            self.isoflop("run", *overrides, "--run-dir", str(base / replicate))
        reference, replicate = read_metrics(base / "a"), read_metrics(base / "b")
        out = base / "killed"
        proc = subprocess.Popen(
            [sys.executable, "-m", "isoflop_cli", "run", *overrides, "--run-dir", str(out)], start_new_session=True
        )
        whole = out / "checkpoint" / CHECKPOINT_FILES  # written last: the checkpoint after step 2 is complete
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not whole.is_file():
            time.sleep(0.05)
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before its first checkpoint: nothing to kill")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.isoflop("run", *overrides, "--run-dir", str(out))
        resumed = read_metrics(out)
        if [r["step"] for r in resumed] != [r["step"] for r in reference]:
            raise RuntimeError(
                f"eval steps {[r['step'] for r in resumed]} against {[r['step'] for r in reference]} uninterrupted"
            )
        worst, name, allowed = 0.0, "every figure", RESUME_TOLERANCE
        for a, b, c in zip(resumed, reference, replicate):
            for k in COMPARED:
                limit = max(RESUME_TOLERANCE, 3 * relative(c.get(k), b.get(k)))
                if relative(a.get(k), b.get(k)) / limit > worst / allowed:
                    worst, name, allowed = relative(a.get(k), b.get(k)), k, limit
        floor = max(relative(c.get(k), b.get(k)) for b, c in zip(reference, replicate) for k in COMPARED)
        return [
            Row(
                "killed after its checkpoint, resumed",
                f"worst {name} {worst:.2g} against the uninterrupted run; "
                f"two uninterrupted runs differ by up to {floor:.2g}",
                "<= max(1%, 3 x replicates)",
                worst <= allowed,
            )
        ]

    def mfu(self) -> list[Row]:
        """Learner MFU and sampling throughput from the run's synchronised timers: the memory run's
        where it finished, else a run of its own."""
        out = self.args.out / "run-memory"
        if not (out / "metrics.jsonl").is_file() or read_metrics(out)[-1]["step"] == 0:
            out = self.args.out / "run-mfu"
            self.isoflop("run", *self.overrides(steps=2), "--run-dir", str(out))
        last = read_metrics(out)[-1]
        peak = self.args.peak_tflops * 1e12
        search_s, learning_s = last["time_search_s"], last["time_learning_s"]
        return [
            Row(
                "learner MFU",
                f"{last['flops_learning'] / learning_s / peak:.1%} "
                f"({last['flops_learning'] / learning_s / 1e12:.1f} TFLOP/s)",
                "",
                None,
            ),
            Row(
                "sampling",
                f"{last['tokens_generated'] / search_s:,.0f} tokens/s, "
                f"MFU {last['flops_search'] / search_s / peak:.1%}",
                "",
                None,
            ),
            *(
                [Row("weight sync", f"{last['time_sync_s'] / last['step']:.2f} s/step", "", None)]
                if "time_sync_s" in last
                else []
            ),
        ]

    def ranks(self) -> list[Row]:
        """Two ranks (NCCL; gloo in the dry run) whose shares pack into different numbers of
        micro-batches, against one process."""
        if not self.cpu and self.gpus < 2:
            return [Row("two NCCL ranks, uneven micro-batches", "skipped: one GPU", "", None)]
        problems = self.args.out / "sums.jsonl"
        write_sums(problems)
        common = [
            *self.overrides(gpus=2, n=4, B_p=4, steps=3, max_new_tokens=6),
            "task=dataset",
            f"task.train={problems}",
            "task.max_prompt_tokens=48",
            "learner.max_tokens_per_micro_batch=24",
            "learner.collective_timeout_s=60",
        ]
        rows = {}
        for world in (1, 2):
            out = self.args.out / f"ranks-{world}"
            started = time.time()
            gpus = [] if self.cpu else [f"cluster.gpus_per_run={world}"]
            self.isoflop("run", *common, *gpus, f"learner.world_size={world}", "--run-dir", str(out))
            rows[world] = (read_metrics(out)[-1], time.time() - started)
        (one, _), (two, seconds) = rows[1], rows[2]
        delta = abs(one["train_loss"] - two["train_loss"])
        return [
            Row(
                "two ranks, uneven micro-batches",
                f"finished in {seconds:.0f} s; train_loss {two['train_loss']:.4g} vs one process "
                f"{one['train_loss']:.4g} (|delta| {delta:.2g})",
                "finishes within the 60 s collective timeout",
                True,
            )
        ]

    def vllm_logprobs(self) -> list[Row]:
        """The learner's weights moved (one AdamW-sized nudge) and pushed into the engine, which
        then samples; the learner scores the same tokens. bf16 kernels differ, so the two never
        agree exactly; a push that missed a tensor, or a stale tied head, differs by far more."""
        if not vllm_imports():
            return [
                Row(
                    "vLLM: engine log-probs after a push vs the learner's",
                    "NOT RUN: vLLM does not import here",
                    "",
                    None,
                )
            ]
        from isoflop_cli import config, tasks
        from isoflop_cli.recipe import checkpoint, distributed
        from isoflop_cli.recipe.learner import Actor, Layout
        from isoflop_cli.recipe.rollouts import make_sampler, sampler_dtype

        overrides = self.overrides() if not self.cpu else [*self.overrides(), "sampler=vllm"]
        cfg = config.load(None, overrides)
        here = distributed.device()
        tokenizer, policy = checkpoint.load(cfg.model, cfg.task, sampler_dtype(cfg))
        policy.to(here)
        task = tasks.make(cfg.task)
        task.prepare(tokenizer)
        sampler = make_sampler(cfg, policy, tokenizer, task.max_prompt_tokens)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(torch.randn_like(p) * 1e-3 * p.abs().mean())
        sampler.load_weights(distributed.stream_weights(policy, trainable_only=False, dtype=sampler_dtype(cfg)))
        prompts = [p.prompt for p in task.validation_set(cfg.B_p)]
        rollouts = sampler.sample(prompts, cfg.n, cfg.algo.temperature, cfg.algo.top_p, cfg.task.max_new_tokens)
        with torch.no_grad():
            layout = Layout.plain(rollouts.sequences.to(here), rollouts.attention_mask.to(here), rollouts.prompt_width)
            learner = Actor(policy, logit_chunk=2048)(layout, cfg.algo.temperature).logp.float().cpu()
        mask = rollouts.completion_mask[:, 1:].bool()
        delta = (learner - rollouts.logprobs)[mask]
        sampler.close()
        mean = delta.abs().mean().item()
        tis = delta.exp().mean().item()
        return [
            Row(
                "vLLM after a push: mean |delta logp| (engine vs learner)",
                f"{mean:.3g} over {int(mask.sum()):,} tokens",
                f"<= {LOGPROB_TARGET}",
                mean <= LOGPROB_TARGET,
            ),
            Row("vLLM after a push: mean TIS ratio pi_learner / pi_engine", f"{tis:.4f}", "~1", None),
        ]


CHECKS = {
    "memory": Check.memory,
    "resume": Check.resume,
    "mfu": Check.mfu,
    "ranks": Check.ranks,
    "vllm-logprobs": Check.vllm_logprobs,
}


def vllm_imports() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def write_sums(path: Path) -> None:
    """Sums in the embedded model's characters, every other one ten times as long (tests/test_ranks.py's
    `_problems`): under a small token budget two ranks' shares pack into different numbers of micro-batches."""
    lines = []
    for i in range(80):
        terms = [i % 10, 7] if i % 2 else [i % 10, *range(1, 10), *range(1, 10)]
        lines.append(
            json.dumps(
                {"prompt": "+".join(map(str, terms)) + "=", "reward_model": {"ground_truth": str(sum(terms))[::-1]}}
            )
        )
    path.write_text("\n".join(lines) + "\n")


def run_check(args: argparse.Namespace) -> None:
    """One check; its rows (or its failure, named) appended to OUT/rows.jsonl as they land."""
    started = time.time()
    try:
        rows = CHECKS[args.check](Check(args))
    except Exception as e:
        traceback.print_exc()
        rows = [
            Row(args.check, f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160], "", False)
        ]
    append(args.out, rows)
    print(f"[{args.check}] {time.time() - started:.0f} s", flush=True)


def append(out: Path, rows: list[Row]) -> None:
    with open(out / "rows.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r.__dict__) + "\n")
            print(f"{r.step} | {r.measured} | {r.target} | {r.ok}", flush=True)


def table(out: Path, title: str) -> bool:
    from rich.console import Console
    from rich.table import Table

    rows = (
        [Row(**json.loads(line)) for line in (out / "rows.jsonl").read_text().splitlines()]
        if (out / "rows.jsonl").is_file()
        else []
    )
    grid = Table(title=title)
    for column in ("check", "measured", "target", ""):
        grid.add_column(column)
    for r in rows:
        grid.add_row(r.step, r.measured, r.target, {True: "[green]pass", False: "[red]FAIL", None: ""}[r.ok])
    Console(width=200).print(grid)
    return all(r.ok is not False for r in rows)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def relative(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check", choices=list(CHECKS), help="run this check")
    parser.add_argument(
        "--stopped", nargs=2, metavar=("CHECK", "SECONDS"), help="record that CHECK was stopped at its time cap"
    )
    parser.add_argument("--table", action="store_true", help="print the rows so far; exit 1 if any failed")
    parser.add_argument(
        "--cpu-dry-run", action="store_true", help="each check's tiny CPU variant: the code paths, no GPU figures"
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100/H200 SXM: 989)"
    )
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--B-p", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--resume-tokens", type=int, default=64, help="new tokens per completion in the kill-and-resume runs"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stopped:
        append(
            args.out,
            [
                Row(
                    args.stopped[0],
                    f"stopped at its {args.stopped[1]} s cap (rows above are what it measured)",
                    "",
                    False,
                )
            ],
        )
    elif args.table:
        device = "CPU dry run" if args.cpu_dry_run else f"{torch.cuda.get_device_name()} x {torch.cuda.device_count()}"
        sys.exit(0 if table(args.out, f"isoflop GPU check: {device}") else 1)
    else:
        if not args.cpu_dry_run and not torch.cuda.is_available():
            sys.exit("gpu_check needs a CUDA GPU (or --cpu-dry-run)")
        run_check(args)


if __name__ == "__main__":
    main()
