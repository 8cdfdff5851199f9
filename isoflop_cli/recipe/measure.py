"""Measured FLOPs (`flops.measure=true`): torch's FlopCounterMode, the truth the ledger is checked against.

torch registers FLOP formulas for the GPU attention kernels but not for the CPU flash kernel that
`scaled_dot_product_attention` runs here; without these two registrations the measurement would
silently miss every attention product on CPU.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.utils.flop_counter import FlopCounterMode, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
def _cpu_flash_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _cpu_flash_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


class Meter:
    """Adds up measured FLOPs per ledger part; does nothing when off."""

    def __init__(self, on: bool):
        self.on = on
        self.totals: dict[str, float] = {}

    @contextlib.contextmanager
    def count(self, part: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        with FlopCounterMode(display=False) as counter:
            yield
        self.totals[part] = self.totals.get(part, 0.0) + counter.get_total_flops()
