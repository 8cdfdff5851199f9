"""A run's training state on disk, saved every `checkpoint.every` steps, so a killed run resumes.

The state is everything the next step depends on: the trained weights (for LoRA only the
adapter), optimizer and scheduler, RNG states, the data position and the ledger so far (in
`progress`). Weights and optimizer go through torch.distributed.checkpoint, which writes each
rank's shards of an FSDP model (and one file without FSDP). A save is written beside the last one
and swapped in by renames, so a kill during a save leaves the previous one whole. Its last file
lists every file of it and its size (`store.checkpoint_files`): a checkpoint missing one later (a
shard deleted, a file cut) is set aside before a load could fail on it, never loaded in part.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from isoflop_cli.recipe.distributed import Group
from isoflop_cli.store import CHECKPOINT_FILES, LeaseLost, RunFiles, atomic_write, checkpoint_files, checkpoint_gap
from isoflop_cli.store import CHECKPOINT_STATE as STATE

OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def save(
    directory: Path,
    group: Group,
    fingerprint: str,
    model,
    optimizer,
    scheduler,
    progress: dict[str, Any],
    files: RunFiles | None = None,
) -> None:
    """With the run's `files` (holding the run dir's lease), the state is written to a directory of
    this attempt's own and swapped in only while the attempt still holds the lease: an attempt that
    another took over (store.take_lease) never replaces or mixes into the new one's checkpoint."""
    holder = files.holder if files is not None else None
    tmp = directory.with_name(f"{directory.name}.tmp" + (f"-{holder}" if holder else ""))
    old = directory.with_name(directory.name + ".old")
    if group.is_main:
        if files is not None:
            files.check_lease()  # before touching anything: the directories below may be the new holder's
        for stale in directory.parent.glob(f"{directory.name}.tmp*"):  # a killed save's, or an attempt's taken over
            shutil.rmtree(stale, ignore_errors=True)
    _barrier(group)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
        if group.is_main:
            rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.get_rng_state()
            torch.save(
                {"fingerprint": fingerprint, "scheduler": scheduler.state_dict(), "rng": rng, "progress": progress},
                tmp / STATE,
            )
            atomic_write(tmp / CHECKPOINT_FILES, json.dumps(checkpoint_files(tmp)))  # last: the checkpoint is whole
    except BaseException as e:  # dcp's CheckpointException is a BaseException
        shutil.rmtree(tmp, ignore_errors=True)  # a partial save must not keep the disk full
        # torch's writers report a full disk as a wrapped "unexpected pos" error, without errno:
        # a save that failed where the state no longer fits is said as what it is.
        if (
            not isinstance(e, KeyboardInterrupt)
            and shutil.disk_usage(directory.parent).free < _nbytes((model_sd, optim_sd)) + 2**20
        ):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory)) from e
        raise
    if group.is_main:
        if files is not None:
            try:
                files.check_lease()
            except LeaseLost:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        if directory.exists():
            # An `.old` beside a whole checkpoint is what a kill during an earlier swap's clean-up
            # left (possibly half deleted): the rename below needs its place.
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
        tmp.rename(directory)  # with no checkpoint, `.old` is the last whole one until here
        shutil.rmtree(old, ignore_errors=True)
    _barrier(group)


def load(
    directory: Path,
    fingerprint: str,
    model,
    optimizer,
    scheduler,
    group: Group | None = None,
    files: RunFiles | None = None,
) -> dict[str, Any] | None:
    """The saved progress after restoring everything else in place; None if there is no whole
    checkpoint of this very run (its `fingerprint`: same computation, `identity.trajectory`); a whole
    checkpoint of another (a copied run dir, one written by an isoflop older than that hash) is one
    line in the run's log and a fresh start.

    The checkpoint, or its `.old` copy where a kill fell between a save's renames. One that is not
    whole is set aside by the main rank (renamed `<name>.incomplete-<i>`, kept for a look; one line
    in the run's log), and the `.old` copy, when whole, or a fresh start takes its place."""
    for candidate in (directory, directory.with_name(directory.name + ".old")):
        if not candidate.is_dir():
            continue
        gap = checkpoint_gap(candidate)
        if gap is None:
            return _restore(candidate, fingerprint, model, optimizer, scheduler)
        if group is None or group.is_main:
            if files is not None:
                files.check_lease()  # the run dir may be another attempt's now
            aside = _set_aside(candidate)
            print(f"checkpoint {candidate} is incomplete ({gap}): set aside as {aside.name}", flush=True)
    return None


def _set_aside(directory: Path) -> Path:
    i = 0
    while (aside := directory.with_name(f"{directory.name}.incomplete-{i}")).exists():
        i += 1
    directory.rename(aside)
    return aside


def _restore(directory: Path, fingerprint: str, model, optimizer, scheduler) -> dict[str, Any] | None:
    saved = torch.load(directory / STATE, weights_only=False)
    if saved["fingerprint"] != fingerprint:
        print(
            f"checkpoint {directory} holds another computation's state (fingerprint {saved['fingerprint'][:12]}, "
            f"this run's {fingerprint[:12]}): starting from step 0",
            flush=True,
        )
        return None
    model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIONS)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=OPTIONS)
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"]["torch"])
    random.setstate(saved["rng"]["python"])
    if "cuda" in saved["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["rng"]["cuda"])
    return saved["progress"]


def remove(directory: Path) -> None:
    for path in (
        directory,
        directory.with_name(directory.name + ".old"),
        *directory.parent.glob(f"{directory.name}.tmp*"),
    ):
        shutil.rmtree(path, ignore_errors=True)


def _nbytes(state: Any) -> int:
    """Bytes of the tensors in a nested state dict: what a save of it writes, roughly."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_nbytes(v) for v in state)
    return 0


def _barrier(group: Group) -> None:
    if group.world_size > 1:
        dist.barrier()
