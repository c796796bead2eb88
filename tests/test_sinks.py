"""Attention sinks on the CPU: the float64 reference against brute-force sums, and the
formula ``variants.sinks`` applies (``out * sigmoid(lse - sink)``, gradients through out,
the LSE and the sink) against that reference, with the kernel replaced by a torch stand-in
of ``sdpa`` (``torch_stand_in_for_sdpa``) in these tests only. The kernel itself runs in
tests/gpu/test_variants_matrix.py."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention import api, variants  # noqa: E402
from tiledattention.errors import InputError  # noqa: E402
from tiledattention.reference import naive_attention  # noqa: E402
from tiledattention.tolerance import relative_error, rtol, rtol_bwd  # noqa: E402


def _ref_of(mod):
    return variants.reference_of(mod)


@pytest.fixture
def stand_in(monkeypatch):
    """``api.sdpa`` replaced by torch math with the kernel's output contract (out in q's
    dtype, fp32 LSE, -inf on fully masked rows); each call's keyword arguments recorded."""
    calls = []

    def torch_stand_in_for_sdpa(q, k, v, attn_mask=None, *, is_causal=False, scale=None,
                                enable_gqa=False, return_lse=False, score_mod=None,
                                mask_mod=None, **kw):
        calls.append(dict(return_lse=return_lse, is_causal=is_causal, **kw))
        out, lse = naive_attention(q, k, v, causal=is_causal, scale=scale, attn_mask=attn_mask,
                                   score_ref=_ref_of(score_mod), keep_ref=_ref_of(mask_mod))
        out = out.to(q.dtype)
        return (out, lse.float()) if return_lse else out

    monkeypatch.setattr(api, "sdpa", torch_stand_in_for_sdpa)
    return calls


def _qkv(b, hq, hk, sq, sk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype)
    k, v = (torch.randn(b, hk, sk, d, generator=g).to(dtype) for _ in range(2))
    sink = torch.randn(hq, generator=g) * 2
    return q, k, v, sink


def test_the_reference_is_the_softmax_with_a_sink_column_written_out():
    q, k, v, sink = _qkv(1, 4, 2, 5, 7, 8, torch.float64)
    out, lse = variants.sinks.reference(q, k, v, sink, causal=True)
    scale = 1 / math.sqrt(8)
    for h in range(4):
        for i in range(5):
            weights = [math.exp(scale * float(q[0, h, i] @ k[0, h // 2, j])) for j in range(i + 1)]
            denom = sum(weights) + math.exp(float(sink[h]))
            want = sum(w * v[0, h // 2, j] for j, w in enumerate(weights)) / denom
            assert torch.allclose(out[0, h, i], want, atol=1e-12)
            assert math.isclose(lse[0, h, i].item(), math.log(denom), abs_tol=1e-12)


def test_a_sink_at_minus_infinity_is_plain_attention():
    q, k, v, _ = _qkv(2, 4, 4, 9, 9, 16, torch.float64)
    mask = torch.rand(2, 1, 9, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True  # no fully masked row
    got, got_lse = variants.sinks.reference(q, k, v, torch.full((4,), float("-inf")),
                                            attn_mask=mask)
    want, want_lse = naive_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(got, want) and torch.allclose(got_lse, want_lse)


CASES = {
    "causal_gqa": dict(shape=(2, 8, 2, 33, 33, 32), kw=dict(is_causal=True, enable_gqa=True)),
    "decode_kv_cache": dict(shape=(2, 4, 4, 1, 40, 32), kw={}),  # Sq = 1: sees the cache
    "padding_mask": dict(shape=(2, 4, 4, 12, 12, 16), kw={}, mask=True),
    "window_and_softcap": dict(shape=(1, 4, 4, 30, 30, 16),
                               kw=dict(is_causal=True, score_mod=variants.softcap(2.0),
                                       mask_mod=variants.sliding_window(6))),
}


def _case(name):
    c = CASES[name]
    q, k, v, sink = _qkv(*c["shape"])
    kw = dict(c["kw"])
    naive = dict(causal=kw.get("is_causal", False), score_ref=_ref_of(kw.get("score_mod")),
                 keep_ref=_ref_of(kw.get("mask_mod")))
    if c.get("mask"):
        mask = torch.ones(q.shape[0], 1, q.shape[2], k.shape[2], dtype=torch.bool)
        mask[0, ..., :5] = False  # a left-padded row
        kw["attn_mask"] = naive["attn_mask"] = mask
    return q, k, v, sink, kw, naive


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_sink_formula_matches_the_reference_forward_and_gradients(stand_in, name):
    q, k, v, sink, kw, naive = _case(name)
    leaves = [t.requires_grad_() for t in (q, k, v, sink)]
    out = variants.sinks(q, k, v, sink, **kw)
    assert stand_in[-1]["return_lse"] is True
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref, _ = variants.sinks.reference(*leaves64, **naive)
    assert relative_error(out, ref) <= rtol(torch.float32)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad(out, leaves, dout)
    grads64 = torch.autograd.grad(ref, leaves64, dout.double())
    for name_, g, r in zip(("dq", "dk", "dv", "dsink"), grads, grads64):
        assert relative_error(g, r) <= rtol_bwd(torch.float32), name_


def test_return_lse_gives_the_log_sum_exp_including_the_sink(stand_in):
    q, k, v, sink, kw, naive = _case("causal_gqa")
    _, lse = variants.sinks(q, k, v, sink, return_lse=True, **kw)
    _, ref = variants.sinks.reference(q, k, v, sink, **naive)
    assert relative_error(lse, ref) <= rtol(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_output_keeps_the_input_dtype_and_a_bf16_sink_is_taken(stand_in, dtype):
    q, k, v, sink = _qkv(1, 4, 4, 16, 16, 32, dtype)
    out = variants.sinks(q, k, v, sink.to(torch.bfloat16), is_causal=True)
    ref, _ = variants.sinks.reference(q, k, v, sink.to(torch.bfloat16), causal=True)
    assert out.dtype == dtype
    assert relative_error(out, ref) <= rtol(dtype)


def test_fully_masked_rows_stay_zero_with_a_sink(stand_in):
    q, k, v, sink = _qkv(1, 2, 2, 4, 4, 8)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False
    out = variants.sinks(q, k, v, sink, attn_mask=mask)
    ref, _ = variants.sinks.reference(q, k, v, sink, attn_mask=mask)
    assert (out[:, :, 2] == 0).all() and torch.allclose(out, ref.float(), atol=1e-5)


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(1, 4), [0.0] * 4])
def test_a_sink_that_is_not_one_logit_per_query_head_is_refused(stand_in, bad):
    q, k, v, _ = _qkv(1, 4, 4, 3, 3, 8)
    with pytest.raises(InputError, match=r"sink must be a tensor of shape \[Hq\] = \[4\]"):
        variants.sinks(q, k, v, bad)
    assert stand_in == []  # refused before attention ran


def test_the_variants_module_is_reachable_as_ta_variants():
    import tiledattention as ta

    assert ta.variants.sinks is variants.sinks and "variants" in ta.__all__
