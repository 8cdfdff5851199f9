"""One run of GRPO or a relative (`algorithms.py`), top to bottom: `Trainer.step` samples, scores,
lays out the batch, runs the passes the updates compare against, estimates advantages, updates,
syncs the sampler and accounts; the loop around it evaluates and checkpoints.

Called with a resolved config, a compute budget on one ledger column (where to stop and where to
evaluate) and the learning rate; it knows nothing of grids or Ray. It writes one metrics row per
eval point to the run directory (flushed as it goes), a status file the dispatcher can watch, and
every `checkpoint.every` steps the training state, from which a restarted run resumes.

With `learner.world_size` > 1 the run is that many processes (see `distributed`): rank 0 decides
what to sample and evaluates, sampling itself (HF) or with every rank's vLLM engine sampling its
share; every rank scores its share of the completions and trains on its share of each mini-batch of
an FSDP2-sharded model, in as many forward and backward passes as every other rank.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from omegaconf import DictConfig, OmegaConf
from transformers.utils import logging as hf_logging

from isoflop_cli import flops, tasks
from isoflop_cli.algorithms import passes, spec
from isoflop_cli.config.identity import trajectory
from isoflop_cli.config.schema import sharded
from isoflop_cli.errors import ConfigError
from isoflop_cli.recipe import checkpoint, distributed, resume
from isoflop_cli.recipe.distributed import Group
from isoflop_cli.recipe.evaluate import Evaluator, Judge
from isoflop_cli.recipe.learner import Actor, Layout, pack, tree_pieces, tree_tokens
from isoflop_cli.recipe.losses import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    Advantages,
    kl_k3,
    learned_first,
    token_weights,
    truncated_is,
    value_loss,
)
from isoflop_cli.recipe.measure import Meter
from isoflop_cli.recipe.rewards import make_reward
from isoflop_cli.recipe.rollouts import Rollouts, make_sampler, sampler_dtype
from isoflop_cli.samplers import SAMPLERS
from isoflop_cli.store import FAILED, PAUSED, RUNNING, Identity, RunFiles, disk_full_message, is_disk_full
from isoflop_cli.tracking import Tracking, flat, tracker_root

T = TypeVar("T")
NO_ROWS = torch.zeros(0, dtype=torch.long)  # a padding pass's micro-batch (`Batch.chunks`)
PADDING_ROW = torch.zeros(
    1, dtype=torch.long
)  # the row a padding pass computes on: the batch's first, which every rank holds
STATS = ("reward", "zero_var", "loss", "kl", "entropy", "clip_frac", "tis", "value_loss")


@dataclass(frozen=True)
class Budget:
    """Where a run stops and evaluates, on one ledger column (rollouts or flops_total)."""

    column: str
    limit: (
        float  # rollouts: never exceeded (a step's cost is known); FLOPs: the first step that reaches it ends the run
    )
    eval_at: tuple[float, ...]  # evaluate at the first step whose ledger value reaches each
    M: int  # the steps expected (exact for rollouts), for progress only


@dataclass
class Progress:
    """What the loop carries from step to step besides weights and optimizer; saved in checkpoints."""

    eval_at: list[float]  # compute checkpoints not reached yet
    step: int = 0
    prompts_drawn: int = 0
    ledger: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "rollouts",
                "tokens_generated",
                "flops_search",
                "flops_learning",
                "flops_reward",
                "reward_cpu_s",
                "flops_eval",
            ),
            0,
        )
    )
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per part (search, reward, learning, sync, eval)
    measured: dict[str, float] = field(default_factory=dict)  # FlopCounterMode per part (flops.measure)
    since_eval: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in STATS})
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        """The ledger's FLOP columns as `flops.Ledger` has them (its total and rho included: a
        checkpoint saved before they were kept in it has them again)."""
        self.ledger.update(flops.Ledger.of(self.ledger).columns())


@dataclass
class Batch:
    """One step's rollouts on their way through the update. Every rank holds rank 0's samples and
    the scores every rank gave its share of them (`Trainer.score`), then adds the rest. R = B_p *
    n_learn rows learned from, L = P + T."""

    sampled: Rollouts  # all B_p * n completions
    rewards: torch.Tensor  # [B_p, n]
    reward_flops: float  # a reward model's FLOPs (0 for a rule)
    reward_cpu_s: float  # a rule's CPU time
    epochs: int = 1  # passes over the rows learned from
    n_learn: int = 0  # completions per group learned from (below n with a fractional algo.epochs)
    rollouts: Rollouts | None = None  # the rows learned from
    mask: torch.Tensor | None = None  # [R, L - 1] completion tokens the loss counts (zero-variance groups filtered out)
    weights: torch.Tensor | None = None  # [R, L - 1] each token's weight in its mini-batch's loss
    # Per mini-batch, this rank's micro-batches (row indices), then as many empty ones as it has fewer
    # than the rank with most: padding passes (`Trainer.padding_pass`).
    chunks: list[list[torch.Tensor]] = field(default_factory=list)
    ref_logp: torch.Tensor | None = None  # [R, L - 1] the KL reference's log-probs
    old_logp: torch.Tensor | None = None  # [R, L - 1] the sampling-time policy's (batch reused or value head)
    old_values: torch.Tensor | None = None  # [R, L - 1] the value head's estimates at sampling time
    advantages: Advantages | None = None


def train(cfg: DictConfig, budget: Budget, lr: float, run_dir: Path | str, pause_at: float | None = None) -> list[dict]:
    """The run to its budget; with `pause_at` (an adaptive sweep's stage), it stops at the first step
    whose ledger reaches it, keeping a checkpoint there, and a later call continues it as if it had
    never stopped (the pause is not part of what the run computes)."""
    # This attempt is the run dir's one writer until another takes it over; its records carry the
    # run's identity (the sweep's manifest holds the same fingerprint for its cell).
    identity = Identity(Path(run_dir).name, trajectory(cfg, budget.column, lr))
    files = RunFiles(run_dir, identity=identity).take_lease()
    files.set_status(RUNNING, step=0, M=budget.M, pid=os.getpid())
    try:
        if sharded(cfg):
            distributed.launch(
                _train,
                cfg.learner.world_size,
                cfg,
                budget,
                lr,
                files,
                pause_at,
                timeout_s=cfg.learner.collective_timeout_s,
            )
        else:
            _train(Group(), cfg, budget, lr, files, pause_at)
    except BaseException as e:
        files.check_lease(
            cause=e
        )  # taken over (a rank's LeaseLost arrives wrapped, a save fails as its dir is cleared): stand down
        with contextlib.suppress(OSError):  # a full disk may refuse even this; the run's error is what is raised
            files.set_status(FAILED, error=_error_line(e), M=budget.M)
        raise
    rows = files.read_metrics()
    if rows[-1][budget.column] < budget.limit:  # paused short of its budget (finished runs reach it)
        files.set_status(
            PAUSED, step=rows[-1]["step"], M=budget.M, paused_at=pause_at, **{budget.column: rows[-1][budget.column]}
        )
        return rows
    files.finish(rows, step=rows[-1]["step"], M=budget.M)
    if not cfg.checkpoint.keep_final:
        files.check_lease()
        resume.remove(files.checkpoint)  # the run is sealed: its results are in metrics.jsonl and status.json
    return rows


def policy_dtype(cfg: DictConfig) -> torch.dtype:
    """The dtype the policy's weights are held in. Full fine-tuning: fp32 (FSDP2's master copy; bf16
    is the forward's). A LoRA backbone is frozen and never takes an update that fp32 would keep, so
    it is held in the compute dtype (`sampler_dtype`: bf16 where learner.bf16, on GPUs; fp32 on the
    CPU, where learner.bf16 is refused): half the memory, what `memory.predict` counts. peft casts
    the adapters, which train, up to fp32 (`with_adapters`)."""
    return sampler_dtype(cfg) if cfg.lora.rank else torch.float32


def with_adapters(policy, lora: DictConfig):
    """The policy with LoRA adapters on lora.targets (trainable, fp32), its backbone frozen."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        policy, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.targets), lora_dropout=0.0)
    )


