"""Reward systems: what a completion earns during training (evaluation always checks exact answers).

All three are rule-based: they cost no model FLOPs, and the ledger records their CPU time.
- sparse: 1 for a verified final answer, else 0.
- structured: `format_weight` for an answer in the expected form, plus the rest for a correct one.
- dense: partial credit, the share of answer positions that are right.
"""

from __future__ import annotations

from typing import Callable

from omegaconf import DictConfig

from isoflop_cli.tasks.arith import ArithTask, Problem

Reward = Callable[[Problem, str], float]


def make_reward(reward: DictConfig, task: ArithTask) -> Reward:
    if reward.name == "sparse":
        return lambda problem, text: float(task.verify(problem, text))
    if reward.name == "structured":
        w = reward.format_weight
        return lambda problem, text: w * task.well_formed(text) + (1 - w) * task.verify(problem, text)
    if reward.name == "dense":
        return task.digit_credit
    raise ValueError(f"unknown reward '{reward.name}'")
