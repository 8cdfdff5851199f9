"""Answer checking for tasks read from data files (`task.verifier`): a registry of verifiers, each
turning (reference answers, completions) into `Verdict`s (was an answer given, is it right).

- `math`: math-verify, as the open RL recipes use it: the last `\\boxed{}` or final expression of the
  completion, compared with the reference by LaTeX/sympy equivalence (`\\frac{1}{2}` = `0.5`,
  intervals, sets). Sympy can hang on hostile input, and math-verify's own timeout uses
  `signal.alarm`, which works only in a process's main thread. So checking runs in a child process
  of its own, where it is the main thread, with math-verify's timeout per expression; the parent
  also holds a hard deadline and replaces a child that overruns it (its answers count as wrong).
  This works the same from a Ray job, a worker thread or a test.
- `exact`: the answer (the last `\\boxed{}` content if any, else the whole completion), normalised
  (case, spaces, `$`, a trailing period), equal to the reference's.
- `choice`: a multiple-choice letter: from `\\boxed{X}`, "answer is (X)" or the last standalone capital.
"""

from __future__ import annotations

import multiprocessing
import re
import time
from collections.abc import Callable

from isoflop_cli.tasks.base import Verdict

MATH_TIMEOUT_S = 5  # math-verify's own timeout per parse or comparison (whole seconds: signal.alarm)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def normalise(text: str) -> str:
    text = " ".join(text.replace("$", " ").split()).lower()
    return text[:-1].rstrip() if text.endswith(".") else text


def exact(answers: list[str], completions: list[str]) -> list[Verdict]:
    out = []
    for answer, completion in zip(answers, completions):
        boxed = last_boxed(completion)
        given = normalise(boxed if boxed is not None else completion)
        out.append(Verdict(parsed=bool(given), correct=bool(given) and given == normalise(answer)))
    return out


_CHOICE = [re.compile(p) for p in (r"answer is:?\s*\(?([A-Z])\)?\b", r"\(([A-Z])\)", r"\b([A-Z])\b")]


def choice_letter(completion: str) -> str | None:
    boxed = last_boxed(completion)
    if boxed is not None and re.fullmatch(r"\s*\(?([A-Z])\)?\s*", boxed):
        return boxed.strip(" ()")
    for pattern in _CHOICE:
        found = pattern.findall(completion)
        if found:
            return found[-1]
    return None


def choice(answers: list[str], completions: list[str]) -> list[Verdict]:
    out = []
    for answer, completion in zip(answers, completions):
        letter = choice_letter(completion)
        out.append(
            Verdict(parsed=letter is not None, correct=letter is not None and letter == answer.strip(" ()").upper())
        )
    return out


class MathVerifier:
    """math-verify in a child process (see the module docstring). One per run; `close` ends it."""

    def __init__(self, timeout_s: int = MATH_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch's threads
        self._conn = None
        self._proc = None
        self.cpu_s = 0.0  # CPU seconds the child processes spent checking

    def __call__(self, answers: list[str], completions: list[str]) -> list[Verdict]:
        if not completions:
            return []
        # The whole batch in one message; each item has the child's own timeout (parse the answer,
        # parse the completion, compare), so the batch's hard deadline is their sum plus start-up.
        items = list(zip(answers, completions))
        deadline = 30 + 3 * self.timeout_s * len(items)
        verdicts = self._ask(items, deadline)
        if verdicts is not None:
            return verdicts
        # The child overran (stuck below Python, where the alarm cannot reach): item by item, so
        # only the item that hangs counts as wrong.
        return [(self._ask([item], 30 + 3 * self.timeout_s) or [Verdict(False, False)])[0] for item in items]

    def _ask(self, items: list[tuple[str, str]], deadline: float) -> list[Verdict] | None:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send(items)
        if self._conn.poll(deadline):
            verdicts, cpu_s = self._conn.recv()
            self.cpu_s += cpu_s
            return [Verdict(*v) for v in verdicts]
        self.close()
        return None

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_math_worker, args=(child, self.timeout_s), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._conn.close()
        self._proc = self._conn = None

    def __del__(self):
        self.close()


def _math_worker(conn, timeout_s: int) -> None:
    """The child: answer batches until the parent closes the pipe."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(
        logging.ERROR
    )  # a timeout or unparsable answer is a verdict, not a log line
    gold_cache: dict[str, list] = {}

    def gold(answer: str) -> list:
        if answer not in gold_cache:
            boxed = last_boxed(answer)
            gold_cache[answer] = parse(
                f"${boxed if boxed is not None else answer}$", parsing_timeout=timeout_s
            ) or parse(answer, parsing_timeout=timeout_s)
        return gold_cache[answer]

    while True:
        try:
            items = conn.recv()
        except EOFError:
            return
        out, started = [], time.process_time()
        for answer, completion in items:
            try:
                given = parse(completion, parsing_timeout=timeout_s)
                out.append((bool(given), bool(given) and bool(verify(gold(answer), given, timeout_seconds=timeout_s))))
            except Exception:  # math-verify raises on timeouts and odd input: no answer it can read
                out.append((False, False))
        conn.send((out, time.process_time() - started))


VERIFIERS: dict[str, Callable[[], Callable[[list[str], list[str]], list[Verdict]]]] = {
    "math": MathVerifier,
    "exact": lambda: exact,
    "choice": lambda: choice,
}
