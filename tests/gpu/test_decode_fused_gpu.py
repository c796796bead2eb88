"""Split-K decode with the combine fused into the attention kernel (``FUSED_COMBINE``) on a
GPU: output and LSE equal the separate-combine path and torch SDPA, over 200 calls in a
loop on one stream (a race between the last split's combine and another split's partial
shows as an occasional mismatch: the inputs change every call, so a stale partial is
wrong), and under a CUDA graph replayed several times."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tiledattention.kernel import launch as launching
from tiledattention.kernel import plan as planning
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol

CALLS = 200
DISTINCT = 4  # query sets cycled through the calls


def _plans(q, k, v, monkeypatch):
    """(fused, separate) plans of one call, the policy's schedule, LSE returned."""
    gqa = q.shape[1] != k.shape[1]
    plans = []
    for fused in (True, False):
        monkeypatch.setattr(planning, "FUSE_COMBINE", fused)
        plans.append(planning.build_plan(q, k, v, None, False, None, gqa, True, None))
    fused, separate = plans
    assert fused.count_shape is not None and fused.combine is None, fused.variant.label()
    assert separate.count_shape is None and separate.combine is not None
    return fused, separate


def _inputs(b, hq, hkv, sq, skv, dtype):
    g = torch.Generator(device="cuda").manual_seed(skv + 7 * sq + b)
    # Differently sharp softmaxes: a stale partial of another query set moves the output
    # by a good part of its value, not by less than the tolerance.
    qs = [(torch.randn(b, hq, sq, 128, device="cuda", generator=g) * (1 + i)).to(dtype)
          for i in range(DISTINCT)]
    k = torch.randn(b, hkv, skv, 128, device="cuda", generator=g).to(dtype)
    v = torch.randn(b, hkv, skv, 128, device="cuda", generator=g).to(dtype)
    return qs, k, v


def _assert_same(out, lse, want_out, want_lse, what):
    # Same math in the same order over the splits; only the row tile differs: about one
    # unit in the last place of bf16 (2^-8) apart at most.
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-2, msg=what)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5, msg=what)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("skv", [1024, 8192, 32768])
@pytest.mark.parametrize("sq", [1, 4, 16])
@pytest.mark.parametrize("hq,hkv", [(32, 8), (8, 8)], ids=["gqa", "mha"])
@pytest.mark.parametrize("b", [1, 2])
def test_fused_split_k_matches_the_separate_combine_and_sdpa_over_many_calls(
        b, hq, hkv, sq, skv, dtype, monkeypatch):
    qs, k, v = _inputs(b, hq, hkv, sq, skv, dtype)
    fused, separate = _plans(qs[0], k, v, monkeypatch)
    want = [launching.launch(separate, q, k, v, None) for q in qs]
    for i, (q, (out, lse)) in enumerate(zip(qs, want)):
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
        assert relative_error(out, ref) <= rtol(dtype)
        if i == 0:
            _, ref_lse = naive_attention(q, k, v)
            torch.testing.assert_close(lse.double(), ref_lse, atol=2e-2, rtol=1e-3)
    got = [launching.launch(fused, qs[i % DISTINCT], k, v, None) for i in range(CALLS)]
    torch.cuda.synchronize()
    for i, (out, lse) in enumerate(got):
        _assert_same(out, lse, *want[i % DISTINCT], lambda m, i=i: f"call {i}: {m}")
    ref = F.scaled_dot_product_attention(qs[0], k, v, enable_gqa=hq != hkv)
    assert relative_error(got[0][0], ref) <= rtol(dtype)
    # Every counter the calls used is back at zero.
    assert all(not c.any() for c in launching._counters.values())


@pytest.mark.parametrize("warm_capture_stream", [True, False], ids=["cached", "graph_owned"])
def test_fused_split_k_under_a_cuda_graph_replayed_several_times(warm_capture_stream,
                                                                  monkeypatch):
    qs, k, v = _inputs(1, 32, 8, 1, 8192, torch.bfloat16)
    fused, separate = _plans(qs[0], k, v, monkeypatch)
    want = [launching.launch(separate, q, k, v, None) for q in qs]
    q = qs[0].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if warm_capture_stream:  # the capture then uses this stream's cached counter
            launching.launch(fused, q, k, v, None)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, lse = launching.launch(fused, q, k, v, None)
    torch.cuda.current_stream().wait_stream(stream)
    for i in range(3 * DISTINCT):
        q.copy_(qs[i % DISTINCT])
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(out, lse, *want[i % DISTINCT], lambda m, i=i: f"replay {i}: {m}")
    # Eager calls on the stream after the graph still see a zero counter.
    with torch.cuda.stream(stream):
        again = launching.launch(fused, qs[1], k, v, None)
    torch.cuda.synchronize()
    _assert_same(*again, *want[1], lambda m: f"eager after replay: {m}")
