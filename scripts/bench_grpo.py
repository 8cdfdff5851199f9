"""Step throughput of our GRPO recipe against TRL's GRPOTrainer, on the embedded tiny model (CPU).

    ISOFLOP_CACHE=/tmp/isoflop-cache .venv/bin/python scripts/bench_grpo.py [--n 4 16 64] [--quick] [--no-trl]
    ISOFLOP_CACHE=/tmp/isoflop-cache .venv-vllm/bin/python scripts/bench_grpo.py --vllm [--quick]

TRL is a dev-only dependency: `pip install -e '.[bench]'` (in .venv-vllm: `pip install trl==1.16.0`,
which accepts its transformers). `--vllm` adds our recipe with `sampler=vllm` (vLLM's CPU build,
`make setup-vllm`): its step split gains `sync` (the weight push after each update), its engine
start-up is reported apart from the steady-state step (`start`: the run's set-up before its first
step, for every side), and `offline` is the same engine's own throughput on the same batch outside
the loop (`LLM.generate` through the sampler, nothing else), against which its in-step generation
is put as a share.

For each n, both sides do the same work per optimizer step: the same checkpoint, the same B_p
prompts (in the same order), n completions each of at most `task.max_new_tokens` tokens at
temperature 0.6 / top_p 1, the exact-answer reward, group-normalised advantages, a token-mean
clipped loss with no KL (beta = 0), one on-policy AdamW step per generation, no activation
checkpointing, fp32, the same thread count (`--threads`, default: the CPUs). Our recipe keeps its
other defaults (the sampler records its log-probs for the truncated IS weight; TRL's counterpart
is vLLM-only), which is work TRL does not do. Only steady-state steps count (those after
`--warmup`), and each configuration runs `--repeats` times, interleaved, keeping the fastest:
another process on a shared machine can only slow a run down, so the minimum is the closest to
the uncontended figure (the 1-minute load average is printed to show the contention).

Our step time excludes evaluation: it is the run's wall time less its `time_eval_s` (evaluation
is also turned down to one problem), so it includes the loop's bookkeeping; "other" is that
bookkeeping (the step less generate, score and learn). Our recipe runs with the shared prefill
on and off. TRL's split: `generate` is its `generate` call, `score` its reward call, `rest` the
step's remainder (tokenising, log-prob passes, loss, backward, optimizer).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))  # before torch is imported
os.environ.setdefault("ISOFLOP_CACHE", "/tmp/isoflop-cache")

import torch
from rich.console import Console
from rich.table import Table

from isoflop_cli import config, grid
from isoflop_cli.recipe import checkpoint
from isoflop_cli.recipe.trainer import Budget, train
from isoflop_cli.tasks import Problem
from isoflop_cli.tasks.arith import ArithTask


@dataclass
class Steps:
    """Seconds per steady-state step, split into parts, and the work those steps did."""

    step_s: float
    parts: dict[str, float]  # seconds per step of each part
    rollouts: int  # per step
    tokens: float  # completion tokens generated per step (eos included)
    load: list[float] = field(default_factory=list)  # 1-minute load average when each repeat started
    slowest_s: float = 0.0  # the slowest repeat's step: far above step_s, the machine was contended
    start_s: float = 0.0  # set-up before the first step: model load, and for vLLM its engine start

    @property
    def rollouts_per_s(self) -> float:
        return self.rollouts / self.step_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s


def ours(n: int, B_p: int, steps: int, warmup: int, shared_prefill: bool = True, sampler: str = "hf") -> Steps:
    """One run of our recipe (`isoflop run`'s path), evaluated after `warmup` steps and at the end.

    The metrics rows are cumulative, so the difference between those two rows is exactly the
    steady-state steps.
    """
    B = n * B_p
    cfg = config.load(
        None,
        [
            f"n={n}",
            f"B_p={B_p}",
            f"grid.budgets=[{warmup * B},{steps * B}]",
            "grid.eval_points=1",
            "eval.problems=1",
            "eval.samples=1",
            "eval.k=1",
            f"sampler.shared_prefill={str(shared_prefill).lower()}",
            "checkpoint.every=0",
            f"sampler={sampler}",
        ],
    )
    plan = grid.plan_run(cfg)
    assert plan.eval_steps == (0, warmup, steps), plan.eval_steps
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as run_dir:
        started = time.perf_counter()
        rows = train(cfg, Budget(plan.column, plan.limit, plan.eval_at, plan.M), plan.lr, run_dir)
        total_s = time.perf_counter() - started
    first, last = rows[1], rows[2]
    count = steps - warmup
    keys = (
        "wall_s",
        "time_eval_s",
        "time_search_s",
        "time_reward_s",
        "time_learning_s",
        "time_sync_s",
        "tokens_generated",
    )
    delta = {k: (last.get(k, 0.0) - first.get(k, 0.0)) / count for k in keys}
    step_s = delta["wall_s"] - delta["time_eval_s"]
    parts = {
        "generate": delta["time_search_s"],
        "score": delta["time_reward_s"],
        "learn": delta["time_learning_s"],
        "sync": delta["time_sync_s"],
    }
    parts["other"] = step_s - sum(parts.values())
    return Steps(step_s, parts, B, delta["tokens_generated"], [load], start_s=total_s - last["wall_s"])


def offline(n: int, B_p: int, rounds: int) -> Steps:
    """vLLM's own generation throughput on the same B_p x n batch of the run's prompts, through the
    sampler alone (one engine, `rounds` batches after one warm-up batch)."""
    from isoflop_cli.recipe.rollouts import make_sampler

    cfg = config.load(None, [f"n={n}", f"B_p={B_p}", "sampler=vllm"])
    tokenizer, model = checkpoint.load(cfg.model, cfg.task)
    task = ArithTask.from_config(cfg.task)
    sampler = make_sampler(cfg, model, tokenizer, task.max_prompt_tokens)
    prompts = [p.prompt for p in itertools.islice(task.stream("train", seed=cfg.seed), B_p * (rounds + 1))]
    batches = [prompts[i * B_p : (i + 1) * B_p] for i in range(rounds + 1)]
    args = (n, cfg.algo.temperature, cfg.algo.top_p, cfg.task.max_new_tokens)
    sampler.sample(batches[0], *args)
    start, tokens = time.perf_counter(), 0
    for batch in batches[1:]:
        tokens += sampler.sample(batch, *args).tokens_generated
    step_s = (time.perf_counter() - start) / rounds
    return Steps(step_s, {"generate": step_s}, B_p * n, tokens / rounds, [os.getloadavg()[0]])


def trl(n: int, B_p: int, steps: int, warmup: int) -> Steps:
    """The same work through TRL's GRPOTrainer: one generation of B_p x n completions per optimizer step."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = config.load(None, [f"n={n}", f"B_p={B_p}"])
    algo = cfg.algo
    task = ArithTask.from_config(cfg.task)
    problems = list(itertools.islice(task.stream("train", seed=cfg.seed), steps * B_p))  # our run's prompts, in order
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])
    tokenizer, model = checkpoint.load(cfg.model, cfg.task)

    def exact_answer(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
        return [float(task.verify(Problem(p, a), c)) for p, c, a in zip(prompts, completions, answer)]

    ends: list[float] = []
    parts: dict[str, list[float]] = {"generate": [], "score": []}
    tokens: list[int] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, *_, **__) -> None:
            ends.append(time.perf_counter())

    class Timed(GRPOTrainer):
        """GRPOTrainer with its generate and reward calls timed (each runs once per step here)."""

        def _generate_single_turn(self, *args, **kwargs):
            start = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            parts["generate"].append(time.perf_counter() - start)
            tokens.append(sum(map(len, completion_ids)))
            return completion_ids, logprobs

        def _calculate_rewards(self, *args, **kwargs):
            start = time.perf_counter()
            out = super()._calculate_rewards(*args, **kwargs)
            parts["score"].append(time.perf_counter() - start)
            return out

    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            push_to_hub=False,
            gradient_checkpointing=False,
            disable_tqdm=True,
            logging_steps=steps + 1,
            dataloader_num_workers=0,
            per_device_train_batch_size=B_p * n,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            num_generations=n,
            shuffle_dataset=False,
            max_steps=steps,
            seed=cfg.seed,
            max_completion_length=cfg.task.max_new_tokens,
            temperature=algo.temperature,
            top_p=algo.top_p,
            top_k=0,
            beta=0.0,
            loss_type="dapo",
            scale_rewards="group",
            epsilon=algo.clip_low,
            epsilon_high=algo.clip_high,
            learning_rate=grid.learning_rate(algo, B_p * n),
            lr_scheduler_type="constant_with_warmup",
            warmup_steps=algo.warmup_steps,
            optim="adamw_torch",
            weight_decay=algo.weight_decay,
            max_grad_norm=algo.max_grad_norm,
        )
        trainer = Timed(
            model=model,
            reward_funcs=exact_answer,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepEnds()],
        )
        trainer.remove_callback(PrinterCallback)
        load = os.getloadavg()[0]
        trainer.train()
    assert len(ends) == steps and len(parts["generate"]) == steps, (len(ends), len(parts["generate"]))
    count = steps - warmup
    step_s = (ends[-1] - ends[warmup - 1]) / count
    split = {k: sum(v[warmup:]) / count for k, v in parts.items()}
    split["rest"] = step_s - sum(split.values())
    return Steps(step_s, split, B_p * n, sum(tokens[warmup:]) / count, [load])


