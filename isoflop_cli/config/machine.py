"""What this machine holds for a config's runs, checked before any compute: checkpoints' weights
and tokenizers, vLLM importable, an interpreter on PATH, and directories the runs write (the
output dir, the model cache, the trackers' files) writable or able to be made. `validate` checks
the config's values; what it finds here depends on the machine it runs on, so the preflight asks
the same of every node (`cannot_make`, `builds_embedded`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig

from isoflop_cli import hub, vllm_pin
from isoflop_cli.config.schema import cache_dir
from isoflop_cli.errors import ConfigError
from isoflop_cli.rewards import REWARDS
from isoflop_cli.samplers import SAMPLERS
from isoflop_cli.tracking import writes_dir

# What AutoTokenizer reads a tokenizer from (fast, then the slow tokenizers' vocabularies).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)


def check_writable(out: Path) -> Path:
    """Create `out` if needed (`store.make_dirs`: never world-writable); fail fast if results could
    not be written there. Absolute, with links left unresolved: a sweep's writes below it refuse a
    link (`store._open_dir`) that resolving here would have followed."""
    from isoflop_cli.store import make_dirs  # here: the store imports pandas, which the config package does not

    out = Path(os.path.abspath(out.expanduser()))
    try:
        make_dirs(out)
    except OSError as e:
        raise ConfigError(f"output dir {out} is not writable: {e.strerror}") from None
    try:  # a real write: root ignores mode bits, and a read-only mount or a full disk says so only here
        with tempfile.TemporaryFile(dir=out) as probe:
            probe.write(b"isoflop")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as e:
        raise ConfigError(f"output dir {out} is not writable: {e.strerror}") from None
    return out


def check_runnable(cfgs: Iterable[DictConfig]) -> None:
    """What starting compute needs beyond what `plan` reads, for the runs of these configs (one per
    axes combination of a sweep): each checkpoint's weights (model.path, reward.path, the judges),
    and vLLM importable where the runs start (sampler=vllm). `plan` needs neither: it reads each
    checkpoint's config.json, and plans a vLLM sweep from a machine without vLLM."""
    checked: set = set()
    for cfg in cfgs:
        paths = {
            f"{part}.path": checkpoint_dir(cfg, part) for part in ("model", "reward") if cfg[part].path is not None
        }
        paths.update({f"eval.judges.{name}": Path(path).expanduser() for name, path in cfg.eval.judges.items()})
        for name, path in paths.items():
            if path not in checked:
                _check_weights(name, path)
                checked.add(path)
        package = SAMPLERS[cfg.sampler.name].package
        if package == "vllm" and (package, cfg.cluster.python) not in checked:
            check_vllm(cfg.cluster.python)
            checked.add((package, cfg.cluster.python))


def checkpoint_dir(cfg: DictConfig, part: str) -> Path:
    """model.path's directory (a Hub id's cached snapshot, downloaded first where model.download
    allows); reward.path's as given."""
    if part == "model":
        return hub.checkpoint(cfg.model.path, "model.path", cfg.model.download)
    return Path(cfg[part].path).expanduser()


def _check_weights(name: str, path: Path) -> None:
    """A checkpoint's weight files (safetensors or PyTorch bins), each safetensors header readable (a
    truncated or foreign file fails here, not in the run's load), and its tokenizer's files: without
    them transformers builds an empty tokenizer from config.json, which turns every prompt into no
    tokens."""
    from safetensors import SafetensorError, safe_open

    shards = sorted(path.glob("*.safetensors"))
    if not shards and not any(path.glob("pytorch_model*.bin")):
        raise ConfigError(
            f"{name} {path} has no weights (*.safetensors or pytorch_model*.bin): "
            "`plan` reads its config.json alone, a run needs the weights"
        )
    for shard in shards:
        try:
            with safe_open(shard, framework="numpy") as f:
                f.keys()
        except (SafetensorError, OSError) as e:
            raise ConfigError(
                f"{name} {shard} is not a readable safetensors file ({' '.join(str(e).split())})"
            ) from None
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(
            f"{name} {path} has no tokenizer ({', '.join(TOKENIZER_FILES[:3])} ...): save it beside the weights "
            "(tokenizer.save_pretrained)"
        )


def check_vllm(python: str | None) -> None:
    """vLLM must import where the runs start, at the version the sampler is written against
    (`vllm_pin`): this Python, or cluster.python when it is set (which the cluster checks found to
    run). Ray and SLURM nodes are checked by the preflight's probe (`preflight.FACTS`) and by the engine
    as it starts."""
    if not python:
        installed = vllm_pin.here()
        if installed is None:
            raise ConfigError(
                "sampler=vllm needs vLLM in this environment: pip install 'isoflop[vllm]' on GPU nodes, "
                "`make setup-vllm` for the CPU build (then run .venv-vllm/bin/isoflop), or use sampler=hf"
            )
        where = "this environment"
    else:
        probe = subprocess.run([python, "-c", vllm_pin.PROBE], capture_output=True, text=True)
        if probe.returncode:
            raise ConfigError(f"sampler=vllm needs vLLM in cluster.python ({python}): it does not import there")
        installed, where = probe.stdout.strip() or None, f"cluster.python ({python})"
    if problem := vllm_pin.mismatch(installed, where):
        raise ConfigError(problem)


def check_executable(name: str, value: str) -> None:
    """An interpreter the runs start with (cluster.python): by path an executable file, by name on PATH."""
    if os.sep in value or value.startswith("~"):
        path = Path(value).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"{name} {value} is not an executable file")
    elif shutil.which(value) is None:
        raise ConfigError(f"{name} {value} is not on PATH")


def builds_embedded(cfg: DictConfig) -> bool:
    """Whether the runs build (or unpack) an embedded model into ISOFLOP_CACHE: the policy's, or a
    model-based reward's, where no checkpoint path is given."""
    return cfg.model.path is None or (REWARDS[cfg.reward.name].model_based and cfg.reward.path is None)


def check_model_cache() -> None:
    """The embedded models are built into ISOFLOP_CACHE (`schema.cache_dir`)."""
    check_makeable("the model cache", "ISOFLOP_CACHE", cache_dir())


def check_trackers_dir(t: DictConfig) -> None:
    """A tracking.dir its trackers can write: a tracker that cannot would only be a warning in
    every run's log."""
    if t.dir and writes_dir(t):
        check_makeable("the trackers' directory", "tracking.dir", Path(t.dir).expanduser())


def check_makeable(what: str, key: str, root: Path) -> None:
    """`cannot_make`'s answer as one ConfigError line naming the directory and its config key."""
    why = cannot_make(root)
    if why:
        raise ConfigError(f"{what} {root} ({key}) {why}")


def cannot_make(root: Path) -> str | None:
    """Why the runs could not write into directory `root` (None: they can): not a directory, or
    none that can be made (its nearest existing parent not a writable directory)."""
    if root.exists():
        return None if root.is_dir() else "is not a directory"
    parent = next(p for p in root.absolute().parents if p.exists())
    if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        return f"cannot be made: {parent} is not a writable directory"
    return None
