"""The kernel against a float64 reference on a CUDA GPU."""

from __future__ import annotations

import math

import pytest
import torch

import tiledattention as ta
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol

DTYPES = [torch.float16, torch.bfloat16]


def _rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def _poison(shape, dtype):
    # Fill the block the caching allocator will hand to the kernel's output with NaN,
    # so an element the kernel never writes shows up as NaN.
    t = torch.empty(shape, dtype=dtype, device="cuda")
    t.fill_(float("nan"))
    del t


def check(q, k, v, *, causal=False, attn_mask=None, scale=None, return_lse=False, **kw):
    _poison(q.shape, q.dtype)
    res = ta.sdpa(q, k, v, causal=causal, attn_mask=attn_mask, scale=scale,
                  enable_gqa=q.shape[1] != k.shape[1], return_lse=return_lse, **kw)
    out, lse = res if return_lse else (res, None)
    torch.cuda.synchronize()
    ref, ref_lse = naive_attention(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "non-finite output (unwritten or overflowed elements)"
    err = relative_error(out, ref)
    max_abs = (out.double() - ref).abs().max().item()
    print(f"rel={err:.2e} max_abs={max_abs:.2e}")
    assert err <= rtol(q.dtype), f"relative error {err:.3e} (max abs {max_abs:.3e})"
    if return_lse:
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-2, rtol=1e-3)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 64, 96, 128, 160, 256])
@pytest.mark.parametrize("s", [1, 17, 128, 1000, 4096])
def test_self_attention_matches_float64_reference(dtype, causal, d, s):
    b, h = (1, 2) if s >= 1000 else (2, 3)
    check(_rand(b, h, s, d, dtype=dtype), _rand(b, h, s, d, dtype=dtype),
          _rand(b, h, s, d, dtype=dtype), causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1000), (1, 4096), (17, 4096), (1000, 17), (128, 1000),
                                   (4096, 128)])
def test_cross_attention_sq_ne_skv(dtype, causal, sq, sk):
    d = 96
    check(_rand(2, 2, sq, d, dtype=dtype), _rand(2, 2, sk, d, dtype=dtype),
          _rand(2, 2, sk, d, dtype=dtype), causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 160])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 1)])
def test_gqa_and_mqa(dtype, causal, d, hq, hkv):
    check(_rand(2, hq, 1000, d, dtype=dtype), _rand(2, hkv, 1000, d, dtype=dtype),
          _rand(2, hkv, 1000, d, dtype=dtype), causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["key_padding_bool", "key_padding_additive", "full_bool",
                                  "full_additive", "head_bcast_bool", "rank2_bool"])
