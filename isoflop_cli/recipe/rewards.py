"""A reward system as the run uses it: the registered scorer (`isoflop_cli.rewards`), with the
reward model loaded for a model-based one, and the FLOPs each call took."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from isoflop_cli.rewards import REWARDS, Scores
from isoflop_cli.tasks import Problem, Task


@dataclass
class Reward:
    """Scores with the FLOPs they took (0 for rules, whose CPU time the recipe measures instead)."""

    score: Scores
    rule_based: bool = True
    flops: Callable[[], float] = lambda: 0.0  # FLOPs of the last call (a reward model's forward passes)

    def __call__(self, problems: list[Problem], completions: list[str]) -> tuple[list[float], float]:
        scores = self.score(problems, completions)
        if len(scores) != len(completions):
            raise ValueError(f"the reward returned {len(scores)} scores for {len(completions)} completions")
        return [float(s) for s in scores], self.flops()


def make_reward(reward: DictConfig, task: Task) -> Reward:
    spec = REWARDS[reward.name]
    if not spec.model_based:
        return Reward(spec.scorer(task, reward))
    from isoflop_cli.recipe import prm  # torch and a checkpoint: only where a reward model scores

    model = prm.load(reward, task)
    return Reward(spec.scorer(task, reward, model), rule_based=False, flops=lambda: model.last_flops)
