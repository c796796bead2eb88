"""The FP8 (e4m3) forward on the CPU: every refusal is one typed error before anything
runs, descales broadcast as FA3's (per tensor, or per batch and K/V head over the group's
query heads), the float64 reference dequantizes, the e4m3 tolerance holds for the
kernel's rounding of P emulated here, and the plan places what the launch needs by name
(benchmarks/notes/head-shapes.md §40h; the GPU runs: tests/gpu/test_fp8_gpu.py)."""

from __future__ import annotations

import math

import pytest
import torch

import tiledattention as ta
from tiledattention.errors import (
    BackwardNotSupportedError,
    DTypeError,
    InputError,
    NoGPUError,
    ShapeError,
    UnsupportedHeadDimError,
)
from tiledattention.reference import dequantized, fp8_attention, naive_attention
from tiledattention.tolerance import relative_error, rtol

E4M3 = torch.float8_e4m3fn


def fp8(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(E4M3)


def qkv(b=1, hq=2, hk=2, s=64, d=64):
    return fp8(b, hq, s, d, seed=1), fp8(b, hk, s, d, seed=2), fp8(b, hk, s, d, seed=3)


def refused(exc, **kwargs):
    """sdpa(**kwargs) raises exactly ``exc`` (not a subclass of it that means another
    thing) with a one-line message."""
    q, k, v = kwargs.pop("qkv", qkv())
    with pytest.raises(exc) as info:
        ta.sdpa(q, k, v, **kwargs)
    assert type(info.value) is exc and "\n" not in str(info.value)
    return str(info.value)


def test_a_gradient_on_fp8_is_refused():
    q, k, v = qkv()
    q.requires_grad_(True)
    assert "no backward" in refused(BackwardNotSupportedError, qkv=(q, k, v))


def test_e5m2_is_refused_naming_e4m3():
    q, k, v = (t.float().to(torch.float8_e5m2) for t in qkv())
    assert "float8_e4m3fn" in refused(DTypeError, qkv=(q, k, v))


@pytest.mark.parametrize("extra", [
    dict(attn_mask=torch.ones(64, 64, dtype=torch.bool)),
    dict(score_mod=lambda s, b, h, qi, ki: s),
    dict(mask_mod=lambda b, h, qi, ki: qi >= ki)], ids=["mask", "score_mod", "mask_mod"])
def test_masks_and_variants_are_refused_on_fp8(extra):
    assert "no attn_mask" in refused(InputError, **extra)


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale", "out_dtype"])
def test_fp8_arguments_on_a_bf16_call_are_refused_not_ignored(name):
    b = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    value = torch.bfloat16 if name == "out_dtype" else torch.ones(())
    msg = refused(InputError, qkv=(b, b, b), **{name: value})
    assert name in msg and "bfloat16" in msg


def test_an_output_dtype_other_than_bf16_or_fp16_is_refused():
    assert "torch.float16" in refused(DTypeError, out_dtype=torch.float32)


def test_mixed_fp8_and_bf16_inputs_are_refused_naming_the_fp8_path():
    q, k, v = qkv()
    assert "float8_e4m3fn" in refused(DTypeError, qkv=(q.float().bfloat16(), k, v))
    assert "float8_e4m3fn" in refused(DTypeError, qkv=(q, k.float().bfloat16(), v))


@pytest.mark.parametrize("dqk,dv", [(48, 48), (288, 288), (128, 64), (16, 16)])
def test_head_dims_outside_32_to_256_by_32_are_refused(dqk, dv):
    q, k, v = fp8(1, 2, 64, dqk), fp8(1, 2, 64, dqk), fp8(1, 2, 64, dv)
    assert "steps of 32" in refused(UnsupportedHeadDimError, qkv=(q, k, v))


@pytest.mark.parametrize("value,exc", [
    (torch.ones((), dtype=torch.float16), DTypeError),
    (torch.ones(2), ShapeError),  # [Hkv] alone: FA3 takes [B, Hkv]
    (torch.ones(2, 1), ShapeError),  # [Hkv, B]
    (1.0, InputError)], ids=["fp16", "per-head-only", "transposed", "python-float"])
def test_a_bad_descale_is_one_typed_error(value, exc):
    q, k, v = qkv(b=1, hq=4, hk=2)
    assert "k_descale" in refused(exc, qkv=(q, k, v), k_descale=value, enable_gqa=True)


@pytest.mark.parametrize("shape", [(), (1,), (2, 2)])
def test_every_accepted_descale_passes_the_checks(shape):
    # a valid call gets as far as the device: every check before it passed
    q, k, v = qkv(b=2, hq=4, hk=2)
    d = torch.full(shape, 0.5)
    refused(NoGPUError, qkv=(q, k, v), q_descale=d, k_descale=d, v_descale=d,
            out_dtype=torch.float16, enable_gqa=True, is_causal=True, return_lse=True)


@pytest.mark.parametrize("given", [(), ("q_descale", "k_descale"), ("k_descale",)])
def test_an_fp8_call_without_every_descale_is_refused_naming_the_missing(given):
    # a forgotten scale would give wrong numbers silently (issue 48: bad input)
    q, k, v = qkv()
    msg = refused(InputError, qkv=(q, k, v), **{n: torch.ones(()) for n in given})
    missing = [n for n in ("q_descale", "k_descale", "v_descale") if n not in given]
    assert msg.endswith("(unit scales: torch.ones((), device=q.device))")
    assert "missing: " + ", ".join(missing) in msg


def test_a_bf16_call_never_reaches_the_fp8_path():
    b = torch.randn(1, 2, 64, 48, dtype=torch.bfloat16)  # D 48: refused on the fp8 path
    refused(NoGPUError, qkv=(b, b, b))


# ----------------------------------------------------------------------------- reference
def test_the_reference_dequantizes_per_tensor():
    q, k, v = qkv()
    qd, kd, vd = torch.tensor(0.5), torch.tensor([2.0]), torch.tensor(0.25)
    out, lse = fp8_attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, causal=True)
    ref, ref_lse = naive_attention(q.double() * 0.5, k.double() * 2.0, v.double() * 0.25,
                                   causal=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=0)


