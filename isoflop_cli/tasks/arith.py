"""Synthetic integer arithmetic with exact answers: the embedded default task.

A prompt is `a+b=`; the answer is the result's digits, least significant first when
`reverse_answer` is on (a left-to-right model can then carry). Difficulty comes from the operand
digits and the number of operands. Train and validation splits partition the problem space by a
stable hash of the prompt, so they never overlap and do not depend on the draw order.

With `steps` on (additions only), a solution shows its work before the answer, one step per digit
column, least significant first: the column's digit and its carry, then `;` and the answer:
`57+68=` -> `51,21;521`. Steps can then be checked (or scored by a model) one by one.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from isoflop_cli.tasks.base import Problem, Task, TaskError, Verdict, in_validation

ALPHABET = "0123456789+-*=,;"
SPECIALS = ("<pad>", "<eos>", "<unk>")  # the embedded model's character vocabulary: SPECIALS + ALPHABET
# A split's stream gives up after this many draws in a row outside it (`check` refuses a split
# that rare up front: a draw must land in each split at least MIN_DRAW_SHARE of the time).
MAX_REJECTS = 1_000_000
MIN_DRAW_SHARE = 1e-4
ENUMERATE_UP_TO = 100_000  # problems of one operand size counted one by one to size the splits exactly


class EmptySplit(TaskError):
    """A split too small to draw from: the stream would never yield."""


@dataclass(frozen=True)
class Splits:
    """The problem space and its train/validation partition: distinct problems in each split (exact,
    or expected where an operand size has more than ENUMERATE_UP_TO problems) and the chance that
    one draw lands in each."""

    total: int
    train: float
    val: float
    p_train: float
    p_val: float
    exact: bool


# Bounds on a problem's size: the problem space is counted in floats (10^digits overflows past 308,
# and a count of 10^50,000,000 is never computed), and a prompt of more than 100 operands of 100
# digits (10,100 tokens) is beyond what any sweep of this task asks of a model.
MAX_DIGITS = 100
MAX_OPERANDS = 100


@dataclass(frozen=True)
class ArithTask(Task):
    CONFIG_KEYS = ("digits", "operands", "ops", "reverse_answer", "val_fraction", "steps")
    PROMPT_KNOBS = "fewer task.digits or task.operands"
    digits: tuple[int, ...] = (1, 2)
    operands: int = 2
    ops: tuple[str, ...] = ("+",)
    reverse_answer: bool = True
    val_fraction: float = 0.2
    steps: bool = False

    @classmethod
    def from_config(cls, task) -> ArithTask:
        if len(task.digits) == 0 or len(task.ops) == 0:
            raise TaskError("task.digits and task.ops must not be empty")
        if any(not isinstance(d, int) or not 1 <= d <= MAX_DIGITS for d in task.digits):
            raise TaskError(f"task.digits must be operand sizes in [1, {MAX_DIGITS}], got {list(task.digits)}")
        if not 2 <= task.operands <= MAX_OPERANDS:
            raise TaskError(f"task.operands must be in [2, {MAX_OPERANDS}], got {task.operands}")
        if set(task.ops) - {"+", "-", "*"}:
            raise TaskError(f"task.ops '{sorted(set(task.ops) - {'+', '-', '*'})[0]}' is not one of: +, -, *")
        if task.steps and (list(task.ops) != ["+"] or not task.reverse_answer):
            raise TaskError("task.steps needs task.ops=[+] and task.reverse_answer=true (column steps of an addition)")
        if not 0 < task.val_fraction < 1:
            raise TaskError(f"task.val_fraction must be in (0, 1), got {task.val_fraction}")
        return cls(
            digits=tuple(task.digits),
            operands=task.operands,
            ops=tuple(task.ops),
            reverse_answer=task.reverse_answer,
            val_fraction=task.val_fraction,
            steps=task.steps,
        )

    def problem(self, terms: list[int], ops: list[str]) -> Problem:
        expr = str(terms[0]) + "".join(op + str(t) for op, t in zip(ops, terms[1:]))
        answer = str(_value(terms, ops))
        if self.reverse_answer:
            sign, digits = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
            answer = sign + digits[::-1]
        return Problem(prompt=expr + "=", answer=answer, steps=_column_steps(terms) if self.steps else ())

    @property
    def max_prompt_tokens(self) -> int:
        """Characters (= tokens of the embedded model) of the longest prompt: operands, operators and '='."""
        return self.operands * max(self.digits) + self.operands

    @property
    def has_steps(self) -> bool:
        return self.steps

    has_partial_credit = True

    def check(self, eval_problems: int) -> None:
        """Both splits hold problems, often enough drawn, and validation holds eval.problems: a run
        draws from them until it has what it needs."""
        s = self.splits()
        show = lambda values: "[" + ",".join(map(str, values)) + "]"  # noqa: E731
        space = (
            f"{s.total:,} problems of task.digits={show(self.digits)}, "
            f"task.operands={self.operands}, task.ops={show(self.ops)}"
        )
        widen = "or widen the task (task.digits, task.operands, task.ops)"
        if s.train < 1:
            raise TaskError(
                f"task.val_fraction={self.val_fraction} leaves the training "
                f"split empty (all {space} are in validation): lower it {widen}"
            )
        if s.val < eval_problems:
            raise TaskError(
                f"eval.problems={eval_problems} exceeds the validation split: "
                f"{'' if s.exact else '~'}{s.val:,.0f} of the {space} (task.val_fraction={self.val_fraction}); "
                f"lower eval.problems, raise task.val_fraction {widen}"
            )
        for split, share in (("training", s.p_train), ("validation", s.p_val)):
            if share < MIN_DRAW_SHARE:
                raise TaskError(
                    f"task.val_fraction={self.val_fraction}: only {share:.2g} of draws "
                    f"land in the {split} split (~{1 / share:,.0f} draws a problem, at "
                    f"most {1 / MIN_DRAW_SHARE:,.0f} allowed): move it toward 0.5 {widen}"
                )

    def is_validation(self, problem: Problem) -> bool:
        return in_validation(problem.prompt, self.val_fraction)

    def splits(self) -> Splits:
        """How large the train and validation splits are (cached: config.check asks per axes combination)."""
        return _splits(self.digits, self.operands, self.ops, self.val_fraction)

    def draw(self, rng: random.Random) -> Problem:
        d = rng.choice(self.digits)
        lo = 0 if d == 1 else 10 ** (d - 1)
        terms = [rng.randint(lo, 10**d - 1) for _ in range(self.operands)]
        ops = [rng.choice(self.ops) for _ in range(self.operands - 1)]
        return self.problem(terms, ops)

    def stream(self, split: str, seed: int) -> Iterator[Problem]:
        """An endless seeded stream of problems of one split ('train' or 'val'). Raises EmptySplit
        after MAX_REJECTS draws in a row outside the split, rather than spin on an empty one."""
        rng = random.Random(f"{split}-{seed}")
        want_val = split == "val"
        rejects = 0
        while rejects < MAX_REJECTS:
            p = self.draw(rng)
            if self.is_validation(p) == want_val:
                rejects = 0
                yield p
            else:
                rejects += 1
        raise EmptySplit(
            f"the {split} split of the task (digits {list(self.digits)}, operands "
            f"{self.operands}, ops {list(self.ops)}, val_fraction {self.val_fraction}) "
            f"is empty or too rare: {MAX_REJECTS} draws in a row fell outside it"
        )

    def validation_set(self, count: int, seed: int = 0) -> list[Problem]:
        """`count` distinct validation problems (fewer if the split has fewer). A split counted
        exactly stops once it has all of them: asking 1,000 of one-digit addition's 20 drew 200,000
        of them first (6.7 s)."""
        splits = self.splits()
        want = (
            min(count, int(splits.val)) if splits.exact and splits.val else count
        )  # an empty split raises in the stream
        seen: dict[str, Problem] = {}
        stream = self.stream("val", seed)
        for _ in range(count * 200):
            if len(seen) >= want:
                break
            p = next(stream)
            seen.setdefault(p.prompt, p)
        return list(seen.values())

    def parse(self, completion: str) -> tuple[list[str], str]:
        """(steps, final answer) of a completion; without `steps` it is all answer."""
        text = completion.strip()
        if not self.steps:
            return [], text
        work, sep, final = text.rpartition(";")
        return (work.split(",") if work else []) if sep else [], final

    def verify(self, problem: Problem, completion: str) -> bool:
        return self.parse(completion)[1] == problem.answer

    def judge(self, problems: list[Problem], completions: list[str]) -> list[Verdict]:
        return [Verdict(self.well_formed(c), self.verify(p, c)) for p, c in zip(problems, completions)]

    def well_formed(self, completion: str) -> bool:
        """The form every solution takes, right or wrong: an integer, after its steps when shown."""
        pattern = r"(\d\d,)*\d\d;-?\d+" if self.steps else r"-?\d+"
        return re.fullmatch(pattern, completion.strip()) is not None

    def partial_credit(self, problem: Problem, completion: str) -> float:
        """Share of positions, over the longer of answer and given answer, where the two agree."""
        got, want = self.parse(completion)[1], problem.answer
        return sum(a == b for a, b in zip(got, want)) / max(len(got), len(want))

    def step_credit(self, problem: Problem, completion: str) -> float:
        """Rule-checked steps: the share right of every step and the final answer (extra steps count as wrong)."""
        steps, final = self.parse(completion)
        right = sum(a == b for a, b in zip(steps, problem.steps)) + (final == problem.answer)
        return right / (max(len(steps), len(problem.steps)) + 1)


@functools.lru_cache(maxsize=256)
def _splits(digits: tuple[int, ...], operands: int, ops: tuple[str, ...], val_fraction: float) -> Splits:
    """Split sizes and draw shares as `draw` samples: an operand size uniformly from `digits` (with
    repeats), each operand uniformly of that size, each operator uniformly from `ops` (with repeats).
    An operand size with at most ENUMERATE_UP_TO problems is counted exactly; a larger one holds
    val_fraction of them in expectation (the hash is uniform)."""
    kinds = sorted(set(ops))
    op_share = {op: ops.count(op) / len(ops) for op in kinds}
    total, val, p_val, exact = 0, 0.0, 0.0, True
    for d in sorted(set(digits)):
        lo, hi = (0 if d == 1 else 10 ** (d - 1)), 10**d
        terms, op_rows = (hi - lo) ** operands, len(kinds) ** (operands - 1)
        size, share = terms * op_rows, digits.count(d) / len(digits)
        total += size
        if size > ENUMERATE_UP_TO:
            exact = False
            val += size * val_fraction
            p_val += share * val_fraction
            continue
        numbers = [str(t) for t in range(lo, hi)]
        for row in itertools.product(kinds, repeat=operands - 1):
            in_val = sum(
                in_validation(first + "".join(op + t for op, t in zip(row, rest)) + "=", val_fraction)
                for first, *rest in itertools.product(numbers, repeat=operands)
            )
            val += in_val
            p_val += share * math.prod(op_share[op] for op in row) * in_val / terms
    return Splits(total=total, train=total - val, val=val, p_train=1.0 - p_val, p_val=p_val, exact=exact)


def _value(terms: list[int], ops: list[str]) -> int:
    """Integer value with the usual precedence (* before + and -)."""
    total, sign, product = 0, 1, terms[0]
    for op, term in zip(ops, terms[1:]):
        if op == "*":
            product *= term
        else:
            total, sign, product = total + sign * product, (1 if op == "+" else -1), term
    return total + sign * product


def _column_steps(terms: list[int]) -> tuple[str, ...]:
    """Per digit column, least significant first: the column's digit and the carry it passes on."""
    columns = max(len(str(t)) for t in terms)
    steps, carry = [], 0
    for i in range(columns):
        total = carry + sum(t // 10**i % 10 for t in terms)
        steps.append(f"{total % 10}{total // 10}")
        carry = total // 10
    return tuple(steps)
