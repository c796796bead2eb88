"""D_qk != D_v: V's head dim may differ from Q/K's, as in torch's SDPA (MLA's (192, 128),
(128, 64)); the output has V's head dim. CPU only: the checks, the plans (no kernels
built), the kernel's flags and the float64 references; the kernels compile in
test_compile_value_headdim.py and run in tests/gpu/test_value_headdim_gpu.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.kernel.validate import Problem, check_inputs, schedule_head_dim
from tiledattention.reference import attention_backward, naive_attention, tiled_attention

SHAPES = [(192, 128), (128, 64), (64, 128)]  # (D_qk, D_v)


def t(b, h, s, d, dtype=torch.float16, grad=False):
    return torch.zeros(b, h, s, d, dtype=dtype, requires_grad=grad)


def problem(dqk, dv, hq=8, hk=2):
    return check_inputs(t(2, hq, 16, dqk), t(2, hk, 32, dqk), t(2, hk, 32, dv), causal=True,
                        scale=None, attn_mask=None, enable_gqa=hq != hk, device=False)


@pytest.mark.parametrize("dqk,dv", SHAPES)
def test_a_value_head_dim_of_its_own_passes_the_checks(dqk, dv):
    p = problem(dqk, dv)
    assert (p.head_dim, p.value_dim, p.group) == (dqk, dv, 4)
    assert p.scale == 1.0 / math.sqrt(dqk)  # torch's default: Q/K's head dim


def test_one_head_dim_keeps_the_problem_it_had():
    assert problem(128, 128) == Problem(2, 8, 2, 16, 32, 128, True, 1.0 / math.sqrt(128))


@pytest.mark.parametrize("k_dim,v_dim,error,words", [
    (128, 128, ta.ShapeError, "q 192, k 128; q and k need one head dim"),
    (192, 520, ta.UnsupportedHeadDimError, "v's head dim 520 is not supported; accepted"),
    (192, 36, ta.UnsupportedHeadDimError, "multiples of 8 from 8 to 256"),
])
def test_a_head_dim_the_kernel_cannot_run_is_one_typed_error(k_dim, v_dim, error, words):
    with pytest.raises(error, match=words):
        ta.sdpa(t(1, 2, 16, 192), t(1, 2, 16, k_dim), t(1, 2, 16, v_dim))


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_a_gradient_of_a_value_head_dim_is_no_longer_refused(which):
    # The backward runs D_qk != D_v: on the CPU the call gets as far as the device check.
    args = [t(1, 4, 16, 192, grad=which == "q"), t(1, 2, 16, 192, grad=which == "k"),
            t(1, 2, 16, 128, grad=which == "v")]
    with pytest.raises((ta.NoGPUError, ta.DeviceError)):
        ta.sdpa(*args, enable_gqa=True)


def test_without_a_gradient_a_value_head_dim_reaches_the_device_check():
    args = (t(1, 2, 16, 192, grad=True), t(1, 2, 16, 192), t(1, 2, 16, 128))
    with torch.no_grad(), pytest.raises((ta.NoGPUError, ta.DeviceError)):
        ta.sdpa(*args)


@pytest.mark.parametrize("dqk,dv,want", [(192, 128, 192), (128, 64, 128), (64, 128, 128)])
def test_schedules_come_from_the_wider_head_dim(dqk, dv, want):
    assert schedule_head_dim(problem(dqk, dv)) == want


def test_the_kernel_takes_value_chunks_only_in_the_dense_entry_points():
    from tiledattention.kernel.entry import entry_fields
    from tiledattention.kernel.flags import FWD_SEQS, PLAIN, VARIANT, FwdFlags

    value = {"VNCHUNK", "VW0", "VW1", "VW2"}
    assert value <= set(entry_fields(FwdFlags, PLAIN))
    assert value <= set(entry_fields(FwdFlags, VARIANT))
    assert not value & set(entry_fields(FwdFlags, FWD_SEQS))  # fixed 0: Q/K's chunks


@pytest.mark.parametrize("family", ["DkdvFlags", "DqFlags"])
def test_the_backward_takes_value_chunks_only_in_the_dense_entry_points(family):
    from tiledattention.kernel import flags
    from tiledattention.kernel.entry import entry_fields

    cls = getattr(flags, family)
    value = {"VNCHUNK", "VW0", "VW1", "VW2"}
    assert value <= set(entry_fields(cls, flags.PLAIN))
    assert value <= set(entry_fields(cls, flags.VARIANT))
    assert not value & set(entry_fields(cls, flags.BWD_SEQS))  # varlen: one head dim


@pytest.mark.parametrize("dqk,dv,qk,value", [
    (192, 128, (2, 128, 64, 64), (1, 128, 128, 128)),
    (128, 64, (1, 128, 128, 128), (1, 64, 64, 64)),
    (128, 128, (1, 128, 128, 128), (1, 128, 128, 128)),
])
def test_backward_constants_chunk_q_k_and_v_each_by_their_head_dim(dqk, dv, qk, value):
    # S, dQ and dK over Q/K's chunks; dO, V, O and dV over V's; delta's O/dO tile is V's
    # head dim wide, the dQacc rows it zeroes Q's.
    from tiledattention.kernel.variant import BwdVariant
    from tiledattention.schedules.backward import BwdSchedule

    v = BwdVariant("bfloat16", dqk, True, BwdSchedule(dq="atomic"),
                   head_dim_v=None if dv == dqk else dv)
    for kernel in ("attention_bwd_dkdv", "attention_bwd_dq"):
        c = v.constants(kernel)
        assert (c["NCHUNK"], c["W0"], c["W1"], c["W2"]) == qk
        assert (c["VNCHUNK"], c["VW0"], c["VW1"], c["VW2"]) == value
    delta = v.constants("attention_bwd_delta")
    assert (delta["WD"], delta["WQ"]) == (1 << (dv - 1).bit_length(),
                                          1 << (dqk - 1).bit_length())
    assert ("_dv" in v.label()) == (dv != dqk)


@pytest.mark.parametrize("dqk,dv", SHAPES)
def test_the_backward_plan_carries_the_value_head_dim(dqk, dv):
    pytest.importorskip("cuda.tile", reason="plans read the kernels' parameters (cuTile)")
    from tiledattention.kernel import plan as planning
    from tiledattention.kernel.spec import DKDV
    from tiledattention.schedules.backward import BwdSchedule, default_bwd_schedule

    q, k = t(2, 8, 100, dqk), t(2, 2, 130, dqk)
    plan = planning.make_bwd_plan(q, k, None, True, 0.1, False, BwdSchedule(),
                                  head_dim_v=dv)
    assert plan.variant.value_dim == dv
    step = dict((role, tail) for role, _, _, tail in plan.launches)["dkdv"]
    consts = dict(zip(DKDV.names()[len(DKDV.tensors):], step))
    assert consts["VW0"] == (128 if dv > 64 else 64) and consts["GROUP"] == 4
    same = planning.make_bwd_plan(q, k, None, True, 0.1, False, BwdSchedule(),
                                  head_dim_v=dqk)
    assert same.variant.head_dim_v is None  # one head dim: the kernels of before
    if dv > dqk:  # no table bucket has a wider V: the default of V's head dim
        chosen = planning.make_bwd_plan(q, k, None, True, 0.1, False, None, head_dim_v=dv)
        assert chosen.schedule == default_bwd_schedule(dv, True)


@pytest.mark.parametrize("dqk,dv,qk,value", [
    (192, 128, (2, 128, 64, 64), (1, 128, 128, 128)),
    (128, 64, (1, 128, 128, 128), (1, 64, 64, 64)),
    (128, 128, (1, 128, 128, 128), (1, 128, 128, 128)),
])
def test_variant_constants_chunk_q_k_and_v_each_by_their_head_dim(dqk, dv, qk, value):
    from tiledattention.kernel.variant import Variant
    from tiledattention.schedules.schedule import default_schedule

    v = Variant("float16", dqk, True, default_schedule(dqk, True),
                head_dim_v=None if dv == dqk else dv)
    c = v.constants()
    assert (c["NCHUNK"], c["W0"], c["W1"], c["W2"]) == qk
    assert (c["VNCHUNK"], c["VW0"], c["VW1"], c["VW2"]) == value
    assert ("_dv" in v.label()) == (dv != dqk)


@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("seq_q", [1, 100])
def test_the_plan_writes_an_output_of_the_value_head_dim(dqk, dv, seq_q):
    pytest.importorskip("cuda.tile", reason="plans read the kernels' parameters (cuTile)")
    from tiledattention.kernel.plan import make_plan
    from tiledattention.schedules.schedule import default_schedule

    p = Problem(2, 8, 2, seq_q, 4096, dqk, False, 0.1, dv)
    plan = make_plan(p, torch.float16, torch.device("cpu"), default_schedule(dqk, False), True,
                     copy_qkv=False, mask=None, sm_count=132, q_viewable=True,
                     build_kernels=False)
    assert plan.out_shape == (2, 8, seq_q, dv)
    assert plan.lse_shape == (2, 8, seq_q)
    if seq_q == 1:  # GQA decode: packed rows, split keys, partials of V's head dim
        assert plan.packed_shape == (2, 2, 4, dqk)
        assert plan.part_shape[3] == dv and plan.splits_per_head > 1
        from tiledattention.kernel.spec import COMBINE

        names = COMBINE.names()[len(COMBINE.tensors):]
        consts = dict(zip(names, plan.launches[1].tail))
        assert consts["W0"] + (consts["W1"] if consts["NCHUNK"] > 1 else 0) == dv


def rand(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("dqk,dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,hq,hk", [(100, 130, 4, 2), (1, 77, 8, 1), (64, 64, 2, 2)])
def test_the_references_follow_torch_for_a_value_head_dim(dqk, dv, causal, sq, sk, hq, hk):
    # softmax(Q K^T / sqrt(D_qk)) V in float64; the tiled re-trace of the kernel (Q K^T over
    # Q/K's chunks, P V over V's) equals it.
    gen = torch.Generator().manual_seed(dqk + dv + sq)
    q, k, v = rand(2, hq, sq, dqk, gen=gen), rand(2, hk, sk, dqk, gen=gen), \
        rand(2, hk, sk, dv, gen=gen)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hk)
    ref, lse = naive_attention(q, k, v, causal=causal)
    assert ref.shape == (2, hq, sq, dv)
    torch.testing.assert_close(ref, want, atol=1e-12, rtol=1e-12)
    out, tiled_lse = tiled_attention(q, k, v, causal=causal, tile_m=64, tile_n=64)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(tiled_lse, lse, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dqk,dv", SHAPES)
def test_the_backward_reference_gives_dv_the_value_head_dim(dqk, dv):
    gen = torch.Generator().manual_seed(3)
    q = rand(1, 4, 40, dqk, gen=gen).requires_grad_()
    k = rand(1, 2, 50, dqk, gen=gen).requires_grad_()
    v = rand(1, 2, 50, dv, gen=gen).requires_grad_()
    dout = rand(1, 4, 40, dv, gen=gen)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad(out, (q, k, v), dout)
    got = attention_backward(q.detach(), k.detach(), v.detach(), dout, causal=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)
