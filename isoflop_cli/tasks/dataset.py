"""Problems from local files (`task=dataset`): parquet, JSONL, or a `datasets` directory saved with
`save_to_disk`. verl's parquet schema works as it is: `prompt` is a string or a list of chat
messages, the answer is `reward_model.ground_truth`; other layouts name their columns with
`task.prompt_key` / `task.answer_key` (dotted paths into nested columns).

Validation problems come from `task.val`, or, without it, from the train file: a stable hash of
each prompt puts `task.val_fraction` of them aside (the same split whatever the row order).

Every row is checked when the config is (before any compute): a missing key, an empty, null, NaN
or infinite answer or a prompt of the wrong type is one error naming the file and the row
(0-based, as pandas counts). Numeric answers are written as the number is (12, not the 12.0 a
float column of whole numbers gives), since verifiers compare text.
Prompts are made with the run's tokenizer (`prepare`): its chat template when it has one and
`task.chat_template=auto`, plain text otherwise, with the optional system prompt and instruction.
A prompt longer than `task.max_prompt_tokens` is dropped and counted (`dropped`), never cut.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from isoflop_cli import hub
from isoflop_cli.tasks import bounds
from isoflop_cli.tasks.base import Problem, Task, TaskError, Verdict, in_validation
from isoflop_cli.tasks.verifiers import VERIFIERS

Messages = tuple[tuple[str, str], ...]  # (role, content) pairs
CALIBRATED = "calibrated_response_tokens"  # the column `isoflop calibrate` adds to the sets it writes


@dataclass(frozen=True)
class Row:
    """One problem as read from a file, before it is made into a prompt."""

    index: int  # the row in its file
    prompt: str | Messages
    answer: str
    response_tokens: float | None = None  # the base model's mean response length, where calibrate measured it
    columns: dict[str, Any] = field(
        default_factory=dict, compare=False
    )  # every other column, for custom rewards (`Problem.columns`)

    def text(self) -> str:
        """The prompt's words, for hashing into a split and for plain-text prompts."""
        return self.prompt if isinstance(self.prompt, str) else "\n\n".join(content for _, content in self.prompt)

    def given_prompt(self) -> str | list[dict[str, str]]:
        """The prompt as the file gives it: the string, or the chat messages as {role, content} dicts."""
        return self.prompt if isinstance(self.prompt, str) else [{"role": r, "content": c} for r, c in self.prompt]


