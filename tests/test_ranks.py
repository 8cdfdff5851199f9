"""What each process of a sharded learner holds and how long it waits: rank 0 reads the weights and
every other rank only ever holds its shards (counted, storage by storage), filled to the
checkpoint's values; a rank that waits in a collective past learner.collective_timeout_s fails the
run instead of hanging."""

import json
import textwrap
import time

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.multiprocessing.spawn import ProcessRaisedException
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from isoflop_cli import config
from isoflop_cli.recipe import checkpoint, distributed
from isoflop_cli.recipe.distributed import Group
from isoflop_cli.recipe.trainer import Budget, Trainer
from isoflop_cli.store import RunFiles

pytestmark = pytest.mark.slow  # two-rank runs of the embedded model

SMALL = ["n=4", "B_p=2", "eval.problems=4", "eval.samples=4"]


class LiveStorage(TorchDispatchMode):
    """The most bytes of real (not meta) tensor storage created under it and alive at once, read
    after every op: each op's outputs, a tensor subclass (FSDP2's DTensor shards) by the plain
    tensors it holds."""

    def __init__(self):
        super().__init__()
        self.alive: dict[StorageWeakRef, int] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.alive = {
            ref: n for ref, n in self.alive.items() if not ref.expired()
        }  # before adding: a freed storage's address is reused
        for tensor in pytree.tree_leaves(out):
            for plain in _plain(tensor) if isinstance(tensor, torch.Tensor) else ():
                if plain.device.type != "meta":
                    self.alive[StorageWeakRef(plain.untyped_storage())] = plain.untyped_storage().nbytes()
        self.peak = max(self.peak, sum(self.alive.values()))
        return out

    def now(self) -> int:
        """Bytes the storages created under it hold now: FSDP2 frees a gathered parameter by
        resizing its storage to 0, which no op's output shows."""
        return sum(
            torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes() for ref in self.alive if not ref.expired()
        )


def _plain(tensor: torch.Tensor) -> list[torch.Tensor]:
    if is_traceable_wrapper_subclass(tensor):
        inner = (getattr(tensor, name) for name in tensor.__tensor_flatten__()[0])
        return [p for t in inner if isinstance(t, torch.Tensor) for p in _plain(t)]
    return [tensor]


def _build(group: Group, overrides: list[str], out: str) -> None:
    """One rank's Trainer, built while its storage is counted; then what its models hold."""
    cfg = config.load(None, overrides)
    with LiveStorage() as live:
        trainer = Trainer(group, cfg, Budget("rollouts", 16, (16,), 2), 1e-4, RunFiles(f"{out}/run"), None)
    _, fresh = checkpoint.load(cfg.model, cfg.task)  # the checkpoint, read here only to compare
    expected, expected_buffers = fresh.state_dict(), dict(fresh.named_buffers())
    policy = trainer.actor.policy.get_base_model() if trainer.lora else trainer.actor.policy
    gathered = [
        get_model_state_dict(m, options=StateDictOptions(full_state_dict=True))
        for m in (trainer.actor, trainer.reference)
        if m is not None
    ]  # every rank's shards
    found = {
        "peak": live.peak,
        "tied": policy.lm_head.weight is policy.model.embed_tokens.weight,
        "buffers": all(
            torch.equal(b, expected_buffers[name]) for name, b in policy.named_buffers()
        ),  # whole on every rank, not in the state dict
        "weights": [
            all(
                torch.equal(v, expected[_checkpoint_key(k)])
                for k, v in full.items()
                if "lora_" not in k and k != "value_head.weight"
            )
            for full in gathered
        ],
    }
    with open(f"{out}/rank{group.rank}.json", "w") as f:
        json.dump(found, f)


def _checkpoint_key(key: str) -> str:
    """An Actor's state-dict key as the checkpoint names it (LoRA: the base layer's)."""
    return key.removeprefix("policy.").removeprefix("base_model.model.").replace(".base_layer.", ".")


