"""Compose a sweep config with Hydra onto the schema, then check it (`validate`): a config that
loads is one a run can start from. Paths are made absolute and device-dependent defaults resolved
here, so run identity and `plan` see the values the run computes with.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from isoflop_cli import hub
from isoflop_cli.config.keys import unknown_key
from isoflop_cli.config.schema import DEFAULT_SWEEP, PATH_KEYS, SweepConfig
from isoflop_cli.config.validate import check
from isoflop_cli.errors import ConfigError
from isoflop_cli.rewards import is_file

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
SWEEPS_DIR = ROOT / "sweeps"


def resolve_sweep_path(name_or_path: str | None) -> Path:
    """A ready-made sweep name (`sweeps/NAME.yaml`) or a path to a YAML file."""
    if name_or_path is None:
        name_or_path = DEFAULT_SWEEP
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file {path} {_what_is(path)}: give a YAML file")
        if path.suffix != ".yaml":  # Hydra composes a config by its name, NAME.yaml
            raise ConfigError(f"config file {path}: name it {path.stem}.yaml (Hydra reads configs by their .yaml name)")
        return path.resolve()
    path = SWEEPS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown sweep config '{name_or_path}' (ready-made: {known})")
    return path


def _what_is(path: Path) -> str:
    """What a path given as a config file is instead of one (a directory, a device such as
    /dev/zero, a pipe): not "not found" where something is there."""
    if not os.path.lexists(path):
        return "does not exist"
    if path.is_dir():
        return "is a directory, not a file"
    return "is not a regular file (a device, a pipe or a socket)" if path.exists() else "is a link to nothing"


def load(config: str | None = None, overrides: list[str] | tuple[str, ...] = (), evaluation: bool = True) -> DictConfig:
    """Compose `config` with `overrides`, merge into the schema and check values (`evaluation=False`:
    not the settings only a sweep's evaluation reads, for calibrate: `validate.check`)."""
    path = resolve_sweep_path(config)
    _check_not_empty(path)
    cfg = _compose(path, list(overrides))
    try:
        cfg = OmegaConf.merge(_schema(), cfg)  # merge copies its first argument
        _check_stable(OmegaConf.to_container(cfg, resolve=False))
        OmegaConf.resolve(cfg)  # a broken ${...} interpolation fails here, not in the middle of a run
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_message(e)) from None
    OmegaConf.set_readonly(cfg, False)
    _absolute_paths(cfg)
    resolve_device_defaults(cfg)
    check(cfg, evaluation=evaluation)
    return cfg


# Resolvers whose value is not a function of the config: the clock (Hydra's `now`) and the
# invocation (`hydra:`, its run directory and working directory). A run's id hashes the resolved
# config and a sweep's directory is its name, so a rerun would start new runs beside the killed ones.
UNSTABLE = re.compile(r"\$\{\s*(now|hydra)\s*:")


