"""A learned process reward model (PRM): it scores every step of a solution, and costs model FLOPs.

The embedded PRM is a small Qwen2 token classifier built the way the tiny policy is: seeded,
trained locally, cached and saved in Hugging Face format, loaded like any checkpoint (a local PRM
of the same form can be given by `reward.path`). It reads prompt + completion + eos and predicts,
at the end of each step (each `,` and `;`) and of the answer (the eos), whether that step is
right. It learns from reference solutions whose steps and answers are corrupted at random, and
from malformed ones (cut short, or noise), whose end is wrong, so that no policy can please it
with an empty or broken completion. The reward is the mean predicted probability over those
positions.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForTokenClassification, AutoTokenizer

from isoflop_cli import flops
from isoflop_cli.recipe.checkpoint import cached, char_tokenizer, qwen2_config, scorer, supervised
from isoflop_cli.recipe.learner import pack
from isoflop_cli.tasks import Problem
from isoflop_cli.tasks.arith import ALPHABET, ArithTask

CORRUPT = 0.3  # the chance that a training step (or answer) is replaced by a wrong one
MALFORMED = 0.15  # the chance that a training completion is cut short or replaced by noise


class ProcessRewardModel:
    def __init__(self, path: Path, task: ArithTask, max_tokens: int = 0):
        self.task, self.max_tokens = task, max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "right"
        self.model = scorer(AutoModelForTokenClassification, path)
        self.shape = replace(flops.Shape.from_config(self.model.config), vocab=self.model.config.num_labels)
        self.last_flops = 0.0

    @torch.no_grad()
    def score(self, problems: list[Problem], completions: list[str]) -> list[float]:
        """Rewards, in forwards of at most `max_tokens` padded positions (`micro_batches`; 0: one);
        the FLOPs the scoring took (every position of each forward's padded rows) go to `last_flops`."""
        prompts = [p.prompt for p in problems]
        ids, attention = encode(self.tokenizer, prompts, [c.strip() for c in completions])
        ends = step_ends(self.tokenizer, ids, attention, prompts)
        probs, self.last_flops = torch.zeros(ids.shape), 0.0
        for rows, width in micro_batches(attention, self.max_tokens):
            part = {"input_ids": ids[rows, :width], "attention_mask": attention[rows, :width]}
            logits = self.model(**{k: v.to(self.model.device) for k, v in part.items()}).logits[..., 0]
            probs[rows, :width] = torch.sigmoid(logits.float()).cpu()
            self.last_flops += flops.reward_model(self.shape, rows.stop - rows.start, width)
        return ((probs * ends).sum(-1) / ends.sum(-1)).tolist()


def micro_batches(attention: torch.Tensor, budget: int) -> list[tuple[slice, int]]:
    """A right-padded batch's rows (`attention` [rows, width]) in the forwards that score them, in
    order: as many rows as `budget` positions hold at the batch's width, packed as the learner packs
    its plain rows (`learner.pack`; a row over the budget alone), each forward cut to the width its
    longest row needs. A scorer's forward holds what grows with its positions (activations, the
    attention mask), so a real reward model at B_p x n completions needs it; 0: one forward."""
    rows, width = attention.shape
    counts = pack(torch.zeros(rows, dtype=torch.long), torch.full((rows, 1), width), budget) if budget else [rows]
    starts = [0, *itertools.accumulate(counts)]
    return [(slice(a, b), int(attention[a:b].sum(-1).max())) for a, b in itertools.pairwise(starts)]


def encode(tokenizer, prompts: list[str], completions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded prompt + completion + eos, and its attention mask."""
    rows = [tokenizer.encode(p + c) + [tokenizer.eos_token_id] for p, c in zip(prompts, completions)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    return ids, (torch.arange(width) < torch.tensor([len(r) for r in rows])[:, None]).long()


def step_ends(tokenizer, ids: torch.Tensor, attention: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Where a step or the answer ends: the separators after the prompt, and the eos."""
    ends = torch.tensor([tokenizer.convert_tokens_to_ids(c) for c in ",;"] + [tokenizer.eos_token_id])
    after_prompt = torch.arange(ids.shape[1]) >= torch.tensor([len(tokenizer.encode(p)) for p in prompts])[:, None]
    return (torch.isin(ids, ends) & after_prompt & attention.bool()).float()


def load(reward_cfg: DictConfig, task: ArithTask) -> ProcessRewardModel:
    """The PRM `reward.path` names, or the embedded one for this task (built on first use)."""
    budget = reward_cfg.max_tokens_per_forward
    if reward_cfg.path:
        return ProcessRewardModel(Path(reward_cfg.path).expanduser(), task, budget)
    recipe = {
        "prm": OmegaConf.to_container(reward_cfg.build),
        "task": {"name": "arith", **asdict(task)},
        "vocab": ALPHABET,
        "corrupt": CORRUPT,
        "malformed": MALFORMED,
    }
    return ProcessRewardModel(cached("prm", recipe, lambda out: build(reward_cfg.build, task, out)), task, budget)


def build(b: DictConfig, task: ArithTask, out: Path) -> None:
    torch.manual_seed(b.seed)
    rng = random.Random(b.seed)
    tokenizer = char_tokenizer()
    tokenizer.padding_side = "right"
    model = AutoModelForTokenClassification.from_config(qwen2_config(b, tokenizer, num_labels=1))

    def batch_loss(problems: list[Problem]) -> torch.Tensor:
        completions, labels = zip(*(_corrupted(p, rng) for p in problems))
        prompts = [p.prompt for p in problems]
        ids, attention = encode(tokenizer, prompts, list(completions))
        ends = step_ends(tokenizer, ids, attention, prompts)
        target = torch.zeros_like(ends)
        for i, row in enumerate(labels):
            target[i, ends[i].nonzero().flatten()] = torch.tensor(row)
        logits = model(input_ids=ids, attention_mask=attention).logits[..., 0]
        return (
            torch.nn.functional.binary_cross_entropy_with_logits(logits, target, weight=ends, reduction="sum")
            / ends.sum()
        )

    supervised(model, b, task, batch_loss, "prm")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _corrupted(problem: Problem, rng: random.Random) -> tuple[str, list[float]]:
    """A training completion and, per step end (then the end of the answer), whether it is right:
    with chance MALFORMED the solution cut short or noise (steps complete in it keep their truth,
    the end is wrong); otherwise the solution with each step and the answer replaced, with chance
    CORRUPT, by a wrong one."""
    if rng.random() < MALFORMED:
        if rng.random() < 0.5:
            text = problem.solution[: rng.randrange(len(problem.solution))]
            return text, [1.0] * sum(c in ",;" for c in text) + [0.0]
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 12)))
        return text, [0.0] * (sum(c in ",;" for c in text) + 1)
    steps, labels = [], []
    for step in problem.steps:
        wrong = rng.random() < CORRUPT
        steps.append(_other(step, rng) if wrong else step)
        labels.append(0.0 if wrong else 1.0)
    wrong = rng.random() < CORRUPT
    answer = _other(problem.answer, rng) if wrong else problem.answer
    return ",".join(steps) + ";" + answer, [*labels, 0.0 if wrong else 1.0]


def _other(digits: str, rng: random.Random) -> str:
    """A string of digits of the same length that differs from `digits`."""
    while True:
        candidate = "".join(rng.choice("0123456789") for _ in digits)
        if candidate != digits:
            return candidate
