"""The launch-plan cache: a repeat call reuses its plan, any changed fact builds a new one,
and bad inputs still get their typed errors. CPU only: plan building is replaced by a
recorder, or the plan is seeded and the launch replaced."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention import api
from tiledattention.kernel import plan as planning
from tiledattention.schedules.schedule import Schedule
from tiledattention.schedules.table import Bucket, Entry, ScheduleTable


def qkv(dtype=torch.float16, device="cpu", b=1, h=2, s=16, d=64):
    return tuple(torch.zeros(b, h, s, d, dtype=dtype, device=device) for _ in range(3))


@pytest.fixture
def builds(monkeypatch):
    """Every plan build, recorded; the cache starts empty."""
    planning.clear()
    seen = []

    def build(*args):
        seen.append(args)
        return object()

    monkeypatch.setattr(planning, "build_plan", build)
    yield seen
    planning.clear()


def plan(q, k, v, mask=None, causal=False, scale=None, gqa=False, lse=False, schedule=None):
    return planning.plan_for(q, k, v, mask, causal, scale, gqa, lse, schedule)


def test_a_repeat_call_reuses_its_plan_without_building(builds):
    q, k, v = qkv()
    first = plan(q, k, v)
    assert plan(q, k, v) is first
    assert plan(*qkv()) is first  # other tensors, same facts
    assert len(builds) == 1


def test_a_changed_stride_builds_a_new_plan(builds):
    q, k, v = qkv()
    first = plan(q, k, v)
    q_t = torch.zeros(1, 16, 2, 64, dtype=torch.float16).transpose(1, 2)  # same shape
    assert q_t.shape == q.shape and q_t.stride() != q.stride()
    assert plan(q_t, k, v) is not first
    assert len(builds) == 2


def test_a_changed_dtype_builds_a_new_plan(builds):
    first = plan(*qkv())
    assert plan(*qkv(dtype=torch.bfloat16)) is not first


def test_a_changed_device_builds_a_new_plan(builds):
    first = plan(*qkv())
    assert plan(*qkv(device="meta")) is not first
    q, k, v = qkv()
    assert plan(q, k, qkv(device="meta")[2]) is not first  # one tensor moved


def test_a_changed_shape_or_mask_layout_builds_a_new_plan(builds):
    q, k, v = qkv()
    plans = {plan(q, k, v), plan(*qkv(s=32)),
             plan(q, k, v, mask=torch.ones(1, 1, 1, 16, dtype=torch.bool)),
             plan(q, k, v, mask=torch.ones(1, 2, 16, 16, dtype=torch.bool)),
             plan(q, k, v, mask=torch.zeros(1, 2, 16, 16, dtype=torch.float16)),
             plan(q, k, v, mask=torch.ones(1, 1, 1, 16, dtype=torch.bool).expand(1, 2, 16, 16))}
    assert len(plans) == len(builds) == 6


def test_a_changed_schedule_or_flag_builds_a_new_plan(builds):
    q, k, v = qkv()
    plans = {plan(q, k, v), plan(q, k, v, schedule=Schedule(64, 64)),
             plan(q, k, v, schedule=Schedule(64, 128)), plan(q, k, v, causal=True),
             plan(q, k, v, lse=True), plan(q, k, v, scale=0.5), plan(q, k, v, gqa=True),
             plan(q, k, v, schedule=Schedule(64, 64, pdl=True))}
    assert len(plans) == len(builds) == 8
    assert plan(q, k, v, schedule=Schedule(64, 64)) in plans  # equal schedule, same plan
    as_dict = plan(q, k, v, schedule={"tile_m": 64, "tile_n": 64})
    assert plan(q, k, v, schedule={"tile_n": 64, "tile_m": 64}) is as_dict
    assert plan(q, k, v, schedule={"tile_m": 64, "tile_n": 128}) is not as_dict
    assert planning.call_key(q, k, v, None, False, None, False, False, {"x": [1]}) is None


def test_a_swapped_schedule_table_builds_a_new_plan(builds, tmp_path):
    q, k, v = qkv()
    first = plan(q, k, v)
    table = ScheduleTable()
    table.add(Entry(Bucket("9.0", "float16", 64, False, 256), Schedule(128, 64), 100.0))
    table.save(str(tmp_path / "mine.json"))
    try:
        ta.set_schedule_table(str(tmp_path / "mine.json"))
        second = plan(q, k, v)
        assert second is not first
        assert plan(q, k, v) is second
        ta.set_schedule_table(None)
        assert plan(q, k, v) not in (first, second)
    finally:
        ta.set_schedule_table(None)


def test_equal_but_differently_typed_flags_never_share_a_plan(builds):
    q, k, v = qkv()
    assert plan(q, k, v, causal=True) is not plan(q, k, v, causal=1)
    assert plan(q, k, v, scale=1.0) is not plan(q, k, v, scale=True)


def test_grad_masks_and_odd_tensors_are_never_cached_but_grad_inputs_are(builds):
    q, k, v = qkv()
    assert planning.call_key(q, k, v, torch.ones(16, requires_grad=True), False, None, False,
                             False, None) is None
    assert planning.call_key(q, k, v, [[True]], False, None, False, False, None) is None
    # q, k, v that require grad launch the same forward (the backward is separate).
    assert planning.call_key(q.clone().requires_grad_(), k, v, None, False, None, False,
                             False, None) == planning.call_key(q, k, v, None, False, None,
                                                               False, False, None)
    plan(q.clone().requires_grad_(), k, v)
    plan(q.clone().requires_grad_(), k, v)
    assert len(builds) == 1


def test_the_cache_is_bounded(builds, monkeypatch):
    monkeypatch.setattr(planning, "MAX_PLANS", 3)
    for s in range(1, 6):
        plan(*qkv(s=s))
    assert len(planning._plans) <= 3


@pytest.fixture
def seeded(monkeypatch):
    """A cached plan for qkv() and a launch that records instead of running."""
    planning.clear()
    q, k, v = qkv()
    key = planning.call_key(q, k, v, None, False, None, False, False, None)
    planning._plans[key] = sentinel = object()
    launches = []

    def fake_launch(p, q, k, v, mask, fresh_lse=True, aux=()):
        launches.append(p)
        return torch.empty(q.shape, dtype=q.dtype), torch.empty(1, 1, 1)

    monkeypatch.setattr(api, "launch", fake_launch)
    monkeypatch.setattr(api, "_plain_eager", lambda q: type(q) is torch.Tensor)
    yield sentinel, launches
    planning.clear()


def test_sdpa_launches_a_cached_plan_with_fresh_outputs(seeded):
    sentinel, launches = seeded
    a, b = ta.sdpa(*qkv()), ta.sdpa(*qkv())
    assert launches == [sentinel, sentinel]
    assert a.data_ptr() != b.data_ptr()


@pytest.mark.parametrize("kwargs,error,words", [
    ({"causal": 1}, ta.InputError, "causal must be a bool"),
    ({"scale": True}, ta.InputError, "scale"),
    ({"scale": float("nan")}, ta.InputError, "scale"),
    ({"attn_mask": torch.zeros(2, 1, 1, 16, dtype=torch.bool)}, ta.MaskError, "axis B"),
])
def test_bad_inputs_next_to_a_cached_plan_still_get_typed_errors(seeded, kwargs, error, words):
    with pytest.raises(error, match=words):
        ta.sdpa(*qkv(), **kwargs)
    assert seeded[1] == []


def test_grad_requiring_masks_next_to_a_cached_plan_are_refused(seeded):
    q, k, v = qkv()
    mask = torch.zeros(1, 1, 1, 16, requires_grad=True)
    with pytest.raises(ta.BackwardNotSupportedError, match="attn_mask requires grad"):
        ta.sdpa(q, k, v, attn_mask=mask)
    with pytest.raises(ta.ShapeError, match="head dims"):
        ta.sdpa(qkv()[0], qkv(d=32)[1], qkv()[2])


def test_eager_calls_skip_the_op_but_tracers_and_modes_do_not():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q = torch.zeros(1)
    assert api._plain_eager(q)
    with Passthrough():
        assert not api._plain_eager(q)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        assert not api._plain_eager(mode.from_tensor(q))
    assert not api._plain_eager(torch.nn.Parameter(q))


def test_a_plan_holds_grid_and_arguments_placed_by_name():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention.kernel.validate import Problem

    problem = Problem(2, 8, 2, 100, 300, 96, True, 0.125)
    p = planning.make_plan(problem, torch.float16, torch.device("cpu"), Schedule(64, 128),
                           False, copy_qkv=False, mask=("float16", (True, False, False)),
                           build_kernels=False)
    assert p.launches[0].grid == (2, 8, 2)  # ceil(100 / 64) query tiles, heads, batch
    assert p.out_shape == (2, 8, 100, 96) and p.lse_shape == (1, 1, 1)
    assert p.launches[0].tail == (0.125 * planning.LOG2E, 8.0, 4,  # scale*log2e, 1/scale, GROUP
                      100, 1, 1,  # SEQ_Q, one split of one tile run (sm_count 0: no split-K)
                      64, 128, 2, 64, 32, 32,  # tiles, chunks of D=96 (64 + 32)
                      True, True, False,  # causal, heavy first, Skv % 128 != 0
                      True, True, False, False,  # key-padding mask: batch axis only
                      False,  # additive (not a bool mask's bytes)
                      False, 2, 4,  # no LSE, latency hints
                      False, False,  # no split-K, no GQA packing
                      False,  # no programmatic dependent launch (the plain kernel: no
                      # variant flags, and no block lists or captured tensors among its arrays)
                      2, 64, 32, 32)  # V's chunks: D=96 as Q/K's


def test_a_pdl_schedule_sets_the_kernel_flag_and_the_launch_flag_together():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention.kernel.spec import FWD
    from tiledattention.kernel.validate import Problem

    problem = Problem(1, 32, 32, 512, 512, 128, True, 0.125)
    p = planning.make_plan(problem, torch.float16, torch.device("cpu"),
                           Schedule(64, 128, 2, pdl=True), False, copy_qkv=False, mask=None,
                           build_kernels=False)
    # The kernel waits before its first load exactly when it is launched as a dependent.
    pdl_index = FWD.names()[len(FWD.tensors):].index("PDL")
    assert p.pdl and p.launches[0].tail[pdl_index] is True and p.variant.constants()["PDL"] is True
    split = _decode_plan(1, 32, 32, 1, 4096, schedule=Schedule(64, 64, 2, pdl=True))
    assert split.part_shape is not None and split.pdl  # the combine launches plainly


def test_the_op_carries_a_schedule_as_one_label_and_a_variant_as_its_key():
    schema = str(api._attention_fwd._schema)
    assert schema.endswith("str schedule, str variant) -> (Tensor, Tensor)")
    label = Schedule(64, 128, 2, worker_warps=8, pdl=True).label()
    assert Schedule.from_label(label) == Schedule(64, 128, 2, worker_warps=8, pdl=True)


def _decode_plan(b, hq, hkv, sq, skv, *, causal=False, schedule=None, mask=None, sms=132,
                 viewable=True):
    from tiledattention.kernel.validate import Problem

    schedule = schedule or Schedule(64, 64, 2)
    problem = Problem(b, hq, hkv, sq, skv, 128, causal, 0.125)
    return planning.make_plan(problem, torch.bfloat16, torch.device("cpu"), schedule, False,
                              copy_qkv=False, mask=mask, build_kernels=False, sm_count=sms,
                              q_viewable=viewable)


def test_a_grid_under_half_a_wave_splits_the_keys_to_about_two_programs_per_sm():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    p = _decode_plan(4, 8, 8, 1, 4096)  # 32 programs on 132 SMs, 64 key tiles
    # ceil(64/9)=8 tiles per split
    assert p.splits_per_head == 8 and p.launches[0].grid == (1, 64, 4)
    assert p.part_shape == (4, 64, 1, 128) and p.launches[1].grid == (1, 8, 4)
    # SEQ_Q, NUM_SPLITS, SPLIT_TILES
    assert p.variant.split_k and p.launches[0].tail[3:6] == (1, 8, 8)
    full = _decode_plan(64, 32, 32, 1, 4096)  # 2048 programs: no split
    assert full.part_shape is None and full.launches[0].grid == (1, 32, 64)
    short = _decode_plan(1, 8, 8, 1, 100)  # 2 key tiles: too few to split
    assert short.part_shape is None


def test_a_grid_of_few_programs_splits_the_keys_to_about_one_program_per_sm():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    # B1 GQA decode packs 4 query heads per KV head: 8 programs; 128 key tiles of 64.
    p = _decode_plan(1, 32, 8, 1, 8192)
    assert p.packed_shape is not None
    # ceil(132/8)=17 -> 8 tiles each
    assert p.splits_per_head == 16 and p.launches[0].grid == (1, 128, 1)
    assert _decode_plan(2, 32, 8, 1, 8192).splits_per_head == 9  # 16 programs: ceil(132/16)
    assert _decode_plan(4, 32, 8, 1, 8192).splits_per_head == 9  # 32: two per SM, ceil(264/32)


def test_splits_follow_the_schedule_and_never_leave_a_split_without_keys():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    assert _decode_plan(4, 8, 8, 1, 4096, schedule=Schedule(64, 64, 2, splits=1)
                        ).part_shape is None
    p = _decode_plan(64, 32, 32, 1, 4096, schedule=Schedule(64, 64, 2, splits=3))
    assert p.splits_per_head == 3
    p = _decode_plan(1, 8, 8, 1, 300, schedule=Schedule(64, 64, 2, splits=64))
    assert p.splits_per_head == 5  # 5 key tiles
    # Causal top-left: query 0 of a decode step sees key 0 only, nothing to split.
    assert _decode_plan(1, 8, 8, 1, 4096, causal=True).part_shape is None


def test_gqa_decode_packs_query_heads_into_the_rows_of_one_tile():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    p = _decode_plan(16, 32, 8, 1, 8192)
    assert p.packed_shape == (16, 8, 4, 128) and p.variant.packed
    assert p.launches[0].tail[2] == 1  # GROUP: the packed view is MHA over the K/V heads
    assert p.launches[0].grid[0] == 1 and p.launches[0].grid[1] % 8 == 0
    assert _decode_plan(2, 32, 8, 16, 1024).packed_shape == (2, 8, 64, 128)
    assert _decode_plan(2, 32, 8, 17, 1024).packed_shape is None  # past speculative lengths
    assert _decode_plan(2, 32, 8, 4, 1024, viewable=False).packed_shape is None
    assert _decode_plan(2, 8, 8, 1, 1024).packed_shape is None  # MHA
    kp = ("bfloat16", (True, False, False))  # key padding: shared by packed rows
    assert _decode_plan(2, 32, 8, 4, 1024, mask=kp).packed_shape is not None
    rows = ("bfloat16", (True, False, True))  # varies per query row
    assert _decode_plan(2, 32, 8, 4, 1024, mask=rows).packed_shape is None


@pytest.mark.parametrize("mask,want", [
    (torch.ones(2, 1, 1, 16, dtype=torch.bool), ("uint8", (True, False, False))),  # its bytes
    (torch.zeros(16, dtype=torch.float32), ("float32", (False, False, False))),
    (torch.ones(1, 1, 1, 16, dtype=torch.bool).expand(2, 4, 16, 16),
     ("uint8", (False, False, False))),  # expanded axes are broadcasts
    (torch.ones(1, 1, 16, 1, dtype=torch.bool).expand(2, 4, 16, 16),
     ("uint8", (False, False, True))),
    (torch.zeros(2, 4, 16, 16, dtype=torch.float16), ("float16", (True, True, True))),
])
def test_mask_layout_follows_from_shape_strides_and_dtype(mask, want):
    from tiledattention.kernel.mask import mask_layout

    assert mask_layout(mask, (2, 4, 16, 16)) == want


@pytest.mark.parametrize("mask", [
    torch.ones(1, 1, 16, 16, dtype=torch.bool).tril(),
    torch.ones(2, 1, 1, 16, dtype=torch.bool).expand(2, 4, 16, 16),  # a broadcast in disguise
])
def test_a_bool_mask_reaches_the_kernels_as_its_own_bytes(mask):
    from tiledattention.kernel.mask import prepare_mask

    bytes_ = prepare_mask(mask, (2, 4, 16, 16))
    assert bytes_.dtype == torch.uint8 and bytes_.data_ptr() == mask.data_ptr()  # no copy
    assert torch.equal(bytes_.bool().expand(2, 4, 16, 16), mask.expand(2, 4, 16, 16))


@pytest.mark.parametrize("variant", [False, True])
def test_backward_plans_place_every_kernels_arguments_by_name(variant):
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention import mods as M
    from tiledattention import variants
    from tiledattention.schedules.backward import BwdSchedule

    q = torch.randn(2, 4, 100, 96, dtype=torch.float16)
    k = torch.randn(2, 2, 130, 96, dtype=torch.float16)
    mods = M.mods_for(variants.softcap(5.0), None) if variant else M.NONE
    plan = planning.make_bwd_plan(q, k, None, True, 0.125, False, BwdSchedule(), mods)
    names = [(role, kernel._pyfunc.__name__) for role, kernel, _, _ in plan.launches]
    suffix = "_variant" if variant else ""
    # dQ computes delta, so it runs before dK/dV, which reads it: two launches.
    assert names == [("dq", f"attention_bwd_dq{suffix}"), ("dkdv", f"attention_bwd_dkdv{suffix}")]
    assert plan.launches[1][2] == (3, 2, 2)  # key tiles of 64, K/V heads, batch


def test_a_causal_backward_above_d128_keeps_the_delta_kernel_before_dq_and_dkdv():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention.schedules.backward import BwdSchedule

    q = torch.randn(1, 2, 100, 160, dtype=torch.bfloat16)
    plan = planning.make_bwd_plan(q, q, None, True, 0.125, False, BwdSchedule())
    assert [role for role, _, _, _ in plan.launches] == ["delta", "dq", "dkdv"]
    assert not plan.variant.constants("attention_bwd_dq")["DELTA"]
    full = planning.make_bwd_plan(q, q, None, False, 0.125, False, BwdSchedule())
    assert [role for role, _, _, _ in full.launches] == ["dq", "dkdv"]


@pytest.mark.parametrize("d,hk,loop_free", [
    (64, 4, False), (96, 4, False), (128, 4, True), (160, 4, True), (192, 4, True),
    # D 256: without the loop tileiras waits on every MMA there (benchmarks/notes/backward.md §37a)
    (256, 4, False),
    (128, 2, False),  # GQA: the program loops over its group
])
def test_mha_dkdv_drops_the_group_loop_only_at_the_head_dims_measured_faster(d, hk, loop_free):
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention.schedules.backward import BwdSchedule

    q = torch.randn(1, 4, 64, d, dtype=torch.bfloat16)
    k = torch.randn(1, hk, 64, d, dtype=torch.bfloat16)
    plan = planning.make_bwd_plan(q, k, None, True, 0.125, False, BwdSchedule())
    assert plan.variant.constants("attention_bwd_dkdv")["ONE_HEAD"] is loop_free


def test_a_backward_reducing_dq_inside_dkdv_runs_the_delta_kernel_first():
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention.schedules.backward import BwdSchedule

    q = torch.randn(1, 2, 100, 128, dtype=torch.float16)
    plan = planning.make_bwd_plan(q, q, None, False, 0.125, False, BwdSchedule(dq="atomic"))
    assert [(role, kernel._pyfunc.__name__) for role, kernel, _, _ in plan.launches] == [
        ("delta", "attention_bwd_delta"), ("dkdv", "attention_bwd_dkdv")]
