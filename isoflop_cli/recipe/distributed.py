"""The processes of one run: start them (torchrun-style), talk between them, shard the learner.

`learner.world_size` processes share a run: rank 0 decides what to sample, evaluates and writes
files (with vLLM every rank's engine samples its share); every rank scores its share of each step's
completions and trains on its share of each mini-batch, with the model sharded by FSDP2
(`fully_shard`): gloo on CPU, NCCL on GPU. With one process and no FSDP every call here is a
no-op, so the recipe reads the same either way.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from isoflop_cli.errors import ConfigError
from isoflop_cli.processes import die_with_parent


@dataclass(frozen=True)
class Group:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            x = x.clone()
            dist.all_reduce(x)
        return x

    def all_max(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            x = x.clone()
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return x

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_tensors(self, obj: Any) -> Any:
        """Rank 0's dataclass on every rank, its tensor fields (CPU) through tensor broadcasts: a
        pickle would copy each tensor's bytes into one buffer on rank 0 and out again on every other
        rank, through the host even with NCCL. Only the rest (shapes, strings, numbers) is pickled."""
        if self.world_size == 1:
            return obj
        tensors = (
            {f.name: getattr(obj, f.name) for f in fields(obj) if isinstance(getattr(obj, f.name), torch.Tensor)}
            if self.is_main
            else {}
        )
        skeleton = self.broadcast(
            replace(obj, **{k: _Placeholder(t.shape, t.dtype) for k, t in tensors.items()}) if self.is_main else None
        )
        received = {}
        for f in fields(skeleton):
            held = getattr(skeleton, f.name)
            if isinstance(held, _Placeholder):
                buffer = (
                    tensors[f.name].to(device())
                    if self.is_main
                    else torch.empty(held.shape, dtype=held.dtype, device=device())
                )
                dist.broadcast(buffer, src=0)
                received[f.name] = buffer.cpu()
        return replace(skeleton, **received)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's object on rank 0, in rank order; None on the other ranks."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def mine(self, rows: torch.Tensor, group_size: int) -> torch.Tensor:
        """This rank's share of some rows of a batch: whole groups of `group_size` rows, contiguous."""
        return rows.view(-1, group_size).tensor_split(self.world_size)[self.rank].flatten()


@dataclass(frozen=True)
class _Placeholder:
    """A tensor field's shape and dtype, pickled in its place (`Group.broadcast_tensors`)."""

    shape: torch.Size
    dtype: torch.dtype


def launch(fn: Callable[..., None], world_size: int, *args: Any, timeout_s: float) -> None:
    """Run fn(group, *args) in `world_size` fresh processes joined in one process group (the caller
    waits); a rank waiting longer than `timeout_s` in a collective fails the run."""
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port on loopback for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="isoflop-ranks-") as user_errors:
        try:
            mp.start_processes(
                _rank_main,
                args=(world_size, port, timeout_s, user_errors, fn, args),
                nprocs=world_size,
                start_method="spawn",
            )
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            # A user error (a reward function's scores) on any rank stays one line, exit 2, not
            # retried; torch reports whichever rank failed first, often a peer whose collective
            # broke when the failing rank exited, so each rank's user error is read from its file.
            said = sorted(Path(user_errors).glob("*"))
            if said:
                raise ConfigError(said[0].read_text()) from None
            raise


