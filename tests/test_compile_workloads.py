"""The packed (varlen) and paged kernels compile with tileiras, no GPU needed: the tile
maps, the forward (and split-K's combine), and the packed backward's dQ and dK/dV, as the
plans launch them for an sm_90 or sm_100 (``compile.workload_launches``: the schedule
table's pick unless a test pins one; causal, a window, seqused_k, GQA decode with split-K
over pages), and every kernel of the shipped workloads stage's points."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.errors import CompileError  # noqa: E402
from tiledattention.kernel.compile import export_workload_cubins  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    cuobjdump_text,
    sass_tool,
    tileiras_path,
)  # noqa: E402
from tiledattention.kernel.workload_check import Workload  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)


def _work(d, causal, window=(-1, -1), seqused=False, page=0, hq=16, hk=16, prefill=False):
    return Workload(4, hq, hk, d, torch.bfloat16, 1024, 1024, causal, d ** -0.5, window, 0.0,
                    seqused=seqused, page_size=page, packed_q=not page or prefill)


def _sass(cubin: bytes) -> tuple[str, str]:
    """(``cuobjdump -sass``, ``-res-usage``) of a cubin; skips without the tools."""
    if sass_tool() is None:
        pytest.skip(SASS_MISSING)
    return cuobjdump_text(cubin, "-sass"), cuobjdump_text(cubin, "-res-usage")


@pytest.mark.parametrize("work, gpu", [
    (_work(128, True), "sm_90"), (_work(64, False, (256, 0), True), "sm_90"),
    (_work(96, True, hq=16, hk=4), "sm_90"),
], ids=["d128-causal", "d64-window-seqused", "d96-gqa"])
def test_every_packed_kernel_compiles_for_hopper(work, gpu):
    from tiledattention.kernel import workload as W

    cubins = export_workload_cubins(work, gpu)
    # the delta launch only where dQ does not compute it (PACKED_DQ_DELTA, §43b)
    assert set(cubins) == {"attention_fwd_seqs", "sequence_map", "sequence_map_dq",
                           "sequence_map_zero_tail", "attention_bwd_dkdv_seqs",
                           "attention_bwd_dq_seqs"} | (
        set() if W.PACKED_DQ_DELTA else {"attention_bwd_delta"})
    assert all(c[:4] == b"\x7fELF" for c in cubins.values())


def test_the_packed_forward_and_dkdv_compile_for_blackwell():
    cubins = export_workload_cubins(_work(128, True), "sm_100", backward=("dkdv",))
    assert all(c[:4] == b"\x7fELF" for c in cubins.values())


@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_packed_dq_compiles_for_blackwell_on_its_own_tiles(d):
    # varlen-paged.md §52e: on sm_100 the plan takes BLACKWELL_DQ's 64 x 128 dQ tiles
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.compile import workload_launches

    dq = workload_launches(_work(d, True), "sm_100", backward=("dq",))["attention_bwd_dq_seqs"]
    assert (dq.constants["TILE_M"], dq.constants["TILE_N"]) == (
        W.BLACKWELL_DQ["dq_m"], W.BLACKWELL_DQ["dq_n"])
    assert dq.export("sm_100")[:4] == b"\x7fELF"


@pytest.mark.xfail(strict=True, raises=CompileError,
                   reason="tileiras 13.4.92 exits 5 on the packed dQ program for sm_100 at "
                          "64 x 64 dQ tiles (benchmarks/notes/varlen-paged.md §52e); strict: a "
                          "toolchain that compiles it makes this test fail, so the limit and "
                          "BLACKWELL_DQ's detour are noticed")
def test_the_packed_dq_on_64_by_64_tiles_for_blackwell_is_the_known_tileiras_limit(
        monkeypatch):
    from tiledattention.kernel import workload as W

    monkeypatch.setattr(W, "BLACKWELL_DQ", {})
    export_workload_cubins(_work(128, True), "sm_100", backward=("dq",))


@pytest.mark.parametrize("page", [16, 64, 256])  # 16: gathered rows; 64: tiles span pages
def test_paged_gqa_decode_with_split_k_compiles(page):
    # a 16k context splits its keys: the plan's two launches, the split forward and the
    # combine, compiled as it passes them
    work = dataclasses.replace(_work(128, True, page=page, hq=32, hk=8), max_k=16384)
    cubins = export_workload_cubins(work, "sm_90", paged=True, return_lse=False)
    assert set(cubins) == {"attention_fwd_seqs", "attention_combine"}
    assert all(c[:4] == b"\x7fELF" for c in cubins.values())


@pytest.mark.compile
@pytest.mark.parametrize("d, hq, hk", [(64, 32, 8), (128, 32, 8), (128, 16, 16)])
def test_a_paged_decode_from_page_64_compiles_at_occupancy_2_without_spilling(d, hq, hk):
    # benchmarks/notes/varlen-paged.md §55b: two CTAs an SM from page 64, timed at D 128
    # GQA 4 only; D 64 and MHA decode take the same rule (D 256 spills as it did before)
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.compile import aot_target
    from tiledattention.mods import NONE

    work = dataclasses.replace(_work(d, True, page=W.PAGED_DECODE_OCCUPANCY_FROM, hq=hq,
                                     hk=hk), max_q=1, max_k=16384)
    plan = W.paged_plan(work, None, None, NONE, False, target=aot_target("sm_90"))
    assert (plan.schedule.worker_warps, plan.schedule.occupancy) == (4, 2)
    cubin = export_workload_cubins(work, "sm_90", paged=True,
                                   return_lse=False)["attention_fwd_seqs"]
    sass, res = _sass(cubin)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    assert not any(op.startswith(("STL", "LDL")) for op in ops)
    assert re.search(r"LOCAL:0\b", res)


@pytest.mark.compile
@pytest.mark.parametrize("page, kind, tile, spills", [
    (16, "decode", 64, 0), (16, "prefill", 64, 0), (32, "decode", 64, 0),
    (32, "prefill", 64, 0),
    # the default (GATHER_TILE 128, decode at page 16): 3 STL / 3 LDL, 24 bytes of stack,
    # timed with them at 1.30-1.34x the 64-key tiles from B 8 (varlen-paged.md §50a)
    (16, "decode", 128, 3),
])
def test_small_pages_gather_their_rows_by_cp_async_spilling_no_more_than_measured(
        page, kind, tile, spills, monkeypatch):
    # benchmarks/notes/varlen-paged.md §40f: K/V rows through the block table by cp.async
    # (LDGSTS), no TMA load per page (Q's own: at most 2 UTMALDG). Page 32 gathers where
    # the threshold is raised to 64 (the default keeps its TMA tiles, §41b); prefill where
    # GATHER_MAX_Q is raised past its chunk (the default: decode only, §42c).
    from tiledattention.kernel import workload as W

    monkeypatch.setattr(W, "PAGE_GATHER_BELOW", 64)
    monkeypatch.setattr(W, "GATHER_MAX_Q", 1 << 20)
    monkeypatch.setattr(W, "GATHER_TILE", tile)
    work = _work(128, True, page=page, hq=32, hk=8, prefill=kind == "prefill")
    cubin = export_workload_cubins(work, "sm_90", paged=True)["attention_fwd_seqs"]
    assert cubin[:4] == b"\x7fELF"
    sass, res = _sass(cubin)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    assert sum(op.startswith("LDGSTS") for op in ops) >= 32
    assert sum(op.startswith("UTMALDG") for op in ops) <= 2
    assert sum(op.startswith("STL") for op in ops) <= spills
    assert sum(op.startswith("LDL") for op in ops) <= spills
    assert re.search(r"LOCAL:0\b", res)
    if not spills:
        assert re.search(r"STACK:0\b", res)


@pytest.mark.compile
@pytest.mark.parametrize("below, gathered, narrow, cp_async", [
    (None, True, False, True),    # the default: K rows by cp.async into one operand (§50b)
    (None, False, False, False),  # K's per-page TMA loads joined by a copy (§49a)
    (0, True, True, False),       # neither: one 64x16 MMA per page
])
def test_page_16_chunked_prefill_runs_wide_q_kt_mmas_without_spilling(below, gathered, narrow,
                                                                     cp_async, monkeypatch):
    # benchmarks/notes/varlen-paged.md §49a/§50b: a 128-key tile's eight 16-key pages in
    # one Q K^T operand, so Q K^T is HGMMA 64x128, not 64x16 per page (PAGE_JOIN_BELOW = 0)
    from tiledattention.kernel import workload as W

    if below is not None:
        monkeypatch.setattr(W, "PAGE_JOIN_BELOW", below)
    monkeypatch.setattr(W, "PAGE_KEYS_GATHERED", gathered)
    work = _work(128, True, page=16, hq=32, hk=8, prefill=True)
    sass, res = _sass(export_workload_cubins(work, "sm_90", paged=True)["attention_fwd_seqs"])
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    assert ("HGMMA.64x16x16" in sass) is narrow
    assert any(op.startswith("LDGSTS") for op in ops) is cp_async
    assert not any(op.startswith(("STL", "LDL")) for op in ops)
    assert re.search(r"STACK:0\b", res) and re.search(r"LOCAL:0\b", res)


def _ops(cubin: bytes) -> tuple[list[str], str]:
    sass, res = _sass(cubin)
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass), res


@pytest.mark.compile
@pytest.mark.parametrize("work, built", [
    # (whole loads, whole loads and scattered stores) per kernel
    (_work(128, True), {"attention_bwd_dkdv_seqs": (2, 0), "attention_bwd_dq_seqs": (1, 0)}),
    # seqused_k keeps K and V sliced (NaN past the used keys must load as TMA zeros)
    (_work(64, False, (256, 0), True), {"attention_bwd_dkdv_seqs": (4, 2),
                                        "attention_bwd_dq_seqs": (4, 3)}),
], ids=["d128-causal", "d64-window-seqused"])
def test_whole_array_loads_build_only_the_sliced_stores_tensor_maps(work, built, monkeypatch):
    # benchmarks/notes/varlen-paged.md §42a: with PACKED_BWD_WHOLE the packed backward
    # loads through the whole arrays' host-built tensor maps (prefetched: UTMACCTL.PF) and
    # builds in the kernel (UTMACCTL.IV after the descriptor's STS.128) only those of
    # the sliced arrays: dK and dV, dQ; §51f: with PACKED_BWD_SCATTER_OUT those are stored
    # by masked scatters (16-byte STG, no TMA store) and their maps are gone too. Same
    # warp-group MMAs and TMA loads, no spills.
    from tiledattention.kernel import workload as W

    counts = {}
    for arm in ("sliced", "whole", "scatter"):
        monkeypatch.setattr(W, "PACKED_BWD_WHOLE", arm != "sliced")
        monkeypatch.setattr(W, "PACKED_BWD_SCATTER_OUT", arm == "scatter")
        for name, cubin in export_workload_cubins(work, "sm_90").items():
            if name in built:
                ops, res = _ops(cubin)
                counts[name, arm] = {p: sum(op.startswith(p) for op in ops) for p in (
                    "UTMACCTL.IV", "UTMALDG", "UTMASTG", "STG.E.128", "HGMMA", "STL", "LDL")}
                assert re.search(r"STACK:0\b", res) and re.search(r"LOCAL:0\b", res)
    for name, n in built.items():
        old = counts[name, "sliced"]
        for arm, maps in zip(("whole", "scatter"), n):
            new = counts[name, arm]
            assert new["UTMACCTL.IV"] == maps < old["UTMACCTL.IV"], (name, arm, old, new)
            assert new["UTMALDG"] == old["UTMALDG"] and new["HGMMA"] == old["HGMMA"]
            assert new["STL"] == new["LDL"] == 0
        assert counts[name, "scatter"]["UTMASTG"] == 0 < counts[name, "scatter"]["STG.E.128"]


@pytest.mark.compile
def test_the_packed_delta_runs_at_64_registers_not_255():
    # no hint: tileiras gave it 255 registers, one CTA an SM (63 µs of a 1.6 ms step at 16k
    # causal D 128, benchmarks/notes/varlen-paged.md §42j); occupancy 4 holds it to 64
    cubin = export_workload_cubins(_work(128, True), "sm_90",
                                   backward=("delta",))["attention_bwd_delta"]
    _, res = _sass(cubin)
    assert int(re.search(r"REG:(\d+)", res).group(1)) <= 64
    assert int(re.search(r"STACK:(\d+)", res).group(1)) == 0


@pytest.mark.compile
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("d", [64, 128, 192, 256])
def test_the_packed_dq_computes_delta_without_spills_or_a_tensor_map(d, causal, monkeypatch):
    # benchmarks/notes/varlen-paged.md §43b: with PACKED_DQ_DELTA the packed backward is two
    # launches (dQ with its rows' delta, then dK/dV) and no delta kernel is compiled; the dQ
    # stores delta by a masked scatter (STG) of its sequence's rows, so it builds no tensor
    # map more than without (UTMACCTL.IV: the dQ slice's), with the same registers and no
    # local memory
    from tiledattention import mods
    from tiledattention.kernel import workload as W

    work = _work(d, causal)
    found = {}
    for on in (False, True):
        monkeypatch.setattr(W, "PACKED_DQ_DELTA", on)
        plan = W.varlen_bwd_plan(work, torch.device("cpu"), mods.NONE, False,
                                 target=W.Target("9.0", 132))
        assert tuple(s.role for s in plan.launches) == (
            ("dq", "dkdv") if on else ("delta", "dq", "dkdv"))
        cubins = export_workload_cubins(work, "sm_90", backward=W.packed_bwd_roles()[:-1])
        assert ("attention_bwd_delta" in cubins) is not on
        ops, res = _ops(cubins["attention_bwd_dq_seqs"])
        assert re.search(r"STACK:0\b", res) and re.search(r"LOCAL:0\b", res)
        found[on] = (int(re.search(r"REG:(\d+)", res).group(1)),
                     sum(op.startswith("UTMACCTL.IV") for op in ops),
                     sum(op.startswith("STG") for op in ops))
        assert not any(op.startswith(("STL", "LDL")) for op in ops)
    (reg_off, iv_off, stg_off), (reg_on, iv_on, stg_on) = found[False], found[True]
    assert reg_on <= reg_off and iv_on == iv_off and stg_off == 0 < stg_on, found


@pytest.mark.compile
@pytest.mark.parametrize("whole", [True, False], ids=["whole", "sliced"])
def test_the_packed_dq_delta_compiles_with_dlse_and_sliced_loads(whole, monkeypatch):
    # the lse output's gradient (return_lse, HAS_DLSE: dlse read at the sequence's rows)
    # and the sliced loads (PACKED_BWD_WHOLE off: O and dlse still at the element origin)
    from tiledattention.kernel import workload as W

    monkeypatch.setattr(W, "PACKED_DQ_DELTA", True)
    monkeypatch.setattr(W, "PACKED_BWD_WHOLE", whole)
    monkeypatch.setattr(W, "packed_dq_delta", lambda has_dlse: dict(DELTA=True,
                                                                     HAS_DLSE=True))
    cubin = export_workload_cubins(_work(128, True), "sm_90",
                                   backward=("dq",))["attention_bwd_dq_seqs"]
    ops, res = _ops(cubin)
    assert re.search(r"STACK:0\b", res) and re.search(r"LOCAL:0\b", res)
    assert any(op.startswith("STG") for op in ops)


def _gather_loops(sass: str) -> list[bool]:
    """For each innermost loop holding cp.async (``G``): whether it holds MMAs (``M``)
    too, i.e. its gathers wait for the MMA loop (repro 7's ``inner_loops`` events)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "repro"))
    try:
        import paged_gather
    finally:
        sys.path.pop(0)
    loops = paged_gather.inner_loops(sass, shown=1000, most=10 ** 6).split(" | ")
    return ["M" in loop.split() for loop in loops if "G" in loop.split()]


@pytest.mark.compile
@pytest.mark.parametrize("kind, warps, own_loop", [
    ("decode", 4, True), ("decode", 8, False), ("prefill", 4, True), ("prefill", 8, False)])
def test_gathered_rows_get_a_loop_of_their_own_only_on_four_worker_warps(kind, warps, own_loop,
                                                                          monkeypatch):
    # benchmarks/notes/varlen-paged.md §51b: tileiras pipelines cp.async gathers (a loop of
    # their own, ahead of the MMAs') only on 4 worker warps at occupancy 1; on 8 each tile's
    # gather is waited on in the MMAs' loop. 64 x 128 tiles, page 16, K and V gathered.
    from tiledattention.kernel import workload as W
    from tiledattention.schedules.schedule import Schedule

    monkeypatch.setattr(W, "GATHER_MAX_Q", 1 << 20)
    pinned = Schedule(64, 128, occupancy=1, latency_k=2, latency_v=4, worker_warps=warps)
    work = _work(128, True, page=16, hq=32, hk=8, prefill=kind == "prefill")
    sass, _ = _sass(export_workload_cubins(work, "sm_90", paged=True, schedule=pinned)[
        "attention_fwd_seqs"])
    with_mmas = _gather_loops(sass)
    assert with_mmas and all(not m for m in with_mmas) == own_loop
    assert any(m for m in with_mmas) != own_loop


@pytest.mark.compile
@pytest.mark.parametrize("work, paged, built", [
    # whole loads: Out's, and the last key tile's V (built only in the programs that reach
    # it); with Out scattered: that V's alone
    (_work(128, True), False, (2, 1)),
    # seqused_k keeps K and V sliced: only Q's (and Out's) are gone
    (_work(128, True, seqused=True), False, (3, 2)),
    # two head-dim chunks: a map per chunk width and array
    (_work(96, True), False, (4, 2)),
    # a chunked prefill (page 16, K gathered): Q's (and Out's) are gone; V's end view stays
    (_work(128, True, page=16, hq=32, hk=8, prefill=True), True, (2, 1)),
], ids=["d128-causal", "d128-seqused", "d96-causal", "prefill-page16"])
def test_whole_array_forward_loads_build_only_the_sliced_arrays_tensor_maps(work, paged, built,
                                                                            monkeypatch):
    # benchmarks/notes/varlen-paged.md §51d-§51e: with PACKED_FWD_WHOLE the packed forward
    # loads Q (and K, V) through the whole arrays' host-built tensor maps, and with
    # PACKED_FWD_SCATTER_OUT stores Out by a masked scatter (16-byte STG, no TMA store); it
    # builds in the kernel (ATOMG.EXCH of the descriptor, UTMACCTL.IV) only the maps of
    # the arrays still sliced. Every TMA load and MMA of the sliced kernel is still there,
    # and nothing spills.
    from tiledattention.kernel import workload as W

    counts = {}
    for arm in ("sliced", "whole", "scatter"):
        monkeypatch.setattr(W, "PACKED_FWD_WHOLE", arm != "sliced")
        monkeypatch.setattr(W, "PACKED_FWD_SCATTER_OUT", arm == "scatter")
        cubin = export_workload_cubins(work, "sm_90", paged=paged,
                                       backward=())["attention_fwd_seqs"]
        ops, res = _ops(cubin)
        counts[arm] = {p: sum(op.startswith(p) for op in ops) for p in (
            "UTMACCTL.IV", "ATOMG.E.EXCH", "UTMALDG", "UTMASTG", "STG.E.128", "HGMMA", "STL",
            "LDL")}
        assert re.search(r"STACK:0\b", res) and re.search(r"LOCAL:0\b", res)
    old = counts["sliced"]
    for arm, n in zip(("whole", "scatter"), built):
        new = counts[arm]
        assert new["UTMACCTL.IV"] == new["ATOMG.E.EXCH"] == n < old["UTMACCTL.IV"], (arm, new)
        assert new["UTMALDG"] >= old["UTMALDG"] and new["HGMMA"] >= old["HGMMA"]
        assert new["STL"] == new["LDL"] == 0
    assert counts["scatter"]["UTMASTG"] == 0 < counts["scatter"]["STG.E.128"]


@pytest.mark.compile
@pytest.mark.parametrize("gpu", ["sm_90", "sm_100"])
@pytest.mark.parametrize("work, paged", [
    (_work(128, True), False), (_work(64, False, (256, 0), True), False),
    (_work(96, True, hq=16, hk=4), False),
    (_work(128, True, page=16, hq=32, hk=8, prefill=True), True),
], ids=["d128-causal", "d64-window-seqused", "d96-gqa", "prefill-page16"])
def test_the_packed_kernels_compile_with_whole_loads_and_scattered_stores(work, paged, gpu,
                                                                         monkeypatch):
    # §51d-§51f's switches, all on (the forward's whole loads ship on, §53c): their
    # kernels compile wherever the defaults' do (the SASS tests above need cuobjdump;
    # this one only tileiras). The packed dQ for sm_100 is tileiras' known limit (§38f),
    # so Blackwell compiles the rest.
    from tiledattention.kernel import workload as W

    for switch in ("PACKED_FWD_WHOLE", "PACKED_FWD_SCATTER_OUT", "PACKED_BWD_SCATTER_OUT"):
        monkeypatch.setattr(W, switch, True)
    backward = ("dkdv",) if gpu == "sm_100" else None
    cubins = export_workload_cubins(work, gpu, paged=paged, backward=backward)
    assert len(cubins) >= (2 if paged else 4)
    assert all(c[:4] == b"\x7fELF" for c in cubins.values())


@pytest.mark.compile
def test_a_gathered_chunked_prefill_compiles_on_the_switchs_schedule(monkeypatch):
    # §51b's A/B arm: K and V gathered on 64 x 128 tiles, 4 worker warps, occupancy 1,
    # taken by the plan from the switch (no schedule pinned)
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.compile import workload_launches
    from tiledattention.kernel.plan import fwd_hints
    from tiledattention.kernel.spec import FWD_SEQS
    from tiledattention.schedules.schedule import Schedule

    monkeypatch.setattr(W, "GATHER_MAX_Q", 1 << 20)
    monkeypatch.setattr(W, "GATHERED_PREFILL_SCHEDULE", "64x128_o1_c1_lk2_lv4_w4")
    work = _work(128, True, page=16, hq=32, hk=8, prefill=True)
    fwd = workload_launches(work, "sm_90", paged=True)["attention_fwd_seqs"]
    assert (fwd.constants["TILE_M"], fwd.constants["PAGE_GATHER"]) == (64, True)
    schedule = Schedule.from_label("64x128_o1_c1_lk2_lv4_w4")
    assert fwd.kernel is FWD_SEQS.kernel(mods.NONE, **fwd_hints(schedule))  # its warps
    assert fwd.export("sm_90")[:4] == b"\x7fELF"


def _point_work(point) -> Workload:
    """The workload a stage point's call plans: the checks of its entry point on the
    point's tensors (shapes only), called as ``bench.methods._ours_workload`` calls it."""
    from tiledattention.bench.workload_cases import make_inputs
    from tiledattention.kernel.workload_check import check_paged, check_varlen

    x = make_inputs(point, 0, "meta")
    common = (point.causal, None, (-1, -1), 0.0)  # scale, window, softcap: the defaults
    if point.kind == "decode":
        q4 = x.q.view(point.batch, 1, point.heads, point.head_dim)
        return check_paged(q4, x.k, x.v, x.page_table, x.cache_seqlens, None, None, *common)
    if point.paged:
        return check_paged(x.q, x.k, x.v, x.page_table, x.cache_seqlens, x.cu_q,
                           max(point.seqs_q), *common)
    return check_varlen(x.q, x.k, x.v, x.cu_q, x.cu_k, max(point.seqs_q), max(point.seqs_kv),
                        None, *common)


def _stage_launches(gpu: str) -> dict:
    """Each distinct kernel the shipped workloads stage's points launch on a ``gpu`` (sm_90:
    the reference's H100 and H200), with the first point that launches it."""
    from tiledattention.kernel.compile import workload_launches
    from tiledattention.stages.workloads import WorkloadsConfig, points

    seen = {}
    for point in points(WorkloadsConfig(enabled=True)):
        training = point.pass_ != "fwd"
        launches = workload_launches(_point_work(point), gpu, paged=point.paged,
                                     return_lse=training, backward=None if training else ())
        for name, launch in launches.items():
            key = (name, id(launch.kernel), tuple(sorted(launch.constants.items())),
                   tuple(sorted(launch.arrays)))
            seen.setdefault(key, (f"{point.key()}:{name}", launch))
    return dict(seen.values())


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.parametrize("gpu", ["sm_90", "sm_100", "sm_120"])
def test_every_kernel_the_workloads_stage_launches_compiles_as_planned(gpu):
    # The plans' own launches (the schedule table's picks for sm_90, the switches' schedules,
    # split-K and its combine, the tile maps; on sm_100 BLACKWELL_DQ's dQ tiles), not a
    # default schedule's: what the reference's H100 and H200 run, and what a Blackwell
    # would, so a table or switch change that cannot compile fails here, not on a GPU.
    launches = _stage_launches(gpu)
    assert {name.split(":")[1] for name in launches} == {
        "attention_fwd_seqs", "attention_combine", "sequence_map", "sequence_map_dq",
        "sequence_map_zero_tail", "attention_bwd_dkdv_seqs", "attention_bwd_dq_seqs"}
    failed = []
    for name, launch in launches.items():
        try:
            assert launch.export(gpu)[:4] == b"\x7fELF"
        except CompileError as exc:
            failed.append(f"{name}: {exc}")
    assert not failed, "\n".join(failed)