def fastest(runs: list[Steps]) -> Steps:
    """The fastest repeat, with every repeat's load average and the slowest step."""
    best = min(runs, key=lambda r: r.step_s)
    return Steps(
        best.step_s,
        best.parts,
        best.rollouts,
        best.tokens,
        [r.load[0] for r in runs],
        max(r.step_s for r in runs),
        min(r.start_s for r in runs),
    )


def table(results: dict[int, dict[str, Steps]], repeats: int, threads: int) -> Table:
    t = Table(title=f"GRPO seconds per step (steady state, fastest of {repeats}, {threads} threads each side)")
    for col in (
        "n",
        "B_p",
        "ours",
        "start",
        "step",
        "gen",
        "score",
        "learn",
        "sync",
        "other",
        "rollouts/s",
        "tokens/s",
        "TRL step",
        "gen",
        "score",
        "rest",
        "tokens/s",
        "TRL/ours",
        "spread",
        "load1",
    ):
        t.add_column(col, justify="left" if col == "ours" else "right")
    for n, by_side in results.items():
        theirs = by_side.get("trl")
        for side in ("shared prefill", "no shared prefill", "vllm"):
            if side not in by_side:
                continue
            r = by_side[side]
            row = [
                str(n),
                str(r.rollouts // n),
                side,
                f"{r.start_s:.1f}",
                f"{r.step_s:.3f}",
                *(f"{r.parts[k]:.3f}" for k in ("generate", "score", "learn", "sync", "other")),
                f"{r.rollouts_per_s:,.0f}",
                f"{r.tokens_per_s:,.0f}",
            ]
            if theirs:
                row += [
                    f"{theirs.step_s:.3f}",
                    *(f"{theirs.parts[k]:.3f}" for k in ("generate", "score", "rest")),
                    f"{theirs.tokens_per_s:,.0f}",
                    f"{theirs.step_s / r.step_s:.2f}x",
                ]
            else:
                row += ["-"] * 6
            loads = r.load + (theirs.load if theirs else [])
            spread = f"{r.slowest_s / r.step_s:.2f}" + (f" / {theirs.slowest_s / theirs.step_s:.2f}" if theirs else "")
            t.add_row(*row, spread, f"{min(loads):.1f}-{max(loads):.1f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[4, 16, 64], help="group sizes")
    ap.add_argument("--B_p", type=int, default=8, help="prompts per step")
    ap.add_argument("--steps", type=int, default=8, help="steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="leading steps left out of the timing")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration; the fastest counts")
    ap.add_argument("--threads", type=int, default=int(os.environ["OMP_NUM_THREADS"]), help="torch threads, both sides")
    ap.add_argument("--quick", action="store_true", help="n = 4 and 16, 6 steps, 2 repeats")
    ap.add_argument("--no-trl", action="store_true", help="our recipe only")
    ap.add_argument("--vllm", action="store_true", help="also sampler=vllm (run from .venv-vllm)")
    args = ap.parse_args()
    if args.vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            ap.error("--vllm needs vLLM: make setup-vllm, then run this with .venv-vllm/bin/python")
    if args.quick:
        args.n, args.steps, args.repeats = [4, 16], 6, 2
    if args.steps <= args.warmup:
        ap.error("--steps must exceed --warmup")
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # our recipe sets its threads from it
    console = Console(width=200)
    started = time.perf_counter()
    results: dict[int, dict[str, Steps]] = {}
    for n in args.n:
        runs: dict[str, list[Steps]] = {}
        for _ in range(args.repeats):  # interleaved, so that contention spreads over all sides
            runs.setdefault("shared prefill", []).append(
                ours(n, args.B_p, args.steps, args.warmup, shared_prefill=True)
            )
            runs.setdefault("no shared prefill", []).append(
                ours(n, args.B_p, args.steps, args.warmup, shared_prefill=False)
            )
            if args.vllm:
                runs.setdefault("vllm", []).append(ours(n, args.B_p, args.steps, args.warmup, sampler="vllm"))
            if not args.no_trl:
                runs.setdefault("trl", []).append(trl(n, args.B_p, args.steps, args.warmup))
        results[n] = {side: fastest(r) for side, r in runs.items()}
        if args.vllm:
            results[n]["offline"] = offline(n, args.B_p, args.steps - args.warmup)
        console.print(f"n={n} B_p={args.B_p}: done ({time.perf_counter() - started:.0f} s)")
    console.print(table(results, args.repeats, args.threads))
    console.print(
        f"steps {args.warmup + 1}..{args.steps} of each run timed; our step excludes evaluation (wall "
        "less time_eval_s); spread: the slowest repeat's step over the fastest's, ours / TRL's; "
        f"load1: the 1-minute load average at the start of each run on {os.cpu_count()} CPUs, this "
        f"benchmark's own {args.threads} threads included; {time.perf_counter() - started:.0f} s in all"
    )
    ratios = [r["trl"].step_s / r["shared prefill"].step_s for r in results.values() if "trl" in r]
    if ratios:
        console.print(
            f"TRL/ours (shared prefill), geometric mean over n: {statistics.geometric_mean(ratios):.2f}x (target >= 2x)"
        )
    for n, r in results.items():
        if "vllm" in r:
            v, hf, off = r["vllm"], r["shared prefill"], r["offline"]
            console.print(
                f"n={n}: sampler=vllm step / hf step {v.step_s / hf.step_s:.2f}x (generate "
                f"{v.parts['generate'] / hf.parts['generate']:.2f}x, sync {v.parts['sync']:.3f} s); vLLM in the "
                f"step at {off.step_s / v.parts['generate']:.0%} of its offline rollouts/s "
                f"({off.rollouts_per_s:,.0f}); engine start {v.start_s - hf.start_s:.1f} s more than hf's set-up"
            )


if __name__ == "__main__":
    main()