def test_masks_with_lse(dtype, causal, kind):
    b, h, sq, sk, d = 2, 4, 300, 517, 64
    q, k, v = (_rand(b, h, s, d, dtype=dtype) for s in (sq, sk, sk))
    if kind.startswith("key_padding"):
        lengths = torch.tensor([sk, 200], device="cuda")
        mask = (torch.arange(sk, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    elif kind.startswith("full"):
        mask = torch.rand(b, h, sq, sk, device="cuda") > 0.5
    elif kind.startswith("head_bcast"):
        mask = torch.rand(b, 1, sq, sk, device="cuda") > 0.5
    else:
        mask = torch.rand(sq, sk, device="cuda") > 0.5
    if kind.endswith("additive"):
        mask = torch.where(mask, torch.randn(mask.shape, device="cuda"),
                           torch.tensor(float("-inf"), device="cuda")).to(dtype)
    check(q, k, v, causal=causal, attn_mask=mask, return_lse=True)


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    q, k, v = (_rand(1, 2, 100, 64, dtype=torch.float16) for _ in range(3))
    mask = torch.ones(1, 2, 100, 100, dtype=torch.bool, device="cuda")
    mask[:, :, 7] = False
    mask[:, 1, 50:60] = False
    out, lse = ta.sdpa(q, k, v, attn_mask=mask, return_lse=True)
    dead = ~mask.any(-1)
    assert (out[dead] == 0).all()
    assert torch.isneginf(lse[dead]).all()
    assert torch.isfinite(out).all()
    check(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("d", [64, 128])
def test_custom_scale_and_inputs_times_100_stay_finite(d):
    q, k, v = (_rand(2, 4, 1000, d, dtype=torch.float16, scale=100.0) for _ in range(3))
    check(q, k, v, scale=0.3 / math.sqrt(d))
    out = ta.sdpa(q, k, v, causal=True)
    assert torch.isfinite(out).all()


def test_non_contiguous_inputs():
    b, s, h, d = 2, 333, 4, 128
    qkv = _rand(b, s, 3, h, d, dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, S, D] views
    assert not q.is_contiguous()
    check(q, k, v, causal=True)
    k_t = _rand(b, h, d, s, dtype=torch.bfloat16).transpose(-1, -2)  # head dim not unit-stride
    check(q, k_t, v)


def test_runs_on_a_non_default_stream():
    q, k, v = (_rand(2, 4, 1024, 64, dtype=torch.float16) for _ in range(3))
    ref = ta.sdpa(q, k, v, causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = ta.sdpa(q, k, v, causal=True)
        out2 = out * 1  # same-stream consumer: ordering comes from the stream
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(out2, ref, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay():
    q, k, v = (_rand(2, 4, 512, 128, dtype=torch.float16) for _ in range(3))
    ta.sdpa(q, k, v, causal=True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ta.sdpa(q, k, v, causal=True)
    for _ in range(2):
        q.copy_(_rand(*q.shape, dtype=q.dtype))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = naive_attention(q, k, v, causal=True)
        assert relative_error(out, ref) <= rtol(torch.float16)


def test_torch_compile_fullgraph():
    q, k, v = (_rand(2, 8, 256, 64, dtype=torch.bfloat16) for _ in range(3))

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return ta.sdpa(q * 2, k, v, causal=True, scale=0.1).float().sum(-1)

    got = f(q, k, v)
    ref, _ = naive_attention(q * 2, k, v, causal=True, scale=0.1)
    torch.testing.assert_close(got.double(), ref.sum(-1), atol=5e-2, rtol=1e-2)


@pytest.mark.parametrize("schedule", [ta.Schedule(128, 64, 2), ta.Schedule(64, 128, 2),
                                      ta.Schedule(128, 128, 1, latency_k=3, latency_v=3,
                                                  worker_warps=8),
                                      ta.Schedule(128, 64, 2, worker_warps=8),
                                      ta.Schedule(64, 128, 2, pdl=True)],
                         ids=lambda s: s.label())
def test_explicit_schedules_agree(schedule):
    q, k, v = (_rand(2, 2, 700, 160, dtype=torch.float16) for _ in range(3))
    check(q, k, v, causal=True, schedule=schedule)


@pytest.mark.parametrize("sq,skv", [(512, 512), (1, 4096)], ids=["prefill", "decode-splitk"])
def test_pdl_chains_read_each_previous_output_eagerly_and_in_a_graph(sq, skv):
    # Each call's output is the next call's q, enqueued behind a spin so the programmatic
    # dependent launches really start before their predecessor ends: a load before the
    # wait would read a stale or unwritten q. The non-PDL chain is the reference.
    q = _rand(1, 8, sq, 128, dtype=torch.float16)
    k, v = (_rand(1, 8, skv, 128, dtype=torch.float16) for _ in range(2))
    plain, pdl = ta.Schedule(64, 128, 2), ta.Schedule(64, 128, 2, pdl=True)

    def chain(schedule, steps=8):
        outs, x = [], q
        for _ in range(steps):
            x = ta.sdpa(x, k, v, causal=sq > 1, schedule=schedule)
            outs.append(x)
        return outs

    want = chain(plain)
    torch.cuda.synchronize()
    torch.cuda._sleep(20_000_000)
    got = chain(pdl)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(pdl)
    q.copy_(_rand(*q.shape, dtype=q.dtype))
    graph.replay()
    want = chain(plain)
    torch.cuda.synchronize()
    for a, b in zip(captured, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_repeat_calls_return_fresh_outputs_with_equal_values():
    q, k, v = (_rand(1, 2, 300, 64, dtype=torch.float16) for _ in range(3))
    a, b = ta.sdpa(q, k, v), ta.sdpa(q, k, v)
    assert a.data_ptr() != b.data_ptr()
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_cached_plans_follow_changed_strides_lengths_masks_and_dtypes():
    b, h, s, d = 2, 4, 256, 128
    q, k, v = (_rand(b, h, s, d, dtype=torch.float16) for _ in range(3))
    check(q, k, v)  # plan for contiguous inputs
    qkv = _rand(b, s, 3, h, d, dtype=torch.float16)
    check(*(qkv[:, :, i].transpose(1, 2) for i in range(3)))  # same shapes, new strides
    check(q, k[:, :, :200], v[:, :, :200])  # Skv no longer a multiple of the key tile
    keep = torch.rand(b, 1, 1, s, device="cuda") > 0.3
    check(q, k, v, attn_mask=keep)
    check(q, k, v, attn_mask=torch.rand(b, h, s, s, device="cuda") > 0.3)
    check(*(t.to(torch.bfloat16) for t in (q, k, v)))
    check(q, k, v)  # and back to the first plan


def test_a_swapped_schedule_table_changes_the_schedule_of_the_next_call(tmp_path):
    from tiledattention.kernel.plan import plan_for
    from tiledattention.schedules.policy import choose_schedule
    from tiledattention.schedules.table import Bucket, Entry, ScheduleTable

    q, k, v = (_rand(1, 4, 512, 64, dtype=torch.float16) for _ in range(3))
    shipped = plan_for(q, k, v, None, False, None, False, False, None).variant.schedule
    mine = ta.Schedule(128, 64, 2) if shipped != ta.Schedule(128, 64, 2) else \
        ta.Schedule(64, 64, 4)
    cc = "{}.{}".format(*torch.cuda.get_device_capability())
    table = ScheduleTable()
    table.add(Entry(Bucket(cc, "float16", 64, False, 512), mine, 1.0))
    table.save(str(tmp_path / "mine.json"))
    try:
        ta.set_schedule_table(str(tmp_path / "mine.json"))
        assert choose_schedule(q, k, False)[0] == mine
        assert plan_for(q, k, v, None, False, None, False, False, None).variant.schedule == mine
        check(q, k, v)
    finally:
        ta.set_schedule_table(None)
    assert plan_for(q, k, v, None, False, None, False, False, None).variant.schedule == shipped
