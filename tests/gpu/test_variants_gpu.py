"""Variants (score_mod / mask_mod / block_mask) on a CUDA GPU: the output and dQ/dK/dV
against float64 autograd of the naive formula with the same modification
(``reference.naive_attention(score_ref=..., keep_ref=...)``), judged by the one tolerance
table."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention import variants
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol, rtol_bwd

DTYPES = [torch.float16, torch.bfloat16]


def _parts(mod):
    """(score_mod, its torch reference) or (mask_mod, reference) of a variants.* result."""
    return variants.reference_of(mod)


def run(b, hq, hk, sq, sk, d, dtype, *, score=None, mask=None, sparse=False, causal=False,
        grads=True, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(b, hq, sq, d, device="cuda").to(dtype)
    k, v = (torch.randn(b, hk, sk, d, device="cuda").to(dtype) for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_(grads)
    kw = dict(is_causal=causal, enable_gqa=hq != hk, score_mod=score)
    if sparse:
        kw["block_mask"] = ta.block_mask(mask, b, None, sq, sk)
    else:
        kw["mask_mod"] = mask
    out = ta.sdpa(q, k, v, **kw)
    score_ref = None if score is None else _parts(score)
    keep_ref = None if mask is None else _parts(mask)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = naive_attention(q64, k64, v64, causal=causal, score_ref=score_ref,
                             keep_ref=keep_ref)
    assert torch.isfinite(out).all()
    err = relative_error(out, ref)
    assert err <= rtol(dtype), f"out {err:.2e}"
    if not grads:
        return out
    dout = torch.randn_like(out)
    out.backward(dout)
    (ref * dout.double()).sum().backward()
    for name, t, r in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        assert torch.isfinite(t.grad).all(), name
        e = relative_error(t.grad, torch.nan_to_num(r.grad))
        assert e <= rtol_bwd(dtype), f"{name} {e:.2e}"
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 96, 128, 160, 256])
def test_softcap_forward_and_gradients_match_float64(dtype, d):
    run(2, 4, 4, 200, 200, d, dtype, score=variants.softcap(5.0), causal=d % 64 == 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alibi_captures_per_head_slopes_and_matches_float64(dtype):
    slopes = variants.alibi_slopes(8)
    run(2, 8, 2, 300, 260, 128, dtype, score=variants.alibi(slopes), causal=True)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_sliding_window_dense_and_block_sparse_match_float64(sparse, d):
    run(1, 4, 4, 700, 700, d, torch.bfloat16, mask=variants.sliding_window(128),
        sparse=sparse, causal=True)


def test_a_window_looking_ahead_without_causal():
    run(1, 2, 2, 333, 333, 64, torch.float16, mask=variants.sliding_window(64, 32),
        sparse=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_documents_with_a_block_mask_match_float64(dtype):
    ids = variants.segments_from_lengths([100, 250, 30, 132])
    run(1, 4, 4, 512, 512, 128, dtype, mask=variants.document(ids), sparse=True, causal=True)


def test_prefix_lm_matches_float64():
    prefix = torch.tensor([40, 300], dtype=torch.int32, device="cuda")
    run(2, 2, 2, 320, 320, 64, torch.float16, mask=variants.prefix_lm(prefix), sparse=True)


def test_score_mod_and_mask_mod_together_with_gqa():
    ids = variants.segments_from_lengths([64, 192])
    run(1, 8, 2, 256, 256, 128, torch.bfloat16, score=variants.softcap(20.0),
        mask=variants.document(ids), sparse=True, causal=True)


@pytest.mark.parametrize("sparse", [False, True])
def test_split_k_decode_honours_a_mask_mod(sparse):
    # Sq = 1 against a long KV cache: the split-K path with a window over the last keys.
    def last_keys(b, h, q_idx, kv_idx):
        return kv_idx >= 3000

    last_keys.reference = lambda b, h, q, k: k >= 3000
    run(2, 8, 8, 1, 4096, 128, torch.bfloat16, mask=last_keys, sparse=sparse, grads=False)


def test_fully_masked_rows_give_zeros_and_zero_gradients():
    def nothing_for_odd_rows(b, h, q_idx, kv_idx):
        return (q_idx % 2 == 0) & (kv_idx >= 0)

    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.float16,
                           requires_grad=True) for _ in range(3))
    for sparse in (False, True):
        kw = ({"block_mask": ta.block_mask(nothing_for_odd_rows, None, None, 128, 128)}
              if sparse else {"mask_mod": nothing_for_odd_rows})
        out = ta.sdpa(q, k, v, **kw)
        out.sum().backward()
        assert (out[:, :, 1::2] == 0).all() and torch.isfinite(out).all()
        assert torch.isfinite(q.grad).all() and (q.grad[:, :, 1::2] == 0).all()
        q.grad = k.grad = v.grad = None


def test_a_factory_made_mask_compiles_once_per_constant():
    from tiledattention.kernel import spec

    before = len(spec._kernels)
    for _ in range(3):
        run(1, 2, 2, 128, 128, 64, torch.float16, mask=variants.sliding_window(32),
            grads=False)
    assert len(spec._kernels) - before == 1  # one forward kernel for window 32


def test_the_eager_and_compiled_paths_agree_on_a_variant_forward_and_backward():
    # Under torch.compile a variant call costs one graph break (its lifting is not traced).
    score = variants.softcap(10.0)
    slopes = variants.alibi_slopes(4)
    q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return ta.sdpa(q, k, v, score_mod=score, is_causal=True) + ta.sdpa(
            q, k, v, score_mod=variants.alibi(slopes))

    eager = f(q, k, v)
    eager.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    compiled = torch.compile(f)(q, k, v)
    compiled.sum().backward()
    assert torch.equal(eager, compiled)
    for g, t in zip(grads, (q, k, v)):
        assert torch.allclose(g, t.grad, rtol=0, atol=1e-2)
