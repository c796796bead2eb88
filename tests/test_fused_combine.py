"""Split-K with the combine fused into the attention kernel (``FUSED_COMBINE``): one launch
per call, a zeroed counter array per (device, stream, shape) reused across calls, and one
combine body shared by the combine kernel and the fused forward. CPU only: plans are
built without kernels and the launch is recorded, not run (tests/gpu/ run it)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention import variants  # noqa: E402
from tiledattention.kernel import launch as launching  # noqa: E402
from tiledattention.kernel import mods as M  # noqa: E402
from tiledattention.kernel import plan as planning  # noqa: E402
from tiledattention.kernel.spec import FWD, FWD_FUSED  # noqa: E402
from tiledattention.kernel.validate import Problem  # noqa: E402
from tiledattention.schedules.schedule import Schedule  # noqa: E402


def _plan(b=1, hq=32, hkv=8, sq=1, skv=8192, *, fuse=None, mods=M.NONE, lse=False):
    problem = Problem(b, hq, hkv, sq, skv, 128, False, 0.125)
    return planning.make_plan(problem, torch.bfloat16, torch.device("cpu"), Schedule(64, 64, 2),
                              lse, copy_qkv=False, mask=None, mods=mods, build_kernels=False,
                              sm_count=132, q_viewable=True, fuse_combine=fuse)


@pytest.fixture
def launches(monkeypatch):
    """Record every launch of ``launch.launch`` and give it a CPU counter (no CUDA here)."""
    seen = []
    monkeypatch.setattr(launching, "launch_kernel",
                        lambda device, grid, kernel, args, pdl=False: seen.append((grid, args)))
    monkeypatch.setattr(launching, "_current_device", lambda: None)
    monkeypatch.setattr(launching, "_raw_stream", lambda index: 7)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(launching, "_counters", {})
    return seen


def _qkv(b=1, hq=32, hkv=8, sq=1, skv=8192):
    return (torch.zeros(b, hq, sq, 128, dtype=torch.bfloat16),
            torch.zeros(b, hkv, skv, 128, dtype=torch.bfloat16),
            torch.zeros(b, hkv, skv, 128, dtype=torch.bfloat16))


def test_a_plain_split_k_plan_is_one_launch_with_the_fused_flag(launches):
    p = _plan()  # B1 GQA decode: 8 packed programs, split 16 ways
    assert p.splits_per_head == 16 and p.variant.split_k and p.variant.fused_combine
    assert p.combine is None and p.count_shape == (1, 8, 1) and p.part_shape == (1, 128, 4, 128)
    names = FWD_FUSED.names()[len(FWD_FUSED.tensors):]
    assert p.tail[names.index("FUSED_COMBINE")] is True
    assert p.tail[names.index("NUM_SPLITS")] == 16
    out, _ = launching.launch(p, *_qkv(), None)
    assert len(launches) == 1 and out.shape == (1, 32, 1, 128)
    (grid, args), = launches
    assert grid == p.grid == (1, 128, 1)
    # Q, K, V, Out, Lse, Mask, Part, PartLse, Count, then the tail
    assert len(args) == len(FWD_FUSED.tensors) + len(p.tail)
    part, part_lse, count = args[6:9]
    assert part.shape == p.part_shape and part.dtype == torch.float32
    assert part_lse.shape == p.part_shape[:3] and count.shape == p.count_shape
    assert count.dtype == torch.int32 and not count.any()
    assert args[3].shape == (1, 8, 4, 128)  # the packed view of the output


def test_the_separate_combine_stays_available_by_keyword_and_by_the_module_switch(
        launches, monkeypatch):
    p = _plan(fuse=False)
    assert not p.variant.fused_combine and p.count_shape is None
    assert p.combine_grid == (1, 8, 1) and p.splits_per_head == 16
    assert "FUSED_COMBINE" not in FWD.names() and len(p.tail) == len(FWD.names()) - 6
    launching.launch(p, *_qkv(), None)
    assert [g for g, _ in launches] == [p.grid, p.combine_grid]  # two launches
    monkeypatch.setattr(planning, "FUSE_COMBINE", False)
    assert _plan().count_shape is None and _plan(fuse=True).count_shape is not None


def test_unsplit_and_variant_plans_are_not_fused():
    assert not _plan(b=64, hq=32, hkv=32).variant.fused_combine  # a full grid: no split
    mods = M.mods_for(None, variants.sliding_window(256))
    p = _plan(hq=8, hkv=8, mods=mods)  # the variant kernel keeps the combine kernel
    assert p.part_shape is not None and not p.variant.fused_combine
    assert p.count_shape is None and p.combine_grid == (1, 8, 1)


def test_the_fused_row_tile_is_the_forwards_own():
    # Sq 16 GQA: 64 packed rows per K/V head, one 64-row tile; the combine kernel would
    # have used 32-row tiles (TILE_R), the fused combine runs on the forward's tile.
    p = _plan(b=2, sq=16, skv=8192)
    assert p.count_shape == (2, 8, 1) and p.grid[0] == 1
    p = _plan(b=1, hq=8, hkv=8, sq=100, skv=8192)  # 100 rows: two 64-row tiles per head
    assert p.count_shape == (1, 8, 2) == (1, 8, p.grid[0])


def test_counters_are_reused_per_stream_and_shape_and_never_shared_across_streams(
        monkeypatch):
    stream = [1]
    monkeypatch.setattr(launching, "_current_device", lambda: None)
    monkeypatch.setattr(launching, "_raw_stream", lambda index: stream[0])
    monkeypatch.setattr(launching, "_counters", {})
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cpu = torch.device("cpu")
    a = launching._counter(cpu, (1, 8, 1))
    assert launching._counter(cpu, (1, 8, 1)) is a and a.dtype == torch.int32 and not a.any()
    assert launching._counter(cpu, (2, 8, 1)) is not a
    stream[0] = 2
    b = launching._counter(cpu, (1, 8, 1))
    assert b is not a and launching._counter(cpu, (1, 8, 1)) is b
    # A graph captured on a stream without one gets its own (zeroed by a captured
    # memset), not cached: the eager calls of that stream never share it with the graph.
    stream[0] = 3
    capturing[0] = True
    g = launching._counter(cpu, (1, 8, 1))
    assert not g.any() and launching._counter(cpu, (1, 8, 1)) is not g
    capturing[0] = False
    assert launching._counter(cpu, (1, 8, 1)) is not g


def test_one_combine_body_serves_the_combine_kernel_and_the_fused_forward():
    from tiledattention.kernel import attention, combine

    assert attention.combine_rows is combine.combine_rows
    assert "combine_rows" in combine.attention_combine._pyfunc.__code__.co_names
    assert "combine_rows" in attention.last_split_combines.__code__.co_names
    # No second copy of the merge: the log-sum-exp weights live in combine.py only.
    assert "split_lse" not in vars(attention)