def _check_stable(node: Any, path: str = "") -> None:
    """Refuse, naming the key, a value that interpolates an UNSTABLE resolver."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_stable(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_stable(value, f"{path}[{i}]")
    elif isinstance(node, str) and (found := UNSTABLE.search(node)):
        raise ConfigError(
            f"{path}={node}: ${{{found.group(1)}:...}} has another value at every invocation, so a rerun "
            "would be a new run beside the old one instead of resuming it; give the value itself"
        )


@functools.cache
def _schema() -> DictConfig:
    """The schema as a structured config, built once a process: each load merges into a copy of it
    (a copy takes a seventh of a build)."""
    return OmegaConf.structured(SweepConfig)


def resolve_device_defaults(cfg: DictConfig) -> None:
    """The learner knobs whose default depends on the run's GPUs (null in the schema), set to what
    the run will use, so that run identity and `plan` see the values the run computes with: one
    learner rank per GPU, bf16 and activation checkpointing with GPUs; one rank in fp32 without."""
    gpus = cfg.cluster.gpus_per_run
    if not (math.isfinite(gpus) and gpus >= 0):
        return  # check() names it
    learner = cfg.learner
    if learner.world_size is None:
        learner.world_size = max(1, int(gpus))
    if learner.bf16 is None:
        learner.bf16 = bool(gpus)
    if learner.activation_checkpointing is None:
        learner.activation_checkpointing = bool(gpus)


def _absolute_paths(cfg: DictConfig) -> None:
    """Files the runs read, as absolute paths: a run is a Ray job whose working directory is not
    the one the sweep was started from. A Hugging Face Hub id stays one (each run finds it in its
    node's cache); a reward function's file (reward.fn=FILE.py:function) is a path too."""
    keys = [*PATH_KEYS, *(f"eval.{part}.{name}" for part in ("sets", "judges") for name in cfg.eval[part])]
    for key in keys:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        if isinstance(value, str) and value and not (hub.takes_ids(key) and hub.hub_id(value)):
            OmegaConf.update(cfg, key, str(Path(value).expanduser().absolute()), merge=False)
    where, _, name = (cfg.reward.fn or "").rpartition(":")
    if where and is_file(where):
        cfg.reward.fn = f"{Path(where).expanduser().absolute()}:{name}"


def with_values(cfg: DictConfig, values: dict[str, Any], checked: bool = True) -> DictConfig:
    """A copy of `cfg` with dotted keys set (a grid axis's values), checked as an override would be
    (`checked=False`: values already checked on the same config)."""
    out = cfg.copy()
    for key, value in values.items():
        try:
            OmegaConf.update(out, key, value, merge=False)
        except OmegaConfBaseException as e:
            raise ConfigError(f"grid.axes.{key}: {omegaconf_message(e)}") from None
    _absolute_paths(out)
    if checked:
        check(out)
    return out


MAX_VALUES = 100_000  # a config file's nodes with every YAML alias expanded: real configs hold hundreds


def _check_not_empty(path: Path) -> None:
    """An empty config file (or one of comments only) would compose to the bare schema and fail on
    whatever the schema leaves unset: say what is wrong instead. One whose aliases expand beyond
    MAX_VALUES (an alias bomb: nine aliases of nine aliases ... of a value) is refused before Hydra
    copies every expanded value, which takes minutes and all memory."""
    try:
        text = path.read_text()
        _check_expansion(path, yaml.compose(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return  # _compose names the syntax error
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty: start it with a defaults list (see sweeps/default.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path} must be a YAML mapping (defaults, name, grid ...), got a {type(data).__name__}"
        )


def _check_expansion(path: Path, root: yaml.Node | None) -> None:
    """Count the nodes `root` stands for once its aliases are expanded, without expanding them:
    each distinct node is counted once, from its children's counts (an alias is the node it names)."""
    counts: dict[int, int] = {}

    def count(node: yaml.Node) -> int:
        if id(node) not in counts:
            counts[id(node)] = 0  # a node inside itself counts as nothing here: _compose names it
            children = (
                [part for pair in node.value for part in pair]
                if isinstance(node, yaml.MappingNode)
                else node.value
                if isinstance(node, yaml.SequenceNode)
                else []
            )
            counts[id(node)] = 1 + sum(count(child) for child in children)
            if counts[id(node)] > MAX_VALUES:
                raise ConfigError(
                    f"config file {path} expands to more than {MAX_VALUES:,} values through its YAML aliases (*name): "
                    "a config holds hundreds; write the values out instead of aliasing aliases"
                )
        return counts[id(node)]

    if root is not None:
        try:
            count(root)
        except RecursionError:
            return  # nested too deep to count: _compose names it


def _compose(path: Path, overrides: list[str]) -> DictConfig:
    # The schema is the base of every sweep (its defaults list starts with `isoflop`), so Hydra
    # itself rejects unknown keys and wrong types while it composes. Stored once a process: storing
    # builds the schema's structured config, a quarter of a load.
    store = ConfigStore.instance()
    if "isoflop.yaml" not in store.repo:
        store.store(name="isoflop", node=SweepConfig)
    _check_parses(overrides)
    searchpath = f"hydra.searchpath=[file://{CONF_DIR}]"
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            cfg = compose(path.stem, overrides=[searchpath, *overrides])
    except MissingConfigException as e:
        text = str(e)
        first = text.splitlines()[0]
        options = re.search(r"Available options in '(\w+)':\n((?:\t.*\n)+)", text)
        if options:
            first += f" (available: {', '.join(o.strip() for o in options.group(2).splitlines())})"
        raise ConfigError(first) from None
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(_compose_message(e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:  # `a: &a [*a]`: YAML allows a node inside itself, a config cannot hold one
        raise ConfigError(f"{path}: a value holds itself (a YAML anchor used inside its own node)") from None
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    cfg.pop("hydra", None)
    return cfg


def _check_parses(overrides: list[str]) -> None:
    """Each override parsed alone, so that one Hydra's grammar refuses (`name=a;b`, a control
    character, a letter outside ASCII unquoted) is named in one line with what to do, not as the
    lexer's exception with its caret drawing."""
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as e:
            raise ConfigError(_parse_message(override, e)) from None


def _parse_message(override: str, e: OverrideParseException) -> str:
    shown = _printable(override)
    bad = re.search(r"token recognition error at: '(.*)'", str(e.__cause__ or e.__context__ or ""), re.S)
    if bad is None:  # the grammar, not a character: `grid.n=[4,`
        return (
            f"cannot parse the override '{shown}': {_printable(str(e).splitlines()[0])} "
            "(overrides are key=value, lists [a,b])"
        )
    key, _, value = override.partition("=")
    return (
        f"cannot parse the override '{shown}': '{_printable(bad.group(1))}' is not allowed in an unquoted value; "
        f"quote the value, {_printable(key)}='{_printable(value)}' "
        f"(in the shell: \"{_printable(key)}='{_printable(value)}'\")"
    )


def _printable(text: str) -> str:
    """Control characters as escapes (`\\x01`, `\\n`): the message stays one line and shows them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _compose_message(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[1].startswith("To append"):  # a key the schema lacks; keep Hydra's `+key=` hint
        cause = e.__cause__
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None) and "axes" not in lines[0]:
            return unknown_key(cause.full_key)
        return " ".join(lines[:2])
    cause = e.__cause__ or e.__context__
    key = getattr(cause, "full_key", None) if isinstance(cause, OmegaConfBaseException) else None
    if key and key.startswith("grid.axes.") and "typing.List" in str(cause):
        return f"{key} must be a list of values (one cell each), got {getattr(cause, 'value', None)}"
    if key:  # e.g. a typo inside a config file
        where = lines[0] if lines[0].startswith("Error merging override") else lines[0].split(":")[0]
        return f"{where}: {omegaconf_message(cause)}"
    if cause is not None and str(cause).strip():
        return f"{lines[0]}: {_first_line(cause)}"
    return lines[0] if lines else type(e).__name__


def _first_line(e: Exception) -> str:
    """The message without OmegaConf's trailing key/type lines (it may wrap over several lines)."""
    lines = []
    for line in str(e).strip().splitlines():
        if line.strip().startswith(("full_key:", "object_type=", "reference_type=")):
            break
        lines.append(line.strip())
    return " ".join(lines) if lines else type(e).__name__


def omegaconf_message(e: OmegaConfBaseException) -> str:
    msg = _first_line(e)
    key = getattr(e, "full_key", None)
    if "not in struct" in msg or ("Key '" in msg and "not in" in msg):
        return unknown_key(key)
    if key:
        return f"bad value for '{key}': {msg}"
    return msg


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
