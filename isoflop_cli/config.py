"""Compose a sweep config with Hydra and validate it against typed schemas before any compute.

Every problem with the user's input surfaces as one `ConfigError` line; the CLI turns it into
exit code 2. Nothing here imports torch or Ray.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Optional

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
import yaml
from hydra.errors import HydraException, MissingConfigException
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from isoflop_cli.algorithms import ALGORITHMS, LOSS_AGGS, spec
from isoflop_cli.flops import PROJECTIONS, Shape, UnsupportedModel
from isoflop_cli.schedule import DEFAULT_MARGIN, Schedule
from isoflop_cli.tracking import BACKENDS
from isoflop_cli import tasks
from isoflop_cli.recipe.rewards import NEEDS, REWARDS, load_function
from isoflop_cli.tasks.arith import ALPHABET

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
SWEEPS_DIR = ROOT / "sweeps"
DEFAULT_SWEEP = "default"


class ConfigError(ValueError):
    """Bad user input: reported as one line, exit code 2, nothing started."""


class LrScaling(str, enum.Enum):
    sqrt = "sqrt"
    linear = "linear"
    constant = "constant"


class BudgetUnit(str, enum.Enum):
    rollouts = "rollouts"
    flops = "flops"


@dataclass
class BudgetConfig:
    # rollouts: C = B_p * n * M, M fixed in advance. flops: a run stops when its own ledger's
    # flops_total reaches the largest budget, and its eval points sit on the FLOP axis.
    unit: BudgetUnit = BudgetUnit.rollouts


@dataclass
class BuildConfig:
    """How the embedded model is built locally: architecture and supervised warm start."""

    hidden_size: int = 128
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    steps: int = 400
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0


@dataclass
class ModelBuildConfig(BuildConfig):
    # The share of warm-start answers followed by a stray digit before eos: the base model then
    # often runs on past its answer, which the exact verifier rejects. Not learning when to stop is a
    # failure shared by every problem, which RL can fix at this scale (where a wrong digit is one
    # problem's own, and barely moves in a sweep's budget); see the README's embedded study.
    stray: float = 0.0


@dataclass
class ModelConfig:
    name: str = "tiny-arith"
    # A local Hugging Face checkpoint directory; null builds the embedded model (`build`) instead.
    # Required (no default): a model group that forgets it is an error, not the embedded model.
    path: Optional[str] = MISSING
    build: ModelBuildConfig = field(default_factory=ModelBuildConfig)


@dataclass
class TaskConfig:
    name: str = "arith"  # arith: synthetic sums (the embedded default); dataset: problems from local files
    max_new_tokens: int = 6
    val_fraction: float = 0.2  # share of the problems held out for validation (dataset: without task.val)
    # arith
    digits: list[int] = field(default_factory=lambda: [1, 2])  # operand sizes, drawn uniformly
    operands: int = 2
    ops: list[str] = field(default_factory=lambda: ["+"])
    reverse_answer: bool = True  # answer digits least-significant first: learnable left to right
    steps: bool = False  # show the work: one step per digit column before the answer (additions)
    # dataset (tasks/dataset.py): verl-style parquet, JSONL, or a datasets save_to_disk directory
    train: Optional[str] = None
    val: Optional[str] = None  # null: task.val_fraction of task.train, by a stable hash of the prompt
    prompt_key: str = "prompt"  # a string, or a list of chat messages
    answer_key: str = "reward_model.ground_truth"  # dotted: a path into nested columns
    max_prompt_tokens: int = 512  # longer prompts are dropped (and counted), never cut
    chat_template: str = "auto"  # auto: the tokenizer's chat template if it has one; none: plain text
    system_prompt: Optional[str] = None
    instruction: Optional[str] = None  # appended to the prompt, e.g. "Put the final answer within \\boxed{}."
    verifier: str = "math"  # math (math-verify), exact, choice


@dataclass
class RewardConfig:
    name: str = "sparse"  # see recipe/rewards.py
    format_weight: float = 0.2  # structured: the share of the reward for the answer's form
    fn: Optional[str] = None  # custom: package.module:function, called with (problems, completions) -> scores
    # prm: a local PRM checkpoint (a token classifier scoring step ends); null builds the embedded one.
    path: Optional[str] = None
    build: BuildConfig = field(default_factory=lambda: BuildConfig(hidden_size=64, intermediate_size=256, num_layers=2, num_heads=2, num_kv_heads=1, steps=300))


@dataclass
class AlgoConfig:
    name: str = "grpo"
    base_lr: float = 1e-3
    ref_batch: int = 64  # B at which base_lr applies
    lr_scaling: LrScaling = LrScaling.sqrt
    warmup_steps: int = 2
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    adv_eps: float = 1e-6
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 0.6
    top_p: float = 1.0
    # Updates per rollout batch: epochs over it, each in mini-batches. More than one reuses the batch
    # (off-policy, the clip matters, an old-policy pass is added): rho rises at a fixed budget. A
    # fraction below 1 trains (one pass) on that share of each group's completions: rho falls.
    epochs: float = 1
    minibatches: int = 1
    # The algorithm's own (algorithms.ALGORITHMS) unless set: grpo's are Dr. GRPO's with
    # std_norm=false and loss_agg=constant.
    std_norm: Optional[bool] = None  # group advantages divided by the group's std
    loss_agg: Optional[str] = None  # token-mean, seq-mean-token-mean or constant (1 / (rows * task.max_new_tokens))
    filter_zero_variance: bool = False  # leave out of the loss the groups whose rewards are all equal
    # Truncated importance sampling: each token's policy gradient times min(pi_learner / pi_sampler,
    # tis_cap), correcting the sampler/learner mismatch (vLLM vs FSDP); null: off.
    tis_cap: Optional[float] = 2.0
    # ppo: a value head on the policy's last hidden state, GAE over completion tokens.
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.1
    value_clip: float = 0.2


@dataclass
class LearnerConfig:
    # Processes of one run (started inside its Ray job, torchrun-style): data parallel, FSDP2-sharded.
    # null: one per GPU of cluster.gpus_per_run (every GPU a learner rank; vLLM engines span
    # sampler.tensor_parallel of them), one on CPU. Resolved when the config loads.
    world_size: Optional[int] = None
    fsdp: Optional[bool] = None  # shard with FSDP2 (default: when world_size > 1 or bf16; true: also on one GPU)
    # bf16 compute and sampling, fp32 weights and gradient reduction (FSDP2 mixed precision); GPU
    # only. null: on with GPUs, off on CPU (resolved when the config loads).
    bf16: Optional[bool] = None
    # Recompute layer activations in backward (not in the ledger). null: on with GPUs, off on CPU.
    activation_checkpointing: Optional[bool] = None
    micro_batch: int = 0  # rows per forward/backward on each rank (whole prompt groups), gradients accumulated; 0: all
    # Tokens per forward/backward on each rank (whole prompt groups, the positions the layout feeds
    # the model), gradients accumulated; 0: by learner.micro_batch. A group over it learns in pieces of its rows.
    max_tokens_per_micro_batch: int = 0
    # Completion tokens whose [tokens, vocab] logits one chunk holds when log-probs and entropy are
    # computed (each chunk recomputed in backward, so at most one chunk's logits live at a time).
    logit_chunk_tokens: int = 2048
    collective_timeout_s: float = 1800.0  # a rank waiting longer than this in a collective fails the run (NCCL watchdog; gloo)
    # Learning passes lay the batch out as prompt trees: each prompt once then its n completions,
    # no padding (`learner.Layout.tree`); false: the padded rows as sampled.
    shared_prompt: bool = True


@dataclass
class SamplerConfig:
    name: str = "hf"  # hf: Hugging Face generate in the learner's process; vllm: a vLLM engine beside the learner (GPU, or its CPU build)
    shared_prefill: bool = True  # hf: prefill each prompt once and share its KV cache over its n rollouts
    tensor_parallel: int = 1  # vllm: GPUs per engine
    gpu_memory_utilization: float = 0.4  # vllm on GPU: its share of the GPU (the learner has the rest); unused when kv_cache_gib is set
    kv_cache_gib: Optional[float] = None  # vllm: KV-cache size in GiB; null: gpu_memory_utilization on GPU, 1 GiB on CPU
    enforce_eager: Optional[bool] = None  # vllm: no compiled graphs; null: eager on CPU (compiling costs ~25 s per engine start), graphs on GPU
    sleep: bool = True  # vllm on GPU: release its memory while the learner trains (the CPU build has no sleep mode)


@dataclass
class CheckpointConfig:
    every: int = 50  # steps between saves of the full training state (0: never); a restarted run resumes
    # Keep the state at a run's end too: a later sweep with larger budgets continues the run from
    # it instead of starting over (paused and stopped runs keep theirs anyway). Costs a checkpoint per run on disk.
    keep_final: bool = False


@dataclass
class EvalConfig:
    k: int = 4
    samples: int = 4  # completions per validation problem (m >= k; unbiased estimators)
    problems: int = 64  # validation problems (and at most this many of each held-out set)
    # Held-out sets, name -> file (read like task=dataset with the task's keys): downstream_<name>_pass@1, _best@k
    sets: dict[str, str] = field(default_factory=dict)
    # Reward models, name -> checkpoint (a sequence classifier): judge_<name>, the mean score; FLOPs in flops_eval
    judges: dict[str, str] = field(default_factory=dict)


@dataclass
class GridConfig:
    n: list[int] = field(default_factory=lambda: [4, 8, 16])
    B_p: list[int] = field(default_factory=lambda: [4, 8])
    seed: list[int] = field(default_factory=lambda: [0])
    # Further axes: a config group (`model`, `reward`, `algo`, `task`) or a dotted key -> values.
    axes: dict[str, list[Any]] = field(default_factory=dict)
    budgets: list[float] = field(default_factory=lambda: [512, 1024, 2048])  # in grid.budget.unit
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    max_batch: int = 65536  # B_max: cells with B_p * n above it are dropped
    min_steps: int = 1
    eval_points: int = 8  # log-spaced compute checkpoints up to the largest budget
    # full: every cell runs to the largest budget. adaptive: every cell runs to the smallest budget,
    # then continues past each budget only while it can still reach the frontier (schedule.py).
    schedule: Schedule = Schedule.full
    margin: float = DEFAULT_MARGIN  # adaptive: how wide the rule's bounds on each curve are, in sd of the metric's noise


@dataclass
class SlurmConfig:
    """cluster.launcher=slurm: each run a SLURM job through submitit (slurm.py)."""

    executor: str = "slurm"  # slurm (sbatch; jobs survive the CLI), or local: the same submitit calls as local processes (no SLURM: tests)
    partition: Optional[str] = None  # null: the cluster's default
    time_min: int = 4320  # each job's time limit; a run it cuts is retried by the sweep (cluster.max_attempts) from its checkpoint
    requeue: bool = True  # SLURM requeues a preempted job (the run resumes from its checkpoint)


@dataclass
class ClusterConfig:
    address: Optional[str] = None  # Ray Jobs address (http://HEAD:8265); null: $RAY_ADDRESS or a local head
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    gpu_memory_gib: Optional[float] = None  # each GPU's memory (H200: 141); `plan` refuses cells predicted not to fit; null: unchecked
    local_cpus: Optional[int] = None  # CPUs a local head offers (default: all of this machine)
    max_concurrent: Optional[int] = None  # jobs in flight (default: what the resources allow)
    python: Optional[str] = None  # interpreter on the nodes (default: this one)
    # Jobs per run in one sweep: a job that fails for a reason that may pass (a lost node, a killed
    # process, an OOM) is resubmitted after a wait and resumes from its checkpoint; a user error
    # (exit 2) or the same error twice is not. 1: never retry.
    max_attempts: int = 3
    poll_s: float = 1.0
    log_every_s: float = 5.0  # a running job's log is copied into its run dir (job.log) this often
    # Probe the nodes before the first run (preflight.py); false skips it, e.g. on an autoscaling
    # cluster whose GPU nodes come up on demand (the probe sees only the nodes that are up).
    preflight: bool = True
    launcher: str = "ray"  # ray (cluster.address, $RAY_ADDRESS or a local head) or slurm (cluster.slurm)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)


@dataclass
class LoraConfig:
    rank: int = 0  # 0: full fine-tuning; > 0: peft LoRA adapters, the backbone frozen
    alpha: float = 16.0
    targets: list[str] = field(default_factory=lambda: list(PROJECTIONS))


@dataclass
class FlopsConfig:
    measure: bool = False  # also count with torch's FlopCounterMode, beside the analytic ledger (slower)
    peak_tflops: Optional[float] = None  # the device's peak, for gpu_hours (e.g. 989 for an H200, dense bf16)
    utilization: Optional[float] = None  # the share of that peak a run achieves (MFU), for gpu_hours


@dataclass
class CalibrateConfig:
    """`isoflop calibrate`: the base model's pass rate per problem of task.train, and the sets cut from it."""

    samples: int = 16  # completions per problem (the first seed study's avg@16)
    easy: list[float] = field(default_factory=lambda: [0.3, 0.6])  # pass-rate band of easy.parquet (bounds included)
    hard: list[float] = field(default_factory=lambda: [0.0, 0.0625])  # pass-rate band of hard.parquet
    shard: int = 512  # problems per Ray job
    rows: Optional[list[int]] = None  # set by calibrate for each job: its rows [start, stop) of task.train


