"""The checks only a GPU can make, on a machine with one or more, as one table; sized for one H200
in 8-9 minutes (first H200 run: the ledger 72 s, one 4-step HF run 127 s).

Builds a Qwen2.5-0.5B-shaped checkpoint from its config (random weights, no download; a character
tokenizer padded with filler tokens to the model's vocabulary) and runs GRPO on it through
`isoflop run`, as a Ray job would: FSDP2 over the GPUs, bf16, activation checkpointing. Random
weights never say eos, so every completion runs to max_new_tokens: a steady decode load. Random
weights also earn no reward, so the runs train on the KL and entropy terms (kl_coef, entropy_coef
> 0): the weights still move every step, which is what the kill-and-resume check needs.

Each step is one row (what was measured, the target, pass or fail); a failing step says why in its
row and the others still run. The steps:

- ledger: the FLOP ledger against FlopCounterMode on the GPU's kernels (gpu_ledger_check.py).
- memory: each run's peak device memory (nvidia-smi, every 100 ms, less what was in use before it
  started) against `isoflop plan`'s `predicted.gpu_memory_gib` for the same config: within 15%.
- learner MFU and sampler tokens/s from the run's own synchronised timers (hf and vllm).
- weight sync: the run's `time_sync_s` per step (the learner's weights streamed into the engine).
- vLLM in the step against vLLM offline: the engine's generation tokens/s inside the run against the
  same engine alone on batches of the same size: target >= 70%.
- sleep/wake: the memory the engine gives back when it sleeps against what it held, target >= 90%,
  and a greedy generation after waking (weights, then KV cache) that equals the one before.
- long completions: the hf run again at 512 new tokens (n=16, B_p=8): the memory model where the
  KV cache and the learner's logit chunks weigh more.
- kill and resume: a run (vLLM where it imports, else hf) killed (SIGKILL) once its first checkpoint
  is whole and started again, against the same run uninterrupted twice: every compared figure
  within max(1%, 3 x the two uninterrupted runs' difference) (bf16 kernels are not bitwise
  deterministic across processes; a resume that lost or repeated a step differs by far more).
- tensor parallel 2, with two or more GPUs: the vLLM run again with two engines' worth of GPUs.

Where vLLM does not import, its rows say NOT RUN (no pass, no fail) and the rest still runs.

    python scripts/gpu_check.py --out /tmp/gpu-check [--peak-tflops 989] [--steps 4]
"""

from __future__ import annotations

import argparse
import itertools
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
IN_STEP_TARGET = 0.70
SLEEP_TARGET = 0.90
RESUME_TOLERANCE = 0.01
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
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIALS[0], eos_token=SPECIALS[1], unk_token=SPECIALS[2])
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN25_05B, max_position_embeddings=4096, rope_theta=1e6, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class DeviceMemory:
    """The peak memory in use on GPU 0 while the block runs, less what was in use before it (GiB),
    polled by nvidia-smi: the whole device as the prediction claims it (learner, engine, CUDA
    contexts of every rank's process), not only torch's caching allocator."""

    def __enter__(self) -> "DeviceMemory":
        self.before = self.used()
        self.peak = self.before
        self.proc = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "100"],
                                     stdout=subprocess.PIPE, text=True)
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
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return int(out.strip()) / 1024


