"""Value checks the schema's types cannot express, before any compute: each failure is one
`ConfigError` line naming the key (exit code 2). `check` reads what `plan` needs (a checkpoint's
config.json, the task's files); what the machine must hold beyond the values (weights, vLLM,
writable directories) is `machine`'s, which `check` asks where the runs run here.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from isoflop_cli import launchers, tasks
from isoflop_cli.algorithms import ALGORITHMS, LOSS_AGGS
from isoflop_cli.config import machine
from isoflop_cli.config.keys import unknown_key
from isoflop_cli.config.schema import GROUPS, Schedule
from isoflop_cli.errors import ConfigError
from isoflop_cli.flops import PROJECTIONS, Shape, UnsupportedModel
from isoflop_cli.rewards import REWARDS
from isoflop_cli.samplers import SAMPLERS
from isoflop_cli.tasks.arith import ALPHABET
from isoflop_cli.tracking import BACKENDS


def check(cfg: DictConfig, axes: bool = True, evaluation: bool = True) -> None:
    """Value checks the schema's types cannot express. `axes=False` leaves out grid.axes (checked
    once with the sweep; grid.expand checks each combination of their values with it).
    `evaluation=False` leaves out what only a sweep's evaluation reads (eval.problems against the
    validation split, eval.sets): calibrate samples task.train whole and evaluates nothing."""

    def positive(name: str, values: list[int] | int) -> None:
        for v in values if isinstance(values, (list, tuple)) or OmegaConf.is_list(values) else [values]:
            if not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a finite number > 0, got {v}")

    for key in (
        "name",
        "model.name",
    ):  # a directory's name (OUT/<name>, the embedded model's cache entry <model.name>-<digest>)
        if not re.fullmatch(
            r"[A-Za-z0-9][A-Za-z0-9._-]*", OmegaConf.select(cfg, key)
        ):  # no separator, no leading dot: it stays under its root
            raise ConfigError(
                f"{key} '{OmegaConf.select(cfg, key)}' must be a plain directory name (letters, digits, '.', '_', '-')"
            )
        if len(OmegaConf.select(cfg, key)) > MAX_NAME:
            raise ConfigError(
                f"{key} is {len(OmegaConf.select(cfg, key))} characters long: at most {MAX_NAME} (it names a directory)"
            )
    _check_seeds(cfg)

    g = cfg.grid
    positive("grid.n", g.n)
    positive("grid.B_p", g.B_p)
    positive("grid.budgets", g.budgets)
    positive("grid.max_batch", g.max_batch)
    positive("grid.min_steps", g.min_steps)
    positive("grid.eval_points", g.eval_points)
    if g.eval_points > 64:
        raise ConfigError(f"grid.eval_points must be <= 64, got {g.eval_points}")
    if g.schedule == Schedule.adaptive and len(g.budgets) < 2:
        raise ConfigError(
            "grid.schedule=adaptive decides at each budget which cells go on: give grid.budgets two or more values"
        )
    if g.margin < 0:
        raise ConfigError(f"grid.margin must be >= 0 (standard deviations of the metric's noise), got {g.margin}")
    if g.indifference < 0:
        raise ConfigError(f"grid.indifference must be >= 0 (in the metric's units), got {g.indifference}")
    positive("n", cfg.n)
    positive("B_p", cfg.B_p)
    for name in ("n", "B_p", "seed", "budgets"):
        if len(g[name]) == 0:
            raise ConfigError(f"grid.{name} is empty")
        _check_no_repeats(f"grid.{name}", g[name])
    for key, values in g.axes.items() if axes else ():
        if not OmegaConf.is_list(values) or len(values) == 0:
            raise ConfigError(f"grid.axes.{key} must be a non-empty list")
        if key in ("n", "B_p", "seed"):
            raise ConfigError(f"grid.axes.{key}: set grid.{key} instead")
        if key.split(".")[0] == "cluster":  # the dispatcher submits every job with the sweep's cluster settings
            raise ConfigError(
                f"grid.axes.{key}: the cluster is the sweep's, not a cell's (each job asks for the sweep's CPUs and "
                "GPUs); run one sweep per cluster setting"
            )
        if key not in GROUPS and OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
            raise ConfigError(f"grid.axes.{key}: {unknown_key(key)}")
        if key in GROUPS and any(OmegaConf.is_config(v) for v in values):
            raise ConfigError(
                f"grid.axes.{key} takes names of {key} configs (conf/{key}/NAME.yaml), got "
                f"{_show(next(v for v in values if OmegaConf.is_config(v)))}"
            )
        _check_no_repeats(f"grid.axes.{key}", values)
    positive("eval.k", cfg.eval.k)
    positive("eval.problems", cfg.eval.problems)
    if cfg.eval.samples < cfg.eval.k:
        raise ConfigError(f"eval.samples ({cfg.eval.samples}) must be >= eval.k ({cfg.eval.k})")
    a = cfg.algo
    for key in (
        "weight_decay",
        "clip_low",
        "clip_high",
        "adv_eps",
        "kl_coef",
        "entropy_coef",
        "vf_coef",
        "warmup_steps",
    ):
        if not (math.isfinite(a[key]) and a[key] >= 0):
            raise ConfigError(f"algo.{key} must be a finite number >= 0, got {a[key]}")
    for key in ("max_grad_norm", "value_clip"):
        positive(f"algo.{key}", a[key])
    if a.clip_low > 1:
        raise ConfigError(f"algo.clip_low must be <= 1 (the ratio's floor is 1 - clip_low), got {a.clip_low}")
    positive("algo.ref_batch", cfg.algo.ref_batch)
    positive("algo.epochs", cfg.algo.epochs)
    if cfg.algo.epochs > 1 and not float(cfg.algo.epochs).is_integer():
        raise ConfigError(
            "algo.epochs must be whole passes (1, 2, ...) or a share of each group's completions below 1, got "
            f"{cfg.algo.epochs}"
        )
    positive("algo.minibatches", cfg.algo.minibatches)
    positive("algo.base_lr", cfg.algo.base_lr)
    if not (cfg.algo.temperature >= MIN_TEMPERATURE and math.isfinite(cfg.algo.temperature)):
        raise ConfigError(
            f"algo.temperature must be a finite number >= {MIN_TEMPERATURE} (below it logits / temperature "
            f"overflow and the loss's gradients scale by 1 / temperature), got {cfg.algo.temperature}"
        )
    if not 0 < cfg.algo.top_p <= 1:
        raise ConfigError(f"algo.top_p must be in (0, 1], got {cfg.algo.top_p}")
    check_choice("algo.name", cfg.algo.name, tuple(ALGORITHMS))
    if cfg.algo.std_norm is not None and ALGORITHMS[cfg.algo.name].advantage != "group":
        raise ConfigError(
            f"algo.std_norm divides group advantages by the group's std; {cfg.algo.name}'s advantages are "
            f"{ALGORITHMS[cfg.algo.name].advantage}'s (leave it null)"
        )
    if cfg.algo.loss_agg is not None:
        check_choice("algo.loss_agg", cfg.algo.loss_agg, LOSS_AGGS)
    if not (
        axes and "algo.name" in cfg.grid.axes
    ):  # an algorithm on an axis: each of its cells is checked (grid.expand)
        _check_group(cfg)
    positive("task.max_new_tokens", cfg.task.max_new_tokens)
    if evaluation and cfg.eval.problems > MAX_EVAL_PROBLEMS:
        raise ConfigError(
            f"eval.problems must be <= {MAX_EVAL_PROBLEMS:,} (every eval point samples eval.samples completions of "
            f"each), got {cfg.eval.problems}"
        )
    if OmegaConf.is_missing(cfg.model, "path"):
        raise ConfigError(
            f"model '{cfg.model.name}' has no checkpoint path: set model.path=/path/to/checkpoint, or "
            "model=tiny-arith (the embedded model)"
        )
    task = _task(cfg, evaluation)
    _check_reward(cfg, task)
    if evaluation:
        _check_eval_sets(cfg)
    for part in ("model", "reward"):
        if cfg[part].path is not None:
            hf_config = _check_checkpoint(f"{part}.path", machine.checkpoint_dir(cfg, part))
            positions, what = hf_config.get("max_position_embeddings"), f"{part}.path {cfg[part].path}"
        else:
            positions, what = (
                EMBEDDED_MAX_POSITIONS,
                f"the embedded {'model' if part == 'model' else 'reward model'} ({part}.build)",
            )
            if part == "model" or REWARDS[cfg.reward.name].model_based:  # the embedded model (and PRM) this run builds
                _check_build(f"{part}.build", cfg[part].build)
        if part == "model" or REWARDS[cfg.reward.name].model_based:
            _check_positions(cfg, task, positions, what, scored=part == "reward")
    if cfg.lora.rank < 0:
        raise ConfigError(f"lora.rank must be >= 0 (0: full fine-tuning), got {cfg.lora.rank}")
    if cfg.lora.rank:
        positive("lora.alpha", cfg.lora.alpha)
    if cfg.lora.rank and not cfg.lora.targets:
        raise ConfigError("lora.targets is empty: name the projections to adapt")
    for target in cfg.lora.targets:
        check_choice("lora.targets", target, PROJECTIONS)
    f = cfg.flops
    if (f.peak_tflops is None) != (f.utilization is None):
        raise ConfigError("flops.peak_tflops and flops.utilization go together (gpu_hours needs both)")
    if f.utilization is not None and not 0 < f.utilization <= 1:
        raise ConfigError(f"flops.utilization must be in (0, 1], got {f.utilization}")
    if f.peak_tflops is not None:
        positive("flops.peak_tflops", f.peak_tflops)
    c = cfg.cluster
    positive("cluster.cpus_per_run", c.cpus_per_run)
    positive("cluster.poll_s", c.poll_s)
    positive("cluster.log_every_s", c.log_every_s)
    check_choice("cluster.launcher", c.launcher, launchers.LAUNCHERS)
    check_choice("cluster.slurm.executor", c.slurm.executor, ("slurm", "local"))
    positive("cluster.slurm.time_min", c.slurm.time_min)
    positive("cluster.max_attempts", c.max_attempts)
    if not (math.isfinite(c.gpus_per_run) and c.gpus_per_run >= 0):
        raise ConfigError(f"cluster.gpus_per_run must be >= 0, got {c.gpus_per_run}")
    for key in ("local_cpus", "max_concurrent", "gpu_memory_gib", "node_memory_gib"):
        if c[key] is not None:
            positive(f"cluster.{key}", c[key])
    here = launchers.runs_here(
        c
    )  # else the interpreter, the model cache and the trackers' files are the nodes' (the preflight's)
    if here and c.python is not None:
        machine.check_executable("cluster.python", c.python)
    if here and machine.builds_embedded(cfg):
        machine.check_model_cache()
    check_engine(cfg)
    _check_tracking(cfg.tracking)
    if here:
        machine.check_trackers_dir(cfg.tracking)
    plain = lambda node: OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node  # noqa: E731
    _check_finite({key: plain(cfg[key]) for key in cfg if key != "grid"}, "")
    _check_finite({key: plain(g[key]) for key in g if axes or key != "axes"}, "grid")


MAX_EVAL_PROBLEMS = 100_000
# Characters of a name that is a directory's (a file name is at most 255 bytes, with a digest and prefixes added).
MAX_NAME = 100
MIN_TEMPERATURE = 0.01  # below it sampling is greedy in all but name; far below, logits / temperature overflow
# Seeds are fed to torch.manual_seed (< 2**64) and random.seed, also as seed * 1_000_003 + step
# (evaluation, calibration): below 2**32 (numpy's seed range) every one of them stays in range.
SEED_LIMIT = 2**32
EMBEDDED_MAX_POSITIONS = 64  # the embedded models' context (recipe.checkpoint.qwen2_config)


def _check_seeds(cfg: DictConfig) -> None:
    """Every seed a run feeds its generators is a whole number in [0, SEED_LIMIT)."""
    seeds = {
        "seed": [cfg.seed],
        "grid.seed": cfg.grid.seed,
        "model.build.seed": [cfg.model.build.seed],
        "reward.build.seed": [cfg.reward.build.seed],
    }
    for key, values in seeds.items():
        for value in values:
            if not 0 <= value < SEED_LIMIT:
                raise ConfigError(f"{key} must be a whole number in [0, 2**32), got {value}")


def _show(value: Any) -> str:
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_show(v)}" for k, v in value.items()) + "}"
    return str(value)


def _frozen(value: Any) -> Any:
    """A hashable stand-in for a config value (lists and mappings included)."""
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _frozen(v)) for k, v in value.items())))
    return value


def _check_no_repeats(name: str, values: Any) -> None:
    """A grid axis lists each value once: a repeat would be planned (and costed) as a cell of its own
    that the sweep runs once."""
    seen: set = set()
    for value in values:
        key = _frozen(value)
        if key in seen:
            raise ConfigError(
                f"{name} lists {_show(value)} twice: each value is one cell of the sweep; drop the repeat"
            )
        seen.add(key)


def _check_finite(node: Any, path: str) -> None:
    """Every number in the config is finite (NaN and infinity fail only deep inside a run)."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for value in node:
            _check_finite(value, path)
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{path} must be a finite number, got {node}")


