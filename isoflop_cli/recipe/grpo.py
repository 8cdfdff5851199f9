"""One GRPO run (or Dr. GRPO, CISPO, PPO), top to bottom: sample, score, advantage, loss, update,
evaluate, ledger, checkpoint.

Called with a resolved config, a compute budget on one ledger column (where to stop and where to
evaluate) and the learning rate; it knows nothing of grids or Ray. It writes one metrics row per
eval point to the run directory (flushed as it goes), a status file the dispatcher can watch, and
every `checkpoint.every` steps the training state, from which a restarted run resumes.

With `learner.world_size` > 1 the run is that many processes (see `distributed`): rank 0 samples,
scores and evaluates; every rank trains on its share of each mini-batch of an FSDP2-sharded model.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from isoflop_cli import flops, tasks
from isoflop_cli.config import run_content, sharded
from isoflop_cli.recipe import checkpoint, distributed, resume
from isoflop_cli.recipe.distributed import Group
from isoflop_cli.recipe.evaluate import Evaluator, Judge
from isoflop_cli.recipe.learner import Actor, Layout, tree_tokens
from isoflop_cli.recipe.losses import cispo_pg, clipped_pg, gae, group_advantages, kl_k3, token_weights, truncated_is, value_loss, whiten
from isoflop_cli.recipe.measure import Meter
from isoflop_cli.recipe.rewards import make_reward
from isoflop_cli.recipe.sampler import make_sampler
from isoflop_cli.store import FAILED, PAUSED, RUNNING, RunFiles, disk_full_message, is_disk_full

STATS = ("reward", "zero_var", "loss", "kl", "entropy", "clip_frac", "tis", "value_loss")


@dataclass(frozen=True)
class Budget:
    """Where a run stops and evaluates, on one ledger column (rollouts or flops_total)."""

    column: str
    limit: float  # rollouts: never exceeded (a step's cost is known); FLOPs: the first step that reaches it ends the run
    eval_at: tuple[float, ...]  # evaluate at the first step whose ledger value reaches each
    M: int  # the steps expected (exact for rollouts), for progress only


@dataclass
class Progress:
    """What the loop carries from step to step besides weights and optimizer; saved in checkpoints."""

    eval_at: list[float]  # compute checkpoints not reached yet
    step: int = 0
    prompts_drawn: int = 0
    ledger: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("rollouts", "tokens_generated", "flops_search", "flops_learning", "flops_reward", "reward_cpu_s", "flops_eval"), 0))
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per part (search, reward, learning, eval)
    measured: dict[str, float] = field(default_factory=dict)  # FlopCounterMode per part (flops.measure)
    since_eval: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in STATS})
    wall_s: float = 0.0


def train(cfg: DictConfig, budget: Budget, lr: float, run_dir: Path | str, pause_at: float | None = None) -> list[dict]:
    """The run to its budget; with `pause_at` (an adaptive sweep's stage), it stops at the first step
    whose ledger reaches it, keeping a checkpoint there, and a later call continues it as if it had
    never stopped (the pause is not part of what the run computes)."""
    files = RunFiles(run_dir)
    files.dir.mkdir(parents=True, exist_ok=True)
    files.set_status(RUNNING, step=0, M=budget.M, pid=os.getpid())
    try:
        if sharded(cfg):
            distributed.launch(_train, cfg.learner.world_size, cfg, budget, lr, files, pause_at)
        else:
            _train(Group(), cfg, budget, lr, files, pause_at)
    except BaseException as e:
        with contextlib.suppress(OSError):  # a full disk may refuse even this; the run's error is what is raised
            files.set_status(FAILED, error=disk_full_message(e) if is_disk_full(e) else f"{type(e).__name__}: {e}", M=budget.M)
        raise
    rows = files.read_metrics()
    if rows[-1][budget.column] < budget.limit:  # paused short of its budget (finished runs reach it)
        files.set_status(PAUSED, step=rows[-1]["step"], M=budget.M, paused_at=pause_at, **{budget.column: rows[-1][budget.column]})
        return rows
    files.finish(rows, step=rows[-1]["step"], M=budget.M)
    resume.remove(files.checkpoint)  # the run is sealed: its results are in metrics.jsonl and status.json
    return rows


def _train(group: Group, cfg: DictConfig, budget: Budget, lr: float, files: RunFiles, pause_at: float | None = None) -> None:
    # The loop reads plain dataclasses: a DictConfig attribute lookup costs ~50 us, ~2 ms a step.
    algo, learner, n, B_p = OmegaConf.to_object(cfg.algo), OmegaConf.to_object(cfg.learner), cfg.n, cfg.B_p
    max_new_tokens, lora_rank, save_every, flops_cfg = cfg.task.max_new_tokens, cfg.lora.rank, cfg.checkpoint.every, OmegaConf.to_object(cfg.flops)
    if group.world_size == 1:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    tokenizer, policy = checkpoint.load(cfg.model, cfg.task)
    torch.manual_seed(cfg.seed)  # after the load: a first-use build must not shift the run's RNG stream
    random.seed(cfg.seed)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=lora_rank, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.targets), lora_dropout=0.0))
    if learner.activation_checkpointing:
        policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ppo = algo.name == "ppo"
    actor = Actor(policy, value_head=ppo).to(device)
    # The KL reference: with LoRA the same model with its adapters off (no second copy).
    use_reference = algo.kl_coef > 0
    reference = Actor(copy.deepcopy(policy)).to(device).eval().requires_grad_(False) if use_reference and not lora_rank else None
    task = tasks.make(cfg.task)
    task.prepare(tokenizer)  # prompts as this tokenizer sees them (chat template; too long ones dropped)
    if group.is_main and any(task.dropped.values()):
        print(f"prompts over task.max_prompt_tokens, left out: {task.dropped}", flush=True)
    # The sampler: the policy itself, or (a sharded learner, vLLM) its own weights, synced after each update.
    sampler = make_sampler(cfg, actor.policy, tokenizer, task.max_prompt_tokens, own_copy=sharded(cfg)) if group.is_main else None
    separate_sampler = sharded(cfg) or cfg.sampler.name == "vllm"
    if sharded(cfg):
        for model in filter(None, (actor, reference)):
            distributed.shard(model, learner.bf16)
    reward = make_reward(cfg.reward, task) if group.is_main else None
    shape = flops.Shape.from_config(policy.config).with_lora(lora_rank, cfg.lora.targets)
    params = sum(p.numel() for p in policy.parameters())
    trainable = [p for p in actor.parameters() if p.requires_grad]
    trainable_params = sum(p.numel() for p in trainable)

    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=algo.weight_decay, fused=True)  # one kernel for all tensors
    # Short linear warm-up, then constant: a run read at any budget is the run trained to that budget.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (algo.warmup_steps + 1)))

    # Resume from this run's last checkpoint, if it has one; else start (its metrics) over.
    fingerprint = hashlib.sha1(f"{json.dumps(run_content(cfg), sort_keys=True)}{budget}{lr}".encode()).hexdigest()
    saved = resume.load(files.checkpoint, fingerprint, actor, optimizer, scheduler)
    progress = Progress(**saved) if saved else Progress(eval_at=list(budget.eval_at))

    def sync_sampler() -> None:
        """The sampler's own weights take the learner's (LoRA: the adapter's); the gather is collective."""
        weights = distributed.full_weights(actor.policy, trainable_only=bool(lora_rank))
        if group.is_main:
            sampler.load_weights(weights)

    if group.is_main:
        if saved:
            files.keep_metrics(until_step=progress.step)
            print(f"resumed from the checkpoint at step {progress.step} ({progress.ledger['rollouts']} rollouts)", flush=True)
        else:
            files.reset_metrics()
    if saved and separate_sampler:
        sync_sampler()
    prompts = itertools.islice(task.stream("train", seed=cfg.seed), progress.prompts_drawn, None)
    ledger, since_eval = progress.ledger, progress.since_eval
    meter = Meter(flops_cfg.measure, progress.seconds, progress.measured)
    started = time.time() - progress.wall_s

    evaluator = _evaluator(cfg, task, tokenizer, reward, shape) if group.is_main else None

    def eval_point(step: int) -> None:
        with meter.count("eval"):
            evaluation = evaluator(sampler, seed=cfg.seed * 1_000_003 + step)
        ledger["flops_eval"] += evaluation.flops
        files.append_problems(step, evaluation.per_problem)
        means = {f"train_{k}" if k in ("reward", "loss") else k: _mean(v) for k, v in since_eval.items()}
        row = {
            "step": step, "model_params": params, "trainable_params": trainable_params,
            **ledger, **_totals(ledger, flops_cfg), **{f"measured_{k}": v for k, v in _measured(meter).items()},
            **{f"time_{part}_s": round(s, 3) for part, s in meter.seconds.items()},
            "train_reward_mean": means.pop("train_reward"), "zero_var_frac": means.pop("zero_var"),
            **evaluation.metrics, "k": cfg.eval.k, "prompts_dropped": sum(task.dropped.values()), **means, "lr": lr, "wall_s": round(time.time() - started, 3),
        }
        files.append_metrics(row)
        for v in since_eval.values():
            v.clear()

    def spent() -> float:
        return ledger["rollouts"] if budget.column == "rollouts" else _totals(ledger, flops_cfg)["flops_total"]

    def budget_left() -> bool:
        if budget.column == "rollouts":
            return ledger["rollouts"] + B_p * n <= budget.limit
        return spent() < budget.limit

    def paused() -> bool:
        return pause_at is not None and spent() >= pause_at

    def passed_checkpoint() -> bool:
        """Whether the ledger has reached the next compute checkpoint (passing all it reached)."""
        passed = False
        while progress.eval_at and spent() >= progress.eval_at[0]:
            progress.eval_at.pop(0)
            passed = True
        return passed

    actor.train()  # the sampler switches the policy to eval mode while it samples, and back
    step = progress.step
    if step == 0:
        passed_checkpoint()
        if group.is_main:
            eval_point(0)  # the base model
    while budget_left() and not paused():
        step += 1
        # 1. Sample n completions for each of B_p prompts (rank 0; then every rank has the batch).
        problems = [next(prompts) for _ in range(B_p)]
        progress.prompts_drawn += B_p
        batch = None
        if group.is_main:
            with meter.count("search"):
                rollouts = sampler.sample([p.prompt for p in problems], n, algo.temperature, algo.top_p, max_new_tokens)

            # 2. Score with the reward system: a rule (CPU time, no FLOPs) or a reward model (its FLOPs).
            cpu = time.process_time() + task.checking_cpu_s()  # a verifier may check in a process of its own
            with meter.count("reward"):
                scores, reward_flops = reward([problems[i // n] for i in range(B_p * n)], rollouts.texts)
            batch = (rollouts, scores, reward_flops, time.process_time() + task.checking_cpu_s() - cpu if reward.rule_based else 0.0)
        sampled, scores, reward_flops, reward_cpu_s = group.broadcast(batch)
        group_rewards = torch.tensor(scores).view(B_p, n)

        # 3. Advantages within each prompt's group, one per completion: normalised by the group's
        #    std (grpo, cispo, ppo's outcome) or only mean-centred (dr_grpo). Optionally drop
        #    all-equal groups. A fractional algo.epochs learns from the first n_learn of each group's n
        #    completions (exchangeable samples: a uniform subset), with the whole group's advantages.
        #    Token weights: how each mini-batch's per-token losses add up to one.
        epochs, n_learn = flops.epoch_plan(algo.epochs, n)
        learned = torch.arange(B_p * n).view(B_p, n)[:, :n_learn].flatten()
        advantages = group_advantages(group_rewards, algo.adv_eps, scale=algo.name != "dr_grpo").flatten()[learned].to(device)
        keep = (group_rewards.std(dim=1) > 0 if algo.filter_zero_variance and n > 1 else torch.ones(B_p, dtype=torch.bool)).repeat_interleave(n_learn)
        rollouts, rewards = (sampled.select(learned), group_rewards[:, :n_learn]) if n_learn < n else (sampled, group_rewards)
        seq, attn = rollouts.sequences.to(device), rollouts.attention_mask.to(device)
        R, L = seq.shape  # R = B_p * n_learn rows learned from
        mask = rollouts.completion_mask[:, 1:].float().to(device) * keep[:, None].to(device)
        #    Mini-batches, ranks and micro-batches split the batch along its prompt groups.
        minibatches = [torch.arange(R).view(B_p, n_learn)[g].flatten() for g in torch.arange(B_p).tensor_split(algo.minibatches)]
        weights = torch.zeros_like(mask)
        for mb in minibatches:
            weights[mb] = token_weights(mask[mb], "constant" if algo.name == "dr_grpo" else algo.loss_agg, max_new_tokens)
        micro_rows = max(1, learner.micro_batch // n_learn) * n_learn if learner.micro_batch else R
        chunks = [group.mine(mb, n_learn).split(micro_rows) for mb in minibatches]  # per mini-batch, this rank's micro-batches
        #    The passes' layout: each micro-batch as one sequence (each prompt once, then its
        #    completions, no padding), or (learner.shared_prompt=false) the rows as they are.
        P, use_tree = rollouts.prompt_width, learner.shared_prompt
        work = flops.tree_work(B_p, n_learn, P, L, tree_tokens(rollouts.attention_mask, P, n_learn)) if use_tree else flops.plain_work(R, L)
        passes = flops.update_passes(algo)
        old_pass = passes["old_policy"]
        learning_flops = flops.learning(shape, *work, logits=rollouts.tokens_generated, **passes)

        def layout(idx: torch.Tensor) -> Layout:
            return Layout.tree(seq[idx], attn[idx], P, n_learn) if use_tree else Layout.plain(seq[idx], attn[idx], P)

        # 4. Log-probs the updates compare against, on this rank's rows: the reference (KL) and,
        #    when the batch is reused for more than one update or a value head needs its old
        #    estimates (PPO), the sampling-time policy's own.
        ref_logp, old_logp, old_values = torch.zeros_like(mask), torch.zeros_like(mask), torch.zeros_like(mask)
        with meter.count("learning"), torch.no_grad():
            for idx in itertools.chain.from_iterable(chunks):
                if use_reference:
                    with actor.policy.disable_adapter() if lora_rank else contextlib.nullcontext():
                        ref_logp[idx] = (reference or actor)(layout(idx), algo.temperature).logp
                if old_pass:
                    old = actor(layout(idx), algo.temperature, with_values=ppo)
                    old_logp[idx] = old.logp
                    if ppo:
                        old_values[idx] = old.values
        if ppo:
            # PPO: the outcome reward on each completion's last token, GAE against the value head,
            # advantages whitened over the batch's completion tokens.
            last = mask.shape[1] - 1 - mask.flip(-1).argmax(-1)
            token_rewards = torch.zeros_like(mask)
            token_rewards[torch.arange(R), last] = rewards.flatten().to(device) * mask.any(-1)
            token_adv, returns = gae(token_rewards, old_values, mask, algo.gamma, algo.lam)
            mine = torch.cat(list(itertools.chain.from_iterable(chunks)))  # the rows this rank trains on
            ours = mask * torch.isin(torch.arange(R, device=device), mine.to(device))[:, None]
            advantages = whiten(token_adv, ours, reduce=group.all_sum)

        # 5. Updates: epochs over the batch, each in mini-batches; each rank its rows, in micro-batches.
        #    Clipped policy-gradient loss (times the truncated importance weight; + KL to the
        #    reference, - entropy bonus, + value loss), AdamW, clipped gradient norm.
        for _ in range(epochs):
            for minibatch in chunks:
                sums = torch.zeros(len(STATS), device=device)  # this mini-batch's statistics, summed over ranks below
                optimizer.zero_grad(set_to_none=True)
                for idx in minibatch:
                    w = weights[idx]
                    with meter.count("learning"):
                        out = actor(layout(idx), algo.temperature, with_entropy=algo.entropy_coef > 0, with_values=ppo)
                        before = old_logp[idx] if old_pass else out.logp.detach()  # on-policy: ratio 1
                        policy_loss = cispo_pg if algo.name == "cispo" else clipped_pg
                        pg, clipped = policy_loss(out.logp, before, advantages[idx], algo.clip_low, algo.clip_high)
                        terms = {"loss": pg, "clip_frac": clipped}
                        if algo.tis_cap:
                            terms["tis"] = truncated_is(before, rollouts.logprobs[idx].to(device), algo.tis_cap)
                            terms["loss"] = pg * terms["tis"]
                        if use_reference:
                            terms["kl"] = kl_k3(out.logp, ref_logp[idx])
                        if out.entropy is not None:
                            terms["entropy"] = out.entropy
                        if ppo:
                            terms["value_loss"] = value_loss(out.values, old_values[idx], returns[idx], algo.value_clip)
                        stat = {k: (x * w).sum() for k, x in terms.items()}
                        loss = stat["loss"] + algo.kl_coef * stat.get("kl", 0) - algo.entropy_coef * stat.get("entropy", 0) + algo.vf_coef * stat.get("value_loss", 0)
                        (loss * group.world_size).backward()  # FSDP averages gradients over ranks: this sums them
                    stat["loss"] = loss
                    for k, v in stat.items():
                        sums[STATS.index(k)] += v.detach()
                torch.nn.utils.clip_grad_norm_(trainable, algo.max_grad_norm)
                optimizer.step()
                scheduler.step()
                sums = group.all_sum(sums)
                for k in stat:
                    since_eval[k].append(sums[STATS.index(k)].item())
        if separate_sampler:
            with meter.count("sync"):
                sync_sampler()

        # 6. Ledger: compute spent so far, in rollouts, generated tokens and FLOPs per part.
        ledger["rollouts"] += B_p * n
        ledger["tokens_generated"] += sampled.tokens_generated
        ledger["flops_search"] += flops.generate(shape, B_p * n, sampled.prompt_width, sampled.generated_width, sampled.prefill_rows)
        ledger["flops_learning"] += learning_flops
        ledger["flops_reward"] += reward_flops
        ledger["reward_cpu_s"] += reward_cpu_s
        since_eval["reward"].append(group_rewards.mean().item())
        since_eval["zero_var"].append((group_rewards.std(dim=1) == 0).float().mean().item() if n > 1 else 1.0)

        # 7. Evaluate at the compute checkpoints this step reached; save the training state every K steps.
        progress.step = step
        if passed_checkpoint() and group.is_main:
            eval_point(step)
        if save_every and step % save_every == 0 and budget_left():
            progress.wall_s = time.time() - started
            resume.save(files.checkpoint, group, fingerprint, actor, optimizer, scheduler, asdict(progress))
        if group.is_main:
            files.set_status(RUNNING, step=step, M=budget.M, rollouts=ledger["rollouts"], pid=os.getpid())
    if budget_left():  # paused: the stage's eval point is written; continue later from here
        progress.wall_s = time.time() - started
        resume.save(files.checkpoint, group, fingerprint, actor, optimizer, scheduler, asdict(progress))
        return
    if group.is_main and files.read_metrics()[-1]["step"] != step:
        eval_point(step)  # the run's last point, when it fell between checkpoints


def _evaluator(cfg: DictConfig, task, tokenizer, reward, shape) -> Evaluator:
    """The validation set, each held-out set of eval.sets (read and prompted like task=dataset) and
    each judge of eval.judges."""
    from isoflop_cli.tasks.dataset import held_out

    sets = {}
    for name, path in cfg.eval.sets.items():
        held = held_out(cfg.task, path)
        held.prepare(tokenizer)
        sets[name] = (held, held.validation_set(cfg.eval.problems))
    judges = {name: Judge(path) for name, path in cfg.eval.judges.items()}
    return Evaluator(task, task.validation_set(cfg.eval.problems), reward, sets, judges, shape, cfg.eval.samples, cfg.eval.k,
                     cfg.algo.temperature, cfg.algo.top_p, cfg.task.max_new_tokens)


def _totals(ledger: dict, flops_cfg: DictConfig) -> dict:
    """flops_total (search + learning + reward; evaluation is not training compute), rho, gpu_hours."""
    total = ledger["flops_search"] + ledger["flops_learning"] + ledger["flops_reward"]
    out = {"flops_total": total, "rho": ledger["flops_learning"] / total if total else None}
    if flops_cfg.peak_tflops:
        out["gpu_hours"] = total / (flops_cfg.peak_tflops * 1e12 * flops_cfg.utilization) / 3600
    return out


def _measured(meter: Meter) -> dict:
    if not meter.on:
        return {}
    parts = {f"flops_{p}": meter.totals.get(p, 0.0) for p in ("search", "learning", "reward", "eval")}
    return {**parts, "flops_total": parts["flops_search"] + parts["flops_learning"] + parts["flops_reward"]}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
