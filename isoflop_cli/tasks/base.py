"""What every task gives the rest of isoflop: problems, prompts, answer checking, sizes.

A task is one module with a `Task` subclass, registered in `tasks.TASKS`, and one config file in
`conf/task/`. The grid and `plan` read its sizes (`max_prompt_tokens`); the recipe draws training
problems from `stream`, evaluates on `validation_set`, and scores completions with `judge` (the
rewards build on it); a task that can give partial credit or check solution steps says so, and the
rewards that need them are refused for tasks that cannot.

Prompts depend on the tokenizer (a chat template, a token limit), so the recipe calls `prepare`
with the run's tokenizer before it draws any problem. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class TaskError(ValueError):
    """The task's configuration or data cannot work: one line, shown as a config error (exit 2)."""


@dataclass(frozen=True)
class Problem:
    prompt: str  # the text the sampler is given (after `prepare`: chat template, instruction ...)
    answer: str  # the reference answer the verifier compares with
    steps: tuple[str, ...] = ()  # reference solution steps, for tasks that check them
    id: str = ""  # a stable name for the problem (a data row's index); the prompt when empty
    # What a user's reward function is given beside the completion (`rewards.STYLES`), as a problem
    # file has it: every column of its row but the prompt's (the answer's included: TRL passes it by
    # its column name, verl's extra_info holds the rest), and the prompt before `prepare` made it
    # the sampler's text (a string, or chat messages as {role, content} dicts). Not compared.
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False)
    given_prompt: Any = field(default=None, compare=False)  # None: `prompt` is as given

    @property
    def solution(self) -> str:
        """The full reference completion (what a supervised warm start learns)."""
        return ",".join(self.steps) + ";" + self.answer if self.steps else self.answer

    @property
    def key(self) -> str:
        return self.id or self.prompt


@dataclass(frozen=True)
class Verdict:
    """One completion, checked: did it give an answer in the expected form, and is it right."""

    parsed: bool
    correct: bool


class Task(ABC):
    """A source of problems with a way to check answers. See the module docstring for who calls what."""

    CONFIG_KEYS: tuple[str, ...] = ()  # the task.* keys it reads besides name and max_new_tokens
    FILE_KEYS: tuple[str, ...] = ()  # those of them that name data files: their content is part of a run's identity
    has_steps: bool = False  # step_credit works (prm_proxy, prm)
    has_partial_credit: bool = False  # partial_credit works (dense)
    # per split, problems `prepare` left out (prompts over the token limit); read-only here, a task that
    # drops prompts sets its own
    dropped: Mapping[str, int] = MappingProxyType({})
    PROMPT_KNOBS: str = ""  # what shortens the longest prompt, for a message where it leaves no room to answer
    # the names of the `Problem.columns` its problems carry (a problem file's other columns)
    columns: tuple[str, ...] = ()

    def check(self, eval_problems: int) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Raise TaskError if a run could not draw what it needs (an empty split, too few validation
        problems for `eval.problems`). Called by config checks, before any compute."""

    def check_alphabet(self, alphabet: str, model: str) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Raise TaskError if a prompt or answer has a character outside `alphabet` (what `model`
        reads); tasks that write their own problems in it need not check."""

    @property
    def response_tokens(self) -> float | None:
        """The base model's measured mean response length on the training problems, where known
        (a set `isoflop calibrate` wrote): plan's first FLOP estimate before any run finishes."""
        return None

    def prepare(self, tokenizer) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Make the prompts for this tokenizer; called once by the recipe before drawing."""

    @property
    @abstractmethod
    def max_prompt_tokens(self) -> int:
        """An upper bound on a prompt's length in tokens: what plan's FLOP bound and the context check use."""

    @abstractmethod
    def stream(self, split: str, seed: int) -> Iterator[Problem]:
        """An endless seeded stream of problems of one split ('train' or 'val')."""

    @abstractmethod
    def validation_set(self, count: int, seed: int = 0) -> list[Problem]:
        """`count` distinct validation problems, the same for every run of a sweep."""

    @abstractmethod
    def judge(self, problems: list[Problem], completions: list[str]) -> list[Verdict]:
        """Each completion checked against its problem's answer."""

    # Only for tasks whose has_partial_credit / has_steps is true: config checks refuse the rewards
    # that call these (dense, prm_proxy, prm) for any other task, before a run starts.
    def partial_credit(self, problem: Problem, completion: str) -> float:
        raise NotImplementedError(f"{type(self).__name__} gives no partial credit")

    def step_credit(self, problem: Problem, completion: str) -> float:
        raise NotImplementedError(f"{type(self).__name__} has no solution steps")

    def checking_cpu_s(self) -> float:
        """CPU seconds spent checking answers outside this process so far (a verifier's worker)."""
        return 0.0

    def close(self) -> None:  # noqa: B027 - an optional hook: doing nothing is its default
        """Release what checking answers holds (a verifier's worker process)."""


def in_validation(key: str, val_fraction: float) -> bool:
    """Whether a problem is held out: a stable hash of its key, below val_fraction. The split then
    depends neither on the draw order nor on the file's row order."""
    h = int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "big")
    return h / 2**64 < val_fraction