def _task(cfg: DictConfig, evaluation: bool = True) -> tasks.Task:
    """The run's task, built (a dataset task reads and checks its files) and able to give what a run
    draws; the embedded model reads only its own few characters."""
    for part in ("task", "reward"):
        missing = [key for key in cfg[part] if OmegaConf.is_missing(cfg[part], key)]
        if missing:
            raise ConfigError(
                f"{part}={cfg[part].name} needs {part}.{missing[0]}=... (see conf/{part}/{cfg[part].name}.yaml)"
            )
    if cfg.task.name != "dataset":  # the other dataset keys also read eval.sets' files; these two name the task's own
        given = [key for key in ("train", "val") if cfg.task[key] is not None]
        if given:
            raise ConfigError(
                f"task.{given[0]} names the problems of task=dataset; task={cfg.task.name} makes its own "
                f"and would not read it: add task=dataset"
            )
    try:
        task = tasks.make(cfg.task)
        if cfg.model.path is None:
            task.check_alphabet(ALPHABET, "the embedded model")
        if evaluation:
            task.check(cfg.eval.problems)
    except tasks.TaskError as e:
        raise ConfigError(str(e)) from None
    return task


def _check_eval_sets(cfg: DictConfig) -> None:
    """Held-out sets read like task=dataset (every row checked), judges are checkpoints."""
    from isoflop_cli.tasks.dataset import held_out

    for part in ("sets", "judges"):
        for name in cfg.eval[part]:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", str(name)):
                raise ConfigError(
                    f"eval.{part} name '{name}' must be letters, digits, '_' or '-' (it names a metrics column)"
                )
    for name, path in cfg.eval.sets.items():
        try:
            held = held_out(cfg.task, path, f"eval.sets.{name}")
            if cfg.model.path is None:
                held.check_alphabet(ALPHABET, "the embedded model")
        except tasks.TaskError as e:
            raise ConfigError(str(e)) from None
    for name, path in cfg.eval.judges.items():
        _check_checkpoint(f"eval.judges.{name}", Path(path))


