"""Wall time per part of a step, and measured FLOPs (`flops.measure=true`): torch's FlopCounterMode,
the truth the ledger is checked against.

torch registers FLOP formulas for the GPU attention kernels but not for the CPU flash kernel that
`scaled_dot_product_attention` runs here; without these two registrations the measurement would
silently miss every attention product on CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula

aten = torch.ops.aten

# Grouped-query attention: torch before 2.13 counts SDPA only when key and value have as many heads as
# the query and asserts otherwise (seen on torch 2.11 with CUDA's kernels and Qwen2.5's 14/2 heads).
# A query head's products cost the same whichever key/value head it shares, so the count is the one
# with the key/value heads repeated; torch's own formulas look these two up by name when they count.
_sdpa_flop_count, _sdpa_backward_flop_count = flop_counter.sdpa_flop_count, flop_counter.sdpa_backward_flop_count


def _heads_as_query(query_shape, shape) -> tuple[int, ...]:
    return (shape[0], query_shape[1], *shape[2:])  # [b, h_kv, s, d] -> [b, h_q, s, d]


def sdpa_flop_count(query_shape, key_shape, value_shape) -> int:
    return _sdpa_flop_count(
        query_shape, _heads_as_query(query_shape, key_shape), _heads_as_query(query_shape, value_shape)
    )


def sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape) -> int:
    return _sdpa_backward_flop_count(
        grad_out_shape, query_shape, _heads_as_query(query_shape, key_shape), _heads_as_query(query_shape, value_shape)
    )


flop_counter.sdpa_flop_count, flop_counter.sdpa_backward_flop_count = sdpa_flop_count, sdpa_backward_flop_count


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
def _cpu_flash_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _cpu_flash_attention_backward(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


class Meter:
    """Adds up wall time per ledger part, and measured FLOPs when on, into the dicts it is given.

    On a GPU the clock is read after the device has finished what was queued: kernels run
    asynchronously, so an unsynchronised part would be charged for its predecessor's work and leave
    its own to the next (time_* and MFU off in both directions)."""

    def __init__(self, on: bool, seconds: dict[str, float], totals: dict[str, float]):
        self.on = on
        self.seconds = seconds
        self.totals = totals
        self.synchronize = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None

    @contextlib.contextmanager
    def count(self, part: str) -> Iterator[None]:
        self.synchronize()
        start = time.perf_counter()
        try:
            if not self.on:
                yield
                return
            with FlopCounterMode(display=False) as counter:
                yield
            self.totals[part] = self.totals.get(part, 0.0) + counter.get_total_flops()
        finally:
            self.synchronize()
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
