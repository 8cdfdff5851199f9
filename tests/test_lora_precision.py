"""A LoRA run's precision as the recipe builds it with learner.bf16 (a GPU run's setting), on the CPU with
the embedded model: the frozen backbone held in bf16 (`trainer.policy_dtype`, what `memory.predict`
counts), the adapters in fp32 for the optimizer, as peft and verl keep them, through FSDP2's bf16
mixed precision on one gloo rank, one optimizer step and the adapter's push to the sampler."""

import pytest
import torch
import torch.distributed as dist

from isoflop_cli import config


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_lora_runs_backbone_is_bf16_and_its_adapters_fp32_through_a_sharded_step(one_rank):
    from isoflop_cli.recipe import checkpoint, distributed
    from isoflop_cli.recipe.learner import Actor, Layout
    from isoflop_cli.recipe.trainer import policy_dtype, with_adapters

    cfg = config.load(None, ["lora.rank=4"])
    assert policy_dtype(cfg) == torch.float32  # the CPU's runs: learner.bf16 is GPU-only
    cfg.learner.bf16 = True  # as a GPU run has it (validation refuses it here)
    assert policy_dtype(cfg) == torch.bfloat16
    tokenizer, policy = checkpoint.load(cfg.model, cfg.task, policy_dtype(cfg))
    actor = Actor(with_adapters(policy, cfg.lora))
    kinds = {("lora_" in name, p.dtype, p.requires_grad) for name, p in actor.named_parameters()}
    assert kinds == {(False, torch.bfloat16, False), (True, torch.float32, True)}
    before = {name: p.detach().clone() for name, p in actor.named_parameters()}

    distributed.shard(actor, bf16=True)  # FSDP2, bf16 compute, fp32 gradient reduction
    optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=1e-2, fused=True)
    ids = torch.tensor([tokenizer.encode("12+34=46"), tokenizer.encode("17+8=255")])
    out = actor(Layout.plain(ids, torch.ones_like(ids), 3), 1.0)
    out.logp.sum().backward()
    optimizer.step()

    for name, p in actor.named_parameters():
        held = p.to_local() if hasattr(p, "to_local") else p
        changed = bool((held.float() - before[name].float()).abs().max() > 0)
        if "lora_" in name:
            assert held.dtype == p.grad.dtype == torch.float32 and changed, name
        else:
            assert held.dtype == torch.bfloat16 and p.grad is None and not changed, name
    pushed = dict(distributed.stream_weights(actor.policy, trainable_only=True, dtype=torch.bfloat16))
    assert pushed and all("lora_" in name and t.dtype == torch.bfloat16 for name, t in pushed.items())
