"""The backward (dQ, dK, dV) against float64 autograd of the naive formula, on a CUDA GPU.

Each gradient is judged on its own by the one tolerance table (``tolerance.rtol_bwd``).
Fully masked rows, where autograd of the naive formula is NaN, are judged against
``reference.attention_backward`` (pinned to autograd on the CPU: test_backward_reference).
"""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.reference import attention_backward, naive_attention
from tiledattention.tolerance import relative_error, rtol_bwd

DTYPES = [torch.float16, torch.bfloat16]


def _rand(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype)


def _reference_grads(q, k, v, dout, dlse, kw, formula):
    if formula:
        return attention_backward(q, k, v, dout, dlse=dlse, **kw)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = naive_attention(q64, k64, v64, **kw)
    loss = (out * dout.double()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse.double()).sum()
    loss.backward()
    return q64.grad, k64.grad, v64.grad


def check_grads(b, hq, hk, sq, sk, d, dtype, *, causal=False, scale=None, attn_mask=None,
                with_lse=False, formula=False):
    q, k, v = _rand(b, hq, sq, d, dtype=dtype), _rand(b, hk, sk, d, dtype=dtype), \
        _rand(b, hk, sk, d, dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kw = dict(causal=causal, scale=scale, attn_mask=attn_mask)
    res = ta.sdpa(q, k, v, enable_gqa=hq != hk, return_lse=with_lse, **kw)
    out, lse = res if with_lse else (res, None)
    dout = _rand(*out.shape, dtype=dtype)
    dlse = torch.randn(lse.shape, device="cuda") if with_lse else None
    torch.autograd.backward([out] + ([lse] if with_lse else []),
                            [dout] + ([dlse] if with_lse else []))
    torch.cuda.synchronize()
    refs = _reference_grads(q, k, v, dout, dlse, kw, formula)
    bound = rtol_bwd(dtype)
    errs = {}
    for name, t, ref in zip(("dq", "dk", "dv"), (q, k, v), refs):
        g = t.grad
        assert g.shape == t.shape and g.dtype == t.dtype, name
        assert torch.isfinite(g).all(), f"{name}: non-finite gradient"
        # Causal Sq = 1 has an exactly zero dQ/dK (P = 1): judge the rounding noise absolutely.
        errs[name] = relative_error(g, ref) if ref.norm() > 0 else g.abs().max().item()
    print(" ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    assert all(e <= bound for e in errs.values()), f"{errs} > {bound}"
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128, 160, 256])
def test_self_attention_grads_match_float64_autograd(dtype, causal, d):
    check_grads(2, 2, 2, 1000, 1000, d, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 300), (17, 1000), (1000, 17), (300, 129), (129, 300)])
