"""Tasks: where problems come from and how answers are checked (see `base.Task`).

A task is one module with a `Task` subclass and one config file in `conf/task/`; this registry names
it for `task.name`. Modules are imported on first use (a dataset task pulls in pandas).
"""

from __future__ import annotations

import importlib

from isoflop_cli.tasks.base import Problem, Task, TaskError, Verdict

TASKS = {  # task.name -> "module:class"
    "arith": "isoflop_cli.tasks.arith:ArithTask",
    "dataset": "isoflop_cli.tasks.dataset:DatasetTask",
}


COMMON_KEYS = ("name", "max_new_tokens")  # task config keys every task reads


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise TaskError(f"task.name '{name}' is not one of: {', '.join(TASKS)}")
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make(task_cfg) -> Task:
    """The task a config describes (its `from_config` checks its own keys, raising TaskError)."""
    return task_class(task_cfg.name).from_config(task_cfg)


def config_keys(name: str) -> tuple[str, ...]:
    """The task config keys a task of this name reads: the others do not change what a run computes."""
    return COMMON_KEYS + task_class(name).CONFIG_KEYS


__all__ = ["TASKS", "Problem", "Task", "TaskError", "Verdict", "config_keys", "make", "task_class"]