@dataclass
class TrackingConfig:
    """Experiment trackers for every eval row of every run (see tracking.py); off by default."""

    backends: list[str] = field(default_factory=list)  # any of wandb, mlflow, tensorboard
    project: str = "isoflop"  # the wandb project and the MLflow experiment
    dir: Optional[str] = None  # offline files (wandb offline runs, MLflow file store, TensorBoard events); null: <sweep dir>/tracking
    wandb_mode: str = "offline"  # offline (upload later with `wandb sync`) or online
    mlflow_uri: Optional[str] = None  # an MLflow server or database URI; null: a file store under tracking.dir


@dataclass
class SweepConfig:
    name: str = DEFAULT_SWEEP
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    flops: FlopsConfig = field(default_factory=FlopsConfig)
    calibrate: CalibrateConfig = field(default_factory=CalibrateConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    # The values of one run (`isoflop run`); a sweep sets them per cell from the grid.
    n: int = 8
    B_p: int = 8
    seed: int = 0


GROUPS = ("model", "task", "reward", "algo", "grid", "cluster", "sampler")
SAMPLERS = ("hf", "vllm")


def resolve_sweep_path(name_or_path: str | None) -> Path:
    """A ready-made sweep name (`sweeps/NAME.yaml`) or a path to a YAML file."""
    if name_or_path is None:
        name_or_path = DEFAULT_SWEEP
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return path.resolve()
    path = SWEEPS_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown sweep config '{name_or_path}' (ready-made: {known})")
    return path


def load(config: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose `config` with `overrides`, merge into the schema and check values."""
    path = resolve_sweep_path(config)
    _check_not_empty(path)
    cfg = _compose(path, list(overrides))
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(SweepConfig), cfg)
        OmegaConf.resolve(cfg)  # a broken ${...} interpolation fails here, not in the middle of a run
    except OmegaConfBaseException as e:
        raise ConfigError(_omegaconf_message(e)) from None
    OmegaConf.set_readonly(cfg, False)
    _absolute_paths(cfg)
    resolve_device_defaults(cfg)
    check(cfg)
    return cfg


def resolve_device_defaults(cfg: DictConfig) -> None:
    """The learner knobs whose default depends on the run's GPUs (null in the schema), set to what
    the run will use, so that run identity and `plan` see the values the run computes with: one
    learner rank per GPU, bf16 and activation checkpointing with GPUs; one rank in fp32 without."""
    gpus = cfg.cluster.gpus_per_run
    learner = cfg.learner
    if learner.world_size is None:
        learner.world_size = max(1, int(gpus))
    if learner.bf16 is None:
        learner.bf16 = bool(gpus)
    if learner.activation_checkpointing is None:
        learner.activation_checkpointing = bool(gpus)


PATH_KEYS = ("model.path", "reward.path", "task.train", "task.val", "tracking.dir")


def _absolute_paths(cfg: DictConfig) -> None:
    """Files the runs read, as absolute paths: a run is a Ray job whose working directory is not
    the one the sweep was started from."""
    keys = [*PATH_KEYS, *(f"eval.{part}.{name}" for part in ("sets", "judges") for name in cfg.eval[part])]
    for key in keys:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        if isinstance(value, str) and value:
            OmegaConf.update(cfg, key, str(Path(value).expanduser().absolute()), merge=False)


def with_values(cfg: DictConfig, values: dict[str, Any], checked: bool = True) -> DictConfig:
    """A copy of `cfg` with dotted keys set (a grid axis's values), checked as an override would be
    (`checked=False`: values already checked on the same config)."""
    out = cfg.copy()
    for key, value in values.items():
        try:
            OmegaConf.update(out, key, value, merge=False)
        except OmegaConfBaseException as e:
            raise ConfigError(f"grid.axes.{key}: {_omegaconf_message(e)}") from None
    _absolute_paths(out)
    if checked:
        check(out)
    return out


def _check_not_empty(path: Path) -> None:
    """An empty config file (or one of comments only) would compose to the bare schema and fail on
    whatever the schema leaves unset: say what is wrong instead."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return  # _compose names the syntax error
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty: start it with a defaults list (see sweeps/default.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must be a YAML mapping (defaults, name, grid ...), got a {type(data).__name__}")


def _compose(path: Path, overrides: list[str]) -> DictConfig:
    # The schema is the base of every sweep (its defaults list starts with `isoflop`), so Hydra
    # itself rejects unknown keys and wrong types while it composes.
    ConfigStore.instance().store(name="isoflop", node=SweepConfig)
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
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    cfg.pop("hydra", None)
    return cfg


def _compose_message(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[1].startswith("To append"):  # a key the schema lacks; keep Hydra's `+key=` hint
        cause = e.__cause__
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None) and "axes" not in lines[0]:
            return f"unknown config key '{cause.full_key}'"
        return " ".join(lines[:2])
    cause = e.__cause__ or e.__context__
    key = getattr(cause, "full_key", None) if isinstance(cause, OmegaConfBaseException) else None
    if key and key.startswith("grid.axes.") and "typing.List" in str(cause):
        return f"{key} must be a list of values (one cell each), got {getattr(cause, 'value', None)}"
    if key:  # e.g. a typo inside a config file
        where = lines[0] if lines[0].startswith("Error merging override") else lines[0].split(":")[0]
        return f"{where}: {_omegaconf_message(cause)}"
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


def _omegaconf_message(e: OmegaConfBaseException) -> str:
    msg = _first_line(e)
    key = getattr(e, "full_key", None)
    if "not in struct" in msg or "Key '" in msg and "not in" in msg:
        return f"unknown config key '{key}'"
    if key:
        return f"bad value for '{key}': {msg}"
    return msg


def check(cfg: DictConfig, axes: bool = True) -> None:
    """Value checks the schema's types cannot express. `axes=False` leaves out grid.axes (checked
    once with the sweep; grid.expand checks each combination of their values with it)."""

    def positive(name: str, values: list[int] | int) -> None:
        for v in values if isinstance(values, (list, tuple)) or OmegaConf.is_list(values) else [values]:
            if not isinstance(v, (int, float)) or not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{name} must be a finite number > 0, got {v}")

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", cfg.name):
        raise ConfigError(f"name '{cfg.name}' must be a plain directory name (letters, digits, '.', '_', '-')")

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
        raise ConfigError("grid.schedule=adaptive decides at each budget which cells go on: give grid.budgets two or more values")
    if g.margin < 0:
        raise ConfigError(f"grid.margin must be >= 0 (standard deviations of the metric's noise), got {g.margin}")
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
        if key not in GROUPS and OmegaConf.select(cfg, key, default="__missing__") == "__missing__":
            raise ConfigError(f"grid.axes.{key}: unknown config key '{key}'")
        if key in GROUPS and any(OmegaConf.is_config(v) for v in values):
            raise ConfigError(f"grid.axes.{key} takes names of {key} configs (conf/{key}/NAME.yaml), got {_show(next(v for v in values if OmegaConf.is_config(v)))}")
        _check_no_repeats(f"grid.axes.{key}", values)
    positive("eval.k", cfg.eval.k)
    positive("eval.problems", cfg.eval.problems)
    if cfg.eval.samples < cfg.eval.k:
        raise ConfigError(f"eval.samples ({cfg.eval.samples}) must be >= eval.k ({cfg.eval.k})")
    a = cfg.algo
    for key in ("weight_decay", "clip_low", "clip_high", "adv_eps", "kl_coef", "entropy_coef", "vf_coef", "warmup_steps"):
        if not (math.isfinite(a[key]) and a[key] >= 0):
            raise ConfigError(f"algo.{key} must be a finite number >= 0, got {a[key]}")
    for key in ("max_grad_norm", "value_clip"):
        positive(f"algo.{key}", a[key])
    if a.clip_low > 1:
        raise ConfigError(f"algo.clip_low must be <= 1 (the ratio's floor is 1 - clip_low), got {a.clip_low}")
    positive("algo.ref_batch", cfg.algo.ref_batch)
    positive("algo.epochs", cfg.algo.epochs)
    if cfg.algo.epochs > 1 and not float(cfg.algo.epochs).is_integer():
        raise ConfigError(f"algo.epochs must be whole passes (1, 2, ...) or a share of each group's completions below 1, got {cfg.algo.epochs}")
    positive("algo.minibatches", cfg.algo.minibatches)
    positive("algo.base_lr", cfg.algo.base_lr)
    if not (0 < cfg.algo.temperature and math.isfinite(cfg.algo.temperature)):
        raise ConfigError(f"algo.temperature must be > 0, got {cfg.algo.temperature}")
    if not 0 < cfg.algo.top_p <= 1:
        raise ConfigError(f"algo.top_p must be in (0, 1], got {cfg.algo.top_p}")
    check_choice("algo.name", cfg.algo.name, tuple(ALGORITHMS))
    if cfg.algo.std_norm is not None and ALGORITHMS[cfg.algo.name].advantage != "group":
        raise ConfigError(f"algo.std_norm divides group advantages by the group's std; {cfg.algo.name}'s advantages are "
                          f"{ALGORITHMS[cfg.algo.name].advantage}'s (leave it null)")
    if cfg.algo.loss_agg is not None:
        check_choice("algo.loss_agg", cfg.algo.loss_agg, LOSS_AGGS)
    positive("task.max_new_tokens", cfg.task.max_new_tokens)
    if cfg.eval.problems > MAX_EVAL_PROBLEMS:
        raise ConfigError(f"eval.problems must be <= {MAX_EVAL_PROBLEMS:,} (every eval point samples eval.samples completions of each), got {cfg.eval.problems}")
    if OmegaConf.is_missing(cfg.model, "path"):
        raise ConfigError(f"model '{cfg.model.name}' has no checkpoint path: set model.path=/path/to/checkpoint, or model=tiny-arith (the embedded model)")
    task = _task(cfg)
    _check_reward(cfg, task)
    _check_eval_sets(cfg)
    for part in ("model", "reward"):
        if cfg[part].path is not None:
            hf_config = _check_checkpoint(f"{part}.path", Path(cfg[part].path).expanduser())
            positions, what = hf_config.get("max_position_embeddings"), f"{part}.path {cfg[part].path}"
        else:
            positions, what = EMBEDDED_MAX_POSITIONS, f"the embedded {'model' if part == 'model' else 'PRM'} ({part}.build)"
            if part == "model" or cfg.reward.name == "prm":  # the embedded model (and PRM) this run builds
                _check_build(f"{part}.build", cfg[part].build)
        if part == "model" or cfg.reward.name == "prm":
            _check_positions(cfg, task.max_prompt_tokens, positions, what, scored=part == "reward")
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
    check_choice("cluster.launcher", c.launcher, ("ray", "slurm"))
    check_choice("cluster.slurm.executor", c.slurm.executor, ("slurm", "local"))
    positive("cluster.slurm.time_min", c.slurm.time_min)
    positive("cluster.max_attempts", c.max_attempts)
    if not (math.isfinite(c.gpus_per_run) and c.gpus_per_run >= 0):
        raise ConfigError(f"cluster.gpus_per_run must be >= 0, got {c.gpus_per_run}")
    for key in ("local_cpus", "max_concurrent"):
        if c[key] is not None:
            positive(f"cluster.{key}", c[key])
    if not (c.address or os.environ.get("RAY_ADDRESS")):  # a remote cluster's interpreter and cache live on its nodes
        if c.python is not None:
            _check_executable("cluster.python", c.python)
        if cfg.model.path is None or (cfg.reward.name == "prm" and cfg.reward.path is None):
            _check_model_cache()
    check_engine(cfg)
    _check_tracking(cfg.tracking)
    plain = lambda node: OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node  # noqa: E731
    _check_finite({key: plain(cfg[key]) for key in cfg if key != "grid"}, "")
    _check_finite({key: plain(g[key]) for key in g if axes or key != "axes"}, "grid")


MAX_EVAL_PROBLEMS = 100_000
EMBEDDED_MAX_POSITIONS = 64  # the embedded models' context (recipe.checkpoint.qwen2_config)


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
            raise ConfigError(f"{name} lists {_show(value)} twice: each value is one cell of the sweep; drop the repeat")
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


def _check_executable(name: str, value: str) -> None:
    if os.sep in value or value.startswith("~"):
        path = Path(value).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"{name} {value} is not an executable file")
    elif shutil.which(value) is None:
        raise ConfigError(f"{name} {value} is not on PATH")


def _check_model_cache() -> None:
    """The embedded models are built into ISOFLOP_CACHE (recipe.checkpoint.cache_dir): a directory,
    or one that can be made."""
    root = Path(os.environ.get("ISOFLOP_CACHE", Path.home() / ".cache" / "isoflop")).expanduser()
    if root.exists():
        if not root.is_dir():
            raise ConfigError(f"the model cache {root} (ISOFLOP_CACHE) is not a directory")
        return
    parent = next(p for p in root.parents if p.exists())
    if not (parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)):
        raise ConfigError(f"the model cache {root} (ISOFLOP_CACHE) cannot be made: {parent} is not a writable directory")


def _task(cfg: DictConfig) -> tasks.Task:
    """The run's task, built (a dataset task reads and checks its files) and able to give what a run
    draws; the embedded model reads only its own few characters."""
    for part in ("task", "reward"):
        missing = [key for key in cfg[part] if OmegaConf.is_missing(cfg[part], key)]
        if missing:
            raise ConfigError(f"{part}={cfg[part].name} needs {part}.{missing[0]}=... (see conf/{part}/{cfg[part].name}.yaml)")
    try:
        task = tasks.make(cfg.task)
        if cfg.model.path is None:
            task.check_alphabet(ALPHABET, "the embedded model")
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
                raise ConfigError(f"eval.{part} name '{name}' must be letters, digits, '_' or '-' (it names a metrics column)")
    for name, path in cfg.eval.sets.items():
        try:
            held = held_out(cfg.task, path)
            if cfg.model.path is None:
                held.check_alphabet(ALPHABET, "the embedded model")
        except tasks.TaskError as e:
            raise ConfigError(f"eval.sets.{name}: {e}") from None
    for name, path in cfg.eval.judges.items():
        _check_checkpoint(f"eval.judges.{name}", Path(path))


def _check_reward(cfg: DictConfig, task: tasks.Task) -> None:
    """A known reward, one the task can score, and a custom function that imports."""
    r = cfg.reward
    check_choice("reward.name", r.name, tuple(REWARDS))
    need = NEEDS.get(r.name)
    if need and not getattr(task, need):
        if need == "has_steps":
            raise ConfigError(f"reward {r.name} scores steps: use task=arith-steps (task.steps=true)")
        raise ConfigError(f"reward {r.name} gives partial credit, which task {cfg.task.name} does not define: use reward=sparse or reward=structured")
    if not 0 <= r.format_weight <= 1:
        raise ConfigError(f"reward.format_weight must be in [0, 1], got {r.format_weight}")
    if (r.name == "custom") != (r.fn is not None):
        raise ConfigError("reward.fn=package.module:function goes with reward=custom (and reward=custom needs it)")
    if r.fn is not None:
        try:
            load_function(r.fn)
        except Exception as e:  # the user's module: whatever its import raises
            raise ConfigError(f"reward.fn '{r.fn}' cannot be loaded: {type(e).__name__}: {e}") from None


def _check_positions(cfg: DictConfig, prompt: int, positions: Any, what: str, scored: bool) -> None:
    """The longest prompt and its completion (a PRM also scores an end token) fit the model's context."""
    if not isinstance(positions, int) or isinstance(positions, bool):
        return  # the checkpoint does not say
    new = cfg.task.max_new_tokens
    need = prompt + new + scored
    if need > positions:
        room = positions - prompt - scored
        fix = f"at most task.max_new_tokens={room}" if room > 0 else ("fewer task.digits or task.operands" if cfg.task.name == "arith" else "a lower task.max_prompt_tokens")
        longest = f"the longest prompt ({prompt} tokens)" if cfg.task.name == "arith" else f"a prompt at task.max_prompt_tokens={prompt}"
        raise ConfigError(f"task.max_new_tokens={new}: {longest} and its completion need {need} positions, "
                          f"above the {positions} of {what}; {fix}")


def _check_checkpoint(name: str, path: Path) -> dict:
    """A local Hugging Face checkpoint of a family the ledger counts; its config.json. Its weights are
    `check_runnable`'s: planning reads the config alone (a 70B sweep is planned without its weights)."""
    if not (path / "config.json").is_file():
        raise ConfigError(f"{name} {path} is not a Hugging Face checkpoint (no config.json)")
    try:
        config = json.loads((path / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError("config.json does not hold an object")
        shape = Shape.from_config(config)
        if not all(isinstance(v, int) and v > 0 for v in (shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.vocab)):
            raise ValueError("config.json lacks the model's sizes (num_hidden_layers, hidden_size, ...)")
    except (UnsupportedModel, ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{name} {path}: {e}") from None
    return config


def check_runnable(cfgs: Iterable[DictConfig]) -> None:
    """What starting compute needs beyond what `plan` reads, for the runs of these configs (one per
    axes combination of a sweep): each checkpoint's weights (model.path, reward.path, the judges),
    and vLLM importable where the runs start (sampler=vllm). `plan` needs neither: it reads each
    checkpoint's config.json, and plans a vLLM sweep from a machine without vLLM."""
    checked: set = set()
    for cfg in cfgs:
        paths = {f"{part}.path": cfg[part].path for part in ("model", "reward") if cfg[part].path is not None}
        paths.update({f"eval.judges.{name}": path for name, path in cfg.eval.judges.items()})
        for name, path in paths.items():
            if path not in checked:
                _check_weights(name, Path(path).expanduser())
                checked.add(path)
        if cfg.sampler.name == "vllm" and ("vllm", cfg.cluster.python) not in checked:
            check_vllm(cfg.cluster.python)
            checked.add(("vllm", cfg.cluster.python))


def _check_weights(name: str, path: Path) -> None:
    """A checkpoint's weight files (safetensors or PyTorch bins), which a run loads."""
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        raise ConfigError(f"{name} {path} has no weights (*.safetensors or pytorch_model*.bin): "
                          "`plan` reads its config.json alone, a run needs the weights")


def _check_build(name: str, b: DictConfig) -> None:
    """The sizes of a model built locally: heads divide the width, key/value heads the heads."""
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "batch_size"):
        if b[key] <= 0:
            raise ConfigError(f"{name}.{key} must be > 0, got {b[key]}")
    if b.hidden_size % b.num_heads or b.num_heads % b.num_kv_heads:
        raise ConfigError(f"{name}: num_heads must divide hidden_size and num_kv_heads num_heads, got "
                          f"{b.hidden_size}, {b.num_heads}, {b.num_kv_heads}")
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
        raise ConfigError("learner.micro_batch, learner.max_tokens_per_micro_batch and checkpoint.every must be >= 0 (0: off)")
    if lrn.logit_chunk_tokens < 1:
        raise ConfigError(f"learner.logit_chunk_tokens must be >= 1, got {lrn.logit_chunk_tokens}")
    if not (math.isfinite(lrn.collective_timeout_s) and lrn.collective_timeout_s > 0):
        raise ConfigError(f"learner.collective_timeout_s must be a finite number > 0, got {lrn.collective_timeout_s}")
    check_choice("sampler.name", smp.name, SAMPLERS)
    gpus = cfg.cluster.gpus_per_run
    if lrn.bf16 and not gpus:
        raise ConfigError("learner.bf16 is GPU-only: set cluster.gpus_per_run (e.g. cluster=gpu)")
    if lrn.fsdp is False and (lrn.bf16 or lrn.world_size > 1):
        raise ConfigError("learner.fsdp=false: bf16 and world_size > 1 run through FSDP2 (leave learner.fsdp unset)")
    if lrn.world_size > 1 and gpus and gpus < lrn.world_size:
        raise ConfigError(f"learner.world_size={lrn.world_size} needs a GPU each: cluster.gpus_per_run is {gpus}")
    if gpus >= 1 and lrn.world_size < int(gpus):  # every GPU a learner rank: the sampler's engines span them too
        raise ConfigError(f"learner.world_size={lrn.world_size} leaves {int(gpus) - lrn.world_size} of cluster.gpus_per_run={gpus:g} GPUs idle: "
                          "leave learner.world_size unset (one rank per GPU) or lower cluster.gpus_per_run")
    if smp.name == "vllm":  # vLLM importable is `check_runnable`'s: `plan` does not need it
        if not 0 < smp.gpu_memory_utilization < 1:
            raise ConfigError(f"sampler.gpu_memory_utilization must be in (0, 1), got {smp.gpu_memory_utilization}")
        if smp.kv_cache_gib is not None and smp.kv_cache_gib <= 0:
            raise ConfigError(f"sampler.kv_cache_gib must be > 0 (null: the default), got {smp.kv_cache_gib}")
        if smp.tensor_parallel > 1 and (gpus or 0) < smp.tensor_parallel:
            raise ConfigError(f"sampler.tensor_parallel={smp.tensor_parallel} needs that many GPUs: cluster.gpus_per_run is {gpus}")
        if smp.tensor_parallel > 1 and lrn.world_size % smp.tensor_parallel:
            raise ConfigError(f"sampler.tensor_parallel={smp.tensor_parallel} must divide learner.world_size={lrn.world_size} "
                              f"(cluster.gpus_per_run={gpus:g}): each engine spans that many of the run's GPUs")
        if cfg.flops.measure:
            raise ConfigError("flops.measure counts torch operations in the run's process; sampler=vllm samples with its own "
                              "kernels, which it cannot see: measure with sampler=hf")


def check_vllm(python: str | None) -> None:
    """vLLM must import where the runs start: this Python, or cluster.python when it is set (which
    the cluster checks found to run)."""
    if not python:
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("sampler=vllm needs vLLM in this environment: pip install 'isoflop[vllm]' on GPU nodes, "
                              "`make setup-vllm` for the CPU build (then run .venv-vllm/bin/isoflop), or use sampler=hf")
        return
    probe = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                           capture_output=True)
    if probe.returncode:
        raise ConfigError(f"sampler=vllm needs vLLM in cluster.python ({python}): it does not import there")


def sharded(cfg: DictConfig) -> bool:
    """Whether a run's learner is FSDP2-sharded: several processes, asked for, or bf16 (its mixed precision)."""
    return cfg.learner.world_size > 1 or bool(cfg.learner.fsdp) or cfg.learner.bf16


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} '{value}' is not one of: {', '.join(choices)}")


def check_writable(out: Path) -> Path:
    """Create `out` if needed; fail fast if results could not be written there."""
    out = out.expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
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


SWEEP_ONLY = ("grid", "cluster", "name", "calibrate", "tracking")  # config parts that do not change what a run computes


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
    custom reward, no held-out sets or judges, vLLM's engine knobs left at null, no stray digits in
    the warm start) or do not change what it computes (whether its last checkpoint is kept): options
    added later leave earlier run ids as they were. A new copy where it drops any."""
    task = {k: v for k, v in content["task"].items() if k in tasks.config_keys(content["task"]["name"])}
    reward = {k: v for k, v in content["reward"].items() if not (k == "fn" and v is None)}
    evaluation = {k: v for k, v in content["eval"].items() if not (k in ("sets", "judges") and not v)}
    epochs = content["algo"]["epochs"]  # whole epochs hash as the integers they were before fractions
    algo = {**content["algo"], "epochs": int(epochs) if float(epochs).is_integer() else epochs}
    if algo["name"] in ALGORITHMS:  # the knobs as the run applies them; std_norm only where it departs from the algorithm's own
        effective = spec(SimpleNamespace(**algo))
        algo["loss_agg"] = effective.loss_agg
        algo.pop("std_norm", None)
        if effective.std_norm != ALGORITHMS[algo["name"]].std_norm:
            algo["std_norm"] = effective.std_norm
    sampler = {k: v for k, v in content["sampler"].items() if not (k in ("kv_cache_gib", "enforce_eager") and v is None)}
    build = {k: v for k, v in content["model"]["build"].items() if not (k == "stray" and v == 0)}
    kept = {k: v for k, v in content["checkpoint"].items() if k != "keep_final"}  # what a run leaves, not what it computes
    # How the learner splits its work in memory and time, not what it computes: a token-budget
    # micro-batch only when set, the logit chunk and the collective timeout never.
    learner = {k: v for k, v in content["learner"].items()
               if k not in ("logit_chunk_tokens", "collective_timeout_s") and not (k == "max_tokens_per_micro_batch" and v == 0)}
    return {**content, "task": task, "reward": reward, "eval": evaluation, "algo": algo, "sampler": sampler,
            "model": {**content["model"], "build": build}, "checkpoint": kept, "learner": learner}


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
