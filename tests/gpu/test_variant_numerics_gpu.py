"""Variants on every input a user can write (issue 36), on a CUDA GPU, against float64
autograd of the naive formula with the same modification in torch:

- FlexAttention's masking idiom, a score_mod returning -inf (inverse causal at the test
  suite's own shape, a document mask, a captured bool sequence mask, a composition of two);
- a relative bias at S = 333 (not a multiple of any tile), forward and dK/dV;
- fully masked rows, whatever masked them: zeros, LSE -inf, zero gradients;
- +inf from a score_mod: NaN in that row only, as torch's softmax;
- integer index arithmetic (true division, floor division, int64 and bool captures);
- gradients into captured tensors that require grad (a learnable bias, ALiBi slopes, a
  per-head gate, per-key and per-query biases), eager and under torch.compile, and a
  learnable bias trained a few steps along the reference's trajectory.
"""

from __future__ import annotations

import math

import pytest
import torch

import tiledattention as ta
from tiledattention.reference import delta_rounding_effect, naive_attention
from tiledattention.tolerance import captured_grad_error, relative_error, rtol, rtol_bwd

ct = pytest.importorskip("cuda.tile", reason="cuTile not installed")

NEG_INF = -math.inf
POS_INF = math.inf


def _qkv(b, h, sq, sk, d, dtype, seed=0, hk=None):
    torch.manual_seed(seed)
    q = torch.randn(b, h, sq, d, device="cuda").to(dtype).requires_grad_()
    k = torch.randn(b, hk or h, sk, d, device="cuda").to(dtype).requires_grad_()
    v = torch.randn(b, hk or h, sk, d, device="cuda").to(dtype).requires_grad_()
    return q, k, v


def check(q, k, v, score, score_ref, *, causal=False, mask_mod=None, keep_ref=None,
          block_mask=None, captured=(), sdpa=ta.sdpa, bwd=True):
    """Output, LSE, dQ/dK/dV and each captured tensor's gradient vs float64 autograd.
    ``captured``: (tensor used by ``score``, its float64 leaf used by ``score_ref``); its
    gradient may also differ by what delta's rounded O explains (``captured_grad_error``):
    all a gradient that cancels to 0 exactly (a per-head or per-query bias) can show."""
    dtype = q.dtype
    out, lse = sdpa(q, k, v, is_causal=causal, score_mod=score, mask_mod=mask_mod,
                    block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1],
                    return_lse=True)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, ref_lse = naive_attention(q64, k64, v64, causal=causal, score_ref=score_ref,
                                   keep_ref=keep_ref)
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    assert relative_error(out, ref) <= rtol(dtype), f"out {relative_error(out, ref):.2e}"
    dead = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), dead), "LSE -inf exactly on fully masked rows"
    assert (out[dead] == 0).all(), "fully masked rows are zeros"
    live = ~dead
    assert relative_error(lse[live], ref_lse[live]) <= rtol(dtype)
    if not bwd:
        return out
    dout = torch.randn_like(out)
    out.backward(dout)
    (ref * dout.double()).sum().backward(retain_graph=bool(captured))
    for name, t, r in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        assert t.grad is not None, f"{name}: no gradient"
        assert torch.isfinite(t.grad).all(), f"{name}: NaN/inf"
        e = relative_error(t.grad, torch.nan_to_num(r.grad))
        assert e <= rtol_bwd(dtype), f"{name} {e:.2e}"
    leaves = [c64 for _, c64 in captured]
    rounding = delta_rounding_effect(out, ref, ref_lse, dout, leaves) if captured else []
    for i, ((c, c64), shift) in enumerate(zip(captured, rounding)):
        assert c.grad is not None, f"captured {i}: no gradient"
        assert torch.isfinite(c.grad).all(), f"captured {i}: NaN/inf"
        e = captured_grad_error(c.grad, c64.grad, shift)
        assert e <= rtol_bwd(dtype), (
            f"captured {i} {e:.2e} beyond 4x delta's rounding: |err| "
            f"{(c.grad.double() - c64.grad).norm():.2e}, |rounding| {shift.norm():.2e}, "
            f"|ref| {c64.grad.norm():.2e}")
    assert (q.grad[dead.unsqueeze(-1).expand_as(q.grad)] == 0).all(), "dq of dead rows"
    return out


# ----------------------------------------------------------------------------- -inf scores
def inverse_causal(score, b, h, q_idx, kv_idx):
    return ct.where(q_idx <= kv_idx, score, NEG_INF)


