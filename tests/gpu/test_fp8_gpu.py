"""The FP8 (e4m3) forward on a CUDA GPU (issue 48 item 1), against the float64 reference of
the dequantized inputs by the tolerance table's e4m3 bound: D 64, 128, 256; S 128 to 4096
(a key tail, Sq != Skv); causal or not; GQA; per-tensor and per-(batch, K/V head)
descales; bf16 and fp16 output; the LSE; V given as a transposed view (read in place)
and q/k without 16-byte strides (copied). Speed: benchmarks/fp8_forward.py."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.errors import BackwardNotSupportedError
from tiledattention.reference import fp8_attention
from tiledattention.tolerance import relative_error, rtol

E4M3 = torch.float8_e4m3fn
FP8_MAX = 448.0


def quantized(x, per_head: bool, heads_kv: int):
    """(e4m3 tensor, its fp32 descale): x / descale fills e4m3's range, per tensor ([])
    or per (batch, K/V head) ([B, Hkv]; a query tensor's heads grouped by K/V head)."""
    b, h = x.shape[:2]
    if per_head:
        amax = x.abs().reshape(b, heads_kv, -1).amax(-1)
        scale = (amax / FP8_MAX).float()
        full = scale.repeat_interleave(h // heads_kv, dim=1)[:, :, None, None]
    else:
        scale = full = (x.abs().amax() / FP8_MAX).float()
    return (x / full).to(E4M3), scale


def inputs(b, hq, hk, sq, sk, d, *, per_head=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    # per-head magnitudes differ (what a per-head descale is for)
    mag = torch.rand(1, hk, 1, 1, device="cuda", generator=g) * 4 + 0.25
    q = r(b, hq, sq, d) * mag.repeat_interleave(hq // hk, dim=1)
    k, v = r(b, hk, sk, d) * mag, r(b, hk, sk, d) * mag
    (q8, qd), (k8, kd), (v8, vd) = (quantized(t, per_head, hk) for t in (q, k, v))
    return q8, k8, v8, dict(q_descale=qd, k_descale=kd, v_descale=vd)


def check(q, k, v, descales, *, causal=False, out_dtype=None, lse=True):
    gqa = q.shape[1] != k.shape[1]
    out, got_lse = ta.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa, return_lse=True,
                           out_dtype=out_dtype, **descales)
    ref, ref_lse = fp8_attention(q, k, v, causal=causal, **descales)
    assert out.dtype == (out_dtype or torch.bfloat16) and out.shape == q.shape
    assert torch.isfinite(out).all()
    err = relative_error(out, ref)
    assert err <= rtol(E4M3), err
    if lse:
        torch.testing.assert_close(got_lse.double(), ref_lse, atol=2e-2, rtol=1e-3)
    return out


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("s", [128, 1000, 4096])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_matches_float64_of_the_dequantized_inputs(d, s, causal):
    q, k, v, ds = inputs(2, 4, 4, s, s, d)
    check(q, k, v, ds, causal=causal)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_with_per_batch_and_kv_head_descales(d, causal):
    q, k, v, ds = inputs(2, 8, 2, 1000, 1000, d, per_head=True, seed=1)
    assert ds["q_descale"].shape == (2, 2)
    check(q, k, v, ds, causal=causal)


@pytest.mark.parametrize("d", [96, 160, 192, 224, 32])
def test_chunked_and_small_head_dims(d):
    q, k, v, ds = inputs(1, 4, 4, 512, 512, d, seed=2)
    check(q, k, v, ds, causal=True)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_output_dtype(out_dtype):
    q, k, v, ds = inputs(1, 4, 2, 2048, 2048, 128, per_head=True, seed=3)
    check(q, k, v, ds, out_dtype=out_dtype)


def test_unit_descales_per_tensor_and_as_one_element_agree():
    q, k, v, _ = inputs(1, 4, 4, 512, 512, 128, seed=4)
    ones = torch.ones((), device="cuda")
    out = check(q, k, v, dict(q_descale=ones, k_descale=ones, v_descale=ones))
    same = ta.sdpa(q, k, v, q_descale=ones, k_descale=ones.view(1), v_descale=ones)
    assert torch.equal(out, same)


@pytest.mark.parametrize("causal", [False, True])
def test_fewer_queries_than_keys_and_more(causal):
    # top-left causal alignment as torch's is_causal; key tails off the 128-key tile
    q, k, v, ds = inputs(1, 4, 4, 200, 1000, 128, seed=5)
    check(q, k, v, ds, causal=causal)
    q, k, v, ds = inputs(1, 4, 4, 1000, 200, 256, seed=6)
    check(q, k, v, ds, causal=causal)


def test_a_transposed_v_view_is_read_in_place_and_agrees_with_the_copy():
    q, k, v, ds = inputs(1, 4, 4, 1000, 1000, 128, seed=7)
    buf = torch.empty(1, 4, 128, 1008, dtype=E4M3, device="cuda")  # keys padded to 16
    vt = buf[..., :1000]
    vt.copy_(v.transpose(2, 3))
    view = vt.transpose(2, 3)
    from tiledattention.kernel.plan import fp8_layout

    assert fp8_layout(q, k, view)["vt_view"]
    out = check(q, k, view, ds)
    assert torch.equal(out, ta.sdpa(q, k, v, **ds))


@pytest.mark.parametrize("d", [64, 96, 256])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_the_v_transpose_kernel_gives_torchs_transpose_bit_for_bit(d, layout):
    # keys past a 128-key tile's end (1000) and D 96 padded to 128 on chip, clipped on store
    from tiledattention.kernel.launch import transposed_copy
    from tiledattention.kernel.plan import fp8_layout, transpose_step
    from tiledattention.kernel.validate import Problem

    v = torch.randn(2, 1000, 4, d, device="cuda").to(E4M3)  # [B, S, H, D] memory
    v = v.transpose(1, 2) if layout == "bshd" else v.transpose(1, 2).contiguous()
    assert fp8_layout(v, v, v)["vt_kernel"]
    step = transpose_step(Problem(2, 4, 4, 1000, 1000, d, False, 1.0))
    vt = transposed_copy(v, 1008, step)
    assert vt.shape == (2, 4, d, 1000) and vt.stride(2) == 1008
    assert torch.equal(vt.view(torch.uint8), v.transpose(2, 3).view(torch.uint8))


def test_q_and_k_without_16_byte_strides_are_copied_and_right():
    # heads interleaved in a [B, S, H, D] layout: strides of H*D bytes are 16-aligned; a
    # slice of a wider head dim (D 128 of 136) is not
    q, k, v, ds = inputs(1, 4, 4, 512, 512, 128, seed=8)
    wide = lambda t: torch.cat([t.float(), torch.zeros(*t.shape[:3], 8, device="cuda")],  # noqa: E731
                               -1).to(E4M3)[..., :128]
    qs, ks = wide(q), wide(k)
    assert qs.stride(2) == 136
    out = check(qs, ks, v, ds, causal=True)
    assert torch.equal(out, ta.sdpa(q, k, v, is_causal=True, **ds))
    bshd = v.transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] memory
    check(q, k, bshd, ds, causal=True)


def test_a_repeat_call_reuses_its_plan():
    from tiledattention.kernel.plan import fp8_plan_for

    q, k, v, ds = inputs(1, 4, 4, 256, 256, 64, seed=9)
    args = (q, k, v, False, None, False, False, None, None,
            (ds["q_descale"], ds["k_descale"], ds["v_descale"]))
    assert fp8_plan_for(*args) is fp8_plan_for(*args)


def test_no_gradient_on_fp8():
    q, k, v, ds = inputs(1, 2, 2, 128, 128, 64)
    with pytest.raises(BackwardNotSupportedError):
        ta.sdpa(q.requires_grad_(True), k, v, **ds)
