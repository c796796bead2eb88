"""The packed grid's tile order and sizes, on the host (no GPU): every (sequence, tile)
once, deepest tiles first, the grid bound never short, and the checks of a packed or
paged call (typed errors before anything runs, CPU tensors)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel.visit import host_sequence_order
from tiledattention.kernel.workload import _paged_tiles, map_steps, programs


@pytest.fixture(autouse=True)
def _cpu_plans_are_an_sm90s(monkeypatch):
    """A plan built here on a CPU device is planned for an sm_90 of 132 SMs (a CPU has no
    capability to read); a CUDA device keeps its own."""
    from tiledattention.kernel import workload as W

    real = W.device_target
    monkeypatch.setattr(W, "device_target", lambda device: W.Target("9.0", 132) if (
        device is not None and device.type == "cpu") else real(device))


@pytest.mark.parametrize("lens", [[300, 1, 0, 129, 64, 700], [5], [0, 0], [4096, 17, 17, 2]])
@pytest.mark.parametrize("tile", [64, 128])
def test_every_tile_of_every_sequence_runs_once_deepest_first(lens, tile):
    order = host_sequence_order(lens, tile)
    want = {(b, m) for b, n in enumerate(lens) for m in range(math.ceil(n / tile))}
    assert sorted(order) == sorted(want) and len(order) == len(want)
    levels = [m for _, m in order]
    assert levels == sorted(levels, reverse=True)


def test_causal_dkdv_starts_with_each_long_sequences_first_key_tiles():
    # a key tile's causal dK/dV work falls with its position: its first tiles go first
    order = host_sequence_order([700, 64, 300], 64, first_heavy=True)
    assert order[0] == (0, 0) and order[-1] in {(0, 10), (1, 0), (2, 4)}
    assert sorted(order) == sorted(host_sequence_order([700, 64, 300], 64))


def test_the_heavy_map_runs_the_sequences_with_the_most_keys_first_each_deepest_first():
    # full attention: a query tile's work is its sequence's keys, whatever its depth, so
    # the longest sequence's first tile must not wait for the end of the grid (§48a)
    lens, keys = [300, 1, 0, 129, 64, 700], [300, 1, 0, 129, 900, 700]
    order = host_sequence_order(lens, 64, weights=keys)
    assert sorted(order) == sorted(host_sequence_order(lens, 64))
    assert [b for b, _ in order] == [4] + [5] * 11 + [0] * 5 + [3] * 3 + [1]
    assert [m for b, m in order if b == 5] == list(range(10, -1, -1))
    # equal weights keep the sequences' order
    assert [b for b, _ in host_sequence_order([64, 64], 64, weights=[5, 5])] == [0, 1]


@pytest.mark.parametrize("bpad, heavy", [(16, True), (64, True), (128, False)])
def test_the_heavy_map_ranks_only_few_enough_sequences(bpad, heavy):
    # a [BPAD, BPAD] ranking per program is kept small; off when not asked for
    from tiledattention.kernel import workload as W

    assert W.heavy_map(bpad, True) is heavy
    assert W.heavy_map(bpad, False) is False


def test_a_grid_in_blocks_of_heads_puts_every_head_on_one_axis():
    from tiledattention.kernel.workload import packed_grid, with_block

    assert packed_grid(10, 16, 4) == (160, 1, 1)
    assert packed_grid(10, 16, 0) == (10, 16, 1)
    assert with_block((1, 2, 3), 1, 8) == (1, 8, 3)


def test_a_plans_tail_per_block_is_built_once_and_holds_the_block():
    # the per-call path looks a block's arguments up, it does not rebuild them
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention.kernel.spec import DKDV_SEQS, DQ_SEQS
    from tiledattention.kernel.workload import block_at, block_tail

    tails, tail = {}, tuple(range(len(DQ_SEQS.names()) - len(DQ_SEQS.tensors)))
    first = block_tail(tails, tail, DQ_SEQS, 4)
    assert block_tail(tails, tail, DQ_SEQS, 4) is first
    assert first[block_at(DQ_SEQS)] == 4 and len(first) == len(tail)
    assert block_tail(tails, tail, DKDV_SEQS, 4) is not first


@pytest.mark.parametrize("hq, hk, mb, block", [
    (16, 16, 4, 8), (16, 16, 8, 4), (16, 16, 16, 2), (16, 16, 33, 0), (16, 16, 1, 16),
    (16, 4, 8, 16), (16, 4, 16, 8), (16, 4, 33, 0), (12, 12, 1, 4), (32, 8, 64, 0),
    (15, 15, 1, 0)])
def test_a_block_of_heads_holds_as_many_as_keep_their_keys_and_values_within_the_l2_budget(
        hq, hk, mb, block):
    # §48a: every head in one block lost where all heads' K/V did not fit L2 (64k tokens,
    # D 128: 33 MB a head); blocks are powers of two dividing the query heads, a GQA
    # group's query heads sharing one K/V head; no block of two fits: the two-axis grid
    from tiledattention.kernel.workload import kv_block, varlen_head_block

    assert varlen_head_block(hq, hk, mb << 20) == block
    assert kv_block(8, 4, 4) == 2 and kv_block(2, 4, 4) == 1 and kv_block(0, 4, 4) == 0


@pytest.mark.parametrize("lens", [[1] * 50, [8191, 1], [64] * 3, [65, 63, 1, 0]])
def test_the_grid_bound_covers_every_tile_and_the_bisection_every_level(lens):
    tile = 64
    total = sum(lens)
    assert programs(total, len(lens), tile) >= len(host_sequence_order(lens, tile))
    assert 2 ** map_steps(total, tile) > max(math.ceil(n / tile) for n in lens)


def _packed(lens, h=2, d=64, dtype=torch.bfloat16):
    return torch.zeros(sum(lens), h, d, dtype=dtype)


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("cu, match", [
    ([0, 5, 3], "non-decreasing"), ([1, 5, 8], "must be 0"), ([0, 5, 99], "past the"),
])
def test_bad_offsets_get_one_typed_error(cu, match):
    q = _packed([5, 3])
    cu = torch.tensor(cu, dtype=torch.int32)
    with pytest.raises(ta.InputError, match=match):
        ta.sdpa_varlen(q, q, q, cu, _cu([5, 3]), 5, 5)


def test_an_understated_max_seqlen_is_refused_on_cpu_offsets():
    q = _packed([5, 3])
    with pytest.raises(ta.InputError, match="longer than max_seqlen_q"):
        ta.sdpa_varlen(q, q, q, _cu([5, 3]), _cu([5, 3]), 4, 5)


@pytest.mark.parametrize("kw, err", [
    (dict(window_size=(1,)), ta.InputError), (dict(softcap=-1.0), ta.InputError),
    (dict(scale=0.0), ta.InputError), (dict(causal=1), ta.InputError),
])
def test_bad_options_get_one_typed_error(kw, err):
    q = _packed([5])
    with pytest.raises(err):
        ta.sdpa_varlen(q, q, q, _cu([5]), _cu([5]), 5, 5, **kw)


def test_offsets_of_another_dtype_or_a_nested_tensor_are_refused():
    q = _packed([5])
    with pytest.raises(ta.DTypeError, match="int32"):
        ta.sdpa_varlen(q, q, q, _cu([5]).long(), _cu([5]), 5, 5)
    nested = torch.nested.nested_tensor([torch.zeros(3, 2, 64), torch.zeros(2, 2, 64)])
    with pytest.raises(ta.InputError, match="dense"):
        ta.sdpa_varlen(nested, q, q, _cu([5]), _cu([5]), 5, 5)


def test_paged_checks_pages_context_and_layout():
    kc = torch.zeros(4, 16, 1, 64, dtype=torch.bfloat16)
    q = torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16)
    table = torch.tensor([[0, 7]], dtype=torch.int32)
    with pytest.raises(ta.InputError, match="outside the cache"):
        ta.sdpa_paged(q, kc, kc, table, torch.tensor([20], dtype=torch.int32))
    with pytest.raises(ta.InputError, match="holds 0..32"):
        ta.sdpa_paged(q, kc, kc, table, torch.tensor([40], dtype=torch.int32))
    with pytest.raises(ta.ShapeError, match="page_size"):
        bad = torch.zeros(4, 24, 1, 64, dtype=torch.bfloat16)
        ta.sdpa_paged(q, bad, bad, table, torch.tensor([20], dtype=torch.int32))
    with pytest.raises(ta.BackwardNotSupportedError):
        ta.sdpa_paged(q.requires_grad_(), kc, kc, table, torch.tensor([20], dtype=torch.int32))


def test_valid_cpu_calls_pass_the_checks_and_then_need_a_gpu():
    q = _packed([5, 3])
    with pytest.raises(ta.NoGPUError):
        ta.sdpa_varlen(q, q, q, _cu([5, 3]), _cu([5, 3]), 5, 5, causal=True)


@pytest.mark.parametrize("tile_n, page, expect", [
    (128, 256, (128, 2, 1)), (128, 128, (128, 1, 1)), (128, 64, (128, 1, 2)),
    (64, 64, (64, 1, 1)), (128, 32, (128, 1, 4)), (128, 16, (128, 1, 8)), (64, 16, (64, 1, 4)),
    (64, 32, (64, 1, 2)),
])
def test_key_tiles_lie_in_one_page_or_span_up_to_eight_whole_pages(tile_n, page, expect,
                                                                    monkeypatch):
    # the per-page TMA path (PAGE_GATHER_BELOW = 0): every page size takes it
    from dataclasses import replace

    from tiledattention.kernel import workload as W
    from tiledattention.schedules.schedule import default_schedule
    monkeypatch.setattr(W, "PAGE_GATHER_BELOW", 0)
    s, tiles, span, gather = _paged_tiles(replace(default_schedule(128, True), tile_n=tile_n),
                                          page, 1)
    assert (s.tile_n, tiles, span, gather) == (*expect, False)
    assert s.tile_n == span * page if span > 1 else page % s.tile_n == 0


@pytest.mark.parametrize("tile_n", [64, 128])
@pytest.mark.parametrize("page, span, below", [(16, 8, None), (16, 8, 64), (32, 4, 64)])
def test_pages_below_the_threshold_are_gathered_into_128_key_tiles(tile_n, page, span, below,
                                                                   monkeypatch):
    # page 16 by default; page 32 too where the threshold is raised (the GPU tests run both)
    from dataclasses import replace

    from tiledattention.kernel import workload as W
    from tiledattention.schedules.schedule import default_schedule
    if below is not None:
        monkeypatch.setattr(W, "PAGE_GATHER_BELOW", below)
    s, tiles, got_span, gather = _paged_tiles(
        replace(default_schedule(128, True), tile_n=tile_n), page, 1)
    assert gather and (s.tile_n, tiles, got_span) == (128, 1, span)


@pytest.mark.parametrize("seq_q, gathers", [(1, True), (16, True), (17, False), (512, False)])
def test_only_decode_gathers_small_pages_chunked_prefill_keeps_tma(seq_q, gathers):
    # chunked prefill re-reads each K/V tile per query tile: TMA won 1.26-1.63x (§42c)
    from tiledattention.schedules.schedule import default_schedule
    s, _, span, gather = _paged_tiles(default_schedule(128, True), 16, seq_q)
    assert gather is gathers
    assert span == 8 if gathers else s.tile_n == 16 * span


@pytest.mark.parametrize("tile_n", [64, 128])
@pytest.mark.parametrize("page", [32, 64, 128, 256])
def test_pages_of_32_keys_or_more_keep_their_tma_loads(tile_n, page):
    from dataclasses import replace

    from tiledattention.schedules.schedule import default_schedule
    s = replace(default_schedule(128, True), tile_n=tile_n)
    assert _paged_tiles(s, page, 1)[3] is False


def test_the_paged_forward_passes_page_gather_to_its_kernel_by_name():
    # the flag reaches the kernel's constant of that name (not a position), on and off
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods
    from tiledattention.kernel.spec import FWD_SEQS
    from tiledattention.kernel.workload import _fwd_tail
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import default_schedule

    w = Workload(2, 32, 8, 128, torch.bfloat16, 1, 4096, True, 128 ** -0.5, (-1, -1), 0.0,
                 page_size=16, packed_q=False)
    names = FWD_SEQS.names()[len(FWD_SEQS.tensors):]
    for page, want in ((16, True), (64, False)):
        s, tiles, span, gather = _paged_tiles(default_schedule(128, True), page, 1)
        tail = _fwd_tail(w, s, mods.NONE, return_lse=False, varlen_q=False, varlen_k=False,
                         paged=True, page_tiles=tiles, page_span=span, page_gather=gather,
                         group=4)
        assert tail[names.index("PAGE_GATHER")] is want


@pytest.mark.parametrize("d, hk", [(64, 16), (128, 4), (256, 16)])
def test_the_packed_backward_plan_names_every_kernel_argument(d, hk, monkeypatch):
    # Built on the host as a call builds it: a constant a kernel gained (delta's WQ) and
    # the packed plan does not pass raises TypeError here, not first on a GPU. Both
    # settings of PACKED_DQ_DELTA (§43b: no delta launch where dQ computes it).
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import Workload

    w = Workload(4, 16, hk, d, torch.bfloat16, 1024, 1024, True, d ** -0.5, (-1, -1), 0.0)
    for folded in (False, True):
        monkeypatch.setattr(W, "PACKED_DQ_DELTA", folded)
        for has_dlse in (False, True):
            plan = W.varlen_bwd_plan(w, torch.device("cpu"), mods.NONE, has_dlse)
            assert [s.role for s in plan.launches] == (
                ["dq", "dkdv"] if folded else ["delta", "dq", "dkdv"])


def test_the_packed_backward_passes_whole_loads_by_name_and_keys_its_plan_on_it(monkeypatch):
    # §42a's and §51f's switches reach both score kernels' WHOLE_LOADS and SCATTER_OUT
    # constants, and the cached plan follows them (an A/B flips one in one process)
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods, varlen
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import DKDV_SEQS, DQ_SEQS
    from tiledattention.kernel.workload_check import Workload

    w = Workload(4, 16, 4, 128, torch.bfloat16, 1024, 1024, True, 128 ** -0.5, (-1, -1), 0.0)
    plans = {}
    for whole, scatter in ((False, False), (True, False), (True, True), (False, True)):
        monkeypatch.setattr(W, "PACKED_BWD_WHOLE", whole)
        monkeypatch.setattr(W, "PACKED_BWD_SCATTER_OUT", scatter)  # §51f
        plans[whole, scatter] = varlen._bwd_plan(w, torch.device("cpu"), mods.NONE, False)
        steps = {s.role: s for s in plans[whole, scatter].launches}
        for role, spec in (("dq", DQ_SEQS), ("dkdv", DKDV_SEQS)):
            names = spec.names()[len(spec.tensors):]
            assert steps[role].tail[names.index("WHOLE_LOADS")] is whole
            assert steps[role].tail[names.index("SCATTER_OUT")] is scatter
    assert len({id(p) for p in plans.values()}) == 4


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("switch", ["VARLEN_BWD_HEAD_BLOCKS", "VARLEN_HEAVY_MAP"])
def test_the_packed_backward_follows_the_order_switches_and_keys_its_plan_on_them(
        causal, switch, monkeypatch):
    # §48a's switches reach the backward plan (blocks of heads picked per call; a heavy
    # map under full attention only), both score kernels take HEAD_BLOCK by name, and
    # the cached plan keys on the switches
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods, varlen
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import DKDV_SEQS, DQ_SEQS
    from tiledattention.kernel.workload_check import Workload

    w = Workload(4, 16, 4, 128, torch.bfloat16, 1024, 1024, causal, 128 ** -0.5, (-1, -1),
                 0.0)
    plans = {}
    for on in (False, True):
        monkeypatch.setattr(W, switch, on)
        plans[on] = plan = varlen._bwd_plan(w, torch.device("cpu"), mods.NONE, False)
        steps = {s.role: s for s in plan.launches}
        for role, spec in (("dq", DQ_SEQS), ("dkdv", DKDV_SEQS)):
            assert steps[role].tail[W.block_at(spec)] == 0  # set per call
        assert plan.l2_blocks is W.VARLEN_BWD_HEAD_BLOCKS
        assert plan.heavy_map is (W.VARLEN_HEAVY_MAP and not causal)
    assert plans[False] is not plans[True]


@pytest.mark.parametrize("causal, d", [(True, 128), (False, 128), (True, 192), (True, 256)])
def test_only_the_causal_packed_dkdv_masks_its_key_tail_in_one_program(causal, d, monkeypatch):
    # §43a: the switch reaches the dK/dV kernel's TAIL_TILE constant for causal calls up to
    # D 192 only (non-causal measured no gain; D 256 spills more), and the cached plan
    # follows the switch
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods, varlen
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import DKDV_SEQS
    from tiledattention.kernel.workload_check import Workload

    w = Workload(4, 16, 16, d, torch.bfloat16, 1024, 1024, causal, d ** -0.5, (-1, -1), 0.0)
    names = DKDV_SEQS.names()[len(DKDV_SEQS.tensors):]
    plans = {}
    for on in (False, True):
        monkeypatch.setattr(W, "PACKED_BWD_TAIL_TILE", on)
        plans[on] = varlen._bwd_plan(w, torch.device("cpu"), mods.NONE, False)
        dkdv = {s.role: s for s in plans[on].launches}["dkdv"]
        assert dkdv.tail[names.index("TAIL_TILE")] is (on and causal and d <= 192)
    assert plans[False] is not plans[True]


@pytest.mark.parametrize("d, key_rows", [(64, False), (96, True), (128, True), (160, False),
                                         (192, False), (256, False)])
def test_the_packed_backward_swaps_keys_into_the_mma_rows_only_where_measured(d, key_rows,
                                                                             monkeypatch):
    # §43c: keys as the dK/dV MMA rows won 3-7 % at D 96 / 128 on packed documents and lost
    # at D 192 / 256; the switch off gives the default schedule back
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.backward import default_bwd_schedule

    for causal in (True, False):
        w = Workload(4, 16, 16, d, torch.bfloat16, 1024, 1024, causal, d ** -0.5, (-1, -1), 0.0)
        s = W.varlen_bwd_schedule(w, "9.0")
        assert s.key_rows is key_rows
        assert dataclasses.replace(s, key_rows=False) == default_bwd_schedule(d, causal)
        monkeypatch.setattr(W, "PACKED_BWD_KEY_ROWS", False)
        assert W.varlen_bwd_schedule(w, "9.0") == default_bwd_schedule(d, causal)
        monkeypatch.setattr(W, "PACKED_BWD_KEY_ROWS", True)
def test_a_pinned_backward_schedule_reaches_the_packed_plan_and_a_reduce_add_one_is_refused():
    # benchmarks compare the packed backward's schedules in one process with the public pin
    # (benchmarks/packed_ab.py --schedules); the packed kernels have no reduce-add dQ
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods, varlen
    from tiledattention.errors import ScheduleError
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.backward import BwdSchedule

    w = Workload(4, 16, 16, 128, torch.bfloat16, 1024, 1024, False, 128 ** -0.5, (-1, -1), 0.0)
    pinned = BwdSchedule.from_label("kv64x128_q128x64_o1_w8_keyrows")
    with ta.pinned_bwd_schedule(pinned):
        assert varlen._bwd_plan(w, torch.device("cpu"), mods.NONE, False).schedule == pinned
    assert varlen._bwd_plan(w, torch.device("cpu"), mods.NONE,
                            False).schedule == W.varlen_bwd_schedule(w, "9.0")
    atomic = BwdSchedule.from_label("kv64x64_q64x64_o2_atomic")
    with ta.pinned_bwd_schedule(atomic), pytest.raises(ScheduleError, match="no reduce-add dQ"):
        varlen._bwd_plan(w, torch.device("cpu"), mods.NONE, False)


@pytest.mark.parametrize("has_dlse", [False, True])
def test_the_packed_dq_computes_delta_and_the_plan_drops_its_launch(has_dlse, monkeypatch):
    # §43b: PACKED_DQ_DELTA reaches the packed dQ's DELTA (and HAS_DLSE) constants, the
    # plan launches dQ then dK/dV (no delta step), and the cached plan follows the switch;
    # off, the three launches of before with DELTA and HAS_DLSE off in dQ
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods, varlen
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import DQ_SEQS
    from tiledattention.kernel.workload_check import Workload

    w = Workload(4, 16, 4, 128, torch.bfloat16, 1024, 1024, True, 128 ** -0.5, (-1, -1), 0.0)
    names = DQ_SEQS.names()[len(DQ_SEQS.tensors):]
    plans = {}
    for on in (False, True):
        monkeypatch.setattr(W, "PACKED_DQ_DELTA", on)
        plans[on] = varlen._bwd_plan(w, torch.device("cpu"), mods.NONE, has_dlse)
        roles = tuple(s.role for s in plans[on].launches)
        assert roles == (("dq", "dkdv") if on else ("delta", "dq", "dkdv"))
        dq = {s.role: s for s in plans[on].launches}["dq"]
        assert dq.tail[names.index("DELTA")] is on
        assert dq.tail[names.index("HAS_DLSE")] is (on and has_dlse)
    assert plans[False] is not plans[True]


@pytest.mark.parametrize("page, seq_q, joined", [
    (16, 512, True),  # chunked prefill at page 16: 16-key MMAs joined into the tile's
    (16, 1, False),   # decode at page 16 gathers its rows instead
    (32, 512, False), (64, 512, False),  # wide enough per page: the join's copy loses (§49a)
])
@pytest.mark.parametrize("gathered", [False, True])
def test_chunked_prefill_joins_only_small_pages_keys_into_one_operand(page, seq_q, joined,
                                                                       gathered, monkeypatch):
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods

    # ... by per-page TMA loads joined with a copy (§49a), or K's rows gathered by cp.async
    # (§50b: PAGE_KEYS_GATHERED)
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import FWD_SEQS
    from tiledattention.kernel.workload import _fwd_tail
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import default_schedule
    monkeypatch.setattr(W, "PAGE_KEYS_GATHERED", gathered)
    w = Workload(2, 32, 8, 128, torch.bfloat16, seq_q, 4096, True, 128 ** -0.5, (-1, -1),
                 0.0, page_size=page, packed_q=seq_q > 1)
    names = FWD_SEQS.names()[len(FWD_SEQS.tensors):]
    s, tiles, span, gather = _paged_tiles(default_schedule(128, True), page, seq_q)
    tail = _fwd_tail(w, s, mods.NONE, return_lse=False, varlen_q=seq_q > 1, varlen_k=False,
                     paged=True, page_tiles=tiles, page_span=span, page_gather=gather,
                     group=4)
    assert tail[names.index("PAGE_JOIN")] is (joined and not gathered)
    assert tail[names.index("PAGE_GATHER_K")] is (joined and gathered)


@pytest.mark.parametrize("split, skip, want", [
    (16, True, True),   # split-K over a ragged batch: the splits past a context skip
    (16, False, False),  # the switch off: every split loads q and writes its partial
    (1, True, False),   # one split: nothing to skip, no combine
])
def test_a_paged_decodes_empty_key_splits_skip_their_loads_only_under_split_k(
        split, skip, want, monkeypatch):
    pytest.importorskip("cuda.tile", reason="the kernel's parameter names come from cuTile")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import FWD_SEQS
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import default_schedule

    monkeypatch.setattr(W, "PAGED_SKIP_EMPTY", skip)
    w = Workload(64, 32, 8, 128, torch.bfloat16, 1, 32768, True, 128 ** -0.5, (-1, -1),
                 0.0, page_size=256, packed_q=False)
    names = FWD_SEQS.names()[len(FWD_SEQS.tensors):]
    s, tiles, span, gather = _paged_tiles(default_schedule(128, True), 256, 1)
    tail = W._fwd_tail(w, s, mods.NONE, return_lse=False, varlen_q=False, varlen_k=False,
                       paged=True, page_tiles=tiles, page_span=span, page_gather=gather,
                       split=split, split_tiles=8, packed=True, seq_q=1, group=1)
    assert tail[names.index("SPLIT_SKIP")] is want


def _plans_on_cpu(monkeypatch, table):
    """Let ``workload``'s plans build on the CPU (an sm_90 of 132 SMs: the module's
    fixture), with ``table`` the table's schedule where the caller pins none."""
    from tiledattention.kernel import workload as W

    monkeypatch.setattr(W, "_forward_schedule", lambda w, cc, sq, sk, schedule: (
        schedule or table))


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("page, occupancy", [(16, 1), (32, 1), (64, 2), (256, 2)])
def test_a_paged_decode_runs_four_worker_warps_and_occupancy_2_from_page_64_unless_pinned(
        pinned, page, occupancy, monkeypatch):
    # §50e: the table's pick (8 worker warps, one CTA an SM) drew half the bandwidth; §55b:
    # two CTAs an SM won at pages 64/256 and lost at page 16. A schedule the caller pins is
    # taken as given.
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import Schedule

    _plans_on_cpu(monkeypatch, Schedule(64, 128, occupancy=1, worker_warps=8))
    w = Workload(64, 32, 8, 128, torch.bfloat16, 1, 32768, True, 128 ** -0.5, (-1, -1),
                 0.0, page_size=page, packed_q=False)
    q = torch.empty(64, 1, 32, 128, dtype=torch.bfloat16)
    pin = Schedule(64, 128, occupancy=1, worker_warps=8) if pinned else None
    plan = W.paged_plan(w, q.device, pin, mods.NONE, False)
    assert (plan.schedule.worker_warps, plan.schedule.occupancy) == (
        (8, 1) if pinned else (4, occupancy))
    monkeypatch.setattr(W, "PAGED_DECODE_OCCUPANCY", 0)  # the A/B's off arm: the table's
    plan = W.paged_plan(w, q.device, pin, mods.NONE, False)
    assert plan.schedule.occupancy == 1


