"""The sweep config's schema: every knob with its default and what it does, as typed dataclasses
Hydra composes onto (unknown keys and wrong types fail there). Plain data: nothing here reads
files or imports torch, Ray or scipy.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig

from isoflop_cli.flops import PROJECTIONS

DEFAULT_SWEEP = "default"
DEFAULT_MARGIN = (
    2.5  # adaptive: in standard deviations of the metric's noise; chosen from replays (README: Adaptive sweeps)
)
# adaptive: in the metric's units; a cell that could beat the frontier by no more stops (README: Adaptive sweeps)
DEFAULT_INDIFFERENCE = 0.01


class Schedule(str, enum.Enum):
    full = "full"
    adaptive = "adaptive"


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
    # A local Hugging Face checkpoint directory, or a Hub id org/name[@revision] found in the local
    # Hugging Face cache (hub.py); null builds the embedded model (`build`) instead.
    # Required (no default): a model group that forgets it is an error, not the embedded model.
    path: str | None = MISSING
    download: bool = (
        False  # a Hub id not in the local cache is downloaded (never with HF_HUB_OFFLINE=1); false: refused
    )
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
    # dataset (tasks/dataset.py): verl-style parquet, JSONL, or a datasets save_to_disk directory;
    # or a Hub data set org/name[@revision] (a file in it: hf://datasets/org/name[@revision]/path) in
    # the local Hugging Face cache (hub.py)
    train: str | None = None
    val: str | None = None  # null: task.val_fraction of task.train, by a stable hash of the prompt
    prompt_key: str = "prompt"  # a string, or a list of chat messages
    answer_key: str = "reward_model.ground_truth"  # dotted: a path into nested columns
    max_prompt_tokens: int = 512  # longer prompts are dropped (and counted), never cut
    chat_template: str = "auto"  # auto: the tokenizer's chat template if it has one; none: plain text
    system_prompt: str | None = None
    instruction: str | None = None  # appended to the prompt, e.g. "Put the final answer within \\boxed{}."
    verifier: str = "math"  # math (math-verify), exact, choice
    download: bool = (
        False  # a Hub data set (task.train, task.val, eval.sets) not in the local cache is downloaded; false: refused
    )


@dataclass
class RewardConfig:
    name: str = "sparse"  # see rewards.py
    format_weight: float = 0.2  # structured: the share of the reward for the answer's form
    fn: str | None = None  # custom: package.module:function or /path/to/file.py:function (rewards.py)
    style: str = "auto"  # custom: its signature, verl, trl or isoflop (rewards.STYLES); auto: told from its parameters
    # prm: a local PRM checkpoint (a token classifier scoring step ends); null builds the embedded one.
    path: str | None = None
    build: BuildConfig = field(
        default_factory=lambda: BuildConfig(
            hidden_size=64, intermediate_size=256, num_layers=2, num_heads=2, num_kv_heads=1, steps=300
        )
    )
    # A reward model's (the PRM's, eval.judges') padded positions per forward: rows at the batch's
    # width, a row over it alone (`recipe.prm.micro_batches`); 0: the whole batch in one forward.
    max_tokens_per_forward: int = 32768


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
    # fraction below 1 trains (one pass) on that share of each group's completions, those whose
    # rewards vary the most (max-variance down-sampling): rho falls.
    epochs: float = 1
    minibatches: int = 1
    # The algorithm's own (algorithms.ALGORITHMS) unless set: grpo's are Dr. GRPO's with
    # std_norm=false and loss_agg=constant.
    std_norm: bool | None = None  # group advantages divided by the group's std
    loss_agg: str | None = None  # token-mean, seq-mean-token-mean or constant (1 / (rows * task.max_new_tokens))
    filter_zero_variance: bool = False  # leave out of the loss the groups whose rewards are all equal
    # Truncated importance sampling: each token's policy gradient times min(pi_learner / pi_sampler,
    # tis_cap), correcting the sampler/learner mismatch (vLLM vs FSDP); null: off.
    tis_cap: float | None = 2.0
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
    world_size: int | None = None
    fsdp: bool | None = None  # shard with FSDP2 (default: when world_size > 1 or bf16; true: also on one GPU)
    # bf16 compute and sampling, fp32 weights and gradient reduction (FSDP2 mixed precision); GPU
    # only. null: on with GPUs, off on CPU (resolved when the config loads).
    bf16: bool | None = None
    # Recompute layer activations in backward (not in the ledger). null: on with GPUs, off on CPU.
    activation_checkpointing: bool | None = None
    micro_batch: int = 0  # rows per forward/backward on each rank (whole prompt groups), gradients accumulated; 0: all
    # Tokens per forward/backward on each rank (whole prompt groups, the positions the layout feeds
    # the model), gradients accumulated; 0: by learner.micro_batch. A group over it learns in pieces of its rows.
    max_tokens_per_micro_batch: int = 0
    # Completion tokens whose [tokens, vocab] logits one chunk holds when log-probs and entropy are
    # computed (each chunk recomputed in backward, so at most one chunk's logits live at a time).
    logit_chunk_tokens: int = 2048
    collective_timeout_s: float = (
        1800.0  # a rank waiting longer than this in a collective fails the run (NCCL watchdog; gloo)
    )
    # Learning passes lay the batch out as prompt trees: each prompt once then its n completions,
    # no padding (`learner.Layout.tree`); false: the padded rows as sampled.
    shared_prompt: bool = True


@dataclass
class SamplerConfig:
    # hf: Hugging Face generate in the learner's process; vllm: a vLLM engine beside the learner (GPU, or its CPU build)
    name: str = "hf"
    shared_prefill: bool = True  # hf: prefill each prompt once and share its KV cache over its n rollouts
    tensor_parallel: int = 1  # vllm: GPUs per engine
    gpu_memory_utilization: float = (
        0.4  # vllm on GPU: its share of the GPU (the learner has the rest); unused when kv_cache_gib is set
    )
    kv_cache_gib: float | None = None  # vllm: KV-cache size in GiB; null: gpu_memory_utilization on GPU, 1 GiB on CPU
    enforce_eager: bool | None = (
        None  # vllm: no compiled graphs; null: eager on CPU (compiling costs ~25 s per engine start), graphs on GPU
    )
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
    # then continues past each budget only while it can still reach the frontier (fit/schedule.py).
    schedule: Schedule = Schedule.full
    margin: float = (
        DEFAULT_MARGIN  # adaptive: how wide the rule's bounds on each curve are, in sd of the metric's noise
    )
    indifference: float = (
        DEFAULT_INDIFFERENCE  # adaptive: a cell whose best case beats the frontier's worst by no more than this stops
    )


@dataclass
class SlurmConfig:
    """cluster.launcher=slurm: each run a SLURM job through submitit (slurm.py)."""

    # slurm (sbatch; jobs survive the CLI), or local: the same submitit calls as local processes (no SLURM: tests)
    executor: str = "slurm"
    partition: str | None = None  # null: the cluster's default
    time_min: int = (
        4320  # each job's time limit; a run it cuts is retried by the sweep (cluster.max_attempts) from its checkpoint
    )
    requeue: bool = True  # SLURM requeues a preempted job (the run resumes from its checkpoint)


@dataclass
class ClusterConfig:
    address: str | None = None  # Ray Jobs address (http://HEAD:8265); null: $RAY_ADDRESS or a local head
    cpus_per_run: float = 1.0
    gpus_per_run: float = 0.0
    gpu_memory_gib: float | None = (
        None  # each GPU's memory (H200: 141); `plan` refuses cells predicted not to fit; null: unchecked
    )
    # Each node's memory for CPU runs (cluster.gpus_per_run = 0): `plan` refuses a run whose learner
    # state alone does not fit (memory.check_node); null: this machine's where the runs run here (a
    # local head, SLURM's local executor), else unchecked.
    node_memory_gib: float | None = None
    local_cpus: int | None = None  # CPUs a local head offers (default: all of this machine)
    max_concurrent: int | None = None  # jobs in flight (default: what the resources allow)
    python: str | None = None  # interpreter on the nodes (default: this one)
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
    peak_tflops: float | None = None  # the device's peak, for gpu_hours (e.g. 989 for an H200, dense bf16)
    utilization: float | None = None  # the share of that peak a run achieves (MFU), for gpu_hours


@dataclass
class CalibrateConfig:
    """`isoflop calibrate`: the base model's pass rate per problem of task.train, and the sets cut from it."""

    samples: int = 16  # completions per problem (the first seed study's avg@16)
    easy: list[float] = field(default_factory=lambda: [0.3, 0.6])  # pass-rate band of easy.parquet (bounds included)
    hard: list[float] = field(default_factory=lambda: [0.0, 0.0625])  # pass-rate band of hard.parquet
    shard: int = 512  # problems per Ray job
    rows: list[int] | None = None  # set by calibrate for each job: its rows [start, stop) of task.train