def test_cross_attention_grads(dtype, causal, sq, sk):
    check_grads(1, 2, 2, sq, sk, 128, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hq,hk", [(8, 2), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_and_mqa_sum_dk_dv_over_the_group(dtype, hq, hk, causal):
    check_grads(2, hq, hk, 333, 333, 64, dtype, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["bool_full", "additive_heads", "key_padding"])
def test_masks_get_no_grad_but_qkv_do(dtype, kind):
    b, h, s = 2, 2, 300
    if kind == "bool_full":
        mask = torch.rand(b, h, s, s, device="cuda") > 0.4
        mask[..., 0] = True
    elif kind == "additive_heads":
        mask = torch.randn(1, h, s, s, device="cuda").to(dtype)
    else:
        mask = torch.ones(b, 1, 1, s, dtype=torch.bool, device="cuda")
        mask[1, ..., 200:] = False
    check_grads(b, h, h, s, s, 96, dtype, attn_mask=mask, causal=kind == "additive_heads")


@pytest.mark.parametrize("shape", [(1, 1, 300, 300), (2, 1, 1, 300)], ids=["full", "keypad"])
def test_a_bool_mask_is_read_as_it_is_and_matches_its_additive_twin_bitwise(shape):
    """A bool mask costs no conversion launches (host-cost.md §58a), forward or backward,
    and selecting -inf gives exactly what adding its additive twin (0 / -inf) gives."""
    from torch.profiler import ProfilerActivity, profile

    mask = torch.rand(shape, device="cuda") > 0.3
    mask[..., 0] = True
    twin = torch.zeros(shape, device="cuda", dtype=torch.bfloat16).masked_fill(~mask, -torch.inf)
    q, k, v = (_rand(2, 4, 300, 96, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = _rand(2, 4, 300, 96, dtype=torch.bfloat16)

    def run(m):
        out = ta.sdpa(q, k, v, attn_mask=m)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        return out, *grads

    want, got = run(twin), run(mask)  # both compiled and warm
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(mask)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert names and all("attention_" in n for n in names), names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [64, 160])  # delta over one and two head-dim chunks
def test_custom_scale_and_lse_gradient(dtype, d):
    check_grads(1, 2, 2, 257, 257, d, dtype, scale=0.05, with_lse=True)


@pytest.mark.parametrize("label,want", [
    ("kv64x64_q64x64_o2", ["attention_bwd_dq", "attention_bwd_dkdv"]),
    ("kv64x64_q64x64_o1_atomic", ["attention_bwd_delta", "attention_bwd_dkdv"]),
])
def test_the_backward_is_two_launches_the_one_writing_delta_first(label, want):
    from torch.profiler import ProfilerActivity, profile

    from tiledattention.kernel.plan import pinned_bwd_schedule
    from tiledattention.schedules.backward import BwdSchedule

    q, k, v = (_rand(1, 2, 300, 64, dtype=torch.float16).requires_grad_() for _ in range(3))
    dout = _rand(1, 2, 300, 64, dtype=torch.float16)
    with pinned_bwd_schedule(BwdSchedule.from_label(label)):
        ta.sdpa(q, k, v, causal=True).backward(dout)  # compiled and warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            ta.sdpa(q, k, v, causal=True).backward(dout)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    ours = [n for n in names if "attention_bwd" in n]
    assert [next(w for w in want if w in n) for n in ours] == want, names


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_get_zero_grads_no_nan(dtype):
    mask = torch.ones(1, 1, 200, 200, dtype=torch.bool, device="cuda")
    mask[..., 5, :] = False
    mask[..., 150:, :] = False
    q, _, _ = check_grads(1, 2, 2, 200, 200, 64, dtype, attn_mask=mask, formula=True)
    assert (q.grad[:, :, 5] == 0).all() and (q.grad[:, :, 150:] == 0).all()


@pytest.mark.parametrize("label", ["kv64x64_q64x64_o1_atomic", "kv64x128_q128x64_o2",
                                   "kv128x64_q64x128_o1"])
@pytest.mark.parametrize("causal", [False, True])
def test_other_backward_schedules_agree(label, causal):
    from tiledattention.kernel.plan import pinned_bwd_schedule
    from tiledattention.schedules.backward import BwdSchedule

    with pinned_bwd_schedule(BwdSchedule.from_label(label)):
        check_grads(2, 4, 2, 300, 300, 96, torch.float16, causal=causal)


def test_a_backward_schedule_pinned_around_the_forward_holds_for_its_backward():
    from tiledattention.kernel import plan as planning
    from tiledattention.schedules.backward import BwdSchedule

    pinned = BwdSchedule.from_label("kv64x64_q64x64_o2")
    q, k, v = (_rand(1, 2, 256, 64, dtype=torch.float16).requires_grad_() for _ in range(3))
    with planning.pinned_bwd_schedule(pinned):
        out = ta.sdpa(q, k, v)
    planning.clear()
    out.sum().backward()  # outside the block: the harness' bwd pass replays it like this
    bwd = [p for p in planning._plans.values() if isinstance(p, planning.BwdPlan)]
    assert [p.variant.schedule for p in bwd] == [pinned]


def test_backward_is_deterministic():
    def grads():
        torch.manual_seed(3)
        q, k, v = (_rand(2, 4, 777, 128, dtype=torch.bfloat16).requires_grad_()
                   for _ in range(3))
        ta.sdpa(q, k, v, causal=True).backward(torch.ones(2, 4, 777, 128, device="cuda",
                                                          dtype=torch.bfloat16))
        return q.grad, k.grad, v.grad
    for a, b in zip(grads(), grads()):
        assert torch.equal(a, b)


def test_grads_under_torch_compile():
    q, k, v = (_rand(1, 2, 256, 64, dtype=torch.float16).requires_grad_() for _ in range(3))

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return ta.sdpa(q, k, v, causal=True).float().square().sum()

    f(q, k, v).backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64, v64, causal=True)[0].square().sum().backward()
    for t, ref in zip((q, k, v), (q64, k64, v64)):
        assert relative_error(t.grad, ref.grad) <= rtol_bwd(torch.float16)


def test_no_grad_calls_keep_the_fast_path_and_no_lse():
    q = _rand(1, 1, 16, 64, dtype=torch.float16).requires_grad_()
    with torch.no_grad():
        out = ta.sdpa(q, q.detach(), q.detach())
    assert out.grad_fn is None
    out = ta.sdpa(q, q.detach(), q.detach())
    assert out.grad_fn is not None
