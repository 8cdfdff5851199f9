"""Reward systems: what a batch of completions earns during training, and the FLOPs that took.
Evaluation always checks answers with the task's verifier, whatever the training reward.

A reward is a callable `(problems, completions) -> scores` (the shape TRL's reward functions and
verl's `custom_reward_function` have); `REWARDS` maps each name to a factory that builds it from
the task and the reward config. Adding one is one function here and one file in `conf/reward/`;
a user's own function needs neither: `reward=custom reward.fn=package.module:function`.

Rule-based (no model FLOPs; the ledger records their CPU time):
- sparse: 1 for a verified final answer, else 0.
- structured: `format_weight` for an answer the verifier could read, plus the rest for a correct one.
- dense: the task's partial credit (arith: the share of answer positions that are right).
- prm_proxy: rule-checked steps, the share right of every step and the final answer. It checks
  steps by rule; the second seed study's proxy PRM is a model: that is `prm` with a small scorer.
- custom: the function `reward.fn` names, called with the problems and completions.
Model-based:
- prm: a learned process reward model's mean step score; its inference FLOPs are the reward's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from omegaconf import DictConfig

from isoflop_cli.tasks import Problem, Task

Scores = Callable[[list[Problem], list[str]], list[float]]


@dataclass
class Reward:
    """A reward system as the recipe uses it: scores with the FLOPs they took (0 for rules, whose
    CPU time the recipe measures instead)."""

    score: Scores
    rule_based: bool = True
    flops: Callable[[], float] = lambda: 0.0  # FLOPs of the last call (a reward model's forward passes)

    def __call__(self, problems: list[Problem], completions: list[str]) -> tuple[list[float], float]:
        scores = self.score(problems, completions)
        if len(scores) != len(completions):
            raise ValueError(f"the reward returned {len(scores)} scores for {len(completions)} completions")
        return [float(s) for s in scores], self.flops()


def sparse(task: Task, reward: DictConfig) -> Reward:
    return Reward(lambda problems, texts: [float(v.correct) for v in task.judge(problems, texts)])


def structured(task: Task, reward: DictConfig) -> Reward:
    w = reward.format_weight
    return Reward(lambda problems, texts: [w * v.parsed + (1 - w) * v.correct for v in task.judge(problems, texts)])


def dense(task: Task, reward: DictConfig) -> Reward:
    return Reward(lambda problems, texts: [task.partial_credit(p, t) for p, t in zip(problems, texts)])


def prm_proxy(task: Task, reward: DictConfig) -> Reward:
    return Reward(lambda problems, texts: [task.step_credit(p, t) for p, t in zip(problems, texts)])


def custom(task: Task, reward: DictConfig) -> Reward:
    return Reward(load_function(reward.fn))


def prm(task: Task, reward: DictConfig) -> Reward:
    from isoflop_cli.recipe import prm as prm_model

    model = prm_model.load(reward, task)
    return Reward(model.score, rule_based=False, flops=lambda: model.last_flops)


REWARDS: dict[str, Callable[[Task, DictConfig], Reward]] = {
    "sparse": sparse, "structured": structured, "dense": dense, "prm_proxy": prm_proxy, "custom": custom, "prm": prm,
}
NEEDS = {"dense": "has_partial_credit", "prm_proxy": "has_steps", "prm": "has_steps"}  # what a reward asks of the task


def make_reward(reward: DictConfig, task: Task) -> Reward:
    return REWARDS[reward.name](task, reward)


def load_function(path: str) -> Scores:
    """`package.module:function`, imported; ImportError/AttributeError/TypeError name what is wrong."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"reward.fn '{path}' must be package.module:function")
    fn = getattr(importlib.import_module(module), name, None)
    if fn is None:
        raise AttributeError(f"reward.fn '{path}': module {module} has no '{name}'")
    if not callable(fn):
        raise TypeError(f"reward.fn '{path}' is not callable")
    return fn