def inverse_causal_ref(s, b, h, q, kv):
    return s.masked_fill(~(q <= kv), NEG_INF)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_inverse_causal_through_minus_inf_at_the_flex_suites_shape(dtype):
    # B4 H8 S2048: rows past the first key tile start with whole tiles of -inf.
    check(*_qkv(4, 8, 2048, 2048, 64, dtype), inverse_causal, inverse_causal_ref)


def test_document_mask_through_minus_inf_with_a_captured_int_tensor():
    q, k, v = _qkv(2, 4, 1000, 1000, 128, torch.float16)
    doc = (torch.arange(1000, device="cuda") // 300).to(torch.int32)

    def document(score, b, h, q_idx, kv_idx):
        return ct.where(doc[q_idx] == doc[kv_idx], score, NEG_INF)

    check(q, k, v, document, lambda s, b, h, qi, ki: s.masked_fill(doc[qi] != doc[ki],
                                                                    NEG_INF))


def test_sequence_mask_from_a_captured_bool_tensor_with_a_fully_masked_batch():
    q, k, v = _qkv(3, 2, 300, 300, 64, torch.bfloat16)
    lengths = torch.tensor([300, 130, 0], device="cuda")  # batch 2: every row fully masked
    valid = torch.arange(300, device="cuda")[None, :] < lengths[:, None]

    def seq_mask(score, b, h, q_idx, kv_idx):
        return ct.where(valid[b, kv_idx], score, NEG_INF)

    check(q, k, v, seq_mask, lambda s, b, h, qi, ki: s.masked_fill(
        ~valid[:, None, None, :], NEG_INF))


def test_a_composition_of_two_minus_inf_helpers():
    q, k, v = _qkv(2, 4, 777, 777, 64, torch.float16)

    def window(score, q_idx, kv_idx):
        return ct.where(kv_idx - q_idx < 200, score, NEG_INF)

    def both(score, b, h, q_idx, kv_idx):
        return inverse_causal(window(score, q_idx, kv_idx), b, h, q_idx, kv_idx)

    def both_grad(score, b, h, q_idx, kv_idx):
        return ct.where((q_idx <= kv_idx) & (kv_idx - q_idx < 200), 1.0, 0.0)

    check(q, k, v, ta.ScoreMod(both, grad=both_grad), lambda s, b, h, qi, ki: s.masked_fill(
        ~((qi <= ki) & (ki - qi < 200)), NEG_INF))


def test_fully_masked_rows_whatever_masked_them_are_zeros_with_lse_minus_inf():
    q, k, v = _qkv(2, 2, 200, 180, 64, torch.float16)

    def late_rows(b, h, q_idx, kv_idx):  # rows >= 150 see nothing
        return q_idx < 150

    def late_ref(b, h, qi, ki):
        return (qi < 150) & (ki >= 0)

    def dead_score(score, b, h, q_idx, kv_idx):
        return ct.where(q_idx < 150, score, NEG_INF)

    check(q, k, v, None, None, mask_mod=late_rows, keep_ref=late_ref)
    for t in (q, k, v):
        t.grad = None
    check(q, k, v, None, None, block_mask=ta.block_mask(late_rows, None, None, 200, 180),
          keep_ref=late_ref)
    for t in (q, k, v):
        t.grad = None
    check(q, k, v, dead_score, lambda s, b, h, qi, ki: s.masked_fill(qi >= 150, NEG_INF))


def test_a_split_k_decode_with_minus_inf_rows_combines_to_zeros():
    q, k, v = _qkv(1, 2, 4, 4096, 128, torch.float16)  # a small grid: key splits

    def only_late_keys(score, b, h, q_idx, kv_idx):  # row 0 sees nothing
        return ct.where((q_idx > 0) & (kv_idx > 3000), score, NEG_INF)

    with torch.no_grad():
        check(q, k, v, only_late_keys, lambda s, b, h, qi, ki: s.masked_fill(
            ~((qi > 0) & (ki > 3000)), NEG_INF), bwd=False)


def test_plus_inf_from_a_score_mod_gives_nan_in_that_row_only_as_torch():
    q, k, v = _qkv(1, 1, 128, 128, 64, torch.float16)

    def hot(score, b, h, q_idx, kv_idx):
        return ct.where((q_idx == 5) & (kv_idx == 7), POS_INF, score)

    with torch.no_grad():
        out = ta.sdpa(q, k, v, score_mod=hot)
    assert torch.isnan(out[0, 0, 5]).all()
    rest = torch.cat([out[0, 0, :5], out[0, 0, 6:]])
    assert torch.isfinite(rest).all()


# ----------------------------------------------------------------------------- untiled S
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_relative_bias_at_s333_forward_and_every_gradient(d, dtype):
    def relative(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx)

    check(*_qkv(2, 4, 333, 333, d, dtype), relative, lambda s, b, h, qi, ki: s + (qi - ki))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_softcap_written_as_flex_users_write_it_matches_float64_forward_and_backward(dtype):
    # Its `score / 30.0` is compiled as a product by 1/30 (mods/lifting._products): within an
    # fp32 ulp of the quotient, so float64's tolerance holds; the where's quotient decides
    # and stays a division.
    def softcap(score, b, h, q_idx, kv_idx):
        return 30.0 * torch.tanh(score / 30.0)

    def decided(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx / 3 >= kv_idx, score / 7, score * (kv_idx - q_idx) / 200)

    q, k, v = _qkv(2, 4, 1000, 1000, 128, dtype)
    check(q, k, v, softcap, lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0), causal=True)
    check(*_qkv(2, 4, 333, 333, 64, dtype, seed=1), decided,
          lambda s, b, h, qi, ki: torch.where(qi / 3 >= ki, s / 7, s * (ki - qi) / 200))


