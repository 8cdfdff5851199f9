"""Reward systems: how a batch of completions is scored during training. Evaluation always checks
answers with the task's verifier, whatever the training reward.

A reward is one function registered here with what it asks of the task and whether a reward model
scores (`RewardSpec`); adding one is that function and a file in `conf/reward/`. A user's own function
needs neither: `reward=custom reward.fn=package.module:function` (or `/path/to/file.py:function`, as
verl's `custom_reward_function.path` and `.name` name one), in the signature of the framework it was
written for (`STYLES`): verl's `compute_score(data_source, solution_str, ground_truth, extra_info)`
per completion, TRL's `f(prompts, completions, **columns)` per batch, or isoflop's own
`(problems, completions) -> scores`. `reward.style` names it, or `auto` tells it from the
parameters. Config checks, planning and the recipe read the same entry, so no module compares
reward names.

Rule-based (no model FLOPs; the ledger records their CPU time):
- sparse: 1 for a verified final answer, else 0.
- structured: `format_weight` for an answer the verifier could read, plus the rest for a correct one.
- dense: the task's partial credit (arith: the share of answer positions that are right).
- prm_proxy: rule-checked steps, the share right of every step and the final answer. It checks
  steps by rule; the second seed study's proxy PRM is a model: that is `prm` with a small scorer.
- custom: the function `reward.fn` names, called in its style with the completions and the problem
  file's other columns (`Problem.columns`); each call's scores are checked (one finite number per
  completion), and what it gets wrong fails the run for good with one line naming it (`checked`). A
  function that cannot be loaded or whose signature fits no style is refused before any compute.
Model-based (the recipe loads the reward model, `reward.path` or one built from `reward.build`, and
passes it; its inference FLOPs are the reward's):
- prm: a learned process reward model's mean step score.

Nothing here imports torch: `config` checks rewards by this registry before any compute.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from isoflop_cli.errors import ConfigError
from isoflop_cli.tasks import Problem, Task

Scores = Callable[[list[Problem], list[str]], list[float]]


@dataclass(frozen=True)
class RewardSpec:
    """One reward system. `scorer(task, reward_cfg)` builds the scorer of a rule-based reward;
    a model-based one's also takes the loaded reward model, `scorer(task, reward_cfg, model)`."""

    scorer: Callable[..., Scores]
    needs: str | None = None  # the Task capability it reads (has_partial_credit, has_steps)
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
    """The user's function in its style, every call checked. Raises ConfigError (one line) for a
    function that cannot be loaded or called in any style: config checks build it to find out."""
    name = f"reward.fn '{reward.fn}'"
    fn = load_function(reward.fn)
    style = style_of(fn, reward.get("style", "auto"), task.columns, name)
    return checked(STYLES[style].call(fn, task.columns), name)


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
            raise ConfigError(
                f"{name} returned {type(returned).__name__} {str(returned)[:40]!r}: "
                "it must return a list of scores, one per completion"
            )
        scores = list(returned)
        if len(scores) != len(completions):
            raise ConfigError(
                f"{name} returned {len(scores)} scores for {len(completions)} "
                "completions: it must return one per completion"
            )
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


FILE_SUFFIX = ".py"


def load_function(spec: str) -> Callable:
    """`package.module:function`, imported, or `/path/to/file.py:function` (verl's
    custom_reward_function.path and .name), loaded from the file; what is wrong is a ConfigError
    naming it (the module's own import error as its last line)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(f"reward.fn '{spec}' must be package.module:function or /path/to/file.py:function")
    try:
        module = _module_file(where, spec) if is_file(where) else importlib.import_module(where)
    except ConfigError:
        raise
    except Exception as e:  # the user's module: whatever its import raises
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise ConfigError(
            f"reward.fn '{spec}' cannot be loaded: {type(e).__name__}" + (f": {lines[-1]}" if lines else "")
        ) from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(f"reward.fn '{spec}': {'file' if is_file(where) else 'module'} {where} has no '{name}'")
    if not callable(fn):
        raise ConfigError(f"reward.fn '{spec}': '{name}' is a {type(fn).__name__}, not a function")
    return fn


def is_file(where: str) -> bool:
    """Whether reward.fn's part before the colon names a file (a path) rather than a module."""
    return where.endswith(FILE_SUFFIX) or "/" in where or where.startswith("~")