@pytest.mark.parametrize("page, pinned, label, want", [
    (16, False, "", "128x128_o1_c1_lk2_lv4_w8"),  # the table's, unless the switch is set
    (16, False, "64x128_o1_c1_lk2_lv4_w4", "64x128_o1_c1_lk2_lv4_w4"),
    (64, False, "64x128_o1_c1_lk2_lv4_w4", "128x128_o1_c1_lk2_lv4_w8"),  # no gather there
    (16, True, "64x128_o1_c1_lk2_lv4_w4", "128x128_o1_c1_lk2_lv4_w8"),  # pinned: as given
])
def test_a_gathered_chunked_prefill_takes_the_switchs_schedule_only_unpinned_below_the_join(
        page, pinned, label, want, monkeypatch):
    # §51b: the A/B of 4 worker warps (gathers pipelined) against the table's 8
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import Schedule

    table = Schedule.from_label("128x128_o1_c1_lk2_lv4_w8")
    _plans_on_cpu(monkeypatch, table)
    monkeypatch.setattr(W, "GATHERED_PREFILL_SCHEDULE", label)
    w = Workload(4, 32, 8, 128, torch.bfloat16, 512, 8192, True, 128 ** -0.5, (-1, -1), 0.0,
                 page_size=page, packed_q=True)
    q = torch.empty(2048, 32, 128, dtype=torch.bfloat16)
    plan = W.paged_plan(w, q.device, table if pinned else None, mods.NONE, False)
    assert dataclasses.replace(plan.schedule, splits=0, heavy_first=True).label() == want


