"""Validation metrics: avg@k, best@k (unbiased pass@k) and worst@k from m >= k samples per problem."""

from __future__ import annotations

from math import comb

import torch


def best_at_k(m: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement is correct) = 1 - C(m-c, k) / C(m, k)."""
    return 1.0 - comb(m - c, k) / comb(m, k)


def worst_at_k(m: int, c: int, k: int) -> float:
    """P(all k draws without replacement are correct) = C(c, k) / C(m, k)."""
    return comb(c, k) / comb(m, k)


def summarize(correct: list[int], m: int, k: int) -> dict[str, float]:
    """Mean over problems of avg, best@k and worst@k, given each problem's count of correct of m."""
    count = len(correct)
    return {
        "val_avg@k": sum(correct) / (m * count),
        "val_best@k": sum(best_at_k(m, c, k) for c in correct) / count,
        "val_worst@k": sum(worst_at_k(m, c, k) for c in correct) / count,
    }


def evaluate(sampler, task, problems, m: int, k: int, temperature: float, top_p: float, max_new_tokens: int, seed: int):
    """Sample m completions per validation problem with a private RNG stream (training's is untouched).

    Returns the metrics and the rollouts (whose shapes the ledger counts as evaluation compute).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rollouts = sampler.sample([p.prompt for p in problems], m, temperature, top_p, max_new_tokens)
    verdicts = task.judge([p for p in problems for _ in range(m)], rollouts.texts)
    correct = [sum(v.correct for v in verdicts[i * m : (i + 1) * m]) for i in range(len(problems))]
    return summarize(correct, m, k), rollouts