def test_integer_index_arithmetic_promotes_like_torch():
    q, k, v = _qkv(1, 2, 333, 333, 64, torch.float16)
    pos = torch.arange(333, device="cuda", dtype=torch.int64)

    def terms(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) / 64 + (q_idx // 64 - kv_idx // 64) + pos[kv_idx] * 0.001

    def terms_ref(s, b, h, qi, ki):
        return s + (qi - ki) / 64 + (qi // 64 - ki // 64) + pos[ki] * 0.001

    check(q, k, v, terms, terms_ref)


# ----------------------------------------------------------------------------- captured grads
def _leaf(t):
    return t.detach().double().requires_grad_()


def test_a_learnable_full_bias_gets_its_gradient():
    q, k, v = _qkv(2, 4, 333, 333, 64, torch.float16)
    bias = (0.5 * torch.randn(4, 333, 333, device="cuda")).requires_grad_()
    b64 = _leaf(bias)

    def full_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx, kv_idx]

    check(q, k, v, full_bias, lambda s, b, h, qi, ki: s + b64[h, qi, ki],
          captured=[(bias, b64)])


def test_alibi_slopes_gate_and_per_key_and_per_query_biases_get_gradients():
    q, k, v = _qkv(2, 8, 300, 260, 128, torch.float16, hk=2)
    slopes = torch.rand(8, device="cuda").requires_grad_()
    gate = (1 + 0.1 * torch.randn(8, device="cuda")).requires_grad_()
    kb = (0.3 * torch.randn(260, device="cuda")).requires_grad_()
    qb = (0.3 * torch.randn(2, 300, device="cuda")).requires_grad_()
    s64, g64, kb64, qb64 = (_leaf(t) for t in (slopes, gate, kb, qb))

    def mod(score, b, h, q_idx, kv_idx):
        return score * gate[h] + slopes[h] * (kv_idx - q_idx) + kb[kv_idx] + qb[b, q_idx]

    def ref(s, b, h, qi, ki):
        return s * g64[h] + s64[h] * (ki - qi) + kb64[ki] + qb64[b, qi]

    check(q, k, v, mod, ref, causal=True,
          captured=[(slopes, s64), (gate, g64), (kb, kb64), (qb, qb64)])


def test_a_per_head_fp16_bias_whose_exact_gradient_is_zero():
    # FlexAttention's test_head_bias_req_grad: softmax ignores a per-row shift, so
    # d out / d bias[h] = sum of a head's dS = 0 exactly; the kernel's is delta's rounding
    # (~1e-3), 1e11 x the float64 one by relative error. One reduction to a scalar a tile.
    q, k, v = _qkv(1, 4, 256, 256, 64, torch.float16)
    bias = torch.randn(4, device="cuda", dtype=torch.float16).requires_grad_()
    b64 = _leaf(bias)

    def head_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    check(q, k, v, head_bias, lambda s, b, h, qi, ki: s + b64[h], captured=[(bias, b64)])
    assert bias.grad.dtype == torch.float16
    assert bias.grad.double().abs().max() < 0.05, "a shift of whole rows: gradient ~0"


@pytest.mark.parametrize("causal", [False, True])
def test_a_per_query_bias_at_an_untiled_length_with_gqa(causal):
    # qb[b, q_idx]: one atomic per row of each tile; rows 300..319 of the last query tile
    # index past the tensor (atomic_add's bounds check drops them; their dS is 0 anyway).
    q, k, v = _qkv(2, 8, 300, 260, 128, torch.float16, hk=2)
    qb = (0.3 * torch.randn(2, 300, device="cuda")).requires_grad_()
    qb64 = _leaf(qb)

    def query_bias(score, b, h, q_idx, kv_idx):
        return score + qb[b, q_idx]

    check(q, k, v, query_bias, lambda s, b, h, qi, ki: s + qb64[b, qi], causal=causal,
          captured=[(qb, qb64)])


@pytest.mark.parametrize("dqk,dv", [(192, 128), (128, 64)])
def test_a_variant_with_v_narrower_than_q_and_k_and_captured_gradients(dqk, dv):
    # D_v != D_qk through a variant: since variants.md 45a a variant's dK/dV program at
    # 64 < D <= 128 takes keys as its MMA rows, the D_qk 192 one does not; the window's
    # mask_mod, ALiBi slopes and a per-key bias (the captured-gradient reads of both
    # orientations) on a GQA batch at an untiled length.
    q, k, _ = _qkv(2, 8, 300, 300, dqk, torch.bfloat16, hk=2)
    v = torch.randn(2, 2, 300, dv, device="cuda").to(torch.bfloat16).requires_grad_()
    slopes = torch.rand(8, device="cuda").requires_grad_()
    kb = (0.3 * torch.randn(300, device="cuda")).requires_grad_()
    s64, kb64 = _leaf(slopes), _leaf(kb)

    def alibi_key_bias(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx) + kb[kv_idx]

    def window(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < 100

    out = check(q, k, v, alibi_key_bias,
                lambda s, b, h, qi, ki: s + s64[h] * (ki - qi) + kb64[ki], causal=True,
                mask_mod=window, keep_ref=lambda b, h, qi, ki: qi - ki < 100,
                captured=[(slopes, s64), (kb, kb64)])
    assert out.shape[-1] == dv and v.grad.shape[-1] == dv and k.grad.shape[-1] == dqk


def test_fully_masked_rows_by_a_mask_mod_at_s256():
    q, k, v = _qkv(2, 2, 256, 256, 64, torch.float16)

    def late_rows(b, h, q_idx, kv_idx):
        return q_idx < 150

    check(q, k, v, None, None, mask_mod=late_rows,
          keep_ref=lambda b, h, qi, ki: (qi < 150) & (ki >= 0))


def test_captured_gradients_under_torch_compile():
    q, k, v = _qkv(1, 4, 256, 256, 64, torch.bfloat16)
    slopes = torch.rand(4, device="cuda").requires_grad_()
    s64 = _leaf(slopes)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    compiled = torch.compile(ta.sdpa)
    check(q, k, v, alibi, lambda s, b, h, qi, ki: s + s64[h] * (ki - qi),
          captured=[(slopes, s64)], sdpa=compiled)


def test_a_learnable_bias_trains_along_the_references_trajectory():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 192, 64, device="cuda", dtype=torch.float16)
               for _ in range(3))
    target = torch.randn(1, 2, 192, 64, device="cuda", dtype=torch.float64)
    bias = torch.zeros(2, 192, device="cuda", requires_grad=True)
    b64 = torch.zeros(2, 192, device="cuda", dtype=torch.float64, requires_grad=True)

    def key_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h, kv_idx]

    opt, opt64 = torch.optim.SGD([bias], lr=50.0), torch.optim.SGD([b64], lr=50.0)
    for _ in range(5):
        out = ta.sdpa(q, k, v, score_mod=key_bias)
        ref, _ = naive_attention(q, k, v, score_ref=lambda s, b, h, qi, ki: s + b64[h, ki])
        for o, opt_ in ((out.double(), opt), (ref, opt64)):
            opt_.zero_grad()
            ((o - target) ** 2).mean().backward()
            opt_.step()
    assert bias.abs().max() > 1e-3, "the bias moved"
    assert relative_error(bias.detach(), b64.detach()) <= rtol_bwd(torch.float16)