def _module_file(where: str, spec: str) -> Any:
    """A Python file loaded as a module of its own, named by its path's digest (two files with the
    same name stay two modules), registered so what it defines pickles."""
    path = Path(where).expanduser()
    if not path.is_file():
        raise ConfigError(f"reward.fn '{spec}': {path} does not exist")
    name = "isoflop_reward_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"reward.fn '{spec}': {path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# --- the users' signatures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Style:
    """A framework's reward signature: the arguments it offers a function (by keyword, where `names`
    lists them; isoflop's are two positional), whether a signature is its (`looks_like`, for
    `reward.style=auto`), and the scorer calling a function so (`call(fn, columns)`)."""

    shown: str  # the signature as docs and errors write it
    names: Callable[[tuple[str, ...]], tuple[str, ...]]  # columns -> the keywords offered; () for positional
    looks_like: Callable[[inspect.Signature], bool]
    call: Callable[[Callable, tuple[str, ...]], Scores]


def _verl(fn: Callable, columns: tuple[str, ...]) -> Scores:
    """verl's reward manager, per completion: the row's data_source, the completion's text, the
    ground truth, and extra_info: the row's `extra_info` mapping (verl's) over every other column.
    A dict returned is verl's {"score": ..., ...}: its score."""
    take = _taker(fn)

    def score(problems: list[Problem], completions: list[str]) -> list[Any]:
        out = []
        for p, text in zip(problems, completions):
            given = p.columns.get("extra_info")
            extra = {k: v for k, v in p.columns.items() if k not in ("data_source", "extra_info")}
            extra.update(given if isinstance(given, dict) else {})
            value = fn(
                **take(
                    {
                        "data_source": p.columns.get("data_source"),
                        "solution_str": text,
                        "ground_truth": p.answer,
                        "extra_info": extra,
                    }
                )
            )
            out.append(value["score"] if isinstance(value, dict) and "score" in value else value)
        return out

    return score


def _trl(fn: Callable, columns: tuple[str, ...]) -> Scores:
    """GRPOTrainer's call, per batch: the prompts as the file gives them, the completions (as
    assistant messages where the prompts are chat messages, as TRL gives them), and each other
    column as a keyword list; completion_ids and trainer_state are None (no trainer of TRL's)."""
    take = _taker(fn)

    def score(problems: list[Problem], completions: list[str]) -> list[Any]:
        prompts = [p.prompt if p.given_prompt is None else p.given_prompt for p in problems]
        chat = bool(prompts) and isinstance(prompts[0], list)
        given = [[{"role": "assistant", "content": c}] for c in completions] if chat else list(completions)
        offered = {
            "prompts": prompts,
            "completions": given,
            "completion_ids": None,
            "trainer_state": None,
            **{c: [p.columns.get(c) for p in problems] for c in columns},
        }
        return fn(**take(offered))

    return score


def _isoflop(fn: Callable, columns: tuple[str, ...]) -> Scores:
    return lambda problems, completions: fn(problems, completions)


def _params(sig: inspect.Signature) -> list[str]:
    return [p.name for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _has_kwargs(sig: inspect.Signature) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def _taker(fn: Callable) -> Callable[[dict], dict]:
    """The offered keywords a function takes: all of them where it has **kwargs, else those it names
    (a verl function without extra_info, a TRL one naming only the columns it reads)."""
    sig = inspect.signature(fn)
    if _has_kwargs(sig):
        return lambda offered: offered
    named = set(_params(sig))
    return lambda offered: {k: v for k, v in offered.items() if k in named}


STYLES: dict[str, Style] = {  # reward.style -> its convention; auto tries them in this order
    "verl": Style(
        "compute_score(data_source, solution_str, ground_truth, extra_info)",
        lambda columns: ("data_source", "solution_str", "ground_truth", "extra_info"),
        lambda sig: "solution_str" in sig.parameters,
        _verl,
    ),
    "trl": Style(
        "f(prompts, completions, **kwargs)",
        lambda columns: ("prompts", "completions", "completion_ids", "trainer_state", *columns),
        lambda sig: (
            "completions" in sig.parameters
            and ("prompts" in sig.parameters or _has_kwargs(sig) or _params(sig)[:1] == ["completions"])
        ),
        _trl,
    ),
    "isoflop": Style("f(problems, completions) -> scores", lambda columns: (), lambda sig: True, _isoflop),
}


def style_of(fn: Callable, style: str, columns: tuple[str, ...], name: str) -> str:
    """The style `fn` is called in: `style` where named (refused if the function cannot be called
    so), else the first whose parameter names the signature has and whose call it accepts."""
    if style != "auto" and style not in STYLES:
        raise ConfigError(f"reward.style '{style}' is not one of: auto, {', '.join(STYLES)}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: its signature cannot be read; wrap it in a Python function") from None
    if style != "auto":
        why = _refusal(sig, STYLES[style], columns)
        if why:
            raise ConfigError(f"{name} does not fit reward.style={style}, {STYLES[style].shown}: {why}")
        return style
    alike = [key for key, candidate in STYLES.items() if candidate.looks_like(sig)]
    fits = [key for key in alike if not _refusal(sig, STYLES[key], columns)]
    if fits:
        return fits[0]
    shown = "; ".join(f"{k}: {s.shown}" for k, s in STYLES.items())
    raise ConfigError(
        f"{name} {sig} fits no reward signature ({shown}); as {alike[0]}'s, {_refusal(sig, STYLES[alike[0]], columns)}"
    )


def _refusal(sig: inspect.Signature, style: Style, columns: tuple[str, ...]) -> str | None:
    """Why a function of this signature cannot be called in `style` (None: it can): a parameter it
    requires that the style does not offer, or, for isoflop's, not two positional parameters."""
    offered = style.names(columns)
    if not offered:
        try:
            sig.bind(None, None)
        except TypeError as e:
            return f"it cannot be called with two arguments ({e})"
        return None
    for p in sig.parameters.values():
        if p.kind == p.POSITIONAL_ONLY:
            return f"'{p.name}' is positional-only, and these arguments are passed by name"
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty and p.name not in offered:
            return (
                f"it requires '{p.name}', which is neither an argument of the style nor a column of the problems"
                f"{_columns_said(columns)}"
            )
    return None


def _columns_said(columns: tuple[str, ...]) -> str:
    return (
        f" (the problems' columns: {', '.join(columns)})" if columns else " (the problems have no columns of their own)"
    )
