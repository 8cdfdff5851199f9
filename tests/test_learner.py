"""The learner's two layouts: the prompt tree built by hand, and the same log-probs, entropies,
values and gradients as the plain rows on a random model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config

from isoflop_cli.recipe.learner import Actor, Layout, tree_tokens

# Two prompts (width 3, the first left-padded) with two completions each (width 3, eos = 1, pad = 0).
SEQ = torch.tensor([
    [0, 5, 6, 10, 11, 1],
    [0, 5, 6, 12, 1, 0],
    [7, 8, 9, 13, 1, 0],
    [7, 8, 9, 1, 0, 0],
])
ATTN = torch.tensor([
    [0, 1, 1, 1, 1, 1],
    [0, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 0, 0],
])


def test_tree_layout_by_hand():
    assert tree_tokens(ATTN, 3, 2) == 13  # 2 + 3 + 2 and 3 + 2 + 1
    t = Layout.tree(SEQ, ATTN, 3, 2)
    # the groups one after the other: prompt, completions; no padding
    assert t.input_ids.tolist() == [[5, 6, 10, 11, 1, 12, 1, 7, 8, 9, 13, 1, 1]]
    assert t.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3, 4, 3]]
    tree = t.prompt_tree
    # attention reads the rows back as the rollout holds them (positions in the sequence; padding: 0)
    assert tree.prompt.tolist() == [[0, 0, 1], [7, 8, 9]] and tree.prompt_on.tolist() == [[False, True, True], [True] * 3]
    assert tree.rows.tolist() == [[0, 0, 1, 2, 3, 4], [0, 0, 1, 5, 6, 0], [7, 8, 9, 10, 11, 0], [7, 8, 9, 12, 0, 0]]
    assert torch.equal(tree.rows_on, ATTN.bool())
    # each position's output: prompt slots 0..5 (group * 3 + slot), completion slots 6 + row * 3 + t
    assert tree.source.tolist() == [1, 2, 6, 7, 8, 9, 10, 3, 4, 5, 12, 13, 15]
    # each completion token's logits come from the prompt's last position (first token) or the token before
    assert t.picked.tolist() == [1, 2, 3, 1, 5, 9, 10, 9]
    assert t.targets.tolist() == [10, 11, 1, 12, 1, 13, 1, 1]
    assert t.dest[0].tolist() == [0, 0, 0, 1, 1, 2, 2, 3] and t.dest[1].tolist() == [2, 3, 4, 2, 3, 2, 3, 2]


def test_plain_layout_picks_the_completion_positions():
    p = Layout.plain(SEQ, ATTN, 3)
    assert p.input_ids is SEQ and p.out_shape == (4, 5)
    assert p.picked.tolist() == [2, 3, 4, 8, 9, 14, 15, 20]
    assert p.targets.tolist() == [10, 11, 1, 12, 1, 13, 1, 1]


COMMON = dict(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, pad_token_id=0, eos_token_id=1)
CONFIGS = {
    "qwen2": Qwen2Config(**COMMON),
    # sliding windows of 3 positions (the rows are 5 long): one layer of two, and every layer
    "qwen2, one sliding layer": Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=3, max_window_layers=1),
    "mistral, sliding": MistralConfig(**COMMON, sliding_window=3),
}


@pytest.mark.parametrize("value_head", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_tree_gives_the_plain_outputs_and_gradients(name, value_head):
    torch.manual_seed(0)
    actor = Actor(AutoModelForCausalLM.from_config(CONFIGS[name], attn_implementation="sdpa"), value_head=value_head)
    if value_head:
        torch.nn.init.normal_(actor.value_head.weight)
    results = {}
    for layout_name, layout in (("plain", Layout.plain(SEQ, ATTN, 3)), ("tree", Layout.tree(SEQ, ATTN, 3, 2))):
        actor.zero_grad()
        out = actor(layout, 0.7, with_entropy=True, with_values=value_head)
        loss = (out.logp * torch.arange(1, 6)).sum() + out.entropy.sum() + (out.values.sum() if value_head else 0)
        loss.backward()
        results[layout_name] = out, {k: p.grad.clone() for k, p in actor.named_parameters()}
    (plain, plain_grads), (tree, tree_grads) = results["plain"], results["tree"]
    on = ATTN[:, 3:].bool()
    assert plain.logp[:, 2:][on].abs().min() > 0 and plain.logp[:, :2].abs().max() == 0  # completion tokens only
    for field in ("logp", "entropy", "values") if value_head else ("logp", "entropy"):
        torch.testing.assert_close(getattr(tree, field), getattr(plain, field), atol=1e-5, rtol=0)
    for k, g in plain_grads.items():
        torch.testing.assert_close(tree_grads[k], g, atol=5e-5, rtol=1e-4)  # float32 sums in another order


def test_the_window_matters_here():
    """The sliding-window cases above compare something: a window of 3 changes the plain rows' log-probs."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS["mistral, sliding"], attn_implementation="sdpa")
    windowed = Actor(model)(Layout.plain(SEQ, ATTN, 3), 1.0).logp
    model.config.sliding_window = None
    assert (Actor(model)(Layout.plain(SEQ, ATTN, 3), 1.0).logp - windowed).abs().max() > 1e-3


def test_tree_needs_sdpa():
    model = AutoModelForCausalLM.from_config(CONFIGS["qwen2"], attn_implementation="eager")
    with pytest.raises(ValueError, match="needs SDPA"):
        Actor(model)(Layout.tree(SEQ, ATTN, 3, 2), 1.0)
