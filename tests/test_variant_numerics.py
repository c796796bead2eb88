"""Variant numerics without a GPU: the kernels that FlexAttention's masking idiom (a
score_mod returning -inf), relative biases at untiled lengths and integer index arithmetic
run through compile with tileiras, forward and backward (tests/gpu/test_variant_numerics_gpu.py
checks their values on the GPU); the float64 reference defines fully masked rows."""

from __future__ import annotations

import math

import pytest
import torch

from tiledattention.reference import naive_attention

NEG_INF = -math.inf


def test_the_reference_gives_fully_masked_rows_zeros_and_lse_minus_inf():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))

    def score_ref(s, b, h, q_idx, kv_idx):  # rows 0..2 see no key at all
        return s.masked_fill((q_idx < 3) & (kv_idx >= 0), NEG_INF)

    out, lse = naive_attention(q, k, v, score_ref=score_ref)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    assert torch.isneginf(lse[:, :, :3]).all() and torch.isfinite(lse[:, :, 3:]).all()
    assert torch.isfinite(out).all()


def test_torch_softmax_of_a_row_holding_plus_inf_is_nan():
    # The semantics the kernels keep for a score_mod returning +inf (documented in body).
    assert torch.isnan(torch.softmax(torch.tensor([math.inf, 1.0]), -1)).all()


# ----------------------------------------------------------------------------- compiles
ct = pytest.importorskip("cuda.tile", reason="cuTile not installed")

from tiledattention.kernel import mods as M  # noqa: E402
from tiledattention.kernel.compile import export_bwd_cubins, export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import tileiras_path  # noqa: E402
from tiledattention.kernel.variant import BwdVariant, Flags, Variant  # noqa: E402
from tiledattention.schedules.backward import default_bwd_schedule  # noqa: E402
from tiledattention.schedules.schedule import Schedule, default_schedule  # noqa: E402

_needs_tileiras = pytest.mark.skipif(tileiras_path() is None, reason="tileiras not found")

_DOC = torch.zeros(333, dtype=torch.int32)
_POS = torch.arange(333, dtype=torch.int64)
_VALID = torch.ones(2, 333, dtype=torch.bool)


def inverse_causal(score, b, h, q_idx, kv_idx):
    return ct.where(q_idx <= kv_idx, score, NEG_INF)


def document_inf(score, b, h, q_idx, kv_idx):
    return ct.where(_DOC[q_idx] == _DOC[kv_idx], score, NEG_INF)


def sequence_mask(score, b, h, q_idx, kv_idx):
    return ct.where(_VALID[b, kv_idx], score, NEG_INF)


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx)


def integer_terms(score, b, h, q_idx, kv_idx):
    # int / int is true division (float), // floors, an int64 tensor read mixes with fp32
    return score + (q_idx - kv_idx) / 64 + (q_idx // 64 - kv_idx // 64) + _POS[kv_idx] * 0.001


def _aux(mods):
    dt = {torch.float32: ct.float32, torch.int32: ct.int32, torch.int64: ct.int64,
          torch.bool: ct.bool_, torch.float16: ct.float16}
    return tuple((dt[t.dtype], t.dim()) for t in mods.tensors())


def _compile_both(score, d=64, causal=False, split_k=False, even=False):
    mods = M.mods_for(score, None)
    assert mods.grad_error is None, mods.grad_error
    aux = _aux(mods)
    flags = Flags("float16", d, causal, mods=mods.key, has_score_mod=True)
    fwd = export_cubin(Variant("float16", d, causal, Schedule(64, 64, 2) if split_k else
                               default_schedule(d, causal), even_n=even, return_lse=True,
                               split_k=split_k, flags=flags), "sm_90", mods=mods, aux=aux)
    assert fwd.cubin[:4] == b"\x7fELF"
    if split_k:
        return
    bwd = export_bwd_cubins(BwdVariant("float16", d, causal, default_bwd_schedule(d, causal),
                                       even_n=even, flags=flags), "sm_90", mods=mods, aux=aux)
    assert all(c[:4] == b"\x7fELF" for c in bwd.values())


@pytest.mark.compile
@_needs_tileiras
@pytest.mark.parametrize("score", [inverse_causal, relative_bias, integer_terms],
                         ids=lambda f: f.__name__)
def test_minus_inf_relative_and_integer_score_mods_compile_forward_and_backward(score):
    _compile_both(score)


@pytest.mark.compile
@_needs_tileiras
@pytest.mark.parametrize("score", [document_inf, sequence_mask], ids=lambda f: f.__name__)
def test_captured_int_and_bool_masks_through_the_score_compile(score):
    _compile_both(score, d=128, causal=True)


@pytest.mark.compile
@_needs_tileiras
def test_a_split_k_forward_with_a_minus_inf_score_mod_compiles():
    _compile_both(inverse_causal, split_k=True)