@pytest.mark.parametrize("kind", ["varlen", "prefill", "decode"])
def test_the_packed_forward_passes_whole_loads_by_name_where_its_rows_are_packed(kind,
                                                                                monkeypatch):
    # §51d-§51e's switches reach the forward's WHOLE_LOADS and SCATTER_OUT constants where q
    # (or k, v) is packed: a packed forward and a chunked prefill, not a paged decode
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import FWD_SEQS
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import Schedule

    _plans_on_cpu(monkeypatch, Schedule.from_label("128x128_o1_c1_lk2_lv4_w8"))
    names = FWD_SEQS.names()[len(FWD_SEQS.tensors):]
    q = torch.empty(2048, 16, 128, dtype=torch.bfloat16)
    for whole, scatter in ((False, True), (True, False), (True, True)):
        monkeypatch.setattr(W, "PACKED_FWD_WHOLE", whole)
        monkeypatch.setattr(W, "PACKED_FWD_SCATTER_OUT", scatter)
        if kind == "varlen":
            w = Workload(4, 16, 16, 128, torch.bfloat16, 1024, 1024, True, 128 ** -0.5,
                         (-1, -1), 0.0)
            plan = W.varlen_plan(w, q.device, None, mods.NONE, False)
        else:
            w = Workload(4, 16, 4, 128, torch.bfloat16, 512 if kind == "prefill" else 1,
                         8192, True, 128 ** -0.5, (-1, -1), 0.0, page_size=64,
                         packed_q=kind == "prefill")
            plan = W.paged_plan(w, q.device, None, mods.NONE, False)
        tail = plan.launches[0].tail
        assert tail[names.index("WHOLE_LOADS")] is (whole and kind != "decode")
        # Out scattered only with whole loads (its origin) and packed query rows
        assert tail[names.index("SCATTER_OUT")] is (whole and scatter and kind != "decode")


