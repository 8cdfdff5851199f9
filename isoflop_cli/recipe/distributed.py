"""The processes of one run: start them (torchrun-style), talk between them, shard the learner.

`learner.world_size` processes share a run: rank 0 samples, scores, evaluates and writes files;
every rank trains on its share of each mini-batch, with the model sharded by FSDP2
(`fully_shard`): gloo on CPU, NCCL on GPU. With one process and no FSDP every call here is a
no-op, so the recipe reads the same either way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn


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

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank."""
        if self.world_size == 1:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mine(self, rows: torch.Tensor, group_size: int) -> torch.Tensor:
        """This rank's share of some rows of a batch: whole groups of `group_size` rows, contiguous."""
        return rows.view(-1, group_size).tensor_split(self.world_size)[self.rank].flatten()


def launch(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run fn(group, *args) in `world_size` fresh processes joined in one process group (the caller waits)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:  # a free port on loopback for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(world_size, port, fn, args), nprocs=world_size, start_method="spawn")


def _rank_main(rank: int, world_size: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    _die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    else:  # share the run's CPU threads among its processes
        torch.set_num_threads(max(1, torch.get_num_threads() // world_size))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    try:
        fn(Group(rank, world_size), *args)
        # Every rank done before any tears down: rank 0 hosts the rendezvous store, and a rank still
        # talking to it while rank 0 exits aborted (SIGABRT in gloo, seen in 1 of ~20 two-rank runs).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _die_with_parent() -> None:
    """A rank must not outlive its run's process (a killed run would leave ranks waiting forever)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def shard(model: nn.Module, bf16: bool) -> None:
    """FSDP2 in place: each transformer layer its own unit, then the root (embeddings, head, the rest)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (dist.get_world_size() if dist.is_initialized() else 1,))
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    layer_types = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    for module in model.modules():
        if type(module).__name__ in layer_types:
            fully_shard(module, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)


def full_weights(model: nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
    """The unsharded weights (only those that train, for LoRA: the adapter), gathered on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, ignore_frozen_params=trainable_only))
