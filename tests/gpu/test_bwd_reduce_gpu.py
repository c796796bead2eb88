"""The five-matmul backward (dQ reduce-added by TMA from the dK/dV program) and the issue-37
candidate schedules, against float64 autograd of the naive formula, on a CUDA GPU.

Each gradient is judged on its own by the one tolerance table (``tolerance.rtol_bwd``).
Shapes have a key/query tail (300 rows: the reduce-add's last tile lies partly outside dQ),
GQA (4 query heads on 2 K/V heads: two programs' groups add into one dQ head), and causal.
"""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel.plan import pinned_bwd_schedule
from tiledattention.reference import naive_attention
from tiledattention.schedules.backward import BwdSchedule, bwd_candidates
from tiledattention.tolerance import relative_error, rtol_bwd

CASES = [(d, name, s.label()) for d in (64, 96, 128, 160, 192, 256)
         for name, s in bwd_candidates(d).items()]


def _grads(q, k, v, dout, causal, label):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with pinned_bwd_schedule(BwdSchedule.from_label(label)):
        ta.sdpa(q, k, v, causal=causal, enable_gqa=True).backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,name,label", CASES, ids=[f"d{d}-{n}" for d, n, _ in CASES])
def test_candidate_backward_matches_float64_autograd(d, name, label, causal):
    torch.manual_seed(d)
    dtype = torch.bfloat16
    q = torch.randn(2, 4, 300, d, device="cuda").to(dtype)
    k, v = (torch.randn(2, 2, 300, d, device="cuda").to(dtype) for _ in range(2))
    dout = torch.randn_like(q)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = naive_attention(q64, k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1),
                             causal=causal)
    out.backward(dout.double())
    got = _grads(q, k, v, dout, causal, label)
    for gname, g, ref in zip(("dq", "dk", "dv"), got, (q64.grad, k64.grad, v64.grad)):
        err = relative_error(g, ref)
        assert err <= rtol_bwd(dtype), f"{label} D={d} causal={causal}: {gname} {err:.3e}"


def test_reduce_add_starts_from_zero_on_every_call():
    """dQacc is allocated uninitialised and zeroed by the delta pass: a second backward
    (reusing the first one's freed fp32 buffer) gives the same dQ up to the order of the
    fp32 additions, not twice it."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    dout = torch.randn_like(q)
    label = "kv64x128_q128x64_o1_w8_atomic"
    first = _grads(q, k, v, dout, False, label)[0]
    second = _grads(q, k, v, dout, False, label)[0]
    assert relative_error(second, first.double()) < 1e-2


KEY_ROWS = sorted({s.label() for d in (64, 128) for s in bwd_candidates(d).values()
                   if s.key_rows})
# Each keys-as-rows schedule beside its queries-as-rows twin: a failure of both is not the
# orientation's.
ORIENTED = [label for kr in KEY_ROWS for label in (kr, kr.removesuffix("_keyrows"))]
MASKS = ("bool_full", "key_padding", "additive_heads")


def _check_pinned(label, q, k, v, dout, *, causal=False, attn_mask=None, score_mod=None,
                  score_ref=None):
    """dQ, dK, dV with backward schedule ``label`` pinned against float64 autograd."""
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out, _ = naive_attention(q64, k64, v64, causal=causal, attn_mask=attn_mask,
                             score_ref=score_ref)
    out.backward(dout.double())
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with pinned_bwd_schedule(BwdSchedule.from_label(label)):
        ta.sdpa(q, k, v, attn_mask=attn_mask, is_causal=causal,
                score_mod=score_mod).backward(dout)
    for gname, g, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                             (q64.grad, k64.grad, v64.grad)):
        assert torch.isfinite(g).all(), f"{label}: {gname} NaN/inf"
        err = relative_error(g, torch.nan_to_num(ref))
        assert err <= rtol_bwd(q.dtype), f"{label}: {gname} {err:.3e}"


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("label", ORIENTED)
def test_keys_as_rows_with_masks_match_float64_autograd(label, kind):
    """Keys as the dK/dV MMA rows read the additive mask transposed, build the causal and
    key-tail masks from index tiles laid out the other way and the row statistics per
    column: each mask layout, D = 96 (two head-dim chunks), a key tail."""
    torch.manual_seed(1)
    b, h, s, d = 2, 2, 300, 96
    q, k, v = (torch.randn(b, h, s, d, device="cuda").to(torch.bfloat16) for _ in range(3))
    if kind == "bool_full":
        mask = torch.rand(b, h, s, s, device="cuda") > 0.4
        mask[..., 0] = True
    elif kind == "additive_heads":
        mask = torch.randn(1, h, s, s, device="cuda").to(torch.bfloat16)
    else:
        mask = torch.ones(b, 1, 1, s, dtype=torch.bool, device="cuda")
        mask[1, ..., 200:] = False
    _check_pinned(label, q, k, v, torch.randn_like(q), causal=kind == "additive_heads",
                  attn_mask=mask)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(17, 300), (300, 129)])
@pytest.mark.parametrize("label", ORIENTED)
def test_keys_as_rows_cross_attention_and_a_position_score_mod(label, sq, sk, causal):
    """Query and key counts that differ (partial query and key tiles at both ends), and
    ALiBi: a score_mod of (q_idx - kv_idx), wrong by a transpose if the orientation's
    index tiles were swapped."""
    torch.manual_seed(2)
    q = torch.randn(1, 2, sq, 128, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(1, 2, sk, 128, device="cuda").to(torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    _check_pinned(label, q, k, v, dout, causal=causal)
    slopes = torch.tensor([0.25, 0.0625], device="cuda")
    s64 = slopes.double()

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    _check_pinned(label, q, k, v, dout, causal=causal, score_mod=alibi,
                  score_ref=lambda s, b, h, qi, ki: s + s64[h] * (ki - qi))