@dataclass
class DatasetTask(Task):
    CONFIG_KEYS = (
        "train",
        "val",
        "val_fraction",
        "prompt_key",
        "answer_key",
        "max_prompt_tokens",
        "chat_template",
        "system_prompt",
        "instruction",
        "verifier",
    )  # not download: the files enter a run's identity by content
    PROMPT_KNOBS = "a lower task.max_prompt_tokens"
    FILE_KEYS = ("train", "val")
    train: str
    val: str | None = None
    val_fraction: float = 0.2
    prompt_key: str = "prompt"
    answer_key: str = "reward_model.ground_truth"
    prompt_limit: int = 512
    chat_template: str = "auto"
    system_prompt: str | None = None
    instruction: str | None = None
    verifier: str = "math"
    download: bool = False  # task.download: a Hub data set not in the local cache is downloaded (hub.py)
    key: str | None = None  # the config key naming a held-out set's file (eval.sets.NAME); None: task.train / task.val
    dropped: dict[str, int] = field(default_factory=dict)  # per split: prompts over max_prompt_tokens (after `prepare`)

    @classmethod
    def from_config(cls, task) -> DatasetTask:
        if not task.train:
            raise TaskError("task=dataset needs task.train=PATH (a parquet, JSONL or save_to_disk directory)")
        if task.verifier not in VERIFIERS:
            raise TaskError(f"task.verifier '{task.verifier}' is not one of: {', '.join(VERIFIERS)}")
        if task.chat_template not in ("auto", "none"):
            raise TaskError(f"task.chat_template '{task.chat_template}' is not one of: auto, none")
        if not 0 < task.val_fraction < 1:
            raise TaskError(f"task.val_fraction must be in (0, 1), got {task.val_fraction}")
        if task.max_prompt_tokens < 1:
            raise TaskError(f"task.max_prompt_tokens must be >= 1, got {task.max_prompt_tokens}")
        return cls(
            train=task.train,
            val=task.val,
            val_fraction=task.val_fraction,
            prompt_key=task.prompt_key,
            answer_key=task.answer_key,
            prompt_limit=task.max_prompt_tokens,
            chat_template=task.chat_template,
            system_prompt=task.system_prompt,
            instruction=task.instruction,
            verifier=task.verifier,
            download=task.download,
        )

    def __post_init__(self) -> None:
        train = read_rows(
            self.train, self.key or "task.train", self.prompt_key, self.answer_key, self.download, self.prompt_limit
        )
        self.rows_of: dict[str, tuple[Row, ...]]  # each split's rows as read, before prompts are made
        if self.key:  # a held-out set: the whole file is validation
            self.rows_of = {"train": train, "val": train}
        elif self.val:
            self.rows_of = {
                "train": train,
                "val": read_rows(
                    self.val, "task.val", self.prompt_key, self.answer_key, self.download, self.prompt_limit
                ),
            }
            if _same_file(self.train, self.val):
                _warn_once(
                    f"task.val {self.val} is the training file task.train: the validation score is measured on "
                    "the problems the runs train on (leave task.val out to hold task.val_fraction of them aside)"
                )
        else:
            held = [in_validation(row.text(), self.val_fraction) for row in train]
            self.rows_of = {
                "train": tuple(r for r, h in zip(train, held) if not h),
                "val": tuple(r for r, h in zip(train, held) if h),
            }
        self._problems: dict[str, list[Problem]] | None = None
        self._verify = None

    @property
    def max_prompt_tokens(self) -> int:
        return self.prompt_limit

    @property
    def columns(self) -> tuple[str, ...]:
        """The files' columns besides the prompt's, in the order first seen: every problem carries
        each of them (None where its row lacks one, as `datasets` fills a JSONL row)."""
        return tuple(dict.fromkeys(name for rows in self.rows_of.values() for row in rows for name in row.columns))

    @property
    def response_tokens(self) -> float | None:
        """The base model's mean response length on the training problems, where every one of them
        was calibrated (a set `isoflop calibrate` wrote); None otherwise."""
        measured = [r.response_tokens for r in self.rows_of["train"]]
        return sum(measured) / len(measured) if measured and None not in measured else None

    def where(self, split: str) -> str:
        if self.key:
            return f"{self.key} {self.train}"
        if split == "val" and self.val:
            return f"task.val {self.val}"
        return f"task.train {self.train}" + (" (its validation share, task.val_fraction)" if split == "val" else "")

    def check(self, eval_problems: int) -> None:
        if not self.rows_of["train"]:
            raise TaskError(
                f"{self.where('train')} leaves no training problems "
                f"(task.val_fraction={self.val_fraction} holds them all out)"
            )
        if len(self.rows_of["val"]) < eval_problems:
            raise TaskError(
                f"eval.problems={eval_problems} exceeds the validation problems: {len(self.rows_of['val'])} in "
                f"{self.where('val')}; lower eval.problems{'' if self.val else ' or raise task.val_fraction'}"
            )

    def check_alphabet(self, alphabet: str, model: str) -> None:
        """Every character of every prompt and answer is one `model` can read (the embedded model's
        vocabulary is a few characters: anything else would be silently unknown)."""
        allowed = set(alphabet)
        extra = (self.system_prompt or "") + (self.instruction or "")
        if set(extra) - allowed:
            raise TaskError(
                f"{model} reads only the characters {alphabet!r}: "
                f"task.system_prompt/task.instruction has {sorted(set(extra) - allowed)[0]!r}"
            )
        for split, rows in self.rows_of.items():
            for row in rows:
                bad = set(row.text() + row.answer) - allowed
                if bad:
                    raise TaskError(
                        f"{self.where(split)} row {row.index}: {sorted(bad)[0]!r} is not a character "
                        f"{model} reads ({alphabet!r}); use a model of your own (model=local model.path=...)"
                    )

    def prepare(self, tokenizer) -> None:
        """Prompts as the sampler will see them, and their token counts; drops (and counts) the long ones."""
        use_template = self.chat_template == "auto" and getattr(tokenizer, "chat_template", None)
        self._problems, self.dropped = {}, {}
        for split, rows in self.rows_of.items():
            texts = [self._render(row, tokenizer if use_template else None) for row in rows]
            lengths = [len(ids) for ids in tokenizer(texts).input_ids] if texts else []
            names = self.columns
            keep = [
                Problem(
                    prompt=t,
                    answer=r.answer,
                    id=str(r.index),
                    columns={c: r.columns.get(c) for c in names},
                    given_prompt=r.given_prompt(),
                )
                for r, t, n in zip(rows, texts, lengths)
                if n <= self.max_prompt_tokens
            ]
            self.dropped[split] = len(rows) - len(keep)
            if not keep:
                raise TaskError(
                    f"every prompt of {self.where(split)} is longer than "
                    f"task.max_prompt_tokens={self.max_prompt_tokens} (the shortest has {min(lengths)} tokens)"
                    if lengths
                    else f"{self.where(split)} holds no problems"
                )
            self._problems[split] = keep

    def _render(self, row: Row, tokenizer) -> str:
        messages = (
            [{"role": "user", "content": row.prompt}]
            if isinstance(row.prompt, str)
            else [{"role": r, "content": c} for r, c in row.prompt]
        )
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if self.instruction:
            last = (
                max(i for i, m in enumerate(messages) if m["role"] != "system")
                if any(m["role"] != "system" for m in messages)
                else len(messages) - 1
            )
            messages[last] = {**messages[last], "content": messages[last]["content"] + "\n" + self.instruction}
        if tokenizer is not None:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages)

    def problems(self, split: str) -> list[Problem]:
        """The problems of a split as `prepare` made them (prompts over the limit left out)."""
        if self._problems is None:
            raise RuntimeError("DatasetTask.prepare(tokenizer) must run before problems are drawn")
        return self._problems[split]

    def stream(self, split: str, seed: int) -> Iterator[Problem]:
        """Seeded epochs over the split, each in a new shuffled order."""
        problems, rng = self.problems(split), random.Random(f"{split}-{seed}")
        while True:
            order = list(range(len(problems)))
            rng.shuffle(order)
            yield from (problems[i] for i in order)

    def validation_set(self, count: int, seed: int = 0) -> list[Problem]:
        problems = list(self.problems("val"))
        random.Random(f"val-{seed}").shuffle(problems)
        return problems[:count]

    def judge(self, problems: list[Problem], completions: list[str]) -> list[Verdict]:
        if self._verify is None:
            self._verify = VERIFIERS[self.verifier]()
        return self._verify([p.answer for p in problems], completions)

    def checking_cpu_s(self) -> float:
        return getattr(self._verify, "cpu_s", 0.0)

    def close(self) -> None:
        if hasattr(self._verify, "close"):
            self._verify.close()


