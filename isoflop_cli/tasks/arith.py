"""Synthetic integer arithmetic with exact answers: the embedded default task.

A prompt is `a+b=`; the answer is the result's digits, least significant first when
`reverse_answer` is on (a left-to-right model can then carry). Difficulty comes from the operand
digits and the number of operands. Train and validation splits partition the problem space by a
stable hash of the prompt, so they never overlap and do not depend on the draw order.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Iterator

ALPHABET = "0123456789+-*="
SPECIALS = ("<pad>", "<eos>", "<unk>")  # the embedded model's character vocabulary: SPECIALS + ALPHABET


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str  # the exact completion the verifier accepts


@dataclass(frozen=True)
class ArithTask:
    digits: tuple[int, ...] = (1, 2)
    operands: int = 2
    ops: tuple[str, ...] = ("+",)
    reverse_answer: bool = True
    val_fraction: float = 0.2

    @classmethod
    def from_config(cls, task) -> "ArithTask":
        return cls(
            digits=tuple(task.digits),
            operands=task.operands,
            ops=tuple(task.ops),
            reverse_answer=task.reverse_answer,
            val_fraction=task.val_fraction,
        )

    def problem(self, terms: list[int], ops: list[str]) -> Problem:
        expr = str(terms[0]) + "".join(op + str(t) for op, t in zip(ops, terms[1:]))
        answer = str(_value(terms, ops))
        if self.reverse_answer:
            sign, digits = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
            answer = sign + digits[::-1]
        return Problem(prompt=expr + "=", answer=answer)

    @property
    def max_prompt_len(self) -> int:
        """Characters (= tokens of the embedded model) of the longest prompt: operands, operators and '='."""
        return self.operands * max(self.digits) + self.operands

    def is_validation(self, problem: Problem) -> bool:
        h = int.from_bytes(hashlib.sha1(problem.prompt.encode()).digest()[:8], "big")
        return h / 2**64 < self.val_fraction

    def draw(self, rng: random.Random) -> Problem:
        d = rng.choice(self.digits)
        lo = 0 if d == 1 else 10 ** (d - 1)
        terms = [rng.randint(lo, 10**d - 1) for _ in range(self.operands)]
        ops = [rng.choice(self.ops) for _ in range(self.operands - 1)]
        return self.problem(terms, ops)

    def stream(self, split: str, seed: int) -> Iterator[Problem]:
        """An endless seeded stream of problems of one split ('train' or 'val')."""
        rng = random.Random(f"{split}-{seed}")
        want_val = split == "val"
        while True:
            p = self.draw(rng)
            if self.is_validation(p) == want_val:
                yield p

    def validation_set(self, count: int, seed: int = 0) -> list[Problem]:
        """`count` distinct validation problems (fewer if the split has fewer)."""
        seen: dict[str, Problem] = {}
        stream = self.stream("val", seed)
        for _ in range(count * 200):
            p = next(stream)
            seen.setdefault(p.prompt, p)
            if len(seen) == count:
                break
        return list(seen.values())

    @staticmethod
    def verify(problem: Problem, completion: str) -> bool:
        return completion.strip() == problem.answer

    @staticmethod
    def well_formed(completion: str) -> bool:
        """An integer and nothing else: the form every answer takes, right or wrong."""
        return re.fullmatch(r"-?\d+", completion.strip()) is not None

    @staticmethod
    def digit_credit(problem: Problem, completion: str) -> float:
        """Share of positions, over the longer of answer and completion, where the two agree."""
        got, want = completion.strip(), problem.answer
        return sum(a == b for a, b in zip(got, want)) / max(len(got), len(want))


def _value(terms: list[int], ops: list[str]) -> int:
    """Integer value with the usual precedence (* before + and -)."""
    total, sign, product = 0, 1, terms[0]
    for op, term in zip(ops, terms[1:]):
        if op == "*":
            product *= term
        else:
            total, sign, product = total + sign * product, (1 if op == "+" else -1), term
    return total + sign * product
