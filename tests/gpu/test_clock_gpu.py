"""NVML's SM clock on a GPU (``bench.clock``): sampled while kernels run, and recorded in
a bench row as ``sm_clock_mhz``."""

from __future__ import annotations

import torch

from tiledattention.bench.clock import ClockSampler


def test_the_sm_clock_is_sampled_while_kernels_run():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with ClockSampler(torch.device("cuda")) as clock:
        for _ in range(200):
            a @ a
        torch.cuda.synchronize()
    assert len(clock.samples) >= 3
    assert all(200 <= mhz <= 3000 for mhz in clock.samples)
