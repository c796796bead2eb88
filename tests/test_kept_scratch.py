"""fp32 scratch a call never returns (``launch.kept_scratch``: split-K's partials, the
backward's delta), made once per (shapes, device, stream, thread) where small, never
shared where two calls' launches could interleave, and fresh while allocations go to a
CUDA graph's pool: its capture, or torch.compile's reduce-overhead warm-up
(benchmarks/notes/host-cost.md §55d, §57d)."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

from tiledattention.kernel import launch as launching


@pytest.fixture
def stream(monkeypatch):
    """The current stream's handle as ``split_partials`` reads it, set by the test; and
    whether the stream is capturing."""
    now = {"stream": 7, "capturing": False}
    monkeypatch.setattr(launching, "_raw_stream", lambda index: now["stream"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: now["capturing"])
    monkeypatch.setattr(launching, "_scratch_kept", {})
    monkeypatch.setattr(launching, "_kept_bytes", [0])
    return now


SHAPE, CPU = (1, 32, 64, 128), torch.device("cpu")


def test_one_thread_on_one_stream_gets_the_same_partials_each_call(stream):
    part, lse = launching.split_partials(SHAPE, CPU)
    assert part.shape == SHAPE and lse.shape == SHAPE[:3] and part.dtype == torch.float32
    again = launching.split_partials(SHAPE, CPU)
    assert again[0] is part and again[1] is lse


def test_another_stream_or_thread_gets_partials_of_its_own(stream):
    part, _ = launching.split_partials(SHAPE, CPU)
    stream["stream"] = 8
    other, _ = launching.split_partials(SHAPE, CPU)
    assert other is not part
    got = []
    worker = threading.Thread(target=lambda: got.append(launching.split_partials(SHAPE, CPU)))
    stream["stream"] = 7
    worker.start()
    worker.join()
    assert got[0][0] is not part
    assert launching.split_partials(SHAPE, CPU)[0] is part


def test_a_capture_gets_fresh_partials_and_keeps_none(stream):
    part, _ = launching.split_partials(SHAPE, CPU)
    stream["capturing"] = True
    captured = launching.split_partials(SHAPE, CPU)[0]
    assert captured is not part and launching.split_partials(SHAPE, CPU)[0] is not captured
    stream["capturing"] = False
    assert launching.split_partials(SHAPE, CPU)[0] is part


def test_a_graph_trees_warm_up_stream_allocates_to_its_pool(stream, monkeypatch):
    """mode="reduce-overhead" warms a graph up on its tree manager's stream, the allocator
    pointed at the graph's pool, without capturing."""
    manager = [types.SimpleNamespace(stream=types.SimpleNamespace(cuda_stream=7))]
    trees = types.SimpleNamespace(get_manager=lambda index, create_if_none_exists: manager[0])
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    cuda = torch.device("cuda", 0)
    assert launching._to_a_graph_pool(cuda)  # on the tree's stream
    stream["stream"] = 8
    assert not launching._to_a_graph_pool(cuda)  # on another
    stream["capturing"] = True
    assert launching._to_a_graph_pool(cuda)  # any capture
    stream["capturing"], manager[0] = False, None
    assert not launching._to_a_graph_pool(cuda)  # no tree yet
    trees.get_manager = lambda index, create_if_none_exists: 1 / 0
    assert launching._to_a_graph_pool(cuda)  # internals moved: keep nothing


def test_nothing_made_for_a_graph_pool_is_kept(stream, monkeypatch):
    pool = [True]
    monkeypatch.setattr(launching, "_to_a_graph_pool", lambda device: pool[0])
    monkeypatch.setattr(launching, "_scratch", {})
    monkeypatch.setattr(launching, "_int_pads", {})
    monkeypatch.setattr(launching, "_ones", {})
    part = launching.split_partials(SHAPE, CPU)[0]
    assert launching.split_partials(SHAPE, CPU)[0] is not part
    assert launching._placeholders(CPU, fresh=False) is not launching._placeholders(
        CPU, fresh=False)
    assert launching.int_pad_views(CPU) is not launching.int_pad_views(CPU)
    assert launching._one(CPU) is not launching._one(CPU)  # an FP8 call's unit descale
    pool[0] = False  # back on an eager stream: kept from here on
    part = launching.split_partials(SHAPE, CPU)[0]
    assert launching.split_partials(SHAPE, CPU)[0] is part
    assert launching.int_pad_views(CPU) is launching.int_pad_views(CPU)


def test_large_partials_are_not_kept(stream):
    big = (1, 32, 64, launching.SCRATCH_KEPT_BYTES // (32 * 64 * 4) + 1)
    assert launching.split_partials(big, CPU)[0] is not launching.split_partials(big, CPU)[0]


def test_a_split_decode_call_passes_its_kept_partials_to_both_launches(launches, stream):
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    import tiledattention as ta

    q = torch.zeros(1, 32, 1, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 8, 8192, 128, dtype=torch.bfloat16)
    for _ in range(2):
        with torch.no_grad():
            ta.sdpa(q, k, v, enable_gqa=True)
    assert [name for name, _ in launches] == ["attention_fwd", "attention_combine"] * 2
    (_, first), (_, combine), (_, second), _ = launches
    assert first[3] is second[3] and first[4] is second[4]  # partials, their LSEs
    assert combine[0] is first[3] and combine[1] is first[4]


def test_a_training_step_passes_its_kept_delta_to_each_backward_kernel(launches, stream):
    pytest.importorskip("cuda.tile", reason="the plan builds cuTile kernel objects")
    import tiledattention as ta

    q, k, v = (torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    for _ in range(2):
        ta.sdpa(q, k, v, is_causal=True).sum().backward()
    per_step = len(launches) // 2
    backward = launches[1:per_step] + launches[per_step + 1:]  # each step: forward first
    assert [n for n, _ in backward] == ["attention_bwd_dq", "attention_bwd_dkdv"] * 2
    delta = backward[0][1][5]  # (q, k, v, dout, lse, delta, ...)
    assert delta.shape == (1, 2, 128) and delta.dtype == torch.float32
    assert all(args[5] is delta for _, args in backward)


def test_kept_scratch_starts_over_past_its_total(stream, monkeypatch):
    unit = 4 * 32 * 64 * 129  # bytes of SHAPE's partials with their LSEs
    monkeypatch.setattr(launching, "SCRATCH_KEPT_TOTAL", 3 * unit)
    same_size = [SHAPE, (1, 16, 128, 128), (1, 64, 32, 128)]
    first = [launching.split_partials(s, CPU)[0] for s in same_size]
    assert all(launching.split_partials(s, CPU)[0] is f  # three fit
               for s, f in zip(same_size, first))
    launching.split_partials((1, 8, 256, 128), CPU)  # a fourth: all start over
    assert all(launching.split_partials(s, CPU)[0] is not f for s, f in zip(same_size, first))
