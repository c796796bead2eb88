"""Head dims past 256, forward only (issue 48 item 3): D up to 512 and MLA decode's D_qk 576
/ D_v 512. CPU only: the checks, the chunking, the schedule and its rejection rules, the
combine's row tile, the drop-in's fallback; the kernels compile in
test_compile_head_dim_512.py and run in tests/gpu/test_head_dim_512_gpu.py."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.headdim import (
    MAX_FWD_HEAD_DIM,
    MAX_FWD_VALUE_DIM,
    plan_head_dim,
    supported_head_dim,
)
from tiledattention.kernel.validate import check_inputs
from tiledattention.schedules.schedule import Schedule, default_schedule
from tiledattention.schedules.space import candidates, rejection

SHAPES = [(512, 512), (576, 512), (384, 384), (512, 256), (264, 264)]  # (D_qk, D_v)


def t(b, h, s, d, grad=False):
    return torch.zeros(b, h, s, d, dtype=torch.bfloat16, requires_grad=grad)


@pytest.mark.parametrize("dqk,dv", SHAPES)
def test_wide_head_dims_pass_the_checks_as_forward_only(dqk, dv):
    assert not supported_head_dim(max(dqk, dv))  # past 256: no backward
    assert supported_head_dim(dqk, MAX_FWD_HEAD_DIM)
    assert supported_head_dim(dv, MAX_FWD_VALUE_DIM)
    p = check_inputs(t(1, 4, 16, dqk), t(1, 4, 32, dqk), t(1, 4, 32, dv), causal=True,
                     scale=None, attn_mask=None, enable_gqa=False, device=False)
    assert (p.head_dim, p.value_dim) == (dqk, dv)


@pytest.mark.parametrize("dqk,dv,words", [
    (584, 512, "head dim 584 is not supported"),
    (576, 576, "v's head dim 576 is not supported"),
    (512, 520, "forward only q/k up to 576 with v up to 512"),
    (516, 516, "head dim 516 is not supported"),
])
def test_past_the_forward_limits_is_one_typed_error(dqk, dv, words):
    with pytest.raises(ta.UnsupportedHeadDimError, match=words):
        ta.sdpa(t(1, 2, 16, dqk), t(1, 2, 16, dqk), t(1, 2, 16, dv))


@pytest.mark.parametrize("dqk,dv", [(512, 512), (576, 512), (264, 128)])
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_the_backward_of_a_wide_head_dim_is_refused_before_anything_runs(dqk, dv, which):
    args = [t(1, 2, 16, dqk, grad=which == "q"), t(1, 2, 16, dqk, grad=which == "k"),
            t(1, 2, 16, dv, grad=which == "v")]
    with pytest.raises(ta.BackwardNotSupportedError,
                       match="head dims above 256 not supported.*the forward runs"):
        ta.sdpa(*args)


def test_without_a_gradient_a_wide_head_dim_reaches_the_device_check():
    args = (t(1, 2, 16, 512, grad=True), t(1, 2, 16, 512), t(1, 2, 16, 512))
    with torch.no_grad(), pytest.raises((ta.NoGPUError, ta.DeviceError)):
        ta.sdpa(*args)


@pytest.mark.parametrize("dqk,dv", [(512, 512), (128, 512), (576, None)])
def test_a_backward_plan_is_never_built_for_a_wide_head_dim(dqk, dv):
    # every backward launch (the eager node's, the custom op's) runs a plan: refused there
    from tiledattention.kernel.plan import make_bwd_plan
    from tiledattention.schedules.backward import BwdSchedule

    q = t(1, 2, 16, dqk)
    with pytest.raises(ta.BackwardNotSupportedError, match="above 256"):
        make_bwd_plan(q, q, None, True, 0.1, False, BwdSchedule(), head_dim_v=dv)


@pytest.mark.parametrize("d,widths", [(512, (512,)), (576, (512, 64)), (384, (256, 128)),
                                      (448, (256, 128, 64)), (264, (256, 16))])
def test_wide_head_dims_fit_the_kernels_three_chunks(d, widths):
    assert plan_head_dim(d).widths == widths


@pytest.mark.parametrize("d", range(264, 577, 8))
def test_every_wide_head_dim_pads_to_at_most_576(d):
    plan = plan_head_dim(d)
    assert len(plan.widths) <= 3 and d <= plan.padded <= 576


@pytest.mark.parametrize("causal", [False, True])
def test_wide_head_dims_take_64x64_with_two_consumer_warp_groups(causal):
    s = default_schedule(512, causal)
    assert (s.tile_m, s.tile_n, s.occupancy, s.worker_warps) == (64, 64, 1, 8)
    assert rejection(s, 512) is None and rejection(s, 576) is None


@pytest.mark.parametrize("schedule,words", [
    (Schedule(64, 128, occupancy=1, worker_warps=8), "shared memory"),  # mma.sync, 3 KB stack
    (Schedule(64, 64, occupancy=1), "would spill"),  # 4 warps: a 1 KB stack
    (Schedule(128, 64, occupancy=1, worker_warps=8), "register share"),
])
def test_schedules_that_spill_at_d512_are_rejected(schedule, words):
    assert words in rejection(schedule, 512)


@pytest.mark.parametrize("d", range(8, 257, 8))
def test_the_shared_memory_rule_rejects_nothing_up_to_256(d):
    _, rejected = candidates(d, worker_warps=(None, 8))
    assert not [r for r in rejected if "shared memory" in r]


def test_the_combine_halves_its_row_tile_past_256():
    pytest.importorskip("cuda.tile", reason="the plan module reads the kernels (cuTile)")
    from tiledattention.kernel.plan import combine_constants

    assert combine_constants(256, 64, True)["TILE_R"] == 32
    assert combine_constants(512, 64, True)["TILE_R"] == 16
    assert combine_constants(512, 4, True)["TILE_R"] == 4


@pytest.mark.parametrize("d", [200, 264, 320, 384, 448, 512, 576])
def test_the_combine_row_tile_is_a_power_of_two_at_every_head_dim(d):
    # cuTile tiles are powers of two: D = 384 once gave 21 rows (tileiras refused it).
    pytest.importorskip("cuda.tile", reason="the plan module reads the kernels (cuTile)")
    from tiledattention.kernel.plan import combine_constants

    for rows in (1, 3, 64, 1000):
        r = combine_constants(d, rows, True)["TILE_R"]
        assert r & (r - 1) == 0 and r * max(d, 256) <= 32 * 256


def test_the_dropin_falls_back_for_a_wide_backward_only():
    from tiledattention.integrations.dropin import fallback_reason

    q = t(1, 2, 16, 512, grad=True)
    assert fallback_reason(q, q, q, None, 0.0, False)[0] == "head dim > 256 backward"
    with torch.no_grad():
        assert fallback_reason(q, q, q, None, 0.0, False)[0] == "device cpu"
    wide = t(1, 2, 16, 584)
    assert fallback_reason(wide, wide, wide, None, 0.0, False)[0] == "head dim 584"


@pytest.mark.parametrize("hk", [1, 2])
def test_mla_decode_plans_packed_split_partials_of_512(hk):
    pytest.importorskip("cuda.tile", reason="plans read the kernels' parameters (cuTile)")
    from tiledattention.kernel.plan import make_plan
    from tiledattention.kernel.validate import Problem

    p = Problem(2, 16, hk, 1, 4096, 576, False, 0.1, 512)
    plan = make_plan(p, torch.bfloat16, torch.device("cpu"), default_schedule(576, False),
                     True, copy_qkv=False, mask=None, sm_count=132, q_viewable=True,
                     build_kernels=False)
    assert plan.out_shape == (2, 16, 1, 512)
    assert plan.packed_shape == (2, hk, 16 // hk, 576)
    assert plan.part_shape[3] == 512 and plan.splits_per_head > 1
    assert plan.variant.schedule.worker_warps == 8
