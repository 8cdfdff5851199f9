"""One GRPO run (or Dr. GRPO, CISPO), top to bottom: sample, score, advantage, loss, update, evaluate, ledger.

Called with a resolved config, a compute budget on one ledger column (where to stop and where to
evaluate) and the learning rate; it knows nothing of grids or Ray. It writes one metrics row per
eval point to the run directory (flushed as it goes) and a status file the dispatcher can watch.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from isoflop_cli import flops
from isoflop_cli.recipe import checkpoint
from isoflop_cli.recipe.evaluate import evaluate
from isoflop_cli.recipe.learner import token_logprobs
from isoflop_cli.recipe.measure import Meter
from isoflop_cli.recipe.losses import aggregate, cispo_pg, clipped_pg, group_advantages, kl_k3, masked_mean
from isoflop_cli.recipe.rewards import make_reward
from isoflop_cli.recipe.sampler import sample
from isoflop_cli.store import FAILED, FINISHED, RUNNING, RunFiles
from isoflop_cli.tasks.arith import ArithTask


@dataclass(frozen=True)
class Budget:
    """Where a run stops and evaluates, on one ledger column (rollouts or flops_total)."""

    column: str
    limit: float  # rollouts: never exceeded (a step's cost is known); FLOPs: the first step that reaches it ends the run
    eval_at: tuple[float, ...]  # evaluate at the first step whose ledger value reaches each
    M: int  # the steps expected (exact for rollouts), for progress only


def train(cfg: DictConfig, budget: Budget, lr: float, run_dir: Path | str) -> list[dict]:
    files = RunFiles(run_dir)
    files.dir.mkdir(parents=True, exist_ok=True)
    files.reset_metrics()
    files.set_status(RUNNING, step=0, M=budget.M, pid=os.getpid())
    try:
        rows = _train(cfg, budget, lr, files)
    except BaseException as e:
        files.set_status(FAILED, error=f"{type(e).__name__}: {e}", M=budget.M)
        raise
    files.set_status(FINISHED, step=rows[-1]["step"], M=budget.M)
    return rows


def _train(cfg: DictConfig, budget: Budget, lr: float, files: RunFiles) -> list[dict]:
    algo, n, B_p = cfg.algo, cfg.n, cfg.B_p
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    tokenizer, policy = checkpoint.load(cfg.model, cfg.task)
    torch.manual_seed(cfg.seed)  # after the load: a first-use build must not shift the run's RNG stream
    random.seed(cfg.seed)
    if cfg.lora.rank:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.targets), lora_dropout=0.0))
    # The KL reference: with LoRA the same model with its adapters off (no second copy).
    use_reference = algo.kl_coef > 0
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if use_reference and not cfg.lora.rank else None
    task = ArithTask.from_config(cfg.task)
    reward, rule_based = make_reward(cfg.reward, cfg.task)
    prompts = task.stream("train", seed=cfg.seed)
    val_problems = task.validation_set(cfg.eval.problems)
    shape = flops.Shape.from_config(policy.config).with_lora(cfg.lora.rank, cfg.lora.targets)
    params = sum(p.numel() for p in policy.parameters())
    trainable = [p for p in policy.parameters() if p.requires_grad]
    trainable_params = sum(p.numel() for p in trainable)
    meter = Meter(cfg.flops.measure)

    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=algo.weight_decay)
    # Short linear warm-up, then constant: a run read at any budget is the run trained to that budget.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (algo.warmup_steps + 1)))

    ledger = {"rollouts": 0, "tokens_generated": 0, "flops_search": 0.0, "flops_learning": 0.0, "flops_reward": 0.0, "reward_cpu_s": 0.0, "flops_eval": 0.0}
    since_eval = {"reward": [], "zero_var": [], "loss": [], "kl": [], "entropy": [], "clip_frac": []}
    rows: list[dict] = []
    start = time.time()

    def eval_point(step: int) -> None:
        policy.eval()
        with meter.count("eval"):
            metrics, rollouts = evaluate(
                policy, tokenizer, task, val_problems, cfg.eval.samples, cfg.eval.k,
                algo.temperature, algo.top_p, cfg.task.max_new_tokens, seed=cfg.seed * 1_000_003 + step,
            )
        ledger["flops_eval"] += flops.generate(shape, len(rollouts.texts), rollouts.prompt_width, rollouts.generated_width)
        means = {f"train_{k}" if k in ("reward", "loss") else k: _mean(v) for k, v in since_eval.items()}
        row = {
            "step": step, "model_params": params, "trainable_params": trainable_params,
            **ledger, **_totals(ledger, cfg.flops), **{f"measured_{k}": v for k, v in _measured(meter).items()},
            "train_reward_mean": means.pop("train_reward"), "zero_var_frac": means.pop("zero_var"),
            **metrics, "k": cfg.eval.k, **means, "lr": lr, "wall_s": round(time.time() - start, 3),
        }
        files.append_metrics(row)
        rows.append(row)
        for v in since_eval.values():
            v.clear()

    def spent() -> float:
        return ledger["rollouts"] if budget.column == "rollouts" else _totals(ledger, cfg.flops)["flops_total"]

    def budget_left() -> bool:
        if budget.column == "rollouts":
            return ledger["rollouts"] + B_p * n <= budget.limit
        return spent() < budget.limit

    checkpoints = list(budget.eval_at)

    def passed_checkpoint() -> bool:
        """Whether the ledger has reached the next compute checkpoint (passing all it reached)."""
        passed = False
        while checkpoints and spent() >= checkpoints[0]:
            checkpoints.pop(0)
            passed = True
        return passed

    step = 0
    passed_checkpoint()
    eval_point(0)  # the base model
    while budget_left():
        step += 1
        # 1. Sample n completions for each of B_p prompts.
        policy.eval()
        problems = [next(prompts) for _ in range(B_p)]
        with meter.count("search"):
            rollouts = sample(policy, tokenizer, [p.prompt for p in problems], n, algo.temperature, algo.top_p, cfg.task.max_new_tokens)

        # 2. Score with the reward system: a rule (CPU time, no FLOPs) or a reward model (its FLOPs).
        cpu = time.process_time()
        with meter.count("reward"):
            scores, reward_flops = reward([problems[i // n] for i in range(B_p * n)], rollouts.texts)
        rewards = torch.tensor(scores).view(B_p, n)
        ledger["flops_reward"] += reward_flops
        if rule_based:
            ledger["reward_cpu_s"] += time.process_time() - cpu

        # 3. Advantages within each prompt's group, one per completion: normalised by the group's
        #    std (grpo, cispo) or only mean-centred (dr_grpo). Optionally drop all-equal groups.
        advantages = group_advantages(rewards, algo.adv_eps, scale=algo.name != "dr_grpo").flatten()
        keep = (rewards.std(dim=1) > 0 if algo.filter_zero_variance and n > 1 else torch.ones(B_p, dtype=torch.bool)).repeat_interleave(n)
        aggregation = "constant" if algo.name == "dr_grpo" else algo.loss_agg

        # 4. Log-probs the updates compare against: the reference (KL) and, when the batch is reused
        #    for more than one update, the sampling policy's own (the clipped ratio's denominator).
        policy.train()
        updates = algo.epochs * algo.minibatches
        with meter.count("learning"), torch.no_grad():
            ref_logp = None
            if use_reference:
                with policy.disable_adapter() if cfg.lora.rank else contextlib.nullcontext():
                    ref_logp = token_logprobs(reference or policy, rollouts.sequences, rollouts.attention_mask, algo.temperature)[0]
            old_logp = token_logprobs(policy, rollouts.sequences, rollouts.attention_mask, algo.temperature)[0] if updates > 1 else None

        # 5. Updates: epochs over the batch, each in mini-batches; clipped policy-gradient loss
        #    (+ KL to the reference, - entropy bonus), token-mean; AdamW, clipped gradient norm.
        for _ in range(algo.epochs):
            for idx in torch.arange(len(rollouts.texts)).tensor_split(algo.minibatches):
                seq, attn = rollouts.sequences[idx], rollouts.attention_mask[idx]
                mask = rollouts.completion_mask[idx, 1:].float() * keep[idx, None]
                with meter.count("learning"):
                    logp, entropy = token_logprobs(policy, seq, attn, algo.temperature, with_entropy=algo.entropy_coef > 0)
                    old = old_logp[idx] if old_logp is not None else logp.detach()  # on-policy: ratio 1
                    policy_loss = cispo_pg if algo.name == "cispo" else clipped_pg
                    pg, clipped = policy_loss(logp, old, advantages[idx], algo.clip_low, algo.clip_high)
                    loss = aggregate(pg, mask, aggregation, cfg.task.max_new_tokens)
                    if ref_logp is not None:
                        kl = aggregate(kl_k3(logp, ref_logp[idx]), mask, aggregation, cfg.task.max_new_tokens)
                        loss = loss + algo.kl_coef * kl
                        since_eval["kl"].append(kl.item())
                    if entropy is not None:
                        ent = aggregate(entropy, mask, aggregation, cfg.task.max_new_tokens)
                        loss = loss - algo.entropy_coef * ent
                        since_eval["entropy"].append(ent.item())
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, algo.max_grad_norm)
                optimizer.step()
                scheduler.step()
                since_eval["loss"].append(loss.item())
                since_eval["clip_frac"].append(masked_mean(clipped, mask).item())

        # 6. Ledger: compute spent so far, in rollouts, generated tokens and FLOPs per part.
        batch_rows, width = rollouts.sequences.shape
        ledger["rollouts"] += B_p * n
        ledger["tokens_generated"] += rollouts.tokens_generated
        ledger["flops_search"] += flops.generate(shape, batch_rows, rollouts.prompt_width, rollouts.generated_width)
        ledger["flops_learning"] += flops.learning(shape, batch_rows, width, algo.epochs, reference=use_reference, old_policy=updates > 1)
        since_eval["reward"].append(rewards.mean().item())
        since_eval["zero_var"].append((rewards.std(dim=1) == 0).float().mean().item() if n > 1 else 1.0)

        # 7. Evaluate at the compute checkpoints this step reached.
        if passed_checkpoint():
            eval_point(step)
        files.set_status(RUNNING, step=step, M=budget.M, rollouts=ledger["rollouts"], pid=os.getpid())
    if rows[-1]["step"] != step:
        eval_point(step)  # the run's last point, when it fell between checkpoints
    return rows


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
