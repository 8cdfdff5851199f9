"""Wall time per part of a step, and measured FLOPs (`flops.measure=true`): torch's FlopCounterMode, the truth the ledger is checked against.

torch registers FLOP formulas for the GPU attention kernels but not for the CPU flash kernel that
`scaled_dot_product_attention` runs here; without these two registrations the measurement would
silently miss every attention product on CPU.
"""

from __future__ import annotations

import contextlib
import time
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
