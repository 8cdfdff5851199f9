"""Hugging Face Hub ids where a checkpoint or a problem file goes (`model.path`, `task.train`,
`task.val`, `eval.sets`), resolved through the local Hugging Face cache as `transformers` and
`datasets` users have it filled: `model.path=Qwen/Qwen2.5-0.5B-Instruct`, `task.train=openai/gsm8k/main`.

An id is `org/name`, optionally `@revision` (a branch, tag or commit; default main). A path inside
a data set's repo (a file, or a folder holding one file per split) is written as `huggingface_hub`'s
file system and pandas write it, `hf://datasets/org/name[@revision]/path`: a bare org/name/path
would be a relative local path. A value that exists as a local path is that path. The cache is the one `huggingface_hub`
reads (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub), looked up when asked (a
test's or a job's environment, not the one at import). Nothing is downloaded unless the config allows
it (`model.download`, `task.download`), and never with `HF_HUB_OFFLINE=1`: an id not in the cache is
one ConfigError line saying so and how to allow the download.

Whatever a value resolves to, a local file's versions are told apart by `file_version`, which the
data digests of run identity and the task's row cache are keyed on.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from isoflop_cli.errors import ConfigError

ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w.-]+))?(?:/(?P<path>[^@]+))?")
URL = ("hf://datasets/", "hf://")  # huggingface_hub's file system: data sets' ids under datasets/
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
TRUE = ("1", "on", "yes", "true")
# The words a data file's path says its split with, per key: the first word some file says is chosen.
SPLIT_WORDS = {"task.train": ("train",)}
HELD_OUT_WORDS = ("test", "validation", "valid", "val", "eval")


ID_KEYS = ("model.path", "task.train", "task.val", "eval.sets.")  # the keys a Hub id may fill (eval.sets.NAME)


def takes_ids(key: str) -> bool:
    return key in ID_KEYS or key.startswith("eval.sets.")


@dataclass(frozen=True)
class HubId:
    repo: str  # org/name
    revision: str | None  # None: main
    path: str | None  # inside the repo (a data set's file or folder)


def hub_id(value: str | None) -> HubId | None:
    """The Hub id `value` names: hf://[datasets/]org/name[@revision][/path], or a bare
    org/name[@revision] that is no local path; None for anything else (a local path)."""
    url = next((prefix for prefix in URL if value and value.startswith(prefix)), None)
    if url is None and (not value or value.startswith(("/", "~", ".")) or Path(value).exists()):
        return None
    m = ID.fullmatch(value[len(url) :] if url else value)
    if m is None or (m["path"] and url is None):
        return None
    return HubId(m["repo"], m["revision"], m["path"].strip("/") or None if m["path"] else None)


def cache() -> Path:
    """The hub cache huggingface_hub reads, from this process's environment now."""
    if os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ.get("HF_HUB_CACHE") or os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def checkpoint(value: str, key: str, download: bool = False) -> Path:
    """A checkpoint's directory: `value` itself, or the cached snapshot of the model it names."""
    ref = hub_id(value)
    if ref is None:
        return Path(value).expanduser()
    if ref.path:
        raise ConfigError(f"{key} {value}: a model is org/name[@revision], without a path inside the repo")
    return snapshot(ref, "model", key, download)


def data_file(value: str, key: str, download: bool = False) -> Path:
    """A problem file: `value` itself, or the file of a cached data set it names; where the id (or
    its folder) holds several, the one whose path names `key`'s split (train for task.train, test or
    validation for the others); none or several is an error listing them."""
    ref = hub_id(value)
    if ref is None:
        return Path(value).expanduser()
    root = snapshot(ref, "dataset", key, download)
    target = root / ref.path if ref.path else root
    if target.is_file():
        return target
    if not target.is_dir():
        raise ConfigError(f"{key} {value}: the data set {ref.repo} (commit {root.name[:12]}) has no {ref.path}")
    files = sorted(str(f.relative_to(root)) for f in target.rglob("*") if f.suffix in DATA_SUFFIXES and f.is_file())
    if not files:
        raise ConfigError(
            f"{key} {value}: the data set holds no {', '.join(DATA_SUFFIXES)} file there (commit {root.name[:12]})"
        )
    chosen = _split_files(files, SPLIT_WORDS.get(key, HELD_OUT_WORDS))
    if len(chosen) == 1:
        return root / chosen[0]
    listed = ", ".join(chosen[:6]) + (" ..." if len(chosen) > 6 else "")
    revision = f"@{ref.revision}" if ref.revision else ""
    raise ConfigError(
        f"{key} {value}: {len(chosen)} files could be it ({listed}); name one, e.g. "
        f"{key}=hf://datasets/{ref.repo}{revision}/{chosen[0]}"
    )


def _split_files(files: list[str], words: tuple[str, ...]) -> list[str]:
    """The files whose path names the first of `words` that any names (a split's files); all of them
    where there is one file or none names a word."""
    if len(files) == 1:
        return files
    for word in words:
        named = [f for f in files if word in re.split(r"[/_.\-]", f.lower())]
        if named:
            return named
    return files


def snapshot(ref: HubId, kind: str, key: str, download: bool) -> Path:
    """The cached snapshot of a repo at its revision; downloaded first only where allowed."""
    return _snapshot(ref.repo, ref.revision, kind, key, download, offline(), str(cache()))


@functools.lru_cache(maxsize=64)
def _snapshot(
    repo: str, revision: str | None, kind: str, key: str, download: bool, offline: bool, cache_dir: str
) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    shown = repo + (f"@{revision}" if revision else "")
    try:
        return Path(
            snapshot_download(
                repo, repo_type=kind, revision=revision, cache_dir=cache_dir, local_files_only=offline or not download
            )
        )
    except LocalEntryNotFoundError:
        allow = (
            "unset HF_HUB_OFFLINE, which forbids the download"
            if download
            else f"allow the download with {kind if kind == 'model' else 'task'}.download=true"
        )
        fetch = (
            f"hf download {repo}"
            + (" --repo-type dataset" if kind == "dataset" else "")
            + (f" --revision {revision}" if revision else "")
        )
        raise ConfigError(
            f"{key} {shown} is neither a local path nor a {kind} in the local Hugging Face cache ({cache_dir}): "
            f"download it (`{fetch}`) or {allow}"
        ) from None
    except Exception as e:  # the Hub's answer (no such repo or revision, gated, no network): its first line
        first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise ConfigError(
            f"{key} {shown}: the Hugging Face Hub {kind} cannot be had: {type(e).__name__}"
            + (f": {first[:300]}" if first else "")
        ) from None


def file_version(path: Path) -> tuple[int, int, int, int, int]:
    """What tells one version of a file from another without reading it: its size and mtime, and its
    change time, inode and device, which user space cannot set back (a copy tool that keeps times,
    `touch -r`, a file regenerated at the same length: each gets a new ctime, or a new inode)."""
    stat = path.stat()
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev)