def held_out(task_cfg, path: str, key: str) -> DatasetTask:
    """A held-out evaluation set (`eval.sets`, or task.train for calibration): the whole file is
    validation, its prompts made and its answers checked as the task config's dataset keys say
    (columns, template, verifier); `key` is the config key that names the file, which errors name."""
    return DatasetTask(
        train=path,
        key=key,
        prompt_key=task_cfg.prompt_key,
        answer_key=task_cfg.answer_key,
        prompt_limit=task_cfg.max_prompt_tokens,
        chat_template=task_cfg.chat_template,
        system_prompt=task_cfg.system_prompt,
        instruction=task_cfg.instruction,
        verifier=task_cfg.verifier,
        download=task_cfg.download,
    )


def read_rows(
    path: str, what: str, prompt_key: str, answer_key: str, download: bool = False, prompt_tokens: int | None = None
) -> tuple[Row, ...]:
    """The problems of one file (a Hub data set's, from the local Hugging Face cache: `hub`), each
    row checked; cached per file version (hub.file_version: config checks and grid expansion ask
    again and again).
    Rows beyond what a prompt of `prompt_tokens` can be are refused before they are read (`bounds`)."""
    p = hub.data_file(path, what, download)
    if not p.exists():
        raise TaskError(f"{what} {path} does not exist")
    if not (p.is_file() or p.is_dir()):  # a named pipe or a device: reading it could wait forever
        raise TaskError(f"{what} {path} is not a regular file (or a data set's directory)")
    # Absolute, links not followed: a Hub cache's file is a link to a blob whose name has no suffix.
    return _read_rows(
        str(p.absolute()),
        hub.file_version(p),
        what,
        prompt_key,
        answer_key,
        bounds.max_row_bytes(prompt_tokens),
    )


