"""Forward-only head dims past 256 on a CUDA GPU (issue 48 item 3): D 512, 384, 264 and MLA
decode's (576, 512) against the float64 reference and torch's SDPA by the tolerance table;
causal and not, GQA/MQA prefill and decode (packing, split-K with the 16-row combine), a
key-padding mask, the LSE, torch.compile. The backward is refused before anything runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol

DTYPES = [torch.float16, torch.bfloat16]
SHAPES = [(512, 512), (576, 512), (384, 384), (264, 264)]  # (D_qk, D_v)


def _qkv(b, hq, hk, sq, sk, dqk, dv, dtype):
    r = lambda *s: torch.randn(*s, device="cuda").to(dtype)  # noqa: E731
    return r(b, hq, sq, dqk), r(b, hk, sk, dqk), r(b, hk, sk, dv)


def check(q, k, v, *, causal=False, attn_mask=None):
    gqa = q.shape[1] != k.shape[1]
    out, lse = ta.sdpa(q, k, v, is_causal=causal, attn_mask=attn_mask, enable_gqa=gqa,
                       return_lse=True)
    ref, ref_lse = naive_attention(q, k, v, causal=causal, attn_mask=attn_mask)
    assert out.shape == (*q.shape[:3], v.shape[3]) and torch.isfinite(out).all()
    assert relative_error(out, ref) <= rtol(q.dtype)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-2, rtol=1e-3)
    if attn_mask is None:
        want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        assert relative_error(out, want.double()) <= 2 * rtol(q.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (128, 128), (1000, 1000), (100, 1000),
                                   (1000, 300)])
def test_prefill_matches_the_float64_reference_and_torch(dtype, dqk, dv, causal, sq, sk):
    check(*_qkv(1, 2, 2, sq, sk, dqk, dv, dtype), causal=causal)


@pytest.mark.parametrize("dqk,dv", [(576, 512), (512, 512)])
@pytest.mark.parametrize("hq,hk", [(16, 1), (8, 2)])  # MLA's one latent head, GQA
@pytest.mark.parametrize("sq,sk", [(1, 4096), (4, 1000), (1, 33)])
def test_decode_packs_the_heads_and_splits_the_keys(dqk, dv, hq, hk, sq, sk):
    check(*_qkv(2, hq, hk, sq, sk, dqk, dv, torch.bfloat16), causal=sq > 1)


def test_a_key_padding_mask():
    q, k, v = _qkv(2, 4, 4, 200, 300, 512, 512, torch.float16)
    mask = torch.ones(2, 1, 1, 300, dtype=torch.bool, device="cuda")
    mask[1, ..., 150:] = False
    check(q, k, v, attn_mask=mask)


def test_repeat_calls_and_compile_fullgraph():
    q, k, v = _qkv(1, 4, 4, 256, 256, 512, 512, torch.bfloat16)
    first = ta.sdpa(q, k, v, is_causal=True)
    assert torch.equal(ta.sdpa(q, k, v, is_causal=True), first)
    compiled = torch.compile(lambda a, b, c: ta.sdpa(a, b, c, is_causal=True), fullgraph=True)
    assert torch.equal(compiled(q, k, v), first)


def test_the_backward_is_refused_before_the_forward_runs():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 64, 64, 512, 512, torch.bfloat16))
    with pytest.raises(ta.BackwardNotSupportedError, match="above 256"):
        ta.sdpa(q, k, v)
    with torch.no_grad():
        assert ta.sdpa(q, k, v).shape == (1, 2, 64, 512)