def _rank_main(
    rank: int, world_size: int, port: int, timeout_s: float, user_errors: str, fn: Callable[..., None], args: tuple
) -> None:
    die_with_parent(signal.SIGKILL)  # a rank must not outlive its run (a killed run would leave ranks waiting forever)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    else:  # share the run's CPU threads among its processes
        torch.set_num_threads(max(1, torch.get_num_threads() // world_size))
    # The timeout bounds every collective (gloo's wait; NCCL's watchdog, whose default of 10 minutes
    # would kill ranks that wait while rank 0 alone evaluates a large model).
    # device_id binds NCCL to this rank's GPU at once (without it a barrier guesses the device: torch
    # warned so on the first H200 run).
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=torch.device("cuda", rank) if cuda else None,
    )
    try:
        fn(Group(rank, world_size), *args)
        # Every rank done before any tears down: rank 0 hosts the rendezvous store, and a rank still
        # talking to it while rank 0 exits aborted (SIGABRT in gloo, seen in 1 of ~20 two-rank runs).
        dist.barrier()
    except ConfigError as e:  # said before this rank exits, so before any peer fails for want of it
        Path(user_errors, str(rank)).write_text(str(e))
        raise
    except RuntimeError as e:
        if "Timed out" in str(e):  # gloo's timeout, a plain RuntimeError: said with the knob that sets it
            raise TimeoutError(
                f"rank {rank} waited longer than learner.collective_timeout_s={timeout_s:g} s in a collective "
                "(another rank is stuck, or slower by that much)"
            ) from e
        raise
    finally:
        dist.destroy_process_group()
    _exit_finished()


def _exit_finished() -> None:
    """End a rank whose work is done and written without the interpreter's teardown. C++ destructors
    run there (gloo's and the rendezvous store's threads among them), and one in ~30 two-rank CPU
    runs aborted in them after its last step was written ("terminate called without an active
    exception", SIGABRT; PYTHONFAULTHANDLER showed no Python frame left), failing a finished run."""
    import logging
    import sys

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def device() -> torch.device:
    """The device this process computes on: its GPU (`_rank_main` gives each rank its own) or the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def shard(model: nn.Module, bf16: bool) -> None:
    """FSDP2 in place: each transformer layer its own unit, then the root (embeddings, head, the rest).

    FSDP2 keeps a root's parameters gathered after its forward, for the backward that follows; a
    frozen model (no parameter trains: the KL reference) runs forwards only, and its root would
    stay gathered from its first forward on (at 7B: embeddings and head, 1.9 GiB per GPU in bf16,
    through sampling and learning alike). Its root reshards after each forward instead, as its
    layers do: one more all-gather of the root per reference micro-batch.

    With several ranks only rank 0 holds the weights (in host memory); the others built the model
    on the meta device (`Trainer._build_models`). Sharding moves rank 0's shards to its device and
    allocates the others' there; rank 0's full tensors then reach every rank's shards one tensor at a
    time, so no rank > 0 ever holds a full copy (torchtune and TRL load FSDP2 models this way)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    world_size, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    mesh = init_device_mesh(device().type, (world_size,))
    full = (
        model.state_dict() if world_size > 1 and rank == 0 else {}
    )  # rank 0's tensors, not copies: sharding leaves them whole
    precision = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    )
    layer_types = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    for module in model.modules():
        if type(module).__name__ in layer_types:
            fully_shard(module, mesh=mesh, mp_policy=precision)
    trains = any(p.requires_grad for p in model.parameters())
    fully_shard(
        model, mesh=mesh, mp_policy=precision, reshard_after_forward=None if trains else True
    )  # None: FSDP2's choice
    if world_size == 1:
        return
    if rank > 0:
        model.to_empty(
            device=device()
        )  # this rank's shards and the buffers, uninitialised (tied weights stay one tensor)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    # Buffers outside the state dict (rotary inv_freq) were meta too: rank 0's, as computed at its build.
    for module in model.modules():
        for name in module._non_persistent_buffers_set:
            dist.broadcast(module._buffers[name], src=0)


def stream_weights(model: nn.Module, trainable_only: bool, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's unsharded parameters (only those that train, for LoRA: the adapter) one at a time,
    in `dtype`: each cast on its shard, then gathered (`full_tensor`), so a rank holds one full
    tensor at a time rather than a full state dict, and moves the sampler's bytes, not fp32. A
    gather is collective: every rank walks the whole stream, in step. Tied weights come once, under
    their first name (the embedding); buffers never train and are not sent."""
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        if trainable_only and not param.requires_grad:
            continue
        tensor = param.detach().to(dtype)
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
