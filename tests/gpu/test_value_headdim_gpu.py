"""D_qk != D_v forward (MLA's (192, 128), and (128, 64)) on a CUDA GPU: against the float64
reference (softmax(Q K^T / sqrt(D_qk)) V) by the tolerance table, and against torch's SDPA;
causal and not, MHA, GQA and MQA, prefill and decode (GQA packing, split-K), masks, the
LSE, torch.compile; and its backward (dQ, dK of Q/K's head dim, dV of V's) against the
float64 backward (``tolerance.rtol_bwd``) and torch's SDPA backward, with the LSE's
gradient, dQ by reduce-add, and a torch.compile training step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.reference import attention_backward, naive_attention
from tiledattention.tolerance import relative_error, rtol, rtol_bwd

DTYPES = [torch.float16, torch.bfloat16]
SHAPES = [(192, 128), (128, 64)]  # (D_qk, D_v)


def _rand(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype)


def _qkv(b, hq, hk, sq, sk, dqk, dv, dtype):
    return (_rand(b, hq, sq, dqk, dtype=dtype), _rand(b, hk, sk, dqk, dtype=dtype),
            _rand(b, hk, sk, dv, dtype=dtype))


def check(q, k, v, *, causal=False, attn_mask=None, return_lse=False):
    gqa = q.shape[1] != k.shape[1]
    res = ta.sdpa(q, k, v, is_causal=causal, attn_mask=attn_mask, enable_gqa=gqa,
                  return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    ref, ref_lse = naive_attention(q, k, v, causal=causal, attn_mask=attn_mask)
    assert out.shape == (*q.shape[:3], v.shape[3]) and out.dtype == q.dtype
    assert torch.isfinite(out).all()
    err = relative_error(out, ref)
    assert err <= rtol(q.dtype), f"relative error {err:.3e}"
    if return_lse:
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-2, rtol=1e-3)
    if attn_mask is None:  # torch's SDPA (any backend) within the same tolerance
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        assert relative_error(want, ref) <= rtol(q.dtype)
        assert relative_error(out, want.double()) <= 2 * rtol(q.dtype)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (128, 128), (1000, 1000), (4096, 4096),
                                   (100, 1000), (1000, 300)])
def test_prefill_matches_the_float64_reference_and_torch(dtype, dqk, dv, causal, sq, sk):
    b, h = (1, 2) if max(sq, sk) >= 1000 else (2, 3)
    check(*_qkv(b, h, h, sq, sk, dqk, dv, dtype), causal=causal, return_lse=True)


@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hk", [(8, 2), (16, 1)])  # GQA, MQA
@pytest.mark.parametrize("sq,sk", [(1, 4096), (4, 1000), (512, 512)])
def test_gqa_and_mqa_prefill_and_decode(dqk, dv, causal, hq, hk, sq, sk):
    # Sq <= 16 packs a group's query heads into one tile and splits the keys (split-K):
    # the partials and the combine run over V's head dim.
    check(*_qkv(2, hq, hk, sq, sk, dqk, dv, torch.bfloat16), causal=causal, return_lse=True)


@pytest.mark.parametrize("dqk,dv", SHAPES)
def test_a_key_padding_mask_and_a_custom_scale(dqk, dv):
    q, k, v = _qkv(2, 4, 4, 200, 300, dqk, dv, torch.float16)
    mask = torch.ones(2, 1, 1, 300, dtype=torch.bool, device="cuda")
    mask[1, ..., 150:] = False
    check(q, k, v, attn_mask=mask)
    out = ta.sdpa(q, k, v, scale=0.05)
    ref, _ = naive_attention(q, k, v, scale=0.05)
    assert relative_error(out, ref) <= rtol(q.dtype)


def test_repeat_calls_reuse_the_plan_and_compile_fullgraph():
    q, k, v = _qkv(1, 4, 2, 256, 256, 192, 128, torch.bfloat16)
    first = ta.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(ta.sdpa(q, k, v, is_causal=True, enable_gqa=True), first)
    compiled = torch.compile(lambda a, b, c: ta.sdpa(a, b, c, is_causal=True, enable_gqa=True),
                             fullgraph=True)
    assert torch.equal(compiled(q, k, v), first)


def check_grads(q, k, v, *, causal=False, with_lse=False):
    """Gradients of ``sdpa`` against the float64 backward by the tolerance table, and
    torch's SDPA backward (of the same inputs) within twice it."""
    gqa = q.shape[1] != k.shape[1]
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    res = ta.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa, return_lse=with_lse)
    out, lse = res if with_lse else (res, None)
    dout = torch.randn_like(out)
    dlse = torch.randn(lse.shape, device="cuda") if with_lse else None
    torch.autograd.backward([out] + ([lse] if with_lse else []),
                            [dout] + ([dlse] if with_lse else []))
    refs = attention_backward(q.detach(), k.detach(), v.detach(), dout, causal=causal,
                              dlse=dlse)
    bound = rtol_bwd(q.dtype)
    for name, t, ref in zip(("dq", "dk", "dv"), (q, k, v), refs):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
        assert torch.isfinite(t.grad).all(), f"{name}: non-finite gradient"
        err = relative_error(t.grad, ref) if ref.norm() > 0 else t.grad.abs().max().item()
        assert err <= bound, f"{name}: relative error {err:.3e} > {bound}"
    if with_lse:
        return
    tq, tk, tv = (t.detach().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=gqa).backward(dout)
    for name, t, want, ref in zip(("dq", "dk", "dv"), (q, k, v), (tq, tk, tv), refs):
        if ref.norm() == 0:
            # One key per row: dS = P (dP - delta) is exactly 0, so dQ is too; both
            # implementations return rounding noise, whose ratio means nothing. Both must be
            # that small (ours is checked above).
            assert want.grad.abs().max().item() <= bound, f"{name}: torch's is not ~0"
            continue
        err = relative_error(t.grad, want.grad.double())
        assert err <= 2 * bound, f"{name} vs torch: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (128, 128), (1000, 1000), (100, 1000),
                                   (1000, 300)])