@dataclass
class TrackingConfig:
    """Experiment trackers for every eval row of every run (see tracking.py); off by default."""

    backends: list[str] = field(default_factory=list)  # any of wandb, mlflow, tensorboard
    project: str = "isoflop"  # the wandb project and the MLflow experiment
    dir: str | None = (
        None  # offline files (wandb offline runs, MLflow file store, TensorBoard events); null: <sweep dir>/tracking
    )
    wandb_mode: str = "offline"  # offline (upload later with `wandb sync`) or online
    mlflow_uri: str | None = None  # an MLflow server or database URI; null: a file store under tracking.dir


@dataclass
class PowerConfig:
    """`plan`'s power analysis (power.py): how likely the sweep is to answer "does n* rise with
    compute?" (fit's trend test), simulated on this grid under the smallest effect worth finding."""

    # One eval point's sd between the seeds of a cell (fit.json's noise.seed_sd; `plan --noise-from`
    # reads it from earlier results): 0.02 is the lookup study's order.
    seed_sd: float = 0.02
    eval_sd: float | None = (
        None  # the evaluation's share of it; null: binomial at a pass rate of 0.5 over eval.problems x eval.samples
    )
    seed_sd_last: float | None = None  # the same at the last budget (runs spread as they train); null: seed_sd
    doublings: float = 1.0  # the effect: n* moves this many doublings over the grid's budgets (1: by a factor of 2)
    start: float | None = None  # the effect: n* at the first budget; null: the move centred on the grid's middle
    end: float | None = None  # the effect: n* at the last budget; null: start moved by `doublings`
    gap: float = 0.02  # the effect: the metric lost one doubling of n away from n*, at every budget
    grids: int = 200  # simulated sweeps per estimate (its sd is at most 0.5 / sqrt(grids))


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
    power: PowerConfig = field(default_factory=PowerConfig)
    # The values of one run (`isoflop run`); a sweep sets them per cell from the grid.
    n: int = 8
    B_p: int = 8
    seed: int = 0


GROUPS = ("model", "task", "reward", "algo", "grid", "cluster", "sampler")
PATH_KEYS = ("model.path", "reward.path", "task.train", "task.val", "tracking.dir")  # files the runs read


def cache_dir() -> Path:
    """ISOFLOP_CACHE (default ~/.cache/isoflop): the embedded models as built or shipped, and the
    digests of data files, as this process's environment names it (a job's: its node's)."""
    return Path(os.environ.get("ISOFLOP_CACHE", Path.home() / ".cache" / "isoflop")).expanduser()


def sharded(cfg: DictConfig) -> bool:
    """Whether a run's learner is FSDP2-sharded: several processes, asked for, or bf16 (its mixed precision)."""
    return cfg.learner.world_size > 1 or bool(cfg.learner.fsdp) or cfg.learner.bf16
