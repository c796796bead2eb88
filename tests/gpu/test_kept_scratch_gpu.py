"""Kept scratch (split-K's partials, placeholders) under torch.compile's
mode="reduce-overhead": nothing a call keeps lives in a CUDA graph's pool. The graph tree
warms a call up on its own stream with the allocator pointed at its pool; a tensor kept
from then is one the tree does not track ("tensor(s) in the cudagraph pool not tracked as
outputs": host-cost.md §57d) and memory it hands to its next graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.kernel import launch
from tiledattention.tolerance import relative_error, rtol

DTYPE = torch.bfloat16


def _graph_pools() -> list[tuple[int, int]]:
    """(start, end) of every allocator segment of a private (graph) pool."""
    return [(s["address"], s["address"] + s["total_size"])
            for s in torch.cuda.memory._snapshot()["segments"]
            if tuple(s["segment_pool_id"]) != (0, 0)]


def _kept() -> list[torch.Tensor]:
    held = (*launch._scratch_kept.values(), *launch._scratch.values(),
            *launch._int_pads.values())
    return [t for ts in held for t in ts] + list(launch._ones.values())


def test_a_reduce_overhead_split_decode_keeps_nothing_in_the_graphs_pool():
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(1, 8, 1024, 128, device="cuda", dtype=DTYPE) for _ in range(2))
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch._dynamo.reset()
    ours = torch.compile(lambda q, k, v: ta.sdpa(q, k, v, enable_gqa=True), fullgraph=True,
                         mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):  # warm-up, recording, replays
            torch.compiler.cudagraph_mark_step_begin()
            err = relative_error(ours(q, k, v).float(), want.double())
            assert err <= 2 * rtol(DTYPE), f"step differs by {err:.3e}"
    pools = _graph_pools()
    assert pools, "no graph pool: the call did not run under CUDA graphs"
    inside = [tuple(t.shape) for t in _kept()
              if any(lo <= t.data_ptr() < hi for lo, hi in pools)]
    assert inside == []
    # the next graphs record and replay: host_cost.py's torch cells failed here
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    theirs = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, enable_gqa=True), fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        qg.grad = kg.grad = vg.grad = None  # a step's gradients are its graph's outputs
        theirs(qg, kg, vg).float().sum().backward()
    torch._dynamo.reset()
