"""What identifies a run: the hash of what it computes. A run id names a run's directory (same
content, same run: a rerun finds its finished work); a trajectory groups the runs that record the
same points up to a smaller budget (`continuation`), and is the fingerprint a run's records and
checkpoint carry (whether a saved state or a record is this run's). Both hashes are made here, and
each is pinned by tests: a change that moves one orphans every existing sweep's finished runs.

A run's data files (a task's `FILE_KEYS`, `eval.sets`) enter by their content, not their path: a file
changed in place is a new run (and a new calibration slice), never a resumed one on other data.
Configs without data files (the embedded arithmetic task) hash as they did before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from isoflop_cli import hub, tasks
from isoflop_cli.algorithms import ALGORITHMS, spec
from isoflop_cli.config.schema import cache_dir
from isoflop_cli.errors import ConfigError
from isoflop_cli.store import atomic_write, read_json

SWEEP_ONLY = (
    "grid",
    "cluster",
    "name",
    "calibrate",
    "tracking",
    "power",
)  # config parts that do not change what a run computes


def run_content(cfg: DictConfig) -> dict[str, Any]:
    """What a run computes, as plain data: its config without the sweep-level parts, so a run keeps
    its id and its checkpoints when only the sweep around it changes (its schedule, its cluster),
    and without keys that do not apply to it (so new options leave old run ids as they were)."""
    content = applicable(OmegaConf.to_container(cfg, resolve=True))
    for key in SWEEP_ONLY:
        content.pop(key, None)
    return content


def applicable(content: dict[str, Any]) -> dict[str, Any]:
    """A plain config without the keys that do not apply to its run (other tasks' keys, an unset
    custom reward or its signature told from its parameters, no held-out sets or judges, vLLM's
    engine knobs left at null, no stray digits in the warm start) or do not change what it computes
    (whether its last checkpoint is kept, whether a Hub checkpoint may be downloaded): options
    added later leave earlier run ids as they were. A new copy where it drops any; with `data`, the
    digests of the data files it reads, where it reads any (`data_files`)."""
    task = {k: v for k, v in content["task"].items() if k in tasks.config_keys(content["task"]["name"])}
    reward = {
        k: v for k, v in content["reward"].items() if not ((k == "fn" and v is None) or (k == "style" and v == "auto"))
    }
    reward.pop("max_tokens_per_forward", None)  # how a reward model splits its forwards, not what it scores
    evaluation = {k: v for k, v in content["eval"].items() if not (k in ("sets", "judges") and not v)}
    epochs = content["algo"]["epochs"]  # whole epochs hash as the integers they were before fractions
    algo = {**content["algo"], "epochs": int(epochs) if float(epochs).is_integer() else epochs}
    if (
        algo["name"] in ALGORITHMS
    ):  # the knobs as the run applies them; std_norm only where it departs from the algorithm's own
        effective = spec(SimpleNamespace(**algo))
        algo["loss_agg"] = effective.loss_agg
        algo.pop("std_norm", None)
        if effective.std_norm != ALGORITHMS[algo["name"]].std_norm:
            algo["std_norm"] = effective.std_norm
    sampler = {
        k: v for k, v in content["sampler"].items() if not (k in ("kv_cache_gib", "enforce_eager") and v is None)
    }
    build = {k: v for k, v in content["model"]["build"].items() if not (k == "stray" and v == 0)}
    model = {
        k: v for k, v in content["model"].items() if k != "download"
    }  # where the checkpoint came from, not what it is
    kept = {
        k: v for k, v in content["checkpoint"].items() if k != "keep_final"
    }  # what a run leaves, not what it computes
    # How the learner splits its work in memory and time, not what it computes: a token-budget
    # micro-batch only when set, the logit chunk and the collective timeout never.
    learner = {
        k: v
        for k, v in content["learner"].items()
        if k not in ("logit_chunk_tokens", "collective_timeout_s")
        and not (k == "max_tokens_per_micro_batch" and v == 0)
    }
    data = data_files(task, evaluation)
    return {
        **content,
        "task": task,
        "reward": reward,
        "eval": evaluation,
        "algo": algo,
        "sampler": sampler,
        "model": {**model, "build": build},
        "checkpoint": kept,
        "learner": learner,
        **({"data": data} if data else {}),
    }


def data_files(task: dict[str, Any], evaluation: dict[str, Any]) -> dict[str, str]:
    """The digest of each data file a run reads, by the key that names it (task.train, eval.sets.X)."""
    paths = {f"task.{key}": task[key] for key in tasks.task_class(task["name"]).FILE_KEYS if task.get(key)}
    paths.update({f"eval.sets.{name}": path for name, path in (evaluation.get("sets") or {}).items()})
    return {key: data_digest(path, key) for key, path in paths.items()}


DIGESTS = "data-digests.json"  # in ISOFLOP_CACHE: path -> version (hub.file_version) and digest of each data file
DIGESTS_KEPT = 1000


def data_digest(path: str, key: str = "data file") -> str:
    """sha1 of a data file's bytes; of a directory (a `save_to_disk` data set), of its files' names
    and digests. Each file is read once per version (hub.file_version: size, mtime, ctime, inode,
    device), as the cache keeps it: a file changed in place with its size and mtime put back is
    still read again."""
    root = hub.data_file(path, key)  # a Hub data set: its cached file, by content like any other
    try:
        if root.exists() and not (root.is_file() or root.is_dir()):  # a named pipe: reading it could wait forever
            raise ConfigError(f"{key} {path} is not a regular file (or a data set's directory)")
        if not root.is_dir():
            return _file_digest(root)
        files = sorted(f for f in root.rglob("*") if f.is_file())
        return hashlib.sha1("".join(f"{f.relative_to(root)} {_file_digest(f)}\n" for f in files).encode()).hexdigest()
    except OSError as e:
        raise ConfigError(f"{key} {path} cannot be read: {e.strerror}") from None


def _file_digest(path: Path) -> str:
    return _digest_of(str(path.resolve()), hub.file_version(path))


@functools.lru_cache(maxsize=256)
def _digest_of(path: str, version: tuple[int, ...]) -> str:
    cache = cache_dir() / DIGESTS
    entries = read_json(cache, default={})
    entries = entries if isinstance(entries, dict) else {}
    entry = entries.get(path)
    if isinstance(entry, dict) and entry.get("version") == list(version) and isinstance(entry.get("sha1"), str):
        return entry["sha1"]
    sha = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    entries.pop(path, None)
    entries[path] = {"version": list(version), "sha1": sha.hexdigest()}
    with contextlib.suppress(OSError):  # a cache that cannot be written (a read-only home): a re-read, nothing else
        atomic_write(cache, json.dumps(dict(list(entries.items())[-DIGESTS_KEPT:])), durable=False)
    return sha.hexdigest()


def _digest(content: dict[str, Any]) -> str:
    """The hash a run id carries: of `content` serialised by json.dumps with sorted keys (the bytes
    `RunIds` puts together from a template of the same serialisation)."""
    return hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()


def run_id(axes: dict[str, Any], cfg: DictConfig, plan_key: list) -> str:
    """Readable axis values plus a hash of what the run computes and of its plan (`RunPlan.key`:
    where it stops and evaluates, its learning rate): same content, same run."""
    content = run_content(cfg)
    content["plan"] = plan_key
    return f"{_slug(axes)}_{_digest(content)[:8]}"


def trajectory(cfg: DictConfig, column: str, lr: float) -> str:
    """What the run `cfg` computes step by step, without where it stops or evaluates (`column`: the
    ledger column its budgets are in): its run id's content less the budget. Runs of one trajectory
    record the same points up to the smaller budget (the learning rate is constant after warm-up;
    evaluation draws from its own RNG stream), so the run to a larger budget continues the smaller
    one's checkpoint (`continuation`). It is also the fingerprint a run's records and checkpoint
    carry (`store.Identity`, `recipe.resume`): kept in files, so its bytes stay as they were written."""
    content = json.dumps(run_content(cfg), sort_keys=True)
    return hashlib.sha1(f"{content}{column}{lr}".encode()).hexdigest()


def _slug(axes: dict[str, Any]) -> str:
    parts = [f"n{axes['n']}", f"bp{axes['B_p']}", f"s{axes['seed']}"]
    parts += [f"{k.split('.')[-1]}-{_slug_value(v)}" for k, v in axes.items() if k not in ("n", "B_p", "seed")]
    return "_".join(parts).replace("/", "-").replace(" ", "")[:80]


def _slug_value(value: Any) -> str:
    """A scalar as written; a list or mapping (a list-typed key's value) as its items, joined by ','
    and kept to characters a directory or job name takes."""
    if isinstance(value, (list, tuple)):
        text = ",".join(_slug_value(v) for v in value)
    elif isinstance(value, dict):
        text = ",".join(f"{k}={_slug_value(v)}" for k, v in value.items())
    else:
        return f"{value}"
    return re.sub(r"[^A-Za-z0-9.,=+-]", "_", text)


class RunIds:
    """`run_id` for every cell of one axes combination without a config per cell (`applicable` of the
    combination's plain config, its axes `choice`). The content `_digest` hashes is serialised once,
    by the same json.dumps, with a placeholder in place of each key that varies from cell to cell;
    a cell's bytes are that template with its n, B_p, seed and plan, each serialised alone, put in
    their places (json.dumps writes a nested value as it writes it alone)."""

    VARYING = ("n", "B_p", "seed", "plan")
    _SLOT = re.compile(r'"\\u0000(\w+)\\u0000"')  # how json.dumps writes the placeholder "\0key\0"

    def __init__(self, content: dict[str, Any], choice: dict[str, Any]):
        fixed = {k: v for k, v in content.items() if k not in SWEEP_ONLY}
        template = json.dumps({**fixed, **{k: f"\0{k}\0" for k in self.VARYING}}, sort_keys=True)
        self.pieces = self._SLOT.split(template)  # text, key, text, key, ..., text
        self.choice = choice

    def cells(self, n: int, B_p: int, seeds: list[int], plan_key: list):
        """(seed, full digest, run id) of each seed's cell at n, B_p with this plan."""
        for seed in seeds:
            values = {"n": n, "B_p": B_p, "seed": seed, "plan": plan_key}
            text = "".join(json.dumps(values[p]) if i % 2 else p for i, p in enumerate(self.pieces))
            digest = hashlib.sha1(text.encode()).hexdigest()
            yield seed, digest, f"{_slug({'n': n, 'B_p': B_p, 'seed': seed, **self.choice})}_{digest[:8]}"