@pytest.mark.parametrize("sq", [1, 3])
def test_a_gqa_decode_packs_its_query_heads_into_their_kv_heads_rows(sq, monkeypatch):
    # the kernel's [B, Hkv, G * Sq, D] rows: head-major within a group, then position; a
    # decode step (Sq 1) is one view of q, not a copy
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import Workload
    from tiledattention.schedules.schedule import Schedule

    _plans_on_cpu(monkeypatch, Schedule(64, 128, occupancy=1))
    b, hq, hk, d = 2, 32, 8, 128
    w = Workload(b, hq, hk, d, torch.bfloat16, sq, 4096, True, d ** -0.5, (-1, -1), 0.0,
                 page_size=64, packed_q=False)
    plan = W.paged_plan(w, torch.device("cpu"), None, mods.NONE, False)
    assert plan.packed_heads
    q = torch.randn(b, sq, hq, d)
    rows = W._paged_q(plan, q)
    g = hq // hk
    want = torch.stack([torch.stack([torch.cat([q[i, :, h * g + j] for j in range(g)])
                                     for h in range(hk)]) for i in range(b)])
    assert torch.equal(rows, want)
    assert (rows.data_ptr() == q.data_ptr() and rows._base is q) is (sq == 1)


def test_a_paged_plan_reads_its_cache_values_once_on_the_first_call_that_may_sync(
        monkeypatch):
    # built while a CUDA graph is captured (no sync allowed): read on the next eager call,
    # then never again for that plan; the hot path pays no lookup (nothing left unread)
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.schedules.schedule import Schedule

    _plans_on_cpu(monkeypatch, Schedule(64, 128, occupancy=1))
    monkeypatch.setattr(W, "check_device", lambda q: None)
    monkeypatch.setattr(W, "_unread", set())
    reads, may_sync = [], [False]
    monkeypatch.setattr(W, "checked_cache", lambda *a: reads.append(a))
    monkeypatch.setattr(W, "_checked_now", lambda t: may_sync[0])
    q = torch.empty(3, 1, 16, 64, dtype=torch.bfloat16)
    cache = torch.empty(12, 16, 4, 64, dtype=torch.bfloat16)
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    lens = torch.tensor([5, 64, 17], dtype=torch.int32)

    def call():
        return W.paged_setup(q, cache, cache, table, lens, None, None, True, None, (-1, -1),
                             0.0, mods.NONE, False, None)

    first = call()
    assert reads == [] and len(W._unread) == 1  # captured: not read yet
    may_sync[0] = True
    assert call() is first and len(reads) == 1 and not W._unread
    assert call() is first and len(reads) == 1
    monkeypatch.setattr(W, "GATHER_TILE", 64)  # another plan key: read once more
    assert call() is not first and len(reads) == 2 and not W._unread


def test_only_plain_dense_tensors_or_none_make_a_packed_plan_key():
    # anything else is checked on every call (its typed error) and never cached
    from tiledattention.kernel.workload import _keyable

    t = torch.zeros(4, 2)
    parts = [torch.zeros(2), torch.zeros(3)]
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged)
    with warnings.catch_warnings():  # torch calls this layout a prototype
        warnings.simplefilter("ignore")
        strided_nested = torch.nested.nested_tensor(parts, layout=torch.strided)  # yet nested
    assert _keyable(t, None, t)
    assert not _keyable(t, torch.nn.Parameter(t))
    assert not _keyable(t.to_sparse(), t)
    assert not _keyable(t, jagged) and not _keyable(strided_nested)
