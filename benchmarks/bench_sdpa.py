"""TiledAttention vs PyTorch SDPA (auto dispatch and forced FLASH), side by side.

Shapes follow the paper: B·S = 16384 tokens and H·D = 2048 (H = 16 for D = 96 and
160, where 2048/D is not an integer). Per point the methods are timed in interleaved
rounds (tiledattention, auto, flash, repeated) so clock drift hits all alike, with the
L2 cache flushed before every repetition. Prints TFLOP/s and the ratios; --out writes
every number as JSON.

    python benchmarks/bench_sdpa.py [--quick] [--out results/bench_sdpa.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import tiledattention as ta
from tiledattention.flops import attention_flops, tflops_per_s
from tiledattention.reference import naive_attention
from tiledattention.schedules.policy import choose_schedule
from tiledattention.timing import L2Flusher, summarize, time_cuda
from tiledattention.torch_backends import detect_auto_backend, torch_sdpa

POINTS = [(64, 1024), (64, 4096), (128, 1024), (128, 4096), (128, 8192), (96, 4096),
          (160, 4096)]
# The paper's grid: S x D (x dtype x causal = 80 points).
PAPER_POINTS = [(d, s) for d in (64, 96, 128, 160) for s in (512, 1024, 2048, 4096, 8192)]


def heads_for(d: int) -> int:
    return 2048 // d if 2048 % d == 0 else 16


def host_overhead_us(fn, calls=20):
    """Host time to enqueue one call (the GPU queue absorbs the work meanwhile)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def run_point(dtype, causal, d, s, rounds, reps, flush, with_cudnn=False):
    b, h = 16384 // s, heads_for(d)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
    methods = {
        "tiledattention": lambda: ta.sdpa(q, k, v, causal=causal),
        "torch_auto": lambda: torch_sdpa(q, k, v, causal=causal),
        "torch_flash": lambda: torch_sdpa(q, k, v, causal=causal, backend="flash"),
    }
    if with_cudnn:
        methods["torch_cudnn"] = lambda: torch_sdpa(q, k, v, causal=causal, backend="cudnn")
    # Correctness on a slice of heads: the speed of a wrong kernel is not reported.
    out = ta.sdpa(q[:1, :2], k[:1, :2], v[:1, :2], causal=causal)
    ref, _ = naive_attention(q[:1, :2], k[:1, :2], v[:1, :2], causal=causal)
    rel_err = ((out.double() - ref).norm() / ref.norm()).item()
    samples = {name: [] for name in methods}
    for r in range(rounds):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        for name in order:
            samples[name] += time_cuda(methods[name], warmup=5 if r else 10, reps=reps,
                                       flush=flush)
    schedule, how = choose_schedule(q, k, causal)
    flops = attention_flops(b, h, s, s, d, causal)
    host_us = {name: host_overhead_us(fn) for name, fn in methods.items()}
    row = {"dtype": str(dtype).removeprefix("torch."), "causal": causal, "D": d, "S": s,
           "B": b, "H": h, "auto_backend": detect_auto_backend(q, k, v, causal=causal),
           "schedule": f"{schedule.label()} ({how})", "rel_err": rel_err,
           "host_us": host_us}
    for name, ms in samples.items():
        st = summarize(ms)
        row[name] = {"tflops": tflops_per_s(flops, st.median_ms), **st.as_dict()}
    row["ratio_auto"] = row["tiledattention"]["tflops"] / row["torch_auto"]["tflops"]
    row["ratio_flash"] = row["tiledattention"]["tflops"] / row["torch_flash"]["tflops"]
    if with_cudnn:
        row["ratio_cudnn"] = row["tiledattention"]["tflops"] / row["torch_cudnn"]["tflops"]
    return row


def print_summary(rows) -> None:
    def geo(key, subset=rows):
        vals = [r[key] for r in subset if key in r]
        return statistics.geometric_mean(vals) if vals else float("nan")

    auto = [r["ratio_auto"] for r in rows]
    print(f"geomean ratio vs auto {geo('ratio_auto'):.3f} (min {min(auto):.3f}), "
          f"vs flash {geo('ratio_flash'):.3f}, vs cudnn {geo('ratio_cudnn'):.3f} over "
          f"{len(rows)} points on {torch.cuda.get_device_name()}")
    for d in sorted({r["D"] for r in rows}):
        sub = [r for r in rows if r["D"] == d]
        mean = statistics.fmean(r["ratio_auto"] for r in sub)
        wins = sum(r["ratio_auto"] >= 1 for r in sub)
        print(f"  D={d}: mean ratio vs auto {mean:.3f}, geomean {geo('ratio_auto', sub):.3f}, "
              f"min {min(r['ratio_auto'] for r in sub):.3f}, wins {wins}/{len(sub)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="fp16 only, one round")
    ap.add_argument("--grid", choices=("issue", "paper"), default="issue",
                    help="issue: the 7 (D, S) points; paper: the 20 (D, S) points of the "
                         "paper's 80-point grid, also timing forced cuDNN")
    ap.add_argument("--out", help="write all rows as JSON here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to benchmark", file=sys.stderr)
        return 2
    dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
    rounds = 1 if args.quick else args.rounds
    flush = L2Flusher()
    rows = []
    hdr = (f"{'dtype':8} {'causal':6} {'D':>4} {'S':>5} {'tiled':>7} {'auto':>7} {'flash':>7} "
           f"{'x auto':>7} {'x flash':>7}  auto-backend  rel_err  host_us(ours/auto)")
    print(hdr)
    for dtype in dtypes:
        for causal in (False, True):
            for d, s in (PAPER_POINTS if args.grid == "paper" else POINTS):
                r = run_point(dtype, causal, d, s, rounds, args.reps, flush,
                              with_cudnn=args.grid == "paper")
                rows.append(r)
                print(f"{r['dtype']:8} {str(causal):6} {d:>4} {s:>5} "
                      f"{r['tiledattention']['tflops']:7.1f} {r['torch_auto']['tflops']:7.1f} "
                      f"{r['torch_flash']['tflops']:7.1f} {r['ratio_auto']:7.3f} "
                      f"{r['ratio_flash']:7.3f}  {r['auto_backend']:12} {r['rel_err']:.1e}  "
                      f"{r['host_us']['tiledattention']:.0f}/{r['host_us']['torch_auto']:.0f}",
                      flush=True)
    print_summary(rows)
    if args.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "python": platform.python_version(), "tiledattention": ta.__version__,
                "rounds": rounds, "reps": args.reps, "l2_flush": True}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
