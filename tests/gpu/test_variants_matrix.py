"""Every built-in variant (``tiledattention.variants``) on a CUDA GPU, as the issue lists
them: the output and every gradient (dQ, dK, dV; dsink for sinks) against float64
autograd of the variant's torch reference, with GQA, in both dtypes and D 64/128/256
(each variant sees each dtype and each D), and decode (Sq = 1) against a KV cache with
transformers' bottom-right alignment (``q_offset``), judged by the one tolerance table."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention import variants
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol, rtol_bwd

B, HQ, HK = 2, 4, 2  # GQA: two query heads per K/V head


def _ref(mod):
    return variants.reference_of(mod)


def _variant(name, sq, sk, q_offset=None):
    """(sdpa keyword arguments, naive_attention keyword arguments, sink or None) of a
    built-in on Sq queries and Skv keys; ``q_offset``: decode against a KV cache."""
    off = {} if q_offset is None else {"q_offset": q_offset}
    causal = q_offset is None  # a decode row sees its whole cache: causal by position only
    score = mask = sink = None
    if name == "window":
        mask = variants.sliding_window(96, **off)
    elif name == "window_ahead":
        mask, causal = variants.sliding_window(64, 32, **off), False
    elif name == "softcap":
        score = variants.softcap(20.0)
    elif name == "alibi":
        score = variants.alibi(variants.alibi_slopes(HQ), **off)
    elif name == "document":
        ids = torch.cat([variants.segments_from_lengths([sk // 3, sk - sk // 3]),
                         variants.segments_from_lengths([40, sk - 60, 20])])
        mask = variants.document(ids, **off)
    elif name == "prefix_lm":
        mask = variants.prefix_lm(torch.tensor([30, sk // 2], dtype=torch.int32,
                                               device="cuda"), **off)
        causal = False
    elif name == "sinks":
        sink = torch.randn(HQ, device="cuda") * 2
    kw = dict(is_causal=causal, enable_gqa=True, score_mod=score)
    if mask is not None:
        kw["block_mask"] = ta.block_mask(mask, B, None, sq, sk)
    naive = dict(causal=causal, score_ref=_ref(score), keep_ref=_ref(mask))
    return kw, naive, sink


def _check(name, dtype, d, sq, sk, *, grads, q_offset=None):
    torch.manual_seed(0)
    q = torch.randn(B, HQ, sq, d, device="cuda").to(dtype)
    k, v = (torch.randn(B, HK, sk, d, device="cuda").to(dtype) for _ in range(2))
    kw, naive, sink = _variant(name, sq, sk, q_offset)
    leaves = [q, k, v] + ([] if sink is None else [sink])
    for t in leaves:
        t.requires_grad_(grads)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    if sink is None:
        out = ta.sdpa(q, k, v, **kw)
        ref, _ = naive_attention(*leaves64, **naive)
    else:
        out = variants.sinks(q, k, v, sink, **kw)
        ref, _ = variants.sinks.reference(*leaves64, **naive)
    assert out.dtype == dtype and torch.isfinite(out).all()
    err = relative_error(out, ref)
    assert err <= rtol(dtype), f"out {err:.2e}"
    if not grads:
        return
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, dout)
    want = torch.autograd.grad(ref, leaves64, dout.double())
    for label, g, r in zip(("dq", "dk", "dv", "dsink"), got, want):
        assert torch.isfinite(g).all(), label
        e = relative_error(g, torch.nan_to_num(r))
        assert e <= rtol_bwd(dtype), f"{label} {e:.2e}"


NAMES = ["window", "window_ahead", "softcap", "alibi", "document", "prefix_lm", "sinks"]


# Each variant runs each dtype and each head dim once (a full product triples the kernels
# compiled for no new path); softcap's full product is in test_variants_gpu.py.
@pytest.mark.parametrize("dtype,d", [(torch.float16, 64), (torch.bfloat16, 128),
                                     (torch.float16, 256)])
@pytest.mark.parametrize("name", NAMES)
def test_builtin_forward_and_gradients_match_float64_with_gqa(name, dtype, d):
    _check(name, dtype, d, 300, 300, grads=True)


@pytest.mark.parametrize("name", NAMES)
def test_builtin_decode_against_a_kv_cache_matches_float64(name):
    # Sq = 1 at position Skv - 1 of each row (transformers' bottom-right alignment).
    sk = 700
    offset = torch.full((B,), sk - 1, dtype=torch.int32, device="cuda")
    _check(name, torch.bfloat16, 128, 1, sk, grads=False, q_offset=offset)


def test_sinks_with_a_sliding_window_and_softcap_together():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    sink = torch.randn(8, device="cuda", requires_grad=True)
    window, cap = variants.sliding_window(64), variants.softcap(30.0)
    out = variants.sinks(q, k, v, sink, is_causal=True, enable_gqa=True, score_mod=cap,
                         block_mask=ta.block_mask(window, None, None, 256, 256))
    ref, _ = variants.sinks.reference(q, k, v, sink.detach(), causal=True,
                                      score_ref=_ref(cap), keep_ref=_ref(window))
    assert relative_error(out, ref) <= rtol(torch.bfloat16)
    out.float().sum().backward()
    assert sink.grad is not None and torch.isfinite(sink.grad).all()
