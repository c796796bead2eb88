"""Split-K (flash-decoding) and GQA packing against the float64 reference on a GPU:
decode (Sq = 1) and speculative lengths, causal (top-left, as torch), masks, LSE, every
head-dim layout, forced and automatic split counts, rows no split sees."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel import plan as planning
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol


def _rand(*shape, dtype):
    return torch.randn(*shape, device="cuda").to(dtype)


def _plan_of(q, k, v, **kw):
    return planning.plan_for(q, k, v, kw.get("attn_mask"), kw.get("causal", False),
                             None, q.shape[1] != k.shape[1], kw.get("return_lse", False),
                             kw.get("schedule"))


def check(q, k, v, *, causal=False, attn_mask=None, schedule=None, return_lse=True,
          want_splits=None, want_packed=None):
    kw = dict(causal=causal, attn_mask=attn_mask, schedule=schedule, return_lse=return_lse)
    plan = _plan_of(q, k, v, **kw)
    if want_splits is not None:
        assert (plan.part_shape is not None) == want_splits, plan.variant.label()
    if want_packed is not None:
        assert (plan.packed_shape is not None) == want_packed, plan.variant.label()
    out, lse = ta.sdpa(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **kw) if return_lse \
        else (ta.sdpa(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **kw), None)
    torch.cuda.synchronize()
    ref, ref_lse = naive_attention(q, k, v, causal=causal, attn_mask=attn_mask)
    assert torch.isfinite(out).all(), "non-finite output"
    err = relative_error(out, ref)
    assert err <= rtol(q.dtype), f"relative error {err:.3e} ({plan.variant.label()})"
    if return_lse:
        assert torch.isfinite(lse).all()
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-2, rtol=1e-3)
    return plan


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 64), (torch.bfloat16, 96),
                                     (torch.float16, 128), (torch.bfloat16, 160),
                                     (torch.float16, 256)], ids=str)
@pytest.mark.parametrize("hq,hkv", [(8, 8), (32, 8), (8, 1)])
def test_decode_splits_and_packs_match_reference(dtype, d, hq, hkv):
    b, skv = 2, 4096
    q, k, v = _rand(b, hq, 1, d, dtype=dtype), _rand(b, hkv, skv, d, dtype=dtype), \
        _rand(b, hkv, skv, d, dtype=dtype)
    check(q, k, v, want_splits=True, want_packed=hq != hkv)


@pytest.mark.parametrize("splits", [2, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,skv", [(1, 1000), (4, 3000), (16, 4096), (200, 777)])
def test_forced_split_counts_with_causal_top_left(splits, causal, sq, skv):
    # Causal with Sq < Skv: query i sees keys 0..i only, so later splits hold no key of
    # any row (lse -inf, zero partials) and must not turn into NaN.
    q, k, v = (_rand(1, 4, s, 128, dtype=torch.bfloat16) for s in (sq, skv, skv))
    check(q, k, v, causal=causal, schedule=ta.Schedule(64, 64, 2, splits=splits))


@pytest.mark.parametrize("kind", ["key_padding", "full", "fully_masked_row"])
@pytest.mark.parametrize("gqa", [1, 4])
def test_masks_with_splits_and_packing(kind, gqa):
    b, hq, sq, skv = 2, 8, 4, 2048
    q = _rand(b, hq, sq, 128, dtype=torch.float16)
    k, v = (_rand(b, hq // gqa, skv, 128, dtype=torch.float16) for _ in range(2))
    if kind == "key_padding":
        mask = torch.rand(b, 1, 1, skv, device="cuda") > 0.3
    else:
        mask = torch.rand(b, hq, sq, skv, device="cuda") > 0.3
    if kind == "fully_masked_row":
        mask[0, 1, 2] = False
    if kind == "fully_masked_row":
        out, lse = ta.sdpa(q, k, v, attn_mask=mask, enable_gqa=gqa > 1, return_lse=True,
                           schedule=ta.Schedule(64, 64, 2, splits=8))
        assert (out[0, 1, 2] == 0).all() and lse[0, 1, 2] == float("-inf")
        assert torch.isfinite(out).all()
        return
    check(q, k, v, attn_mask=mask, schedule=ta.Schedule(64, 64, 2, splits=8),
          want_splits=True, want_packed=gqa > 1 and kind == "key_padding")


@pytest.mark.parametrize("causal", [False, True])
def test_packed_speculative_lengths_causal(causal):
    for sq in (2, 5, 16):
        q = _rand(3, 32, sq, 128, dtype=torch.bfloat16)
        k, v = (_rand(3, 8, 5000, 128, dtype=torch.bfloat16) for _ in range(2))
        check(q, k, v, causal=causal, want_packed=True)


def test_transposed_query_of_hf_decode_packs_and_prefill_layout_does_not():
    # transformers hands q as [B, Sq, H, D].transpose(1, 2): viewable when Sq = 1.
    q1 = _rand(2, 1, 32, 128, dtype=torch.float16).transpose(1, 2)
    q4 = _rand(2, 4, 32, 128, dtype=torch.float16).transpose(1, 2)
    k, v = (_rand(2, 8, 1024, 128, dtype=torch.float16) for _ in range(2))
    check(q1, k, v, want_packed=True)
    check(q4, k, v, want_packed=False)


def test_split_plans_are_cuda_graph_capturable():
    q = _rand(4, 8, 1, 128, dtype=torch.bfloat16)
    k, v = (_rand(4, 8, 4096, 128, dtype=torch.bfloat16) for _ in range(2))
    eager = ta.sdpa(q, k, v)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ta.sdpa(q, k, v)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = ta.sdpa(q, k, v)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