def _check_reward(cfg: DictConfig, task: tasks.Task) -> None:
    """A known reward, one the task can score, and a custom function that imports."""
    r = cfg.reward
    check_choice("reward.name", r.name, tuple(REWARDS))
    need = REWARDS[r.name].needs
    if need and not getattr(task, need):
        if need == "has_steps":
            raise ConfigError(f"reward {r.name} scores steps: use task=arith-steps (task.steps=true)")
        raise ConfigError(
            f"reward {r.name} gives partial credit, which task {cfg.task.name} does not define: use reward=sparse or "
            "reward=structured"
        )
    if not 0 <= r.format_weight <= 1:
        raise ConfigError(f"reward.format_weight must be in [0, 1], got {r.format_weight}")
    if (r.name == "custom") != (r.fn is not None):
        raise ConfigError("reward.fn=package.module:function goes with reward=custom (and reward=custom needs it)")
    if r.style != "auto" and r.fn is None:
        raise ConfigError(
            f"reward.style={r.style} is the signature of reward.fn: it goes with reward=custom reward.fn=..."
        )
    if r.fn is not None:
        REWARDS["custom"].scorer(task, r)  # loaded and its style settled: what is wrong is a ConfigError


def _check_positions(cfg: DictConfig, task: tasks.Task, positions: Any, what: str, scored: bool) -> None:
    """The longest prompt and its completion (a PRM also scores an end token) fit the model's context."""
    if not isinstance(positions, int) or isinstance(positions, bool):
        return  # the checkpoint does not say
    new, prompt = cfg.task.max_new_tokens, task.max_prompt_tokens
    need = prompt + new + scored
    if need > positions:
        room = positions - prompt - scored
        fix = f"at most task.max_new_tokens={room}" if room > 0 else task.PROMPT_KNOBS
        longest = f"the longest prompt ({prompt} tokens)"
        raise ConfigError(
            f"task.max_new_tokens={new}: {longest} and its completion need {need} positions, "
            f"above the {positions} of {what}; {fix}"
        )