def _bytes(model: torch.nn.Module) -> int:
    return sum(
        t.untyped_storage().nbytes() for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    )


@pytest.mark.parametrize("variant", [["algo.kl_coef=0.1"], ["algo=ppo", "lora.rank=4"]], ids=["reference", "ppo-lora"])
def test_rank_1_never_holds_a_full_copy_of_the_weights(tmp_path, variant):
    """Two gloo ranks build a run (a KL reference beside the policy; or LoRA with a value head, the
    reference being the adapter turned off). Every storage rank 1 allocates while it builds is
    counted against the models one process holds: at its peak rank 1 held its half of them and at
    most two of rank 0's tensors in flight (a broadcast's buffer lives until gloo's worker lets
    go), and what it holds is the checkpoint (weights, the tie of embeddings and head, the rotary
    buffers outside the state dict)."""
    overrides = [*SMALL, *variant]
    (tmp_path / "run").mkdir()
    RunFiles(tmp_path / "run").take_lease()
    distributed.launch(_build, 2, [*overrides, "learner.world_size=2"], str(tmp_path), timeout_s=600)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for found in ranks:
        assert found["tied"] and found["buffers"] and all(found["weights"]), found

    one = Trainer(
        Group(), config.load(None, overrides), Budget("rollouts", 16, (16,), 2), 1e-4, RunFiles(tmp_path / "one"), None
    )
    models = [m for m in (one.actor, one.reference) if m is not None]
    full, largest = sum(map(_bytes, models)), max(t.untyped_storage().nbytes() for m in models for t in m.parameters())
    peak = ranks[1]["peak"]
    print(
        f"rank 1 peak {peak} B of the full models' {full} B "
        f"({peak / full:.1%}); largest tensor {largest} B ({largest / full:.1%})"
    )
    assert full / 2 < peak <= full / 2 + 2 * largest + 0.01 * full  # the padding of shards and the buffers: within 1%
    assert peak < (0.6 if len(models) == 2 else 0.7) * full


class _Counted:
    """A model whose calls (FSDP2's gathers in its hooks included) run under a LiveStorage."""

    def __init__(self, model: torch.nn.Module, live: LiveStorage):
        self.model, self.live = model, live

    def __call__(self, *args, **kwargs):
        with self.live:
            return self.model(*args, **kwargs)


def _reference_pass(group: Group, overrides: list[str], out: str) -> None:
    """One step of a two-rank run with a KL reference, the reference's calls counted: the most bytes
    their storages held and what they hold after the step, against its root's parameters."""
    cfg = config.load(None, overrides)
    trainer = Trainer(group, cfg, Budget("rollouts", 16, (16,), 2), 1e-4, RunFiles(f"{out}/run"), None)
    embeddings = (
        trainer.reference.policy.get_input_embeddings().weight
    )  # the root's (tied to the head): a DTensor, its numel the whole
    counted = trainer.reference = _Counted(trainer.reference, LiveStorage())
    trainer.step()
    found = {
        "root": embeddings.numel() * embeddings.element_size(),
        "peak": counted.live.peak,
        "after": counted.live.now(),
        "sharded": isinstance(counted.model.policy.get_input_embeddings().weight, DTensor),
    }
    with open(f"{out}/rank{group.rank}.json", "w") as f:
        json.dump(found, f)


def test_the_reference_reshards_its_root_after_each_forward(tmp_path):
    """The KL reference never runs backward, where FSDP2 reshards a root: without resharding after
    its forward its embeddings and head stayed gathered through sampling and learning (at 7B 1.9 GiB
    a GPU). Two gloo ranks run a step; the storages the reference's calls create held the gathered
    root in its forward (its logits need the head), and hold nothing of it once the step is done:
    the registered parameters are shards again."""
    (tmp_path / "run").mkdir()
    RunFiles(tmp_path / "run").take_lease()
    overrides = [*SMALL, "algo.kl_coef=0.1", "learner.world_size=2", "learner.max_tokens_per_micro_batch=64"]
    distributed.launch(_reference_pass, 2, overrides, str(tmp_path), timeout_s=600)
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        print(
            f"rank {rank}: root {found['root']} B; the reference's storages "
            f"at most {found['peak']} B, after the step {found['after']} B"
        )
        assert found["peak"] >= found["root"]
        assert found["after"] < 0.05 * found["root"] and found["sharded"]