class Check:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rows: list[Row] = []
        self.path = build(args.out)
        self.gpus = torch.cuda.device_count()
        self.total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30

    def step(self, name: str, fn) -> None:
        """One step's rows; an exception is that step's failure, named, and the next step runs."""
        start, before = time.time(), len(self.rows)
        try:
            self.rows += fn()
        except Exception as e:  # noqa: BLE001  (the table names the failing step; the traceback goes to stderr)
            traceback.print_exc()
            self.rows.append(Row(name, f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160], "", False))
        for r in self.rows[before:]:  # as they land: a check stopped by its time limit keeps what it measured
            print(f"[{name}] {r.step} | {r.measured} | {r.target} | {r.ok}", flush=True)
        print(f"[{name}] {time.time() - start:.0f} s", flush=True)

    def overrides(self, sampler: str, gpus: int, tp: int = 1, every: int = 2, n: int | None = None, B_p: int | None = None,
                  steps: int | None = None, max_new_tokens: int | None = None) -> list[str]:
        a = self.args
        n, B_p, steps, max_new_tokens = n or a.n, B_p or a.B_p, steps or a.steps, max_new_tokens or a.max_new_tokens
        out = ["model=local", f"model.path={self.path}", f"n={n}", f"B_p={B_p}", f"grid.budgets=[{n * B_p * steps}]",
               "grid.eval_points=1", "eval.problems=8", "eval.samples=4", f"task.max_new_tokens={max_new_tokens}",
               f"cluster.gpus_per_run={gpus}", f"cluster.gpu_memory_gib={self.total_gib:.1f}", f"checkpoint.every={every}",
               f"flops.peak_tflops={a.peak_tflops}", "flops.utilization=0.4", f"sampler={sampler}",
               "algo.kl_coef=0.01", "algo.entropy_coef=0.01"]
        if sampler == "vllm":
            out += ["sampler.sleep=true", f"sampler.tensor_parallel={tp}"]
        return out

    def isoflop(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "isoflop_cli", *args], check=check, capture_output=False, text=True)

    def predicted_gib(self, overrides: list[str]) -> float:
        out = subprocess.run([sys.executable, "-m", "isoflop_cli", "plan", "--json", *overrides], check=True, capture_output=True, text=True).stdout
        record = json.loads(out)["cells"][0]
        if not record["feasible"]:
            raise RuntimeError(f"plan calls the check's own cell infeasible: {record['reason']}")
        return record["predicted"]["gpu_memory_gib"]

    # The steps.

    def ledger(self) -> list[Row]:
        subprocess.run([sys.executable, str(HERE / "gpu_ledger_check.py")], check=True)
        return [Row("ledger vs FlopCounterMode", "see the table above", "ratio ~1", None)]

    def run(self, label: str, overrides: list[str], out: Path) -> tuple[list[Row], dict]:
        """One run: its memory against the plan's prediction, MFU and tokens/s from its timers."""
        predicted = self.predicted_gib(overrides)
        with DeviceMemory() as memory:
            self.isoflop("run", *overrides, "--run-dir", str(out))
        last = read_metrics(out)[-1]
        peak = self.args.peak_tflops * 1e12
        search_s, learning_s, steps = last["time_search_s"], last["time_learning_s"], last["step"]
        error = memory.gib / predicted - 1
        rows = [
            Row(f"{label}: peak memory / GPU", f"{memory.gib:.1f} GiB, predicted {predicted:.1f} ({error:+.0%})", f"within {MEMORY_TOLERANCE:.0%}",
                abs(error) <= MEMORY_TOLERANCE),
            Row(f"{label}: sampling", f"{last['tokens_generated'] / search_s:,.0f} tokens/s, MFU {last['flops_search'] / search_s / peak:.1%}", "", None),
            Row(f"{label}: learner MFU", f"{last['flops_learning'] / learning_s / peak:.1%} ({last['flops_learning'] / learning_s / 1e12:.0f} TFLOP/s)", "", None),
        ]
        if "time_sync_s" in last:
            rows.append(Row(f"{label}: weight sync", f"{last['time_sync_s'] / steps:.2f} s/step", "", None))
        return rows, last

    def hf(self) -> list[Row]:
        return self.run("hf", self.overrides("hf", 1), self.args.out / "run-hf")[0]

    def hf_long(self) -> list[Row]:
        overrides = self.overrides("hf", 1, n=16, B_p=8, steps=1, max_new_tokens=self.args.long_tokens)
        return self.run(f"hf {self.args.long_tokens} tokens", overrides, self.args.out / "run-hf-long")[0]

    def vllm(self, tp: int = 1) -> list[Row]:
        overrides = self.overrides("vllm", tp, tp)
        rows, last = self.run(f"vllm tp{tp}", overrides, self.args.out / f"run-vllm-tp{tp}")
        in_step = last["tokens_generated"] / last["time_search_s"]
        offline = offline_tokens_per_s(overrides, self.args.steps)
        share = in_step / offline
        rows.append(Row(f"vllm tp{tp}: in the step vs offline", f"{in_step:,.0f} vs {offline:,.0f} tokens/s = {share:.0%}", f">= {IN_STEP_TARGET:.0%}",
                        share >= IN_STEP_TARGET))
        return rows

    def sleep_wake(self) -> list[Row]:
        from vllm import LLM, SamplingParams

        before = DeviceMemory.used()
        llm = LLM(model=str(self.path), dtype=torch.bfloat16, enable_sleep_mode=True, gpu_memory_utilization=0.4, seed=0, max_model_len=1024)
        params = SamplingParams(temperature=0.0, max_tokens=16)
        first = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)[0].outputs[0].token_ids
        torch.cuda.empty_cache()
        awake = DeviceMemory.used()
        llm.sleep(level=1)  # weights offloaded to CPU memory and back: the output after waking must not change
        torch.cuda.empty_cache()
        asleep = DeviceMemory.used()
        llm.wake_up(tags=["weights"])
        llm.wake_up(tags=["kv_cache"])
        again = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], params, use_tqdm=False)[0].outputs[0].token_ids
        freed = (awake - asleep) / (awake - before)
        return [Row("sleep (level 1) frees", f"{awake - asleep:.1f} of {awake - before:.1f} GiB = {freed:.0%}", f">= {SLEEP_TARGET:.0%}", freed >= SLEEP_TARGET),
                Row("wake: greedy output as before", "equal" if list(first) == list(again) else f"{list(first)} vs {list(again)}", "equal",
                    list(first) == list(again))]

    def kill_and_resume(self, sampler: str) -> list[Row]:
        """The `sampler` run (checkpoint every 2 steps, `--resume-tokens` new tokens) twice
        uninterrupted and once killed when its first checkpoint is whole, then started again.

        The two uninterrupted runs give the floor: bf16 kernels with atomics (flash attention's
        backward) differ between processes, and sampling from near-flat distributions turns the
        smallest difference into other tokens (first H200 run: 34 of 131,072 tokens, kl 2.6% apart
        after a resume, with no replicate to say whether that was the floor). A resume passes when
        every compared figure is within max(1%, 3 x the replicates' own difference) of the first
        run; one that lost or repeated a step moves rollouts and FLOPs by a quarter at least."""
        overrides = self.overrides(sampler, 1, max_new_tokens=self.args.resume_tokens)
        base = self.args.out / f"resume-{sampler}"
        for replicate in ("a", "b"):
            self.isoflop("run", *overrides, "--run-dir", str(base / replicate))
        reference, replicate = read_metrics(base / "a"), read_metrics(base / "b")
        out = base / "killed"
        proc = subprocess.Popen([sys.executable, "-m", "isoflop_cli", "run", *overrides, "--run-dir", str(out)], start_new_session=True)
        whole = out / "checkpoint" / CHECKPOINT_FILES  # written last: the checkpoint after step 2 is complete
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not whole.is_file():
            time.sleep(0.1)
        if proc.poll() is not None:
            raise RuntimeError(f"the run ended (exit {proc.returncode}) before its first checkpoint: nothing to kill")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.isoflop("run", *overrides, "--run-dir", str(out))
        resumed = read_metrics(out)
        if [r["step"] for r in resumed] != [r["step"] for r in reference]:
            raise RuntimeError(f"eval steps {[r['step'] for r in resumed]} against {[r['step'] for r in reference]} uninterrupted")
        worst, name, allowed = 0.0, "every figure", RESUME_TOLERANCE
        for a, b, c in zip(resumed, reference, replicate):
            for k in COMPARED:
                limit = max(RESUME_TOLERANCE, 3 * relative(c.get(k), b.get(k)))
                if relative(a.get(k), b.get(k)) / limit > worst / allowed:
                    worst, name, allowed = relative(a.get(k), b.get(k)), k, limit
        floor = max(relative(c.get(k), b.get(k)) for b, c in zip(reference, replicate) for k in COMPARED)
        return [Row(f"{sampler}: killed after its checkpoint, resumed",
                    f"worst {name} {worst:.2g} against the uninterrupted run; two uninterrupted runs differ by up to {floor:.2g}",
                    "<= max(1%, 3 x replicates)", worst <= allowed)]

    def table(self) -> bool:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"isoflop GPU check: {torch.cuda.get_device_name()} x {self.gpus}, {self.total_gib:.0f} GiB each")
        for column in ("step", "measured", "target", ""):
            table.add_column(column)
        for r in self.rows:
            table.add_row(r.step, r.measured, r.target, {True: "[green]pass", False: "[red]FAIL", None: ""}[r.ok])
        Console(width=200).print(table)
        return all(r.ok is not False for r in self.rows)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def relative(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def offline_tokens_per_s(overrides: list[str], rounds: int) -> float:
    """The run's vLLM engine alone (same model, batch, sampling and engine knobs), in this process:
    tokens/s over `rounds` batches after a warm-up batch."""
    from isoflop_cli import config, tasks
    from isoflop_cli.recipe import checkpoint
    from isoflop_cli.recipe.rollouts import make_sampler

    cfg = config.load(None, overrides)
    tokenizer, model = checkpoint.load(cfg.model, cfg.task, meta=True)  # the engine reads the weights itself
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
    seconds = time.perf_counter() - start
    sampler.close()
    torch.cuda.empty_cache()
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak (H100/H200 SXM: 989)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--B-p", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--long-tokens", type=int, default=512, help="new tokens per completion in the long-completion memory run")
    parser.add_argument("--resume-tokens", type=int, default=128, help="new tokens per completion in the kill-and-resume runs")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args)
    check.step("ledger", check.ledger)
    check.step("hf", check.hf)
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        check.rows.append(Row("vllm: tp1, in-step vs offline, sleep/wake, tp2", f"NOT RUN: vLLM does not import here ({e})"[:160], "", None))
        check.step("kill and resume", lambda: check.kill_and_resume("hf"))
    else:
        check.step("vllm tp1", check.vllm)
        check.step("kill and resume", lambda: check.kill_and_resume("vllm"))
        check.step("sleep/wake", check.sleep_wake)
        if check.gpus >= 2:
            check.step("vllm tp2", lambda: check.vllm(2))
        else:
            check.rows.append(Row("vllm tp2", "skipped: one GPU", "", None))
    check.step("hf long", check.hf_long)
    sys.exit(0 if check.table() else 1)


if __name__ == "__main__":
    main()
