"""Evaluation at a run's eval points: avg@k, best@k (unbiased pass@k) and worst@k from m >= k
samples per problem, the variance of avg@k from its per-problem binomials, the native reward,
held-out sets and judges.

Evaluation is paired across runs: each problem's m completions are drawn from a random stream of
its own, seeded by the problem alone (`stream_seeds`), so every run of a sweep (every cell, every
seed, every eval point) meets each problem with the same random numbers. Two runs then differ at
an eval point by what their policies do, not by which samples they happened to draw: the
difference between cells carries only the part of the evaluation noise their policies do not
share (common random numbers), and the base evaluation (step 0) is the same in every run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from math import comb

import torch

from isoflop_cli import flops
from isoflop_cli.recipe.distributed import device


def best_at_k(m: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement is correct) = 1 - C(m-c, k) / C(m, k)."""
    return 1.0 - comb(m - c, k) / comb(m, k)


def worst_at_k(m: int, c: int, k: int) -> float:
    """P(all k draws without replacement are correct) = C(c, k) / C(m, k)."""
    return comb(c, k) / comb(m, k)


def mean_variance(correct: list[int], m: int) -> float:
    """The variance of avg@k (the mean pass rate over P problems, m samples each) that sampling
    adds, the problems held fixed: sum_i p_i (1 - p_i) / m / P^2, with each p_i (1 - p_i) estimated
    without bias by c_i (m - c_i) / (m (m - 1)). With m = 1 a problem's p_i cannot be told from the
    mean's, and p (1 - p) / P of the mean p is used: an upper bound (sum p_i (1 - p_i) <= P p (1 - p))."""
    count = len(correct)
    if m == 1:
        p = sum(correct) / count
        return p * (1 - p) / count
    return sum(c * (m - c) for c in correct) / (m * m * (m - 1)) / count**2


def summarize(correct: list[int], m: int, k: int) -> dict[str, float]:
    """Mean over problems of avg, best@k and worst@k, given each problem's count of correct of m,
    and avg@k's sampling variance (`mean_variance`), which `fit` reads as the evaluation's noise."""
    count = len(correct)
    return {
        "val_avg@k": sum(correct) / (m * count),
        "val_avg@k_var": mean_variance(correct, m),
        "val_best@k": sum(best_at_k(m, c, k) for c in correct) / count,
        "val_worst@k": sum(worst_at_k(m, c, k) for c in correct) / count,
    }


def stream_seeds(problems, salt: str = "") -> list[int]:
    """One seed per problem, from its key (and `salt`: a held-out set's name) and nothing of the
    run: the seed of the problem's own sampling stream in every run and at every eval point. 62
    bits: vLLM gives the i-th of a request's n samples seed + i.

    Both samplers take them: the HF sampler as per-row uniforms (`sampler.streams`), vLLM as a
    seeded `SamplingParams` per prompt, its slower per-row path. One batch-level seed would be
    deterministic there too, but not paired: vLLM's batched sampler draws a row's noise by its place
    in the batch, which depends on the other prompts, the engine count and when other rows finish
    (`vllm_sampler`'s module docstring; tests/test_vllm.py shows it), so evaluation keeps a seed per
    problem on both."""
    return [
        int.from_bytes(hashlib.blake2b(f"{salt}\0{p.key}".encode(), digest_size=8).digest(), "big") >> 2
        for p in problems
    ]


@dataclass
class Evaluation:
    """One eval point: its metrics, the FLOPs it took (never training compute), and each validation
    problem's count of correct samples (problem id, correct, samples)."""

    metrics: dict[str, float]
    flops: float
    per_problem: list[tuple[str, int, int]]