@functools.lru_cache(maxsize=16)
def _read_rows(
    path: str, _version: tuple[int, ...], what: str, prompt_key: str, answer_key: str, max_row: int
) -> tuple[Row, ...]:
    rows = records(Path(path), what, max_row)
    if not rows:
        raise TaskError(f"{what} {path} holds no rows")
    return _consistent(
        tuple(_row(i, record, f"{what} {path} row {i}", prompt_key, answer_key) for i, record in enumerate(rows)),
        f"{what} {path}",
    )


def _consistent(rows: tuple[Row, ...], where: str) -> tuple[Row, ...]:
    """Rows that agree with each other: one prompt given two answers is refused, naming its rows.
    Each row alone is well formed, but a verifier would mark one of the two right answers wrong, and
    calibrate would put the prompt in both its easy and its hard set."""
    first: dict[str | Messages, Row] = {}
    for row in rows:
        seen = first.setdefault(row.prompt, row)
        if seen.answer != row.answer:
            raise TaskError(
                f"{where} rows {seen.index} and {row.index}: the same prompt {row.text()[:60]!r} has two answers "
                f"({seen.answer!r}, {row.answer!r}); keep one of them"
            )
    return rows


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # a Hub id, or a file read_rows has named already
        return a == b


@functools.cache
def _warn_once(message: str) -> None:
    """A warning on stderr, once per process (the config is checked again for each grid cell)."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def records(path: Path, what: str, max_row: int | None = None) -> list[dict]:
    """The rows of a file as they are (every column), for reading problems and for writing subsets;
    a file or a row larger than a reader may hold is refused first (`bounds`; rows of at most
    `max_row` bytes, by default the room for a row's answer and columns alone)."""
    max_row = max_row or bounds.max_row_bytes(None)
    try:
        if path.is_dir():
            import datasets

            data = datasets.load_from_disk(str(path))
            if isinstance(data, datasets.DatasetDict):
                names = ["train"] if what == "task.train" else ["validation", "test"]
                split = next(iter(data)) if len(data) == 1 else next((s for s in names if s in data), None)
                if split is None:
                    raise TaskError(f"{what} {path} holds the splits {', '.join(data)}: give the split's own directory")
                data = data[split]
            bounds.check_table(data.data.table, f"{what} {path}", max_row)
            return data.to_list()
        if path.suffix == ".parquet":
            import pandas as pd

            bounds.check_parquet(path, f"{what} {path}", max_row)
            return pd.read_parquet(path).to_dict("records")
        if path.suffix in (".jsonl", ".json"):
            rows = []
            _check_not_a_json_array(path, what)
            with path.open("rb") as f:
                for line_no, line in bounds.jsonl_lines(f, f"{what} {path}", max_row):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise TaskError(f"{what} {path} line {line_no}: not JSON ({e.msg})") from None
            return rows
    except TaskError:
        raise
    except Exception as e:  # an unreadable file, whatever the library raises for it
        raise TaskError(f"{what} {path} cannot be read: {type(e).__name__}: {' '.join(str(e).split())[:300]}") from None
    raise TaskError(
        f"{what} {path}: give a .parquet file, a .jsonl file or a directory saved by datasets' save_to_disk"
    )


def _check_not_a_json_array(path: Path, what: str) -> None:
    """A .json file holding one array of rows (not JSON Lines) is said as that, not as a row that
    is not an object (its first line '[' alone, or the whole array on one line)."""
    with path.open() as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):
        raise TaskError(
            f"{what} {path} is a JSON array: give JSON Lines (one object per line, as .jsonl), a .parquet file "
            "or a save_to_disk directory"
        )


