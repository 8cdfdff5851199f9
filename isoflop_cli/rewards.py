"""Reward systems: how a batch of completions is scored during training. Evaluation always checks
answers with the task's verifier, whatever the training reward.

A reward is one function registered here with what it asks of the task and whether a reward model
scores (`RewardSpec`); adding one is that function and a file in `conf/reward/`. A user's own function
needs neither: `reward=custom reward.fn=package.module:function`. The function returns the scorer
`(problems, completions) -> scores`, the shape TRL's reward functions and verl's
`custom_reward_function` have. Config checks, planning and the recipe read the same entry, so no
module compares reward names.

Rule-based (no model FLOPs; the ledger records their CPU time):
- sparse: 1 for a verified final answer, else 0.
- structured: `format_weight` for an answer the verifier could read, plus the rest for a correct one.
- dense: the task's partial credit (arith: the share of answer positions that are right).
- prm_proxy: rule-checked steps, the share right of every step and the final answer. It checks
  steps by rule; the second seed study's proxy PRM is a model: that is `prm` with a small scorer.
- custom: the function `reward.fn` names, called with the problems and completions; each call's
  scores are checked (one finite number per completion), and what it gets wrong fails the run for
  good with one line naming it (`checked`).
Model-based (the recipe loads the reward model, `reward.path` or one built from `reward.build`, and
passes it; its inference FLOPs are the reward's):
- prm: a learned process reward model's mean step score.

Nothing here imports torch: `config` checks rewards by this registry before any compute.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from omegaconf import DictConfig

from isoflop_cli.errors import ConfigError
from isoflop_cli.tasks import Problem, Task

Scores = Callable[[list[Problem], list[str]], list[float]]


@dataclass(frozen=True)
class RewardSpec:
    """One reward system. `scorer(task, reward_cfg)` builds the scorer of a rule-based reward;
    a model-based one's also takes the loaded reward model, `scorer(task, reward_cfg, model)`."""

    scorer: Callable[..., Scores]
    needs: Optional[str] = None  # the Task capability it reads (has_partial_credit, has_steps)
    model_based: bool = False  # a reward model scores: its FLOPs are the reward's, its checkpoint the run's


REWARDS: dict[str, RewardSpec] = {}


def register(name: str, needs: str | None = None, model_based: bool = False) -> Callable:
    """Add a reward under `name`; a second reward of the same name is a mistake, refused."""
    def add(scorer: Callable[..., Scores]) -> Callable[..., Scores]:
        if name in REWARDS:
            raise ValueError(f"reward '{name}' is registered twice")
        REWARDS[name] = RewardSpec(scorer, needs, model_based)
        return scorer
    return add


@register("sparse")
def sparse(task: Task, reward: DictConfig) -> Scores:
    return lambda problems, texts: [float(v.correct) for v in task.judge(problems, texts)]


@register("structured")
def structured(task: Task, reward: DictConfig) -> Scores:
    w = reward.format_weight
    return lambda problems, texts: [w * v.parsed + (1 - w) * v.correct for v in task.judge(problems, texts)]


@register("dense", needs="has_partial_credit")
def dense(task: Task, reward: DictConfig) -> Scores:
    return lambda problems, texts: [task.partial_credit(p, t) for p, t in zip(problems, texts)]


@register("prm_proxy", needs="has_steps")
def prm_proxy(task: Task, reward: DictConfig) -> Scores:
    return lambda problems, texts: [task.step_credit(p, t) for p, t in zip(problems, texts)]


@register("custom")
def custom(task: Task, reward: DictConfig) -> Scores:
    return checked(load_function(reward.fn), f"reward.fn '{reward.fn}'")


@register("prm", needs="has_steps", model_based=True)
def prm(task: Task, reward: DictConfig, model: Any) -> Scores:
    return model.score  # the mean predicted probability over the completion's steps


def checked(fn: Scores, name: str) -> Scores:
    """A user's scorer whose every call is checked: one finite number per completion. What it
    gets wrong (and what it raises) is a `ConfigError` naming it, one line: the run fails for good
    (exit 2, not retried: the same function fails again), where a NaN would otherwise surface
    steps later as the sampler's "probability tensor contains inf/nan", and a raise as a traceback
    retried once."""

    def score(problems: list[Problem], completions: list[str]) -> list[float]:
        try:
            returned = fn(problems, completions)
        except Exception as e:  # the user's code: whatever it raises
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            raise ConfigError(f"{name} raised {type(e).__name__}" + (f": {lines[-1]}" if lines else "")) from None
        if isinstance(returned, (str, bytes)) or not hasattr(returned, "__iter__"):
            raise ConfigError(f"{name} returned {type(returned).__name__} {str(returned)[:40]!r}: it must return a list of scores, one per completion")
        scores = list(returned)
        if len(scores) != len(completions):
            raise ConfigError(f"{name} returned {len(scores)} scores for {len(completions)} completions: it must return one per completion")
        values = []
        for i, value in enumerate(scores):
            number = _number(value)
            if number is None or not math.isfinite(number):
                shown = repr(value) if isinstance(value, (str, bytes)) else str(value)[:40]
                raise ConfigError(f"{name} returned {shown} for completion {i}: each score must be a finite number")
            values.append(number)
        return values

    return score


def _number(value: Any) -> float | None:
    """A score as a float (Python, numpy or 0-d torch numbers, bools as 0 and 1); None for what is
    not a number."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


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
