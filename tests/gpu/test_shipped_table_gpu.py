"""Every schedule in the shipped tuning table is correct on its bucket's shapes."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.reference import naive_attention
from tiledattention.schedules.policy import shipped_table_paths
from tiledattention.schedules.table import ScheduleTable
from tiledattention.tolerance import relative_error, rtol

ENTRIES = [e for p in shipped_table_paths() for e in ScheduleTable.load(p).entries.values()]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: "{dtype}_d{head_dim}_{causal}_s{s_bucket}"
                         .format(**e.bucket.__dict__))
def test_shipped_schedule_matches_float64(entry):
    b = entry.bucket
    if "{}.{}".format(*torch.cuda.get_device_capability()) != b.cc:
        pytest.skip(f"entry is for compute capability {b.cc}")
    dtype = getattr(torch, b.dtype)
    q = torch.randn(1, 2 * b.gqa, b.s_bucket, b.head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(1, 2, b.s_bucket, b.head_dim, device="cuda", dtype=dtype)
            for _ in range(2))
    out = ta.sdpa(q, k, v, causal=b.causal, enable_gqa=b.gqa > 1, schedule=entry.best)
    ref, _ = naive_attention(q, k, v, causal=b.causal)
    err = relative_error(out, ref)
    assert err <= rtol(b.dtype), f"{entry.best.label()}: relative error {err:.2e}"