_MISSING = object()


def _get(record: Any, key: str) -> Any:
    """A dotted key: a column of that exact name, else a path into nested mappings."""
    if isinstance(record, dict) and key in record:
        return record[key]
    value = record
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _row(index: int, record: Any, where: str, prompt_key: str, answer_key: str) -> Row:
    if not isinstance(record, dict):
        raise TaskError(f"{where}: a row must be an object of columns, got {type(record).__name__}")
    prompt, answer = _get(record, prompt_key), _get(record, answer_key)
    if prompt is _MISSING or prompt is None:
        raise TaskError(f"{where}: no '{prompt_key}' (set task.prompt_key to the prompt's column)")
    if answer is _MISSING:
        raise TaskError(
            f"{where}: no '{answer_key}' (set task.answer_key to the answer's column, dotted for nested ones)"
        )
    measured = record.get(CALIBRATED)
    tokens = (
        float(measured)
        if isinstance(measured, (int, float)) and not isinstance(measured, bool) and measured > 0
        else None
    )
    prompt_column = prompt_key if prompt_key in record else prompt_key.split(".")[0]
    columns = {name: _plain(value) for name, value in record.items() if name != prompt_column}
    return Row(
        index=index,
        prompt=_prompt(prompt, where, prompt_key),
        answer=_answer(answer, where, answer_key),
        response_tokens=tokens,
        columns=columns,
    )


def _plain(value: Any) -> Any:
    """A column's value as `datasets` gives it to TRL and verl's parquet reader to its reward:
    Python lists, dicts and scalars (pandas gives numpy arrays and scalars)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _prompt(value: Any, where: str, key: str) -> str | Messages:
    if isinstance(value, str):
        if not value.strip():
            raise TaskError(f"{where}: '{key}' is empty")
        return value
    if hasattr(value, "tolist"):  # parquet lists arrive as numpy arrays
        value = value.tolist()
    if isinstance(value, list) and value:
        messages = []
        for m in value:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise TaskError(
                    f"{where}: '{key}' must be a string or a list of chat messages "
                    f"({{role, content}} strings), got an item {_short(m)}"
                )
            messages.append((m["role"], m["content"]))
        if all(role == "system" for role, _ in messages):
            raise TaskError(f"{where}: '{key}' holds only system messages")
        return tuple(messages)
    raise TaskError(f"{where}: '{key}' must be a string or a list of chat messages, got {_short(value)}")


def _answer(value: Any, where: str, key: str) -> str:
    """The reference answer as text a verifier compares: a whole number as one (a float column
    holds 12 as 12.0, which an exact check would never match); null, NaN and infinity refused
    (they would be the text 'nan' or 'inf', an answer no completion gives)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if value is None:
        raise TaskError(f"{where}: '{key}' is null (every row needs an answer)")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TaskError(f"{where}: '{key}' must be a string or a number, got {_short(value)}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TaskError(
                f"{where}: '{key}' is {value}: every row needs a finite "
                "answer (NaN is a numeric column's missing value)"
            )
        value = int(value) if value.is_integer() else value
    text = str(value).strip()
    if not text:
        raise TaskError(f"{where}: '{key}' is empty")
    return text


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
