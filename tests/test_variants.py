"""Variants on the CPU: lifting user functions into kernel code, their compile identity, the
symbolic derivative of a score_mod (checked numerically against torch autograd), the
refusals, and the block lists built from tile classes."""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import cuda.tile as ct  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention import mods as M  # noqa: E402
from tiledattention import variants  # noqa: E402
from tiledattention.errors import BackwardNotSupportedError, InputError  # noqa: E402
from tiledattention.kernel.blockmask import FULL, PARTIAL, lists_from_classes  # noqa: E402

SHIM = types.SimpleNamespace(tanh=torch.tanh, exp=torch.exp, exp2=torch.exp2,
                             where=torch.where)


def _source(lifted) -> str:
    return lifted.key[1]


def _run_generated(lifted, *args):
    """Execute a lifted function's generated source with torch in place of cuTile."""
    scope = {**lifted.fn.__globals__, "ct": SHIM, "_ta_ct": SHIM}
    exec(compile(_source(lifted), "<test>", "exec"), scope)  # noqa: S102
    return scope[lifted.fn.__name__](*args, None, None, None, None)


def test_a_captured_tensor_becomes_a_kernel_array_indexed_by_gather():
    slopes = torch.rand(8)
    mods = M.mods_for(variants.alibi(slopes), None)
    src = _source(mods.score_mod)
    assert "_ta_ct.gather(_ta_aux0, (h,))" in src
    assert mods.tensors() == (slopes,)


def test_score_and_mask_captures_share_the_arrays_in_order():
    slopes = torch.rand(8)
    ids = torch.zeros(1, 64, dtype=torch.int32)
    mods = M.mods_for(variants.alibi(slopes), variants.document(ids))
    assert "_ta_aux1" in _source(mods.mask_mod) and mods.tensors() == (slopes, ids)


def test_factory_constants_are_part_of_the_compile_identity():
    a, b, c = (M.mods_for(None, variants.sliding_window(n)) for n in (128, 128, 256))
    assert a.key == b.key and a.key != c.key


def test_symbolic_derivatives_match_torch_autograd():
    cap = 3.0

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * ct.tanh(score / cap)

    def affine(score, b, h, q_idx, kv_idx):
        return score * 0.5 - 2.0

    def gated(score, b, h, q_idx, kv_idx):
        return ct.where(q_idx >= kv_idx, ct.exp(score) * 2.0, -score)

    x = torch.linspace(-5, 5, 41, dtype=torch.float64, requires_grad=True)
    qi, ki = torch.arange(41)[:, None] % 7, torch.arange(41)[:, None] % 5
    for fn, ref in ((softcap, lambda s: cap * torch.tanh(s / cap)),
                    (affine, lambda s: s * 0.5 - 2.0),
                    (gated, lambda s: torch.where(qi[:, 0] >= ki[:, 0], torch.exp(s) * 2.0,
                                                  -s))):
        grad = M.mods_for(fn, None).score_grad
        (g,) = torch.autograd.grad(ref(x).sum(), x)
        got = _run_generated(grad, x.detach(), 0, 0, qi[:, 0], ki[:, 0])
        got = torch.as_tensor(got, dtype=torch.float64).expand_as(x)
        assert torch.allclose(got, g), fn.__name__


def test_a_score_mod_without_a_derivative_is_refused_before_anything_runs():
    def wavy(score, b, h, q_idx, kv_idx):  # ct.sinh: outside the closed set
        return ct.sinh(score)

    mods = M.mods_for(wavy, None)
    assert mods.score_grad is None and "ScoreMod(fn, grad=dfn)" in mods.grad_error
    q = torch.randn(1, 1, 8, 64, requires_grad=True)
    with pytest.raises(BackwardNotSupportedError, match="cannot differentiate"):
        ta.sdpa(q, q.detach(), q.detach(), score_mod=wavy)


def test_a_paired_derivative_is_used_as_given():
    def wavy(score, b, h, q_idx, kv_idx):
        return ct.sin(score)

    def d_wavy(score, b, h, q_idx, kv_idx):
        return ct.cos(score)

    mods = M.mods_for(M.ScoreMod(wavy, grad=d_wavy), None)
    assert mods.grad_error is None and "ct.cos(score)" in _source(mods.score_grad)


def test_bad_variant_functions_get_one_clear_error():
    with pytest.raises(M.VariantError, match="must be a Python function"):
        M.mods_for(len, None)
    with pytest.raises(M.VariantError, match="exactly 4 positional"):
        M.mods_for(None, lambda b, h, q: q > 0)
    a, b_, c, d, e = (torch.zeros(4) for _ in range(5))

    def five(b, h, q_idx, kv_idx):
        return a[h] + b_[h] + c[h] + d[h] + e[h] > 0

    with pytest.raises(M.VariantError, match="at most 4"):
        M.mods_for(None, five)


def test_block_mask_arguments_are_checked_when_made_and_when_used():
    with pytest.raises(InputError, match="B must be a positive int or None"):
        ta.block_mask(variants.sliding_window(8), 0, None, 64, 64, device="cpu")
    bm = ta.block_mask(variants.sliding_window(8), None, None, 64, 64, device="cpu")
    q = torch.randn(1, 2, 32, 64)
    with pytest.raises(InputError, match="block_mask was made for"):
        ta.sdpa(q, q, q, block_mask=bm)


def test_torch_argument_names_are_accepted_and_dropout_refused():
    q = torch.randn(1, 1, 8, 64)
    with pytest.raises(InputError, match="no dropout"):
        ta.sdpa(q, q, q, None, 0.1)
    with pytest.raises(InputError, match="disagree"):
        ta.sdpa(q, q, q, is_causal=True, causal=False)


def test_block_lists_put_partial_tiles_first_then_full_ones_in_order():
    cls = torch.tensor([[[[FULL, 0, PARTIAL, FULL, PARTIAL]]]], dtype=torch.uint8)
    count, index = lists_from_classes(cls)
    assert count.tolist() == [[[[2, 2]]]]
    assert index[0, 0, 0, :4].tolist() == [2, 4, 0, 3]