def _error_line(e: BaseException) -> str:
    """A failed run's reason, as `isoflop status` and the sweep show it: a user error (a reward
    function's scores) its own line, a full disk as one, anything else with its type."""
    if is_disk_full(e):
        return disk_full_message(e)
    return str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"


def _train(
    group: Group, cfg: DictConfig, budget: Budget, lr: float, files: RunFiles, pause_at: float | None = None
) -> None:
    # No progress bars in a run (transformers draws one per weight load): its log is a file, where a
    # bar is carriage returns, and on a rank of a sharded run tqdm's multiprocessing lock outlived the
    # rank's os._exit, so every such run ended with the resource tracker's "leaked semaphore" warning.
    hf_logging.disable_progress_bar()
    trainer = Trainer(group, cfg, budget, lr, files, pause_at)
    try:
        trainer.fit()
    except BaseException as e:  # a failed run's tracker runs end as failed, their rows so far kept
        files.check_lease(
            cause=e
        )  # ... unless the run is another attempt's now: its tracker runs are that one's to close
        if trainer.tracking:
            trainer.tracking.close(failed=True)
        raise
    finally:
        trainer.close()
    if trainer.tracking:
        trainer.tracking.close()


class Trainer:
    """One process's share of a run: its models, sampler, reward, optimizer and progress."""

    def __init__(
        self, group: Group, cfg: DictConfig, budget: Budget, lr: float, files: RunFiles, pause_at: float | None
    ):
        # The loop reads plain dataclasses: a DictConfig attribute lookup costs ~50 us, ~2 ms a step.
        self.group, self.cfg, self.budget, self.lr, self.files, self.pause_at = group, cfg, budget, lr, files, pause_at
        self.algo, self.learner, self.flops_cfg = (
            OmegaConf.to_object(cfg.algo),
            OmegaConf.to_object(cfg.learner),
            OmegaConf.to_object(cfg.flops),
        )
        self.spec, self.passes = spec(self.algo), passes(self.algo)
        self.n, self.B_p, self.lora = cfg.n, cfg.B_p, cfg.lora.rank
        if group.world_size == 1:
            torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
        # A step's prompts take microseconds to tokenize; the tokenizer's thread pool only waits on
        # torch's threads (0.6 ms of a 30 ms step at n = 4, measured). A user's setting stands.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.device = distributed.device()
        if group.is_main:  # in the job log: where the run trains, and the GPUs its scheduler gave it
            print(
                f"device {self.device} on {socket.gethostname()}, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
                flush=True,
            )
        self._build_models()
        self._build_task()
        self._build_optimizer()
        self._resume()
        # The run's tracker runs (rank 0), keyed by its run id: a resumed run continues them.
        self.tracking = (
            Tracking(
                cfg.tracking,
                files.dir.name,
                cfg.name,
                flat(OmegaConf.to_container(cfg, resolve=True)),
                tracker_root(cfg.tracking, files.dir),
            )
            if group.is_main
            else None
        )

    def _build_models(self) -> None:
        """The policy (LoRA: in `policy_dtype`, with adapters), its value head if the algorithm has one, and the KL
        reference: the checkpoint once more, frozen, in the compute dtype (bf16 with learner.bf16,
        the precision its forward runs at anyway), or with LoRA the policy with its adapters off.

        Ranks > 0 of a sharded learner build all of it on the meta device, without storage: their
        shards are allocated and filled from rank 0's weights as they are sharded (`distributed.shard`)."""
        cfg, meta = self.cfg, not self.group.is_main
        separate = self.passes.reference and not self.lora
        self.tokenizer, policy = checkpoint.load(cfg.model, cfg.task, policy_dtype(cfg), meta=meta)
        reference = (
            checkpoint.load(cfg.model, cfg.task, sampler_dtype(cfg), meta=meta)[1] if separate else None
        )  # the compute dtype
        torch.manual_seed(cfg.seed)  # after the loads: a first-use build must not shift the run's RNG stream
        random.seed(cfg.seed)
        with torch.device("meta") if meta else contextlib.nullcontext():  # the adapters and the value head too
            if self.lora:
                policy = with_adapters(policy, cfg.lora)
            if self.learner.activation_checkpointing:
                checkpoint.activation_checkpointing(policy)
            self.actor = Actor(policy, value_head=self.spec.value_head, logit_chunk=self.learner.logit_chunk_tokens)
            self.reference = (
                Actor(reference, logit_chunk=self.learner.logit_chunk_tokens).eval().requires_grad_(False)
                if separate
                else None
            )
        if not sharded(cfg):  # a sharded learner's weights reach the device as they are sharded
            for model in filter(None, (self.actor, self.reference)):
                model.to(self.device)
        self.shape = flops.Shape.from_config(policy.config).with_lora(self.lora, cfg.lora.targets)
        self.params = sum(p.numel() for p in policy.parameters())

    def _build_task(self) -> None:
        """The task's prompts as this tokenizer sees them, the sampler (HF, rank 0: the policy itself,
        or with a sharded learner its own copy; vLLM: an engine on every rank or tensor-parallel
        group; either with its own weights synced after each update), the reward."""
        cfg, main = self.cfg, self.group.is_main
        self.task = tasks.make(cfg.task)
        try:
            self.task.prepare(self.tokenizer)  # chat template; prompts over task.max_prompt_tokens dropped
        except (
            tasks.TaskError
        ) as e:  # every prompt too long for this tokenizer: the input, which a retry would not change
            raise ConfigError(str(e)) from None
        if main and any(self.task.dropped.values()):
            print(f"prompts over task.max_prompt_tokens, left out: {self.task.dropped}", flush=True)
        self.own_engine = SAMPLERS[cfg.sampler.name].own_engine  # an engine on every rank (vLLM)
        self.sampler = (
            make_sampler(
                cfg,
                self.actor.policy,
                self.tokenizer,
                self.task.max_prompt_tokens,
                own_copy=sharded(cfg),
                group=self.group,
            )
            if main or self.own_engine
            else None
        )
        self.separate_sampler = sharded(cfg) or self.own_engine
        if sharded(cfg):
            for model in filter(None, (self.actor, self.reference)):
                distributed.shard(model, self.learner.bf16)
        self.reward = make_reward(cfg.reward, self.task)  # every rank scores its share of each step's completions
        self.evaluator = _evaluator(cfg, self.task, self.tokenizer, self.reward, self.shape) if main else None

    def _build_optimizer(self) -> None:
        self.trainable = [p for p in self.actor.parameters() if p.requires_grad]
        self.trainable_params = sum(p.numel() for p in self.trainable)
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=self.lr, weight_decay=self.algo.weight_decay, fused=True
        )  # one kernel for all tensors
        # Short linear warm-up, then constant: a run read at any budget is the run trained to that budget.
        warmup = self.algo.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))

    def _resume(self) -> None:
        """From this run's last checkpoint, if it has one (its metrics kept up to there); else from the start.

        The checkpoint's fingerprint is what the run computes, not its budget: a run to a larger
        budget continues it (`continuation`), evaluating from there at its own budget's points."""
        cfg = self.cfg
        self.fingerprint = trajectory(cfg, self.budget.column, self.lr)
        saved = resume.load(
            self.files.checkpoint, self.fingerprint, self.actor, self.optimizer, self.scheduler, self.group, self.files
        )
        self.progress = Progress(**saved) if saved else Progress(eval_at=list(self.budget.eval_at))
        self.progress.eval_at = [c for c in self.budget.eval_at if c > self.spent()]
        if self.group.is_main:
            if saved:
                self.files.keep_metrics(until_step=self.progress.step)
                print(
                    f"resumed from the checkpoint at step {self.progress.step} "
                    f"({self.progress.ledger['rollouts']} rollouts)",
                    flush=True,
                )
            else:
                self.files.reset_metrics()
        if saved and self.separate_sampler:
            self.sync_sampler()
        self.prompts = itertools.islice(self.task.stream("train", seed=cfg.seed), self.progress.prompts_drawn, None)
        self.meter = Meter(self.flops_cfg.measure, self.progress.seconds, self.progress.measured)
        self.started = time.time() - self.progress.wall_s

    # The loop.

    def fit(self) -> None:
        self.actor.train()  # the sampler switches the policy to eval mode while it samples, and back
        if self.progress.step == 0:
            self.passed_checkpoint()
            self.evaluate()  # the base model
        while self.budget_left() and not self.paused():
            self.step()
            self.progress.step += 1
            if self.passed_checkpoint():
                self.evaluate()
            every = self.cfg.checkpoint.every
            if every and self.progress.step % every == 0 and self.budget_left():
                self.save()
            if self.group.is_main:
                self.files.set_status(
                    RUNNING,
                    step=self.progress.step,
                    M=self.budget.M,
                    rollouts=self.progress.ledger["rollouts"],
                    pid=os.getpid(),
                    started=round(self.started, 3),
                    durable=False,
                )  # `status` reads rollouts/s from these; each step replaces them
        if self.budget_left():  # paused: the stage's eval point is written; continue later from here
            self.save()
            return
        last = self.group.broadcast(
            self.files.read_metrics()[-1]["step"] if self.group.is_main else None
        )  # every rank takes part in an eval
        if last != self.progress.step:
            self.evaluate()  # the run's last point, when it fell between checkpoints
        if self.cfg.checkpoint.keep_final:  # after the last point: a sweep with larger budgets continues from here
            self.save()

    def step(self) -> None:
        problems = [next(self.prompts) for _ in range(self.B_p)]
        self.progress.prompts_drawn += self.B_p
        rollouts = self.lead(lambda: self.sample(problems))
        if self.own_engine:
            self.sampler.sleep()  # the learner's turn (GPU): the engine's memory back until the next push and sampling
        batch = self.score(problems, self.group.broadcast_tensors(rollouts))
        self.arrange(batch)
        self.pre_passes(batch)
        self.estimate_advantages(batch)
        self.update(batch)
        if self.separate_sampler:
            with self.meter.count("sync"):
                self.sync_sampler()
        self.account(batch)

    # The step's parts, in order.

    def lead(self, work: Callable[[], T]) -> T | None:
        """`work()` on rank 0, which alone decides what to sample, scores and evaluates; None on the
        other ranks. With vLLM those serve rank 0's sampling requests meanwhile, each engine sampling
        its share; with the HF sampler (rank 0's alone) they go straight on to the next collective."""
        if not self.group.is_main:
            if self.own_engine:
                self.sampler.serve()
            return None
        try:
            return work()
        finally:
            if self.own_engine:
                self.sampler.release()

    def sample(self, problems: list) -> Rollouts:
        """n completions for each of the B_p prompts (rank 0; with vLLM every engine samples its share)."""
        with self.meter.count("search"):
            return self.sampler.sample(
                [p.prompt for p in problems],
                self.n,
                self.algo.temperature,
                self.algo.top_p,
                self.cfg.task.max_new_tokens,
            )

    def score(self, problems: list, rollouts: Rollouts) -> Batch:
        """The reward system's scores: a rule (its CPU time, no FLOPs) or a reward model (its FLOPs).
        Each rank scores its share of the completions (whole groups) at once, rather than every rank
        waiting while rank 0 scores them all; the scores, FLOPs and CPU time are the ranks' sum."""
        n, task, total = self.n, self.task, self.B_p * self.n
        mine = self.group.mine(torch.arange(total), n)
        cpu = time.process_time() + task.checking_cpu_s()  # a verifier may check in a process of its own
        with self.meter.count("reward"):
            scores, reward_flops = self.reward(
                [problems[i // n] for i in mine.tolist()], [rollouts.texts[i] for i in mine.tolist()]
            )
        cpu_s = time.process_time() + task.checking_cpu_s() - cpu if self.reward.rule_based else 0.0
        summed = torch.zeros(total + 2, dtype=torch.float64)  # exact: each score is added to zeros only
        summed[mine], summed[total], summed[total + 1] = torch.tensor(scores, dtype=torch.float64), reward_flops, cpu_s
        summed = self.group.all_sum(summed.to(self.device)).cpu()
        rewards = summed[:total].float()  # as torch.tensor(scores) rounds each score to float32
        return Batch(rollouts, rewards.view(self.B_p, n), summed[total].item(), summed[total + 1].item())

    def arrange(self, batch: Batch) -> None:
        """The rows learned from (a fractional algo.epochs: the n_learn of each group whose rewards
        vary the most, moved to the front of their group with its rewards: `learned_first`), the
        tokens the loss counts and their weights in each mini-batch's loss, and the split into
        mini-batches, ranks and micro-batches, all along prompt groups."""
        algo, B_p, n = self.algo, self.B_p, self.n
        batch.epochs, batch.n_learn = flops.epoch_plan(algo.epochs, n)
        k = batch.n_learn
        if k < n:
            order = learned_first(batch.rewards, k)  # [B_p, n]
            batch.sampled = batch.sampled.select((order + n * torch.arange(B_p)[:, None]).flatten())
            batch.rewards = batch.rewards.gather(1, order)
        learned = torch.arange(B_p * n).view(B_p, n)[:, :k].flatten()
        batch.rollouts = batch.sampled.select(learned) if k < n else batch.sampled
        keep = (
            batch.rewards.std(dim=1) > 0 if algo.filter_zero_variance and n > 1 else torch.ones(B_p, dtype=torch.bool)
        )
        batch.mask = batch.rollouts.completion_mask[:, 1:].float().to(self.device) * keep.repeat_interleave(k)[
            :, None
        ].to(self.device)
        R = B_p * k
        minibatches = [
            torch.arange(R).view(B_p, k)[g].flatten() for g in torch.arange(B_p).tensor_split(algo.minibatches)
        ]
        batch.weights = torch.zeros_like(batch.mask)
        for mb in minibatches:
            batch.weights[mb] = token_weights(batch.mask[mb], self.spec.loss_agg, self.cfg.task.max_new_tokens)
        chunks = [self.micro_batches(batch, self.group.mine(mb, k)) for mb in minibatches]
        # Every rank runs as many passes per mini-batch as the rank with most: each pass all-gathers
        # FSDP's units and each backward reduce-scatters, so a rank's extra pass would meet another's
        # next collective and every rank would wait there until the collective timeout.
        passes = self.group.all_max(torch.tensor([len(c) for c in chunks], device=self.device)).tolist()
        batch.chunks = [[*c, *[NO_ROWS] * (most - len(c))] for c, most in zip(chunks, passes)]

    def micro_batches(self, batch: Batch, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's rows of a mini-batch (whole groups) in the forwards that take them: groups
        packed in order up to learner.max_tokens_per_micro_batch positions of the layout (the tree:
        each prompt once and its completion tokens; plain rows: each at its padded width), a group
        over it in pieces of its rows; else learner.micro_batch rows (whole groups, at least one),
        else all at once. The token weights are the mini-batch's, so any split sums to the same loss
        and gradient."""
        k, budget = batch.n_learn, self.learner.max_tokens_per_micro_batch
        if budget:
            r = batch.rollouts
            mask = r.attention_mask[rows]  # [rows, L]
            if self.learner.shared_prompt:
                shared, per_row = (
                    mask[::k, : r.prompt_width].sum(-1),
                    mask[:, r.prompt_width :].sum(-1).view(-1, k),
                )  # [G], [G, k]
            else:
                shared, per_row = (
                    torch.zeros(len(rows) // k, dtype=torch.long),
                    torch.full((len(rows) // k, k), mask.shape[1]),
                )
            return rows.split(pack(shared, per_row, budget))
        return rows.split(max(1, self.learner.micro_batch // k) * k if self.learner.micro_batch else len(rows))

    def layout(self, batch: Batch, idx: torch.Tensor) -> Layout:
        """Rows `idx` as a learning pass reads them: one sequence of prompt trees (each prompt once,
        then its completions, no padding; a piece of a group split by the token budget, its prompt
        and those rows), or (learner.shared_prompt=false) the rows as they are."""
        r = batch.rollouts
        seq, attn = r.sequences[idx].to(self.device), r.attention_mask[idx].to(self.device)
        if not self.learner.shared_prompt:
            return Layout.plain(seq, attn, r.prompt_width)
        return Layout.tree(
            seq, attn, r.prompt_width, min(batch.n_learn, len(idx))
        )  # whole groups, or one group's piece

    @torch.no_grad()
    def pre_passes(self, batch: Batch) -> None:
        """Log-probs the updates compare against, on this rank's rows: the reference's (KL) and,
        when the batch is reused or a value head needs its old estimates, the sampling-time policy's."""
        batch.ref_logp, batch.old_logp, batch.old_values = (torch.zeros_like(batch.mask) for _ in range(3))
        if not (self.passes.reference or self.passes.old_policy):
            return
        with self.meter.count("learning"):
            for idx in itertools.chain.from_iterable(batch.chunks):
                # A padding pass (no rows) runs the same forwards on a stand-in row and writes nothing.
                rows = self.layout(batch, idx if len(idx) else PADDING_ROW)
                if self.passes.reference:
                    with self.actor.policy.disable_adapter() if self.lora else contextlib.nullcontext():
                        batch.ref_logp[idx] = (self.reference or self.actor)(rows, self.algo.temperature).logp[
                            : len(idx)
                        ]
                if self.passes.old_policy:
                    old = self.actor(rows, self.algo.temperature, with_values=self.spec.value_head)
                    batch.old_logp[idx] = old.logp[: len(idx)]
                    if self.spec.value_head:
                        batch.old_values[idx] = old.values[: len(idx)]

    def estimate_advantages(self, batch: Batch) -> None:
        """The spec's estimator (losses.ADVANTAGES) on the batch."""
        mine = torch.zeros(batch.mask.shape[0], dtype=torch.bool, device=self.device)
        mine[torch.cat(list(itertools.chain.from_iterable(batch.chunks))).to(self.device)] = True
        inputs = AdvantageInputs(batch.rewards, batch.n_learn, batch.mask, mine, batch.old_values, self.group.all_sum)
        batch.advantages = ADVANTAGES[self.spec.advantage](inputs, self.algo, self.spec)

    def update(self, batch: Batch) -> None:
        """Epochs over the batch, each in mini-batches: per mini-batch one AdamW step on the summed
        gradients of this rank's micro-batches (clipped norm), its statistics summed over ranks."""
        for _ in range(batch.epochs):
            for minibatch in batch.chunks:
                sums = torch.zeros(len(STATS), device=self.device)
                self.optimizer.zero_grad(set_to_none=True)
                for idx in minibatch:
                    with self.meter.count("learning"):
                        if not len(idx):
                            self.padding_pass(batch)
                            continue
                        terms = self.loss_terms(batch, idx)
                    for k, v in terms.items():
                        sums[STATS.index(k)] += v
                torch.nn.utils.clip_grad_norm_(self.trainable, self.algo.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                sums = self.group.all_sum(sums)
                for k in (
                    terms
                ):  # a real pass's: padding comes after this rank's own (each holds a group of each mini-batch)
                    self.progress.since_eval[k].append(sums[STATS.index(k)].item())

    def loss_terms(self, batch: Batch, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """One micro-batch's forward and backward: the spec's policy loss (times the truncated
        importance weight; + KL to the reference, - entropy bonus, + value loss), each term summed
        with the token weights. Returns the detached terms."""
        algo, value_head = self.algo, self.spec.value_head
        out = self.actor(
            self.layout(batch, idx), algo.temperature, with_entropy=algo.entropy_coef > 0, with_values=value_head
        )
        before = batch.old_logp[idx] if self.passes.old_policy else out.logp.detach()  # on-policy: ratio 1
        pg, clipped = POLICY_LOSSES[self.spec.policy_loss](
            out.logp, before, batch.advantages.advantages[idx], algo.clip_low, algo.clip_high
        )
        terms = {"loss": pg, "clip_frac": clipped}
        if algo.tis_cap:
            terms["tis"] = truncated_is(before, batch.rollouts.logprobs[idx].to(self.device), algo.tis_cap)
            terms["loss"] = pg * terms["tis"]
        if self.passes.reference:
            terms["kl"] = kl_k3(out.logp, batch.ref_logp[idx])
        if out.entropy is not None:
            terms["entropy"] = out.entropy
        if value_head:
            terms["value_loss"] = value_loss(
                out.values, batch.old_values[idx], batch.advantages.returns[idx], algo.value_clip
            )
        w = batch.weights[idx]
        stat = {k: (x * w).sum() for k, x in terms.items()}
        loss = (
            stat["loss"]
            + algo.kl_coef * stat.get("kl", 0)
            - algo.entropy_coef * stat.get("entropy", 0)
            + algo.vf_coef * stat.get("value_loss", 0)
        )
        (loss * self.group.world_size).backward()  # FSDP averages gradients over ranks: this sums them
        stat["loss"] = loss
        return {k: v.detach() for k, v in stat.items()}

    def padding_pass(self, batch: Batch) -> None:
        """A forward and backward that changes nothing, run where this rank has fewer micro-batches
        than another: the stand-in row's outputs times zero, so its gradients are zero, and every
        output the real passes produce (log-probs, entropy, values) takes part, so the backward
        reaches every parameter a real one does and the ranks' reduce-scatters match. Times zero
        rather than a loss times zero-weights: a term that overflowed (the KL's exp) would make NaN."""
        algo = self.algo
        out = self.actor(
            self.layout(batch, PADDING_ROW),
            algo.temperature,
            with_entropy=algo.entropy_coef > 0,
            with_values=self.spec.value_head,
        )
        sum((x * 0).sum() for x in (out.logp, out.entropy, out.values) if x is not None).backward()

    def sync_sampler(self) -> None:
        """The sampler's own weights take the learner's (LoRA: the adapter's), streamed one tensor at a
        time in the sampler's dtype. Each tensor's gather is collective, so every rank walks the whole
        stream: into its engine (vLLM), into rank 0's copy (HF), or nowhere (HF, ranks > 0)."""
        weights = distributed.stream_weights(
            self.actor.policy, trainable_only=bool(self.lora), dtype=sampler_dtype(self.cfg)
        )
        if self.sampler is None:
            for _ in weights:
                pass
        else:
            self.sampler.load_weights(weights)

    def account(self, batch: Batch) -> None:
        """The ledger: rollouts, generated tokens and FLOPs per part, the step's measured sizes
        through the step cost `plan` bounds; and the training statistics since the last eval."""
        r, s, B_p, n = batch.rollouts, batch.sampled, self.B_p, self.n
        trees = tree_pieces(
            r.attention_mask, r.prompt_width, batch.n_learn, self.learner.max_tokens_per_micro_batch
        )  # [B_p]
        sizes = flops.StepBatch(
            prompts=B_p,
            n=n,
            prompt_width=r.prompt_width,
            generated_width=s.generated_width,
            prefill_rows=s.prefill_rows,
            n_learn=batch.n_learn,
            tree_tokens=tree_tokens(r.attention_mask, r.prompt_width, batch.n_learn, trees),
            learned_tokens=r.tokens_generated,
            decode_rows=s.decode_rows,
            trees=int(trees.sum()),
        )
        cost = flops.step_cost(self.shape, self.algo, sizes, self.learner.shared_prompt, batch.reward_flops)
        ledger, since_eval = self.progress.ledger, self.progress.since_eval
        ledger["rollouts"] += B_p * n
        ledger["tokens_generated"] += s.tokens_generated
        ledger["reward_cpu_s"] += batch.reward_cpu_s
        ledger.update(flops.Ledger.of(ledger).add(cost).columns())
        since_eval["reward"].append(batch.rewards.mean().item())
        since_eval["zero_var"].append((batch.rewards.std(dim=1) == 0).float().mean().item() if n > 1 else 1.0)

    # Budget, evaluation, checkpoints.

    def spent(self) -> float:
        return self.progress.ledger[self.budget.column]  # rollouts or flops_total

    def budget_left(self) -> bool:
        if self.budget.column == "rollouts":
            return self.progress.ledger["rollouts"] + self.B_p * self.n <= self.budget.limit
        return self.spent() < self.budget.limit

    def paused(self) -> bool:
        return self.pause_at is not None and self.spent() >= self.pause_at

    def passed_checkpoint(self) -> bool:
        """Whether the ledger has reached the next compute checkpoint (passing all it reached)."""
        passed, eval_at = False, self.progress.eval_at
        while eval_at and self.spent() >= eval_at[0]:
            eval_at.pop(0)
            passed = True
        return passed

    def evaluate(self) -> None:
        """One metrics row (rank 0; with vLLM every engine samples its share of the validation sets):
        the ledger, timings, validation metrics and the training statistics since the last row;
        per-problem results beside it."""
        step, ledger, since_eval, cfg = self.progress.step, self.progress.ledger, self.progress.since_eval, self.cfg
        with self.meter.count("eval"):
            evaluation = self.lead(lambda: self.evaluator(self.sampler))
        if not self.group.is_main:
            return
        ledger["flops_eval"] += evaluation.flops
        self.files.append_problems(step, evaluation.per_problem)
        means = {f"train_{k}" if k in ("reward", "loss") else k: _mean(v) for k, v in since_eval.items()}
        row = {
            "step": step,
            "model_params": self.params,
            "trainable_params": self.trainable_params,
            **ledger,
            **_gpu_hours(ledger["flops_total"], self.flops_cfg),
            **{f"measured_{k}": v for k, v in _measured(self.meter).items()},
            **{f"time_{part}_s": round(s, 3) for part, s in self.meter.seconds.items()},
            "train_reward_mean": means.pop("train_reward"),
            "zero_var_frac": means.pop("zero_var"),
            **evaluation.metrics,
            "k": cfg.eval.k,
            "prompts_dropped": sum(self.task.dropped.values()),
            **means,
            "lr": self.lr,
            "wall_s": round(time.time() - self.started, 3),
        }
        self.files.append_metrics(row)
        self.tracking.log(row)
        for v in since_eval.values():
            v.clear()

    def close(self) -> None:
        """vLLM's engines shut down while the run's process group is still up (see `VllmSampler.close`)."""
        if self.own_engine:
            self.sampler.close()

    def save(self) -> None:
        self.progress.wall_s = time.time() - self.started
        resume.save(
            self.files.checkpoint,
            self.group,
            self.fingerprint,
            self.actor,
            self.optimizer,
            self.scheduler,
            asdict(self.progress),
            self.files,
        )


def _evaluator(cfg: DictConfig, task, tokenizer, reward, shape) -> Evaluator:
    """The validation set, each held-out set of eval.sets (read and prompted like task=dataset) and
    each judge of eval.judges."""
    from isoflop_cli.tasks.dataset import held_out

    sets = {}
    for name, path in cfg.eval.sets.items():
        held = held_out(cfg.task, path, f"eval.sets.{name}")
        held.prepare(tokenizer)
        sets[name] = (held, held.validation_set(cfg.eval.problems))
    judges = {name: Judge(path, cfg.reward.max_tokens_per_forward) for name, path in cfg.eval.judges.items()}
    return Evaluator(
        task,
        task.validation_set(cfg.eval.problems),
        reward,
        sets,
        judges,
        shape,
        cfg.eval.samples,
        cfg.eval.k,
        cfg.algo.temperature,
        cfg.algo.top_p,
        cfg.task.max_new_tokens,
    )


def _gpu_hours(total: float, flops_cfg) -> dict:
    """gpu_hours where the device's peak and MFU are given (none otherwise)."""
    if not flops_cfg.peak_tflops:
        return {}
    return {"gpu_hours": total / (flops_cfg.peak_tflops * 1e12 * flops_cfg.utilization) / 3600}


def _measured(meter: Meter) -> dict:
    if not meter.on:
        return {}
    parts = {f"flops_{p}": meter.totals.get(p, 0.0) for p in ("search", "learning", "reward", "eval")}
    return {**parts, "flops_total": flops.Ledger.of(parts).total}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