def _check_checkpoint(name: str, path: Path) -> dict:
    """A local Hugging Face checkpoint of a family the ledger counts; its config.json. Its weights are
    `machine.check_runnable`'s: planning reads the config alone (a 70B sweep is planned without its weights)."""
    if not (path / "config.json").is_file():
        raise ConfigError(f"{name} {path} is not a Hugging Face checkpoint (no config.json)")
    try:
        config = json.loads((path / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("config.json does not hold an object")
        shape = Shape.from_config(config)
        if not all(
            isinstance(v, int) and v > 0
            for v in (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.vocab)
        ):
            raise ValueError("config.json lacks the model's sizes (num_hidden_layers, hidden_size, ...)")
    except (UnsupportedModel, ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{name} {path}: {e}") from None
    return config


def _check_build(name: str, b: DictConfig) -> None:
    """The sizes of a model built locally: heads divide the width, key/value heads the heads."""
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "batch_size"):
        if b[key] <= 0:
            raise ConfigError(f"{name}.{key} must be > 0, got {b[key]}")
    if b.hidden_size % b.num_heads or b.num_heads % b.num_kv_heads:
        raise ConfigError(
            f"{name}: num_heads must divide hidden_size and num_kv_heads num_heads, got "
            f"{b.hidden_size}, {b.num_heads}, {b.num_kv_heads}"
        )
    if b.steps < 0 or not (math.isfinite(b.lr) and b.lr > 0):
        raise ConfigError(f"{name}: steps must be >= 0 and lr > 0, got {b.steps} and {b.lr}")
    if "stray" in b and not 0 <= b.stray < 1:
        raise ConfigError(f"{name}.stray must be in [0, 1), got {b.stray}")


def _check_tracking(t: DictConfig) -> None:
    """Known backends and wandb mode (whether each imports where the runs run is the preflight's)."""
    for name in t.backends:
        check_choice("tracking.backends", name, BACKENDS)
    _check_no_repeats("tracking.backends", t.backends)
    check_choice("tracking.wandb_mode", t.wandb_mode, ("offline", "online"))


def check_engine(cfg: DictConfig) -> None:
    """The learner, sampler and checkpoint settings; GPU-only paths need GPUs in the run."""
    a, lrn, smp = cfg.algo, cfg.learner, cfg.sampler
    if a.tis_cap is not None and a.tis_cap < 1:
        raise ConfigError(f"algo.tis_cap must be >= 1 (null: off), got {a.tis_cap}")
    if not 0 <= a.gamma <= 1 or not 0 <= a.lam <= 1:
        raise ConfigError(f"algo.gamma and algo.lam must be in [0, 1], got {a.gamma} and {a.lam}")
    positive_int = {"learner.world_size": lrn.world_size, "sampler.tensor_parallel": smp.tensor_parallel}
    for name, value in positive_int.items():
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if lrn.micro_batch < 0 or lrn.max_tokens_per_micro_batch < 0 or cfg.checkpoint.every < 0:
        raise ConfigError(
            "learner.micro_batch, learner.max_tokens_per_micro_batch and checkpoint.every must be >= 0 (0: off)"
        )
    if lrn.logit_chunk_tokens < 1:
        raise ConfigError(f"learner.logit_chunk_tokens must be >= 1, got {lrn.logit_chunk_tokens}")
    if not (math.isfinite(lrn.collective_timeout_s) and lrn.collective_timeout_s > 0):
        raise ConfigError(f"learner.collective_timeout_s must be a finite number > 0, got {lrn.collective_timeout_s}")
    check_choice("sampler.name", smp.name, tuple(SAMPLERS))
    gpus = cfg.cluster.gpus_per_run
    if lrn.bf16 and not gpus:
        raise ConfigError("learner.bf16 is GPU-only: set cluster.gpus_per_run (e.g. cluster=gpu)")
    if lrn.fsdp is False and (lrn.bf16 or lrn.world_size > 1):
        raise ConfigError("learner.fsdp=false: bf16 and world_size > 1 run through FSDP2 (leave learner.fsdp unset)")
    if lrn.world_size > 1 and gpus and gpus < lrn.world_size:
        raise ConfigError(f"learner.world_size={lrn.world_size} needs a GPU each: cluster.gpus_per_run is {gpus}")
    if gpus >= 1 and lrn.world_size < int(gpus):  # every GPU a learner rank: the sampler's engines span them too
        raise ConfigError(
            f"learner.world_size={lrn.world_size} leaves {int(gpus) - lrn.world_size} of "
            f"cluster.gpus_per_run={gpus:g} GPUs idle: "
            "leave learner.world_size unset (one rank per GPU) or lower cluster.gpus_per_run"
        )
    if SAMPLERS[smp.name].own_engine:  # its package importable is `machine.check_runnable`'s: `plan` does not need it
        if not 0 < smp.gpu_memory_utilization < 1:
            raise ConfigError(f"sampler.gpu_memory_utilization must be in (0, 1), got {smp.gpu_memory_utilization}")
        if smp.kv_cache_gib is not None and smp.kv_cache_gib <= 0:
            raise ConfigError(f"sampler.kv_cache_gib must be > 0 (null: the default), got {smp.kv_cache_gib}")
        if smp.tensor_parallel > 1 and (gpus or 0) < smp.tensor_parallel:
            raise ConfigError(
                f"sampler.tensor_parallel={smp.tensor_parallel} needs that many GPUs: cluster.gpus_per_run is {gpus}"
            )
        if smp.tensor_parallel > 1 and lrn.world_size % smp.tensor_parallel:
            raise ConfigError(
                f"sampler.tensor_parallel={smp.tensor_parallel} must divide learner.world_size={lrn.world_size} "
                f"(cluster.gpus_per_run={gpus:g}): each engine spans that many of the run's GPUs"
            )
        if cfg.flops.measure:
            raise ConfigError(
                "flops.measure counts torch operations in the run's process; sampler=vllm samples with its own "
                "kernels, which it cannot see: measure with sampler=hf"
            )


def _check_group(cfg: DictConfig) -> None:
    """Every n the config runs (a run's, the grid's) gives its algorithm a signal (`Algorithm.min_n`)."""
    need = ALGORITHMS[cfg.algo.name].min_n
    for name, values in (("n", [cfg.n]), ("grid.n", cfg.grid.n)):
        short = [v for v in values if v < need]
        if short:
            raise ConfigError(
                f"{name}={short[0]} with algo.name={cfg.algo.name}: its advantages are relative to each prompt's "
                "group of "
                f"n completions, and a group of {short[0]} has no learning signal (its advantage is always 0) yet "
                "would be "
                f"charged learning FLOPs; use n >= {need}, or an algorithm with a value head (ppo)"
            )


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} '{value}' is not one of: {', '.join(choices)}")
