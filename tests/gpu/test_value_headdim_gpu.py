"""D_qk != D_v forward (MLA's (192, 128), and (128, 64)) on a CUDA GPU: against the float64
reference (softmax(Q K^T / sqrt(D_qk)) V) by the tolerance table, and against torch's SDPA;
causal and not, MHA, GQA and MQA, prefill and decode (GQA packing, split-K), masks, the
LSE, torch.compile. Its backward is refused before anything runs (not yet implemented)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol

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


def test_the_backward_is_refused_before_the_forward_runs():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 64, 64, 192, 128, torch.bfloat16))
    with pytest.raises(ta.BackwardNotSupportedError, match="D_qk != D_v backward"):
        ta.sdpa(q, k, v)
    with torch.no_grad():
        assert ta.sdpa(q, k, v).shape == (1, 2, 64, 128)
