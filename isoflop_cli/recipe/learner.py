"""The learner's model, and how a learning pass lays out a batch of rollouts.

A rollout batch is [R, L]: each row a left-padded prompt (width P) then its completion,
right-padded after eos. The learner needs the log-prob of every completion token, nothing at the
prompt. Two layouts give exactly those, from one forward each:

- `Layout.plain`: the rows as they are (HF's causal mask with the padding mask).
- `Layout.tree`: each prompt group of n rows as one sequence, the prompt once and then the n
  completions, padding dropped; a 4D mask lets each completion see its prompt and itself. The
  prompt runs once per group instead of n times, and no position is padding except at the end of
  the shorter groups' rows.

Logits are computed only at the positions that predict a completion token (at a real vocabulary
the log-softmax over every position is most of a pass's memory).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

PROMPT, PAD = -1, -2  # branch ids in a tree row; completions are 0 .. n-1


@dataclass
class Layout:
    input_ids: torch.Tensor  # [rows, width]
    position_ids: torch.Tensor  # [rows, width]
    attention_mask: torch.Tensor  # [rows, width] padding mask, or [rows, 1, width, width] bool (True: attend)
    picked: torch.Tensor  # [N]: flat positions (row * width + column) whose logits predict a completion token
    targets: torch.Tensor  # [N]: those tokens
    dest: tuple[torch.Tensor, torch.Tensor]  # [N] each: (row, column) of each in the [R, L - 1] outputs
    out_shape: tuple[int, int]  # (R, L - 1)

    @classmethod
    def plain(cls, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> "Layout":
        R, L = sequences.shape
        on = attention_mask[:, prompt_width:].bool()  # [R, T] completion tokens (eos included)
        row = torch.arange(R, device=sequences.device)[:, None].expand_as(on)[on]
        col = (prompt_width - 1 + torch.arange(L - prompt_width, device=sequences.device)).expand_as(on)[on]
        return cls(
            input_ids=sequences,
            position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0),
            attention_mask=attention_mask,
            picked=row * L + col,
            targets=sequences[:, prompt_width:][on],
            dest=(row, col),
            out_shape=(R, L - 1),
        )

    @classmethod
    def tree(cls, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, group_size: int,
             width: int | None = None) -> "Layout":
        """Rows in consecutive groups of `group_size` share their prompt. `width` (at least
        `tree_width` of these rows, its default) pads every group's sequence to one width, e.g. the
        whole batch's."""
        R, L = sequences.shape
        P, n, dev = prompt_width, group_size, sequences.device
        G, T = R // n, L - P
        prompt_len = attention_mask[::n, :P].sum(-1)  # [G]
        assert R % n == 0 and bool((prompt_len > 0).all()), "whole groups, each with a prompt"
        assert torch.equal(sequences[:, :P].view(G, n, P), sequences[::n, None, :P].expand(G, n, P)), "a group shares its prompt"
        on = attention_mask[:, P:].bool().view(G, n, T)  # [G, n, T] completion tokens
        completions = sequences[:, P:].reshape(G, n, T)[on]
        lengths = on.sum(-1)  # [G, n]
        starts = prompt_len[:, None] + lengths.cumsum(-1) - lengths  # [G, n]: each completion's first column
        W = width or tree_width(attention_mask, P, n)
        ids = torch.zeros(G, W, dtype=sequences.dtype, device=dev)
        positions = torch.zeros(G, W, dtype=torch.long, device=dev)
        branch = torch.full((G, W), PAD, device=dev)

        # The prompt, left padding dropped: columns 0 .. prompt_len - 1.
        pcol = torch.arange(P, device=dev) - (P - prompt_len[:, None])  # [G, P]; < 0 on padding
        p_on = pcol >= 0
        g = torch.arange(G, device=dev)[:, None].expand(G, P)[p_on]
        ids[g, pcol[p_on]] = sequences[::n, :P][p_on]
        positions[g, pcol[p_on]] = pcol[p_on]
        branch[g, pcol[p_on]] = PROMPT

        # The completions one after another, each at the positions that follow the prompt.
        j = torch.arange(T, device=dev)
        ccol = starts[..., None] + j  # [G, n, T]
        g3 = torch.arange(G, device=dev)[:, None, None].expand(G, n, T)[on]
        i3 = torch.arange(n, device=dev)[None, :, None].expand(G, n, T)[on]
        j3 = j.expand(G, n, T)[on]
        ids[g3, ccol[on]] = completions
        positions[g3, ccol[on]] = prompt_len[g3] + j3
        branch[g3, ccol[on]] = i3

        # Causal in the row's order; a key is the prompt or the query's own completion, never
        # padding. Every position sees itself, so no row of the mask is empty (padding's outputs are never read).
        col = torch.arange(W, device=dev)
        key, query = branch[:, None, :], branch[:, :, None]
        mask = (col[None, :] <= col[:, None]) & (key != PAD) & ((key == PROMPT) | (key == query))
        mask |= torch.eye(W, dtype=torch.bool, device=dev)

        # A completion's first token is predicted by the prompt's last position, the others by the token before.
        predictor = torch.where(j3 == 0, prompt_len[g3] - 1, ccol[on] - 1)
        return cls(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask[:, None],
            picked=g3 * W + predictor,
            targets=completions,
            dest=(g3 * n + i3, P - 1 + j3),
            out_shape=(R, L - 1),
        )


