"""Experiment (benchmarks/notes/forward.md §19): a persistent grid for the forward kernel.

One program per SM slot (SMs x occupancy programs) loops over (query tile, head, batch)
work items, w = start, start + programs, ...; work item w is query tile w % M of head
(w // M) % H, so the programs running at one time hold consecutive query tiles of one
head and share its K/V in L2. The loop body is the shipped kernel's (one head-dim chunk,
no mask, no LSE, Skv a multiple of TILE_N: the paper grid's D = 64/128 points), so the
A/B against ``tiledattention.sdpa`` with the same schedule measures the grid alone.
Kept out of ``kernel/attention.py`` unless it wins (it did not: see benchmarks/notes/forward.md
§19).

    python benchmarks/persistent_grid.py   # on a GPU; prints TFLOP/s and ratios
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import cuda.tile as ct
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.flops import attention_flops  # noqa: E402
from tiledattention.schedules.schedule import Schedule  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402

_ZERO = ct.PaddingMode.ZERO
ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = 1.0 / math.log(2.0)


@ct.kernel
def persistent_fwd(Q, K, V, Out, qk_scale_log2: float, TILE_M: ConstInt, TILE_N: ConstInt,
                   D: ConstInt, CAUSAL: ConstBool, LAT_K: ConstInt, LAT_V: ConstInt):
    heads = Q.shape[1]
    seq_k = K.shape[2]
    num_m = ct.cdiv(Q.shape[2], TILE_M)
    total = num_m * heads * Q.shape[0]
    for w in range(ct.bid(0), total, ct.num_blocks(0)):
        bid_m = w % num_m
        if CAUSAL:
            bid_m = num_m - 1 - bid_m  # heaviest query tiles first, as the shipped kernel
        h = (w // num_m) % heads
        b = w // (num_m * heads)
        q = ct.load(Q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, D),
                    padding_mode=_ZERO).reshape((TILE_M, D))
        m_i = ct.full((TILE_M, 1), -np.inf, dtype=np.float32)
        l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)
        acc = ct.full((TILE_M, D), 0.0, dtype=np.float32)
        q_start = bid_m * TILE_M
        offs_m = (q_start + ct.arange(TILE_M, dtype=np.int32))[:, None]
        offs_n_tile = ct.arange(TILE_N, dtype=np.int32)[None, :]
        n_tiles = ct.cdiv(seq_k, TILE_N)
        mask_start = n_tiles
        if CAUSAL:
            n_tiles = ct.cdiv(min(q_start + TILE_M, seq_k), TILE_N)
            mask_start = q_start // TILE_N
        for j in range(0, n_tiles):
            k = ct.load(K, index=(b, h, 0, j), shape=(1, 1, D, TILE_N), order=(0, 1, 3, 2),
                        padding_mode=_ZERO, latency=LAT_K).reshape((D, TILE_N))
            qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
            if CAUSAL and j >= mask_start:
                offs_n = j * TILE_N + offs_n_tile
                qk = qk + ct.where(offs_m >= offs_n, 0.0, -np.inf)
            m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
            p = ct.exp2(qk * qk_scale_log2 - m_ij, flush_to_zero=True)
            alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)
            l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
            v = ct.load(V, index=(b, h, j, 0), shape=(1, 1, TILE_N, D), padding_mode=_ZERO,
                        latency=LAT_V).reshape((TILE_N, D))
            acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
            m_i = m_ij
        out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
        ct.store(Out, index=(b, h, bid_m, 0), tile=out.reshape((1, 1, TILE_M, D)).astype(Out.dtype))


def run_persistent(q, k, v, causal: bool, s: Schedule, programs: int):
    out = torch.empty_like(q)
    kern = persistent_fwd.replace_hints(occupancy=s.occupancy, num_worker_warps=s.worker_warps)
    args = (q, k, v, out, LOG2E / math.sqrt(q.shape[3]), s.tile_m, s.tile_n, q.shape[3],
            causal, s.latency_k, s.latency_v)
    ct.launch(torch.cuda.current_stream(), (programs, 1, 1), kern, args)
    return out


POINTS = (  # (dtype, causal, D, S, schedule label): the table's winners at these points
    ("float16", False, 128, 4096, "64x128_o2_c1_lk2_lv4"),
    ("float16", False, 128, 1024, "64x128_o3_c1_lk2_lv4"),
    ("float16", True, 128, 4096, "64x128_o2_c1_lk2_lv4"),
    ("float16", False, 64, 4096, "64x128_o2_c1_lk2_lv4"),
)


def measure_point(dtype, causal, d, s_len, label, sms, flush) -> str | None:
    """One printed line: TFLOP/s of the normal grid, the persistent grid (SMs x occupancy
    programs, and twice that) and torch SDPA; None when the persistent output is wrong."""
    import tiledattention as ta

    s = Schedule.from_label(label)
    heads, b = 2048 // d, 16384 // s_len
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, heads, s_len, d, device="cuda", dtype=getattr(torch, dtype),
                           generator=g) for _ in range(3))
    ref = ta.sdpa(q, k, v, causal=causal, schedule=s)
    fns = {"grid": functools.partial(ta.sdpa, q, k, v, causal=causal, schedule=s),
           "torch": functools.partial(torch.nn.functional.scaled_dot_product_attention,
                                      q, k, v, is_causal=causal)}
    items = math.ceil(s_len / s.tile_m) * heads * b
    # p1, p2: one or two programs per SM slot looping over work items; pall: one program
    # per work item (the loop runs once), which isolates the cost of looping.
    for mult, programs in ((1, sms * s.occupancy), (2, 2 * sms * s.occupancy), ("all", items)):
        fns[f"p{mult}"] = functools.partial(run_persistent, q, k, v, causal, s, programs)
        err = (fns[f"p{mult}"]().float() - ref.float()).abs().max().item()
        if not err < 2e-2:
            print(f"  persistent x{mult} WRONG at {dtype} D{d} S{s_len}: max err {err}")
            return None
    ms = {name: [] for name in fns}
    for _ in range(3):  # interleaved rounds
        for name, fn in fns.items():
            ms[name] += time_cuda(fn, warmup=3, reps=15, flush=flush)
    fl = attention_flops(b, heads, s_len, s_len, d, causal)
    t = {name: fl / (summarize(x).median_ms * 1e-3) / 1e12 for name, x in ms.items()}
    return (f"{dtype} {'causal' if causal else 'full'} D{d} S{s_len} | {label} | "
            f"{t['grid']:.1f} | {t['p1']:.1f} ({t['p1'] / t['grid']:.3f}x), "
            f"{t['p2']:.1f} ({t['p2'] / t['grid']:.3f}x), one item per program "
            f"{t['pall']:.1f} ({t['pall'] / t['grid']:.3f}x) | {t['torch']:.1f}")


def main() -> int:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush = L2Flusher()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} SMs {sms}")
    print("point | schedule | grid TFLOP/s | persistent (x1, x2 programs/slot, one per item) | "
          "torch SDPA")
    for point in POINTS:
        line = measure_point(*point, sms, flush)
        if line is None:
            return 1
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