def test_per_head_descales_follow_the_k_v_head_over_its_query_heads():
    # q [B2, Hq 4, ...], K/V heads 2: query heads 0, 1 read descale [b, 0]; 2, 3 [b, 1]
    q, k, v = qkv(b=2, hq=4, hk=2)
    qd = torch.tensor([[1.0, 2.0], [4.0, 8.0]])
    out = dequantized(q, qd, 4)
    for b in range(2):
        for h in range(4):
            torch.testing.assert_close(out[b, h], q[b, h].double() * qd[b, h // 2])
    kd = torch.tensor([[0.5, 0.25], [2.0, 1.0]])
    out = dequantized(k, kd, 2)
    torch.testing.assert_close(out[1, 0], k[1, 0].double() * 2.0)


def emulated_fp8_kernel(q, k, v, *, causal, tile_n=128):
    """The kernel's arithmetic on the CPU: scores from the (exact) e4m3 inputs, the online
    softmax over key tiles with P rounded to e4m3 for P V against the running max, the
    row sums from unrounded P."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    m = torch.full(s.shape[:-1] + (1,), -math.inf, dtype=torch.float64)
    l_ = torch.zeros_like(m)
    acc = torch.zeros(*s.shape[:-1], v.shape[-1], dtype=torch.float64)
    for j in range(0, s.shape[-1], tile_n):
        sj = s[..., j:j + tile_n]
        m_new = torch.maximum(m, sj.amax(-1, keepdim=True))
        p = torch.exp(sj - m_new)
        alpha = torch.exp(m - m_new)
        l_ = l_ * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p.float().to(E4M3).double() @ v[..., j:j + tile_n, :]
        m = m_new
    return acc / l_


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_the_e4m3_tolerance_bounds_the_rounding_of_p(d, causal):
    q, k, v = (fp8(1, 2, 512, d, seed=s) for s in (4, 5, 6))
    ref, _ = fp8_attention(q, k, v, causal=causal)
    err = relative_error(emulated_fp8_kernel(q, k, v, causal=causal), ref)
    # the rounding shows (the bound is not vacuous) and stays inside it with a margin
    assert 1e-3 < err < rtol(E4M3) / 2


# ----------------------------------------------------------------------------- plan
def test_the_fp8_plan_places_descale_layouts_and_output_by_name():
    pytest.importorskip("cuda.tile", reason="cuTile not installed")
    from tiledattention.kernel.plan import make_fp8_plan
    from tiledattention.kernel.spec import FWD_FP8
    from tiledattention.kernel.validate import Problem
    from tiledattention.schedules.schedule import default_fp8_schedule

    p = Problem(2, 8, 2, 1000, 1000, 256, True, 0.125)
    plan = make_fp8_plan(p, torch.device("cpu"), default_fp8_schedule(256, True), False,
                         torch.float16, copy_q=False, copy_k=True, vt_view=False,
                         per_head=(True, False, True), build_kernels=False)
    args = dict(zip(FWD_FP8.names()[len(FWD_FP8.tensors):], plan.launches[0].tail))
    assert (args["QD_HEADS"], args["KD_HEADS"], args["VD_HEADS"]) == (1, 0, 1)
    assert args["FP8"] is True and args["GROUP"] == 4 and args["CAUSAL"] is True
    assert args["qk_scale_log2"] == pytest.approx(0.125 / math.log(2.0))
    assert (args["TILE_M"], args["TILE_N"]) == (128, 128)  # D 256: 128x128 on 8 warps
    assert plan.schedule.worker_warps == 8 and args["EVEN_N"] is False
    assert plan.vt_cols == 1008 and plan.copy_k and not plan.copy_q
    assert plan.out_shape == (2, 8, 1000, 256) and plan.out_dtype is torch.float16
    assert plan.launches[0].grid == (8, 8, 2)


@pytest.mark.parametrize("d, tile_s, d_pad", [(64, 128, 64), (96, 128, 128), (256, 64, 256)])
def test_a_v_the_kernel_can_read_is_transposed_by_the_plans_own_launch(d, tile_s, d_pad):
    # V [B, Hkv, Skv, D] -> V^T by transpose.keys_last, one program per key tile and head
    pytest.importorskip("cuda.tile", reason="cuTile not installed")
    from tiledattention.kernel.plan import make_fp8_plan
    from tiledattention.kernel.spec import TRANSPOSE
    from tiledattention.kernel.validate import Problem
    from tiledattention.schedules.schedule import default_fp8_schedule

    p = Problem(2, 8, 2, 1000, 1000, d, False, 0.125)
    plan = make_fp8_plan(p, torch.device("cpu"), default_fp8_schedule(d, False), False,
                         torch.bfloat16, copy_q=False, copy_k=False, vt_view=False,
                         vt_kernel=True, per_head=(False,) * 3, build_kernels=False)
    assert plan.vt_step.grid == (-(-1000 // tile_s), 2, 2)
    assert dict(zip(TRANSPOSE.names()[2:], plan.vt_step.tail)) == dict(TILE_S=tile_s,
                                                                      D_PAD=d_pad)
    torch_copy = make_fp8_plan(p, torch.device("cpu"), default_fp8_schedule(d, False), False,
                               torch.bfloat16, copy_q=False, copy_k=False, vt_view=False,
                               per_head=(False,) * 3, build_kernels=False)
    assert torch_copy.vt_step is None


def test_only_the_fp8_variant_carries_the_fp8_flag():
    from tiledattention.kernel.variant import Variant
    from tiledattention.schedules.schedule import default_schedule

    s = default_schedule(128, False)
    assert "FP8" not in Variant("bfloat16", 128, False, s).constants()
    v = Variant("float8_e4m3fn", 128, False, s, out_dtype="bfloat16")
    assert v.constants()["FP8"] is True and "out_bfloat16" in v.label()


def test_layout_copies_only_what_lacks_16_byte_strides():
    from tiledattention.kernel.plan import fp8_layout

    q, k, v = qkv(s=64, d=64)
    assert fp8_layout(q, k, v) == dict(copy_q=False, copy_k=False, vt_view=False,
                                       vt_kernel=True)
    vt = fp8(1, 2, 64, 80)[..., :64]  # an aligned V^T [B, H, D, Skv]: rows of 80 keys
    assert fp8_layout(q, k, vt.transpose(2, 3))["vt_view"]
    odd = fp8(1, 2, 64, 72)[..., :64]  # rows of 72 bytes: not 16-byte strides
    assert fp8_layout(odd, odd, odd.transpose(2, 3)) == dict(copy_q=True, copy_k=True,
                                                              vt_view=False, vt_kernel=False)


def test_v_is_transposed_into_rows_padded_to_16_keys():
    from tiledattention.kernel.launch import transposed_copy

    v = fp8(1, 2, 100, 64)
    vt = transposed_copy(v, 112)
    assert vt.shape == (1, 2, 64, 100) and vt.stride() == (2 * 64 * 112, 64 * 112, 112, 1)
    assert torch.equal(vt.float(), v.transpose(2, 3).float())
