"""Reward systems: what a batch of completions earns during training, and the FLOPs that took.
Evaluation always checks exact answers, whatever the training reward.

Rule-based (no model FLOPs; the ledger records their CPU time):
- sparse: 1 for a verified final answer, else 0.
- structured: `format_weight` for a solution in the expected form, plus the rest for a correct one.
- dense: partial credit, the share of answer positions that are right.
- prm_proxy: rule-checked steps, the share right of every step and the final answer.
Model-based:
- prm: a learned process reward model's mean step score; its inference FLOPs are the reward's.
"""

from __future__ import annotations

from typing import Callable

from omegaconf import DictConfig

from isoflop_cli.tasks.arith import ArithTask, Problem

# problems, completions -> (rewards, FLOPs spent scoring them)
Reward = Callable[[list[Problem], list[str]], tuple[list[float], float]]


def make_reward(reward: DictConfig, task_cfg: DictConfig) -> tuple[Reward, bool]:
    """The reward function, and whether it is rule-based."""
    task = ArithTask.from_config(task_cfg)
    if reward.name == "prm":
        from isoflop_cli.recipe import prm

        return prm.load(reward, task_cfg), False
    rule = _rule(reward, task)
    return (lambda problems, texts: ([rule(p, t) for p, t in zip(problems, texts)], 0.0)), True


def _rule(reward: DictConfig, task: ArithTask) -> Callable[[Problem, str], float]:
    if reward.name == "sparse":
        return lambda problem, text: float(task.verify(problem, text))
    if reward.name == "structured":
        w = reward.format_weight
        return lambda problem, text: w * task.well_formed(text) + (1 - w) * task.verify(problem, text)
    if reward.name == "dense":
        return task.digit_credit
    if reward.name == "prm_proxy":
        return task.step_credit
    raise ValueError(f"unknown reward '{reward.name}'")
