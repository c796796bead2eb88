"""The five-matmul backward (dQ reduce-added by TMA from the dK/dV program) and the issue-37
candidate schedules, against float64 autograd of the naive formula, on a CUDA GPU.

Each gradient is judged on its own by the one tolerance table (``tolerance.rtol_bwd``).
Shapes have a key/query tail (300 rows: the reduce-add's last tile lies partly outside dQ),
GQA (4 query heads on 2 K/V heads: two programs' groups add into one dQ head), and causal.
"""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel.plan import pinned_bwd_schedule
from tiledattention.reference import naive_attention
from tiledattention.schedules.backward import BwdSchedule, bwd_candidates
from tiledattention.tolerance import relative_error, rtol_bwd

CASES = [(d, name, s.label()) for d in (64, 96, 128, 160, 192, 256)
         for name, s in bwd_candidates(d).items()]


def _grads(q, k, v, dout, causal, label):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with pinned_bwd_schedule(BwdSchedule.from_label(label)):
        ta.sdpa(q, k, v, causal=causal, enable_gqa=True).backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,name,label", CASES, ids=[f"d{d}-{n}" for d, n, _ in CASES])
def test_candidate_backward_matches_float64_autograd(d, name, label, causal):
    torch.manual_seed(d)
    dtype = torch.bfloat16
    q = torch.randn(2, 4, 300, d, device="cuda").to(dtype)
    k, v = (torch.randn(2, 2, 300, d, device="cuda").to(dtype) for _ in range(2))
    dout = torch.randn_like(q)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = naive_attention(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1),
                             causal=causal)
    out.backward(dout.double())
    got = _grads(q, k, v, dout, causal, label)
    for gname, g, ref in zip(("dq", "dk", "dv"), got, (q64.grad, k64.grad, v64.grad)):
        err = relative_error(g, ref)
        assert err <= rtol_bwd(dtype), f"{label} D={d} causal={causal}: {gname} {err:.3e}"


def test_reduce_add_starts_from_zero_on_every_call():
    """dQacc is allocated uninitialised and zeroed by the delta pass: a second backward
    (reusing the first one's freed fp32 buffer) gives the same dQ up to the order of the
    fp32 additions, not twice it."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    dout = torch.randn_like(q)
    label = "kv64x128_q128x64_o1_w8_atomic"
    first = _grads(q, k, v, dout, False, label)[0]
    second = _grads(q, k, v, dout, False, label)[0]
    assert relative_error(second, first.double()) < 1e-2
