"""The RL algorithms a run trains with: one spec per `algo.name`, read by the Trainer, the FLOP
ledger and `plan` (none of them compares names).

A spec says which advantage estimator and policy loss the algorithm uses (functions registered
under those names in `recipe/losses.py`), its default group-std normalisation and token weighting
(knobs a config may override: `algo.std_norm`, `algo.loss_agg`), and whether it trains a value
head. Adding an algorithm is one entry here and, if its loss is new, one registered function.
This module has no torch: the CLI and the grid read it too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Algorithm:
    advantage: str  # "group": one per completion from its group's rewards; "gae": per token, from a value head
    policy_loss: str  # "clipped" (PPO-style ratio), "cispo" (clipped stop-gradient weight times log-prob)
    std_norm: bool = True  # group advantages divided by the group's std (Dr. GRPO: only mean-centred)
    loss_agg: str = "token-mean"  # how per-token losses add up (LOSS_AGGS; Dr. GRPO: a constant normaliser)

    @property
    def min_n(self) -> int:
        """The fewest completions per prompt that carry a learning signal: a group-relative advantage
        is a completion's reward against its group's, always 0 in a group of one (whose learning
        FLOPs would be charged for nothing); a value head's advantage needs no group."""
        return 2 if self.advantage == "group" else 1

    @property
    def value_head(self) -> bool:
        """GAE needs a value estimate per token: a head on the policy, trained beside it."""
        return self.advantage == "gae"


ALGORITHMS = {
    "grpo": Algorithm(advantage="group", policy_loss="clipped"),
    "dr_grpo": Algorithm(advantage="group", policy_loss="clipped", std_norm=False, loss_agg="constant"),
    "cispo": Algorithm(advantage="group", policy_loss="cispo"),
    "ppo": Algorithm(advantage="gae", policy_loss="clipped"),
}

# token-mean: every completion token weighs the same; seq-mean-token-mean: every sequence weighs the
# same; constant: 1 / (rows * task.max_new_tokens), independent of the completions' lengths.
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "constant")


def spec(algo) -> Algorithm:
    """The algorithm a config's `algo` section runs: its name's spec with the knobs it sets."""
    knobs = {k: getattr(algo, k) for k in ("std_norm", "loss_agg") if getattr(algo, k, None) is not None}
    return replace(ALGORITHMS[algo.name], **knobs)


@dataclass(frozen=True)
class Passes:
    """The learner's passes over one rollout batch, as `flops.learning` counts them."""

    epochs: int  # forward and backward passes over the batch
    reference: bool  # a forward of the KL reference (algo.kl_coef > 0)
    old_policy: (
        bool  # a forward of the sampling-time policy: the batch is reused, or a value head needs its old estimates
    )
    value_head: bool


def passes(algo) -> Passes:
    epochs = int(max(1, algo.epochs))
    value_head = spec(algo).value_head
    return Passes(
        epochs=epochs,
        reference=algo.kl_coef > 0,
        old_policy=value_head or epochs * algo.minibatches > 1,
        value_head=value_head,
    )
