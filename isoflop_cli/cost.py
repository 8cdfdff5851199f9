"""What a sweep costs in wall time and GPU-hours (CPU-hours on a cluster without GPUs), before it runs.

FLOPs alone misprice RL post-training: sampling spends most of the wall time at a small share of the
FLOPs, because decoding is bound by memory bandwidth, not by arithmetic. So each part of a step is
timed by the resource that bounds it:

- search (sampling): each decode step reads the weights once plus the KV cache of every sequence in
  the engine's batch, at `bandwidth x bandwidth_efficiency`, and pays a fixed per-step cost (an
  eager HF decode loop launches every layer's kernels from Python; vLLM replays a graph); the
  prefill is FLOP-bound (the ledger's prefill FLOPs at `mfu`).
- learning: the ledger's learning FLOPs at `mfu` on every learner rank.
- reward: a reward model's ledger FLOPs at `mfu` on one device; a rule a CPU cost per completion.
- eval: the evaluation's sampling, by the same decode model, at each of the plan's eval points.
- other: what the run's clock holds beside those (weight sync, checkpoints): known only from
  finished runs.

Defaults per device class are in DEVICES; where the sweep dir holds finished runs of this grid,
each part's measured seconds over what the defaults predict for the same work calibrate the rest
(`Calibration`). A run's `wall_s` is its training clock (from the model built to its last eval
point); the process start and model load are not in it, nor here.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from isoflop_cli import flops, launchers, tasks
from isoflop_cli.grid import Cell
from isoflop_cli.rewards import REWARDS
from isoflop_cli.samplers import SAMPLERS
from isoflop_cli.store import SweepDir, read_json, write_json

PARTS = ("search", "learning", "reward", "eval")  # timed parts (the runs' time_<part>_s), beside `other`
PLAN_FILE = "cost.json"  # in the sweep dir: what `sweep` planned to spend, for `status`


@dataclass(frozen=True)
class Device:
    """One device class's throughput figures. Each number's source is beside it in DEVICES."""

    name: str
    bandwidth: float  # bytes/s of one device's memory
    peak_flops: float  # FLOP/s of one device: dense bf16 on a GPU, fp32 on a CPU
    bandwidth_efficiency: float  # share of `bandwidth` a decode step's reads reach
    mfu: float  # share of `peak_flops` that FLOP-bound work reaches: learning, prefill, a reward model
    hf_layer_s: float  # eager HF decode loop: seconds per layer per decode step beside its reads (kernel launches)
    engine_step_s: float  # an engine of its own (vLLM, graphs replayed): seconds per decode step beside its reads
    rule_s: float  # a rule reward: CPU seconds per completion scored


TB_s, TFLOPs = 1e12, 1e12
DEVICES: dict[str, Device] = {
    "h200": Device(
        "H200",
        bandwidth=4.8 * TB_s,  # HBM3e 4.8 TB/s: NVIDIA H200 Tensor Core GPU datasheet (SXM)
        peak_flops=989 * TFLOPs,  # 989 TFLOP/s dense BF16: same datasheet (1,979 is with 2:4 sparsity)
        # assumed: memory-bound decode kernels reach ~60-80% of HBM peak; calibration replaces it
        bandwidth_efficiency=0.7,
        # assumed for FSDP2 7B-class training at 32k-token micro-batches; the one GPU run (README)
        # measured 9.6% on 0.5B
        mfu=0.3,
        # README's GPU run: 0.5B (24 layers), HF sampler, 35.5 s over 4 steps x 255 decode steps,
        # reads ~0.2 ms of it
        hf_layer_s=1.4e-3,
        # assumed: vLLM's scheduler and sampler per step with CUDA graphs (no vLLM run measured yet)
        engine_step_s=2e-3,
        rule_s=1e-3,  # assumed: a parsed-answer check (math); the embedded arith verifier measured 35 us (below)
    ),
    "h100": Device(
        "H100",
        bandwidth=3.35 * TB_s,  # HBM3 3.35 TB/s: NVIDIA H100 Tensor Core GPU datasheet (SXM5)
        peak_flops=989 * TFLOPs,  # 989 TFLOP/s dense BF16: same datasheet
        bandwidth_efficiency=0.7,  # as H200
        mfu=0.3,  # as H200
        hf_layer_s=1.4e-3,  # as H200: launch overhead, not bandwidth
        engine_step_s=2e-3,  # as H200
        rule_s=1e-3,  # as H200
    ),
    "cpu": Device(
        "CPU",
        # measured: torch copy of 256 MiB, 2-core AMD EPYC VM (this project's dev machine), read + write
        bandwidth=33e9,
        peak_flops=182e9,  # measured: torch fp32 2048^2 matmul on the same 2 cores
        bandwidth_efficiency=0.7,  # as the GPUs: small models are launch-bound here, which hf_layer_s carries
        mfu=0.3,  # assumed; calibration from the sweep's finished runs replaces it
        hf_layer_s=1e-4,  # assumed: eager PyTorch op dispatch (~10 ops a layer at ~10 us)
        engine_step_s=1e-3,  # assumed: vLLM's CPU build
        rule_s=3.5e-5,  # measured: embedded arith verifier, reward_cpu_s / rollouts of a run here
    ),
}


def device_class(cluster) -> Device:
    """The cluster's device class: CPU without GPUs, else by each GPU's memory (cluster.gpu_memory_gib:
    an H200 has 141 GiB, an H100 80); an unknown GPU is priced as an H200."""
    if not cluster.gpus_per_run:
        return DEVICES["cpu"]
    memory = cluster.gpu_memory_gib
    return DEVICES["h100"] if memory is not None and memory <= 96 else DEVICES["h200"]


@dataclass(frozen=True)
class Seconds:
    """Wall seconds of one run per part: predicted, or measured (a run's time_<part>_s)."""

    search: float = 0.0
    learning: float = 0.0
    reward: float = 0.0
    eval: float = 0.0
    other: float = 0.0

    @property
    def wall(self) -> float:
        return self.search + self.learning + self.reward + self.eval + self.other

    def scaled(self, factors: dict[str, float]) -> Seconds:
        return Seconds(**{p: getattr(self, p) * factors.get(p, 1.0) for p in (*PARTS, "other")})


@dataclass(frozen=True)
class Setup:
    """What pricing reads of a run config beside n and B_p (shared by an axes combination's cells)."""

    shape: flops.Shape
    prompt: int  # padded prompt width at the bound
    new_tokens: int
    engines: int  # engines that sample a step's rows in parallel (vLLM: one per rank or TP group; HF: rank 0's)
    engine_devices: int  # devices per engine (tensor parallel)
    eager: bool  # an eager decode loop (HF) rather than an engine of its own
    shared_prefill: bool
    learners: int  # learner ranks
    weight_bytes: int  # bytes per weight and KV entry while sampling
    rule_reward: bool
    eval_rows: int  # validation completions sampled at each eval point
    eval_prompts: int
    devices_per_run: float  # GPUs, or CPUs where the cluster has none: what GPU-hours (CPU-hours) count
    gpu: bool
    cpus: float  # CPUs per run (cluster.cpus_per_run)

    @classmethod
    def of(cls, cfg) -> Setup:
        spec, gpus = SAMPLERS[cfg.sampler.name], cfg.cluster.gpus_per_run
        world = cfg.learner.world_size or 1
        tp = cfg.sampler.tensor_parallel if spec.own_engine and gpus else 1
        return cls(
            shape=flops.model_shape(cfg.model),
            prompt=tasks.make(cfg.task).max_prompt_tokens,
            new_tokens=cfg.task.max_new_tokens,
            engines=max(1, world // tp) if spec.own_engine else 1,
            engine_devices=tp,
            eager=not spec.own_engine,
            shared_prefill=spec.always_shares_prefill or bool(cfg.sampler.shared_prefill),
            learners=world,
            weight_bytes=2 if cfg.learner.bf16 else 4,
            rule_reward=not REWARDS[cfg.reward.name].model_based,
            eval_rows=cfg.eval.problems * cfg.eval.samples,
            eval_prompts=cfg.eval.problems,
            devices_per_run=float(gpus or cfg.cluster.cpus_per_run),
            gpu=bool(gpus),
            cpus=float(cfg.cluster.cpus_per_run),
        )


def sampling_seconds(setup: Setup, device: Device, prompts: int, n: int) -> float:
    """`prompts` x `n` completions at the bound (every prompt at the padded width, every completion
    at new_tokens), split evenly over the engines: a FLOP-bound prefill, then new_tokens - 1 decode
    steps (the ledger's count: the prefill yields the first token), each reading the weights once
    and every running row's KV cache, plus its fixed per-step cost."""
    s, steps = setup.shape, setup.new_tokens - 1
    rows = math.ceil(prompts * n / setup.engines)
    prefill_rows = math.ceil((prompts if setup.shared_prefill and n > 1 else prompts * n) / setup.engines)
    engine_flops = setup.engine_devices * device.peak_flops * device.mfu
    prefill = flops.forward(s, prefill_rows, setup.prompt, setup.prompt, 1).total / engine_flops
    if steps <= 0:
        return prefill
    weights = (
        s.layers * s.linear_macs + s.hidden * s.vocab
    ) * setup.weight_bytes  # projections and LM head, read once a step
    kv_per_position = (
        2 * s.layers * s.kv_heads * s.head_dim * setup.weight_bytes
    )  # K and V of one position, every layer
    positions = steps * setup.prompt + steps * (steps + 1) // 2  # one row's context summed over the decode steps
    read = steps * weights + rows * positions * kv_per_position
    per_step = s.layers * device.hf_layer_s if setup.eager else device.engine_step_s
    return prefill + read / (setup.engine_devices * device.bandwidth * device.bandwidth_efficiency) + steps * per_step


def step_seconds(setup: Setup, device: Device, step: flops.StepCost, prompts: int, n: int) -> Seconds:
    """One step at the bound: sampling, learning (`step.learning` FLOPs over the learner ranks) and
    reward (a model's `step.reward` FLOPs on one device, or a rule's CPU cost per completion)."""
    reward = prompts * n * device.rule_s if setup.rule_reward else step.reward / (device.peak_flops * device.mfu)
    return Seconds(
        search=sampling_seconds(setup, device, prompts, n),
        learning=step.learning / (setup.learners * device.peak_flops * device.mfu),
        reward=reward,
    )


def eval_seconds(setup: Setup, device: Device) -> float:
    """One eval point: the validation set's completions (held-out sets and judges are not priced)."""
    return sampling_seconds(setup, device, setup.eval_prompts, setup.eval_rows // max(1, setup.eval_prompts))


@dataclass(frozen=True)
class Calibration:
    """Per part, measured seconds over the defaults' seconds for the same work, from the sweep's
    finished runs (1 where none measured it); `other_per_step`: seconds a step outside the timed
    parts. `runs`: how many runs it was fitted from (0: the defaults alone)."""

    factors: dict[str, float] = field(default_factory=dict)
    other_per_step: float = 0.0
    runs: int = 0


@dataclass(frozen=True)
class CellCost:
    """One run's predicted wall seconds per part, and what they cost on its devices."""

    seconds: Seconds
    devices: float  # GPUs per run, or CPUs where the cluster has none
    gpu: bool
    cpus: float

    @property
    def wall_s(self) -> float:
        return self.seconds.wall

    @property
    def hours(self) -> float:
        """Device-hours: GPU-hours, or CPU-hours where the cluster has no GPUs."""
        return self.wall_s * self.devices / 3600

    def record(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall_s, 3),
            "gpu_hours": self.hours if self.gpu else 0.0,
            "cpu_hours": self.wall_s * self.cpus / 3600,
            **{f"{p}_s": round(getattr(self.seconds, p), 3) for p in (*PARTS, "other")},
        }


@dataclass(frozen=True)
class Price:
    """A sweep's predicted cost: per cell (None where infeasible), in total, and where its figures
    came from. `parallel`: runs at once (cluster.max_concurrent, else what the launcher runs)."""

    cells: list[CellCost | None]
    device: Device
    calibration: Calibration
    parallel: int

    @property
    def unit(self) -> str:
        return "GPU-h" if self.device.name != "CPU" else "CPU-h"

    @property
    def hours(self) -> float:
        return sum(c.hours for c in self.cells if c is not None)

    @property
    def wall_s(self) -> float:
        """The sweep's wall time with `parallel` runs at once, each next run (in the grid's order,
        as the dispatcher submits them) on the first slot free."""
        slots = [0.0] * self.parallel
        for c in self.cells:
            if c is not None:
                heapq.heappush(slots, heapq.heappop(slots) + c.wall_s)
        return max(slots)

    @property
    def source(self) -> str:
        c = self.calibration
        if c.runs:
            return f"calibrated from {c.runs} finished run(s) of this sweep on {self.device.name} defaults"
        return f"{self.device.name} defaults (isoflop_cli/cost.py DEVICES), no finished run to calibrate from"

    def totals(self, cells: list[Cell]) -> dict[str, float | int | str]:
        gpu = self.unit == "GPU-h"
        return {
            "gpu_hours": self.hours if gpu else 0.0,
            "cpu_hours": sum(c.record()["cpu_hours"] for c in self.cells if c is not None),
            "wall_s": round(self.wall_s, 3),
            "parallel_runs": self.parallel,
            "flops": sum(c.plan.predicted_flops["flops_total"] for c in cells if c.feasible),
            "source": self.source,
        }

    def costliest(self, cells: list[Cell], k: int = 3) -> list[tuple[str, float]]:
        ranked = sorted(((c.run_id, p.hours) for c, p in zip(cells, self.cells) if p is not None), key=lambda x: -x[1])
        return ranked[:k]


def predict(cells: list[Cell], calibration: Calibration, device: Device) -> list[CellCost | None]:
    """Each feasible cell's seconds: its M steps at the bound scaled by the plan's FLOP scale (how
    much shorter finished runs were than the bound), its eval points, then the calibration."""
    setups: dict[int, tuple[Setup, float]] = {}
    out: list[CellCost | None] = []
    for c in cells:
        if not c.feasible:
            out.append(None)
            continue
        if id(c.combo) not in setups:
            setup = Setup.of(c.cfg)
            setups[id(c.combo)] = setup, eval_seconds(setup, device)
        setup, per_eval = setups[id(c.combo)]
        p = c.plan
        step = step_seconds(setup, device, p.step_bound, c.axes["B_p"], c.axes["n"])
        seconds = Seconds(
            search=step.search * p.flops_scale * p.M,
            learning=step.learning * p.flops_scale * p.M,
            reward=step.reward * p.flops_scale * p.M,
            eval=per_eval * len(p.eval_steps),
            other=calibration.other_per_step * p.M,
        ).scaled(calibration.factors)
        out.append(CellCost(seconds, setup.devices_per_run, setup.gpu, setup.cpus))
    return out


def measured(rows: list[dict]) -> Seconds:
    """A finished run's seconds per part from its last eval point (time_<part>_s accumulate over the
    run; `other` is its wall clock less them)."""
    last = rows[-1]
    parts = {p: float(last.get(f"time_{p}_s", 0.0)) for p in PARTS}
    return Seconds(**parts, other=max(0.0, float(last.get("wall_s", 0.0)) - sum(parts.values())))


def calibrate(cells: list[Cell], sweep: SweepDir, device: Device) -> Calibration:
    """Per part, the finished runs' measured seconds over the defaults' seconds for the work each run
    did: its part's ledger FLOPs over the bound's (shorter completions are less work), a rule's
    completions, its eval points. Only runs of this grid count (their work is priced from its cells)."""
    done = sweep.manifest().cells
    spent = {p: 0.0 for p in (*PARTS, "other")}
    modelled = {p: 0.0 for p in PARTS}
    steps = runs = 0
    setups: dict[int, Setup] = {}
    for c in cells:
        rows = sweep.run(c.run_id).finished_rows() if c.feasible and c.run_id in done else None
        if not rows or rows[-1].get("step", 0) <= 0 or "time_search_s" not in rows[-1]:
            continue
        setup = setups.setdefault(id(c.combo), Setup.of(c.cfg))
        last, bound = rows[-1], c.plan.step_bound
        step = step_seconds(setup, device, bound, c.axes["B_p"], c.axes["n"])
        for part in ("search", "learning"):
            per_flop = getattr(step, part) / getattr(bound, part) if getattr(bound, part) else 0.0
            modelled[part] += per_flop * last[f"flops_{part}"]
        modelled["reward"] += (
            last["rollouts"] * device.rule_s
            if setup.rule_reward
            else last["flops_reward"] / (device.peak_flops * device.mfu)
        )
        modelled["eval"] += eval_seconds(setup, device) * len(rows)
        seen = measured(rows)
        for part in spent:
            spent[part] += getattr(seen, part)
        steps += last["step"]
        runs += 1
    factors = {p: spent[p] / modelled[p] for p in PARTS if modelled[p] > 0 and spent[p] > 0}
    return Calibration(factors, spent["other"] / steps if steps else 0.0, runs)


def parallel_runs(cfg, cells: int) -> int:
    """Runs at once, as the dispatcher decides: cluster.max_concurrent, else what the launcher runs
    at once (a local head: its CPUs over cluster.cpus_per_run; a remote cluster queues them all)."""
    if cfg.cluster.max_concurrent:
        return int(cfg.cluster.max_concurrent)
    return max(1, launchers.of(cfg.cluster).capacity(cells))


def price(cfg, cells: list[Cell], sweep: SweepDir) -> Price:
    """The sweep's cost: calibrated from its finished runs in `sweep` where it has them."""
    device = device_class(cfg.cluster)
    if cfg.flops.peak_tflops:  # the user's own peak and MFU, as runs' gpu_hours use them
        device = replace(device, peak_flops=cfg.flops.peak_tflops * TFLOPs, mfu=cfg.flops.utilization)
    calibration = calibrate(cells, sweep, device)
    feasible = sum(c.feasible for c in cells)
    return Price(predict(cells, calibration, device), device, calibration, min(feasible, parallel_runs(cfg, feasible)))


def write(sweep: SweepDir, cells: list[Cell], price: Price) -> None:
    """The plan's cost in the sweep dir (PLAN_FILE), for `status` to set what runs spent against."""
    runs = {c.run_id: p.hours for c, p in zip(cells, price.cells) if p is not None}
    write_json(
        sweep.path / PLAN_FILE,
        {
            "unit": price.unit,
            "devices_per_run": next((p.devices for p in price.cells if p is not None), 0.0),
            "hours": price.hours,
            "runs": runs,
            "source": price.source,
        },
    )


def spent_seconds(files) -> float:
    """A run's training clock so far: its last eval point's wall_s, or longer while it runs (its
    status's last update)."""
    rows = files.read_metrics()
    seconds = float(rows[-1].get("wall_s", 0.0)) if rows else 0.0
    status = files.status()
    if status.state == "running" and status.started and status.updated:
        seconds = max(seconds, status.updated - status.started)
    return seconds


def status_line(sweep: SweepDir) -> str:
    """Device-hours the sweep's runs spent (from their records) against what `sweep` planned (PLAN_FILE)."""
    plan = read_json(sweep.path / PLAN_FILE)
    numbers = (
        isinstance(plan, dict)
        and all(isinstance(plan.get(k), (int, float)) for k in ("devices_per_run", "hours"))
        and isinstance(plan.get("runs"), dict)
        and plan.get("unit") in ("GPU-h", "CPU-h")
    )
    if not numbers:
        return f"cost: no readable {PLAN_FILE} (written by `isoflop sweep`): nothing planned to compare with"
    ids = [rid for rid in sweep.manifest().cells if rid in plan["runs"]]
    spent = sum(spent_seconds(sweep.run(rid)) for rid in ids) * plan["devices_per_run"] / 3600
    return (
        f"cost: {spent:.3g} {plan['unit']} spent of {plan['hours']:.3g} planned ({spent / plan['hours']:.0%})"
        if plan["hours"] > 0
        else f"cost: {spent:.3g} {plan['unit']} spent, none planned"
    )
