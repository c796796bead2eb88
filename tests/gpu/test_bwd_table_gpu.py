"""The shipped backward table on a CUDA GPU of compute capability 9.0 (the H100 table): where
it reduce-adds dQ (D = 64 bf16 non-causal S = 4096) the gradients match float64 autograd;
under ``torch.use_deterministic_algorithms(True)`` the same call runs the seven-matmul
schedule and repeats bit for bit; D = 256 runs the two-warp-group schedule."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.reference import naive_attention
from tiledattention.schedules.policy import choose_bwd_schedule
from tiledattention.tolerance import relative_error, rtol_bwd

DTYPE = torch.bfloat16


@pytest.fixture(autouse=True)
def h100_table():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the shipped backward table is for compute capability 9.0")
    ta.set_schedule_table(None)
    yield
    torch.use_deterministic_algorithms(False)


def _inputs(s, d):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, s, d, device="cuda").to(DTYPE) for _ in range(3))
    return q, k, v, torch.randn_like(q)


def _grads(q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ta.sdpa(*leaves).backward(dout)
    return [t.grad for t in leaves]


def test_the_reduce_add_bucket_matches_float64_and_deterministic_mode_repeats_bitwise():
    q, k, v, dout = _inputs(4096, 64)
    assert choose_bwd_schedule(q, k, False, False)[0].dq == "atomic"
    assert choose_bwd_schedule(q, k, False, True)[0].dq == "kernel"
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64, v64)[0].backward(dout.double())
    refs = (q64.grad, k64.grad, v64.grad)
    fast = _grads(q, k, v, dout)
    torch.use_deterministic_algorithms(True)
    first, second = _grads(q, k, v, dout), _grads(q, k, v, dout)
    for name, g, d1, d2, ref in zip("qkv", fast, first, second, refs):
        assert relative_error(g, ref) <= rtol_bwd(DTYPE), f"d{name} (reduce-add)"
        assert relative_error(d1, ref) <= rtol_bwd(DTYPE), f"d{name} (deterministic)"
        assert torch.equal(d1, d2), f"d{name} differs between two deterministic runs"


@pytest.mark.parametrize("causal", [False, True])
def test_d256_runs_two_consumer_warp_groups_and_matches_float64(causal):
    q, k, v, dout = _inputs(1024, 256)
    assert choose_bwd_schedule(q, k, causal)[0].label() == "kv64x64_q64x64_o1_w8"
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ta.sdpa(*leaves, is_causal=causal).backward(dout)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64, v64, causal=causal)[0].backward(dout.double())
    for name, t, ref in zip("qkv", leaves, (q64.grad, k64.grad, v64.grad)):
        assert relative_error(t.grad, ref) <= rtol_bwd(DTYPE), f"d{name}"