def tree_width(attention_mask: torch.Tensor, prompt_width: int, group_size: int) -> int:
    """The longest group sequence of `Layout.tree`: its prompt and its completions, no padding."""
    prompt_len = attention_mask[::group_size, :prompt_width].sum(-1)
    completions = attention_mask[:, prompt_width:].sum(-1).view(-1, group_size).sum(-1)
    return int((prompt_len + completions).max())


@dataclass
class Outputs:
    logp: torch.Tensor  # [R, L - 1]: log pi(x_t | x_<t) at the sampling temperature, at completion tokens (0 elsewhere)
    entropy: torch.Tensor | None  # [R, L - 1]
    values: torch.Tensor | None  # [R, L - 1]: the value head's estimate before each completion token


class Actor(nn.Module):
    """A Hugging Face causal LM (LoRA adapters or not) with an optional value head on its last hidden state.

    One `forward` gives everything a loss needs, so that FSDP's hooks on this module gather every
    parameter the step uses, the value head's included.
    """

    def __init__(self, policy: nn.Module, value_head: bool = False):
        super().__init__()
        self.policy = policy
        self.value_head = nn.Linear(policy.config.hidden_size, 1, bias=False) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)  # V = 0 at first: the first advantages are the returns

    def forward(self, layout: Layout, temperature: float, with_entropy: bool = False, with_values: bool = False) -> Outputs:
        """Outputs at the layout's completion tokens, zero elsewhere. It runs the decoder and then the
        LM head at the picked positions only (the supported families apply nothing to logits between)."""
        hidden = self.policy.get_decoder()(input_ids=layout.input_ids, attention_mask=self._mask(layout),
                                           position_ids=layout.position_ids, use_cache=False).last_hidden_state
        hidden = hidden.flatten(0, 1)[layout.picked]  # [N, hidden]
        logprobs = torch.log_softmax(self.policy.get_output_embeddings()(hidden).float() / temperature, dim=-1)

        def place(x: torch.Tensor) -> torch.Tensor:
            out = x.new_zeros(layout.out_shape)
            out[layout.dest] = x
            return out

        logp = place(logprobs.gather(-1, layout.targets[:, None]).squeeze(-1))
        entropy = place(-(logprobs.exp() * logprobs).sum(-1)) if with_entropy else None
        values = place(self.value_head(hidden).squeeze(-1).float()) if with_values else None
        return Outputs(logp, entropy, values)

    def _mask(self, layout: Layout) -> torch.Tensor | dict[str, torch.Tensor]:
        """A tree's 4D mask as the model's attention takes it: SDPA (which reads a boolean mask as
        given), with a sliding window where the model's layers have one (by position distance, as
        HF applies it to the plain rows)."""
        mask, config = layout.attention_mask, self.policy.config
        if mask.dim() != 4:
            return mask
        if config._attn_implementation != "sdpa":
            raise ValueError(f"the prompt-tree layout needs SDPA attention, not {config._attn_implementation}")
        window, types = getattr(config, "sliding_window", None), getattr(config, "layer_types", None)
        if not window or (types is not None and "sliding_attention" not in types):
            return mask
        pos = layout.position_ids
        near = mask & ((pos[:, None, :, None] - pos[:, None, None, :]) < window)
        return near if types is None else {"full_attention": mask, "sliding_attention": near}