def _wait(group: Group, nap_s: float) -> None:
    group.broadcast("ready")  # both past the rendezvous
    if group.rank == 1:
        time.sleep(nap_s)
    group.broadcast("after the nap")


def test_a_rank_waiting_past_the_collective_timeout_fails_the_run():
    """Rank 0 waits in a broadcast while rank 1 sleeps far longer than learner.collective_timeout_s:
    the run fails with the knob named, long before rank 1 would have woken."""
    started = time.time()
    with pytest.raises(ProcessRaisedException, match=r"waited longer than learner\.collective_timeout_s=5 s"):
        distributed.launch(_wait, 2, 300.0, timeout_s=5)
    assert time.time() - started < 120


def _one_and_two_ranks(tmp_path, args: list[str]) -> dict[int, list[dict]]:
    """The run `args` describes (`isoflop run`) as one process and as two ranks: each one's metrics rows."""
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    rows = {}
    for ws in (1, 2):
        result = CliRunner().invoke(
            app, ["run", *args, f"learner.world_size={ws}", "--run-dir", str(tmp_path / f"ws{ws}")]
        )
        assert result.exit_code == 0, result.output
        rows[ws] = [json.loads(line) for line in (tmp_path / f"ws{ws}" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows[1]] == [r["step"] for r in rows[2]]
    return rows


def _same_losses(rows: dict[int, list[dict]], keys: tuple[str, ...]) -> None:
    """Two ranks' rows after the base model's give one process's statistics (to 1e-4) and validation."""
    for a, b in zip(rows[1][1:], rows[2][1:]):
        for key in keys:
            assert abs(a[key] - b[key]) < 1e-4, (a["step"], key, a[key], b[key])
        assert a["val_avg@k"] == b["val_avg@k"]


def test_two_ranks_with_lora_and_a_value_head_give_the_losses_of_one_process(tmp_path):
    """The adapters and the value head built on the meta device on rank 1 and filled from rank 0's:
    two ranks' first steps (PPO, LoRA, a KL to the adapter turned off) give one process's losses."""
    args = [
        *SMALL,
        "B_p=4",
        "grid.budgets=[16,32]",
        "grid.eval_points=1",
        "algo=ppo",
        "lora.rank=4",
        "algo.kl_coef=0.1",
    ]
    rows = _one_and_two_ranks(tmp_path, args)
    assert [r["step"] for r in rows[1]] == [0, 1, 2]
    _same_losses(rows, ("train_loss", "kl", "value_loss", "clip_frac"))
    assert abs(rows[1][-1]["value_loss"]) > 0 and abs(rows[1][-1]["kl"]) > 0  # the compared terms are not all zero


SCORE_S = 0.01  # the slow reward's wall time per completion


def _problems(path) -> str:
    """Sums in the embedded model's characters, every other one with a prompt ten times as long (a
    sum of many terms): a step's prompt groups then differ in length, so under a small token budget
    the two ranks' shares pack into different numbers of micro-batches."""
    lines = []
    for i in range(80):
        terms = [i % 10, 7] if i % 2 else [i % 10, *range(1, 10), *range(1, 10)]
        lines.append(
            json.dumps(
                {"prompt": "+".join(map(str, terms)) + "=", "reward_model": {"ground_truth": str(sum(terms))[::-1]}}
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_ranks_packing_different_numbers_of_micro_batches_run_in_step(tmp_path, monkeypatch):
    """Prompts of 4 and 38 characters under a token budget of 24 positions: a short group packs into
    one or two micro-batches, a long one into a piece per completion, so in some steps one rank has
    more forward and backward passes than the other (counted below, on the one-process run's
    batches: the last of the three steps, 2 against 5). The rank with fewer runs padding passes
    (zero gradient) to match: the run finishes well within a short collective timeout, with one
    process's losses and trained weights (apart by 5e-5 of what the updates moved them; a padding
    pass with a gradient puts them 0.27 apart, and without its backward the run fails on the
    timeout; without padding gloo aborts on the first mismatched all-gather). Its reward (a
    function of the user's) sleeps per completion, and each rank scores only its share: rank 0
    spends about half the one process's reward time."""
    (tmp_path / "slow_rewards.py").write_text(
        textwrap.dedent(f"""
        import time

        def exact(problems, completions):
            time.sleep({SCORE_S} * len(completions))
            return [float(c.strip() == p.answer) for p, c in zip(problems, completions)]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # the ranks, spawned, start from this process's path
    args = [
        *SMALL,
        "B_p=4",
        "grid.budgets=[48]",
        "grid.eval_points=1",
        "task=dataset",
        f"task.train={_problems(tmp_path / 'sums.jsonl')}",
        "task.max_prompt_tokens=48",
        "task.max_new_tokens=6",
        "reward=custom",
        "reward.fn=slow_rewards:exact",
        "algo.kl_coef=0.1",
        "learner.max_tokens_per_micro_batch=24",
        "learner.collective_timeout_s=60",
        "checkpoint.keep_final=true",  # the trained weights, compared below
    ]
    counts = []
    original = Trainer.arrange
    monkeypatch.setattr(
        Trainer, "arrange", lambda self, batch: original(self, batch) or counts.append(_shares(self, batch))
    )
    rows = _one_and_two_ranks(tmp_path, args)
    assert [r["step"] for r in rows[1]] == [0, 3]
    print(f"micro-batches of the two ranks' shares, step by step: {counts}")
    assert any(a != b for a, b in counts), counts  # the scenario: ranks that pack differently
    _same_losses(rows, ("train_loss", "kl", "clip_frac"))
    assert rows[1][-1]["kl"] > 0
    # The last step's update is in no row above (its losses are computed before it), and there the
    # ranks pack differently: the trained weights show whether the padding passes added nothing.
    cfg = config.load(None, args)
    start = {_checkpoint_key(k): v for k, v in checkpoint.load(cfg.model, cfg.task)[1].state_dict().items()}
    weights = {ws: _final_weights(tmp_path / f"ws{ws}") for ws in (1, 2)}
    moved = sum((w - start[_checkpoint_key(k)]).square().sum() for k, w in weights[1].items()).sqrt()
    apart = sum((w - weights[2][k]).square().sum() for k, w in weights[1].items()).sqrt()
    print(f"weights: the updates moved them {moved:.3g} (L2), two ranks' from one process's {apart:.3g}")
    assert apart < 1e-3 * moved
    reward_s = {ws: rows[ws][-1]["time_reward_s"] for ws in (1, 2)}
    print(f"reward seconds on rank 0: one process {reward_s[1]:.3f}, two ranks {reward_s[2]:.3f}")
    assert reward_s[1] >= 3 * 16 * SCORE_S and reward_s[2] < 0.75 * reward_s[1]


def _final_weights(run_dir) -> dict[str, torch.Tensor]:
    """A finished run's trained weights (checkpoint.keep_final) as whole tensors, by the Actor's
    parameter names, whether one process wrote them or each rank its shards."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(run_dir / "checkpoint", run_dir / "weights.pt")
    return torch.load(run_dir / "weights.pt")["model"]


def _shares(trainer, batch) -> tuple[int, int]:
    """How many micro-batches the first and the second half of a one-process batch's groups pack
    into under its token budget: what two ranks' shares would."""
    k = batch.n_learn
    rows = torch.arange(len(batch.rollouts.texts)).view(-1, k)
    return tuple(len(trainer.micro_batches(batch, half.flatten())) for half in rows.tensor_split(2))
