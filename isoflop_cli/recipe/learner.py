"""The learner's model, and how a learning pass lays out a batch of rollouts.

A rollout batch is [R, L]: each row a left-padded prompt (width P) then its completion,
right-padded after eos. The learner needs the log-prob of every completion token, nothing at the
prompt. Two layouts give exactly those, from one forward each:

- `Layout.plain`: the rows as they are (HF's causal mask with the padding mask).
- `Layout.tree`: the whole batch as one sequence, each prompt group's prompt once and then its n
  completions, no padding. The projections and MLPs run each prompt once instead of n times and
  never run on padding. Its attention (`Tree`) gives each completion its prompt and itself: the
  plain rows' attention at the completion tokens, and each prompt's over itself, once.

Logits are computed only at the positions that predict a completion token (at a real vocabulary
the log-softmax over every position is most of a pass's memory), and only a chunk of those at a
time (`token_logprobs`). A step's rows reach the model in micro-batches of whole prompt groups, by
rows or by the positions the layout feeds the model (`pack`; a group over that budget in pieces).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

TREE_ATTENTION = "isoflop_tree"  # the attention implementation an Actor gives its policy: SDPA, or a tree's


@dataclass
class Tree:
    """Where a prompt tree's attention reads its queries, keys and values (positions in its sequence).

    A mask over the whole sequence would have SDPA compute its whole square: every group and
    completion against every other. Instead each completion attends over its row as the rollout
    holds it, [prompt, left padded | completion], gathered from the tree's keys and values, and
    each prompt over itself: the work of the plain rows' attention at the completion tokens.
    """

    prompt: torch.Tensor  # [G, P] each group's prompt slots, left-padded (padding: 0)
    prompt_on: torch.Tensor  # [G, P] which of them hold a token
    rows: torch.Tensor  # [R, L] each rollout row: its group's prompt slots, then its completion's (padding: 0)
    rows_on: torch.Tensor  # [R, L]
    source: (
        torch.Tensor
    )  # [S] each position's output among the prompt slots' (G * P), then the completion slots' (R * T)
    masks: dict = field(default_factory=dict)  # sliding window (None: none) -> (prompt mask, row mask)

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        dropout: float = 0.0,
        scaling: float | None = None,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """[1, S, heads, d] from HF's [1, heads, S, d] query and [1, kv_heads, S, d] key and value."""
        P = self.prompt.shape[1]
        repeat = query.shape[1] // key.shape[1]  # grouped-query attention: each key head serves `repeat` query heads
        q, k, v = (
            x[0].transpose(0, 1).repeat_interleave(r, 1) for x, r in ((query, 1), (key, repeat), (value, repeat))
        )  # [S, heads, d]

        def gather(x: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            """[B, slots, heads, d] -> [B, heads, slots, d]; index_select's backward is a fast index_add."""
            return x.index_select(0, at.flatten()).view(*at.shape, *x.shape[1:]).transpose(1, 2)

        def sdpa(queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            out = F.scaled_dot_product_attention(
                gather(q, queries), gather(k, keys), gather(v, keys), attn_mask=mask, dropout_p=dropout, scale=scaling
            )
            return out.transpose(1, 2).flatten(0, 1)  # [queries, heads, d]

        prompt_mask, row_mask = self._masks(sliding_window)
        prompts = sdpa(self.prompt, self.prompt, prompt_mask)
        completions = sdpa(self.rows[:, P:], self.rows, row_mask)
        return torch.cat([prompts, completions]).index_select(0, self.source)[None]

    def _masks(self, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts' [G, 1, P, P] and the rows' [R, 1, T, L]: each query (at the last slots) sees
        the token slots up to its own (within the window); every query sees itself, so a padding
        query's row is not empty (its output is never read). Built once per layout and window."""
        if window not in self.masks:

            def causal(on: torch.Tensor, queries: int) -> torch.Tensor:
                slot = torch.arange(on.shape[1], device=on.device)
                at = slot[-queries:, None]
                see = (slot <= at) & (at - slot < window) if window else slot <= at
                return ((on[:, None, :] & see) | (slot == at))[:, None]

            self.masks[window] = (
                causal(self.prompt_on, self.prompt.shape[1]),
                causal(self.rows_on, self.rows.shape[1] - self.prompt.shape[1]),
            )
        return self.masks[window]


def _attention(module, query, key, value, attention_mask, tree: Tree | None = None, **kwargs):
    """HF's SDPA attention, or a prompt tree's when the forward carries one (`Actor.forward`)."""
    if tree is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return tree.attend(
        query, key, value, kwargs.get("dropout", 0.0), kwargs.get("scaling"), kwargs.get("sliding_window")
    ), None


AttentionInterface.register(TREE_ATTENTION, _attention)
AttentionMaskInterface.register(TREE_ATTENTION, sdpa_mask)  # outside a tree: SDPA's masks (sampling, plain rows)


@dataclass
class Layout:
    input_ids: torch.Tensor  # [rows, width]
    position_ids: torch.Tensor  # [rows, width]
    attention_mask: torch.Tensor  # [rows, width] padding mask (a tree: all ones, its attention is `prompt_tree`'s)
    picked: torch.Tensor  # [N]: flat positions (row * width + column) whose logits predict a completion token
    targets: torch.Tensor  # [N]: those tokens
    dest: tuple[torch.Tensor, torch.Tensor]  # [N] each: (row, column) of each in the [R, L - 1] outputs
    out_shape: tuple[int, int]  # (R, L - 1)
    prompt_tree: Tree | None = None  # the tree layout's attention

    @classmethod
    def plain(cls, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> Layout:
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
    def tree(cls, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, group_size: int) -> Layout:
        """Rows in consecutive groups of `group_size` share their prompt. The groups follow one
        another in a single sequence: no padding at all."""
        R, L = sequences.shape
        P, n, dev = prompt_width, group_size, sequences.device
        G, T = R // n, L - P
        prompt_len = attention_mask[::n, :P].sum(-1)  # [G]
        assert R % n == 0 and bool((prompt_len > 0).all()), "whole groups, each with a prompt"
        assert torch.equal(sequences[:, :P].view(G, n, P), sequences[::n, None, :P].expand(G, n, P)), (
            "a group shares its prompt"
        )
        on = attention_mask[:, P:].bool().view(G, n, T)  # [G, n, T] completion tokens
        lengths = on.sum(-1)  # [G, n]
        widths = prompt_len + lengths.sum(-1)  # [G]
        first = widths.cumsum(0) - widths  # [G]: each group's first position
        starts = first[:, None] + prompt_len[:, None] + lengths.cumsum(-1) - lengths  # [G, n]: each completion's
        S = int(widths.sum())
        ids = torch.empty(S, dtype=sequences.dtype, device=dev)
        positions = torch.empty(S, dtype=torch.long, device=dev)
        source = torch.empty(S, dtype=torch.long, device=dev)  # each position's attention output (see Tree)

        # Each group's prompt, left padding dropped, then its completions one after another, each at
        # the positions that follow the prompt.
        pcol = torch.arange(P, device=dev) - (P - prompt_len[:, None])  # [G, P]: position in the prompt; < 0 on padding
        p_on = pcol >= 0
        prompt_at = torch.where(p_on, first[:, None] + pcol, 0)  # [G, P]
        ids[prompt_at[p_on]] = sequences[::n, :P][p_on]
        positions[prompt_at[p_on]] = pcol[p_on]
        source[prompt_at[p_on]] = torch.arange(G * P, device=dev).view(G, P)[p_on]
        j = torch.arange(T, device=dev)
        at = starts[..., None] + j  # [G, n, T]
        ids[at[on]] = sequences[:, P:].reshape(G, n, T)[on]
        positions[at[on]] = (prompt_len[:, None, None] + j).expand(G, n, T)[on]
        source[at[on]] = G * P + torch.arange(R * T, device=dev).view(G, n, T)[on]

        # A completion's first token is predicted by the prompt's last position, the others by the token before.
        predictor = torch.where(j == 0, (first + prompt_len - 1)[:, None, None], at - 1)[on]
        row = torch.arange(R, device=dev).view(G, n, 1).expand(G, n, T)[on]
        col = (P - 1 + j).expand(G, n, T)[on]
        rows = torch.cat([prompt_at.repeat_interleave(n, 0), torch.where(on, at, 0).view(R, T)], dim=1)  # [R, L]
        return cls(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=torch.ones(
                1, S, dtype=torch.long, device=dev
            ),  # the tree's attention ignores it; all ones, HF builds no mask
            picked=predictor,
            targets=sequences[:, P:].reshape(G, n, T)[on],
            dest=(row, col),
            out_shape=(R, L - 1),
            prompt_tree=Tree(prompt_at, p_on, rows, attention_mask.bool(), source),
        )


def tree_tokens(
    attention_mask: torch.Tensor, prompt_width: int, group_size: int, trees: torch.Tensor | None = None
) -> int:
    """The positions of `Layout.tree`: each group's prompt once (or once per piece, `trees` [G] from
    `tree_pieces`), then every completion token."""
    prompts = attention_mask[::group_size, :prompt_width].sum(-1)  # [G]
    return int((prompts * (1 if trees is None else trees)).sum() + attention_mask[:, prompt_width:].sum())


def pack(shared: torch.Tensor, rows: torch.Tensor, budget: int) -> list[int]:
    """Rows per micro-batch, in order, for consecutive groups of k rows with `shared` [G] positions
    each (a tree's prompt, laid out once; 0 for plain rows) and `rows` [G, k] positions per row:
    whole groups packed up to `budget` positions; a group over it split into pieces of its rows
    (`pieces`), each piece a micro-batch of its own. What a forward holds grows with its positions,
    not its rows: completions that run long fill a micro-batch with fewer groups, short ones with
    more, and a group at large n and long completions (n = 128 x 2k tokens: 263k positions) is
    never one forward."""
    counts, held, packing = [], 0, False
    k = rows.shape[1]
    for s, r in zip(shared.tolist(), rows.tolist()):
        total = s + sum(r)
        if total > budget:
            counts += pieces(s, r, budget)
            packing = False
        elif packing and held + total <= budget:
            counts[-1] += k
            held += total
        else:
            counts.append(k)
            held, packing = total, True
    return counts


def pieces(shared: int, rows: list[int], budget: int) -> list[int]:
    """A group's rows in consecutive pieces of at most `budget` positions, each with the group's
    `shared` positions once (a row over the budget alone): the rows in each piece. Splitting a
    group costs its prompt once more per piece (in the ledger: `flops.tree_work`'s trees); the
    gradient is unchanged, since token weights and advantages are the whole mini-batch's."""
    counts, held = [], 0
    for t in rows:
        if counts and held + t <= budget:
            counts[-1] += 1
            held += t
        else:
            counts.append(1)
            held = shared + t
    return counts


def tree_pieces(attention_mask: torch.Tensor, prompt_width: int, group_size: int, budget: int) -> torch.Tensor:
    """[G]: the prompt trees each group's rows are laid out in: 1, or with a token budget
    (`learner.max_tokens_per_micro_batch`) the pieces of a group over it."""
    prompts = attention_mask[::group_size, :prompt_width].sum(-1)  # [G]
    if not budget:
        return torch.ones_like(prompts)
    completions = attention_mask[:, prompt_width:].sum(-1).view(-1, group_size)  # [G, k]
    return torch.tensor(
        [len(pieces(s, r, budget)) for s, r in zip(prompts.tolist(), completions.tolist())]
    )  # a group within it: one piece


def token_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(target) and the entropy ([N] each) at N positions from their last hidden states
    ([N, hidden]) and the LM head, `chunk` positions at a time.

    The fp32 log-softmax over the vocabulary is the largest tensor of a learning pass (152k x 32k
    tokens: 20 GB a copy), and backward needs it, the entropy's product besides. With gradients
    and more than one chunk, each chunk runs under a (non-reentrant) checkpoint: autograd keeps
    only the chunk's inputs (views of `hidden` and `targets`) and recomputes its logits in its own
    backward, so one chunk's [chunk, vocab] tensors exist at a time (the recomputation is the LM
    head's forward once more, like activation checkpointing). The recomputation reads the head's
    weight as the forward did, and the gradients flow along the forward's own graph: a weight that
    FSDP2 gathers on the Actor, a tied embedding, a frozen head under LoRA get what they get
    without chunks. A single chunk, or a pass without gradients, computes directly (nothing
    recomputed; without gradients each chunk's logits are freed before the next).
    """

    def chunk_logprobs(
        h: torch.Tensor, t: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # [c, hidden], [c] -> [c], [c]
        logprobs = torch.log_softmax(head(h).float() / temperature, dim=-1)  # [c, vocab]
        entropy = -(logprobs.exp() * logprobs).sum(-1) if with_entropy else None
        return logprobs.gather(-1, t[:, None]).squeeze(-1), entropy

    pieces = zip(hidden.split(chunk), targets.split(chunk))
    if len(hidden) > chunk and torch.is_grad_enabled():
        parts = [
            checkpoint(chunk_logprobs, h, t, use_reentrant=False, preserve_rng_state=False) for h, t in pieces
        ]  # nothing random to replay
    else:
        parts = [chunk_logprobs(h, t) for h, t in pieces]
    logp, entropy = zip(*parts)
    return torch.cat(logp), torch.cat(entropy) if with_entropy else None


@dataclass
class Outputs:
    logp: torch.Tensor  # [R, L - 1]: log pi(x_t | x_<t) at the sampling temperature, at completion tokens (0 elsewhere)
    entropy: torch.Tensor | None  # [R, L - 1]
    values: torch.Tensor | None  # [R, L - 1]: the value head's estimate before each completion token


class Actor(nn.Module):
    """A Hugging Face causal LM (LoRA adapters or not) with an optional value head on its last hidden state.

    One `forward` gives everything a loss needs, so that FSDP's hooks on this module gather every
    parameter the step uses, the value head's included. Log-probs and entropies are computed
    `logit_chunk` tokens at a time (`token_logprobs`; the Trainer passes learner.logit_chunk_tokens,
    None: all in one chunk).
    """

    def __init__(self, policy: nn.Module, value_head: bool = False, logit_chunk: int | None = None):
        super().__init__()
        self.policy, self.logit_chunk = policy, logit_chunk
        if policy.config._attn_implementation == "sdpa":
            policy.set_attn_implementation(
                TREE_ATTENTION
            )  # SDPA as before, and the tree's attention where a forward carries one
        self.value_head = nn.Linear(policy.config.hidden_size, 1, bias=False) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)  # V = 0 at first: the first advantages are the returns

    def forward(
        self, layout: Layout, temperature: float, with_entropy: bool = False, with_values: bool = False
    ) -> Outputs:
        """Outputs at the layout's completion tokens, zero elsewhere. It runs the decoder and then the
        LM head at the picked positions only (the supported families apply nothing to logits between)."""
        tree = {}
        if layout.prompt_tree is not None:
            if (attention := self.policy.config._attn_implementation) != TREE_ATTENTION:
                raise ValueError(f"the prompt-tree layout needs SDPA attention, not {attention}")
            tree = {"tree": layout.prompt_tree}  # HF hands the forward's extra arguments to each layer's attention
        hidden = self.policy.get_decoder()(
            input_ids=layout.input_ids,
            attention_mask=layout.attention_mask,
            position_ids=layout.position_ids,
            use_cache=False,
            **tree,
        ).last_hidden_state
        hidden = hidden.flatten(0, 1)[layout.picked]  # [N, hidden]
        logp, entropy = token_logprobs(
            self.policy.get_output_embeddings(),
            hidden,
            layout.targets,
            temperature,
            self.logit_chunk or len(hidden),
            with_entropy,
        )

        def place(x: torch.Tensor) -> torch.Tensor:
            out = x.new_zeros(layout.out_shape)
            out[layout.dest] = x
            return out

        values = place(self.value_head(hidden).squeeze(-1).float()) if with_values else None
        return Outputs(place(logp), place(entropy) if with_entropy else None, values)