def test_grads_match_the_float64_backward_and_torch(dtype, dqk, dv, causal, sq, sk):
    b, h = (1, 2) if max(sq, sk) >= 1000 else (2, 3)
    check_grads(*_qkv(b, h, h, sq, sk, dqk, dv, dtype), causal=causal)


@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hk", [(8, 2), (16, 1)])  # GQA, MQA: dK, dV summed over a group
def test_gqa_and_mqa_grads(dqk, dv, causal, hq, hk):
    check_grads(*_qkv(2, hq, hk, 300, 300, dqk, dv, torch.bfloat16), causal=causal)


@pytest.mark.parametrize("dqk,dv", SHAPES)
def test_the_lse_gradient_enters_delta(dqk, dv):
    check_grads(*_qkv(2, 4, 2, 200, 333, dqk, dv, torch.float16), causal=True, with_lse=True)


@pytest.mark.parametrize("dqk,dv", SHAPES + [(64, 128)])
@pytest.mark.parametrize("label", ["kv64x64_q64x64_o1_w8_atomic",
                                   "kv64x64_q64x64_o1_w8_keyrows"])
def test_other_backward_paths_agree(dqk, dv, label):
    # dQ by reduce-add (the delta kernel zeroes Q's columns of dQacc) and keys as the MMA
    # rows (dP^T = V dO^T); (64, 128) a V wider than Q/K.
    from tiledattention.kernel.plan import pinned_bwd_schedule
    from tiledattention.schedules.backward import BwdSchedule

    with pinned_bwd_schedule(BwdSchedule.from_label(label)):
        check_grads(*_qkv(2, 4, 2, 300, 300, dqk, dv, torch.bfloat16), causal=True)


def test_a_torch_compile_training_step():
    # One step of a tiny MLA-shaped attention layer: loss, backward, SGD, under
    # torch.compile(fullgraph); its gradients equal the eager ones.
    torch.manual_seed(0)
    x = torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16)
    wq, wk, wv = (torch.randn(256, n, device="cuda", dtype=torch.bfloat16) * 0.05
                  for n in (4 * 192, 2 * 192, 2 * 128))  # 4 query heads, 2 K/V heads

    def loss(x, wq, wk, wv):
        q = (x @ wq).view(2, 128, 4, 192).transpose(1, 2)
        k = (x @ wk).view(2, 128, 2, 192).transpose(1, 2)
        v = (x @ wv).view(2, 128, 2, 128).transpose(1, 2)
        return ta.sdpa(q, k, v, is_causal=True, enable_gqa=True).float().square().mean()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        ws = [w.detach().clone().requires_grad_() for w in (wq, wk, wv)]
        fn(x, *ws).backward()
        grads.append([w.grad for w in ws])
        with torch.no_grad():
            for w in ws:
                w -= 0.1 * w.grad
        assert all(torch.isfinite(w).all() for w in ws)
    for eager, compiled in zip(*grads):
        assert relative_error(compiled, eager.double()) <= rtol_bwd(torch.bfloat16)