class Judge:
    """A reward model given by path (`eval.judges`): a sequence classifier whose first logit scores
    prompt + completion, read as plain text with its own tokenizer, in forwards of at most
    `max_tokens` padded positions (`prm.micro_batches`; 0: one)."""

    def __init__(self, path: str, max_tokens: int = 0):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from isoflop_cli.recipe.checkpoint import scorer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = scorer(AutoModelForSequenceClassification, path)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.shape = replace(flops.Shape.from_config(self.model.config), vocab=self.model.config.num_labels)
        self.max_tokens = max_tokens

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> tuple[float, float]:
        """The mean score and the FLOPs it took (the head runs at every position of each forward's padded rows)."""
        from isoflop_cli.recipe.prm import micro_batches

        enc = self.tokenizer([p + c for p, c in zip(prompts, completions)], padding=True, return_tensors="pt")
        scores, spent = [], 0.0
        for rows, width in micro_batches(enc.attention_mask, self.max_tokens):
            part = {k: v[rows, :width].to(self.model.device) for k, v in enc.items()}
            scores.append(self.model(**part).logits[:, 0].float().cpu())
            spent += flops.reward_model(self.shape, rows.stop - rows.start, width)
        return torch.cat(scores).mean().item(), spent


class Evaluator:
    """What a run measures at each eval point, in one place: the validation set by the task's
    verifier (avg@k, best@k, worst@k), the same completions scored by the training reward
    (`val_native`), each held-out set of `eval.sets`, and each judge of `eval.judges`. Each problem
    is sampled from its own stream (`stream_seeds`: paired across runs), and the run's generators
    are forked around it, so evaluation never changes what training draws."""

    def __init__(
        self,
        task,
        problems,
        reward,
        sets: dict,
        judges: dict[str, Judge],
        shape,
        m: int,
        k: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ):
        self.task, self.problems, self.reward, self.sets, self.judges = task, problems, reward, sets, judges
        self.shape, self.m, self.k = shape, m, k
        self.sampling = (temperature, top_p, max_new_tokens)
        self.seeds = {"": stream_seeds(problems)} | {name: stream_seeds(p, name) for name, (_, p) in sets.items()}

    def __call__(self, sampler) -> Evaluation:
        m, k = self.m, self.k
        rollouts = self._sample(sampler, self.problems, self.seeds[""])
        spent = self._flops(rollouts)
        expanded = [p for p in self.problems for _ in range(m)]
        correct = _correct(self.task, expanded, rollouts.texts, m)
        metrics = summarize(correct, m, k)
        native, native_flops = self.reward(expanded, rollouts.texts)
        metrics["val_native"] = sum(native) / len(native)
        spent += native_flops
        for name, judge in self.judges.items():
            metrics[f"judge_{name}"], judge_flops = judge([p.prompt for p in expanded], rollouts.texts)
            spent += judge_flops
        for name, (task, problems) in self.sets.items():
            held = self._sample(sampler, problems, self.seeds[name])
            spent += self._flops(held)
            scores = summarize(_correct(task, [p for p in problems for _ in range(m)], held.texts, m), m, k)
            metrics[f"downstream_{name}_pass@1"] = scores["val_avg@k"]
            metrics[f"downstream_{name}_best@k"] = scores["val_best@k"]
        return Evaluation(metrics, spent, [(p.key, c, m) for p, c in zip(self.problems, correct)])

    def _sample(self, sampler, problems, seeds: list[int]):
        # The run's GPU generator is forked too: a sampler may draw from it (vLLM draws its request's seed).
        here = device()
        with torch.random.fork_rng(devices=[here] if here.type == "cuda" else []):
            return sampler.sample([p.prompt for p in problems], self.m, *self.sampling, seeds=seeds)

    def _flops(self, rollouts) -> float:
        return flops.generate(
            self.shape,
            len(rollouts.texts),
            rollouts.prompt_width,
            rollouts.generated_width,
            rollouts.prefill_rows,
            rollouts.decode_rows,
        )


def _correct(task, problems, texts: list[str], m: int) -> list[int]:
    """Per problem (each repeated m times in `problems`), how many of its m completions are right."""
    verdicts = task.judge(problems, texts)
    return [sum(v.correct for v in verdicts[i : i + m]) for i in range(0, len(verdicts), m)]
