"""Where a call's host time goes: torch.profiler over back-to-back calls, ours vs torch.

For issue 26's paths (eager and compiled, no grad and forward+backward) on its two
host-bound shapes, prints per implementation the wall time per call and the profiler's
top rows by self CPU time, and the GPU kernels with their time per call, so a gap between
call latency and kernel time can be attributed (op dispatch, Python, allocation, launches).

    python benchmarks/host_profile.py [--calls 50] [--rows 12]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import tiledattention as ta
from tiledattention.timing import time_calls

SHAPES = {  # name: (B, Hq, Hkv, Sq, Skv, D, causal), bf16
    "prefill B1 H16 S512 D128 causal": (1, 16, 16, 512, 512, 128, True),
    "decode B1 H32/8 Sq1 Skv1024 D128": (1, 32, 8, 1, 1024, 128, False),
}
PATHS = ("eager fwd+bwd", "compiled no-grad", "compiled fwd+bwd")


def make_step(impl, shape, path):
    b, hq, hk, sq, sk, d, causal = shape
    dev, dt = "cuda", torch.bfloat16
    grad = "fwd+bwd" in path
    q = torch.randn(b, hq, sq, d, device=dev, dtype=dt, requires_grad=grad)
    k = torch.randn(b, hk, sk, d, device=dev, dtype=dt, requires_grad=grad)
    v = torch.randn(b, hk, sk, d, device=dev, dtype=dt, requires_grad=grad)
    dout = torch.randn(b, hq, sq, d, device=dev, dtype=dt)
    gqa = hq != hk

    def ours(q, k, v):
        return ta.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    def theirs(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    fn = ours if impl == "ours" else theirs
    if path.startswith("compiled"):
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True)

    def step():
        if grad:
            out = fn(q, k, v)
            out.backward(dout)
            q.grad = k.grad = v.grad = None
        else:
            with torch.no_grad():
                fn(q, k, v)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rows", type=int, default=12)
    args = ap.parse_args()
    for sname, shape in SHAPES.items():
        for path in PATHS:
            for impl in ("ours", "torch"):
                step = make_step(impl, shape, path)
                wall = statistics.median(time_calls(step, calls=args.calls, warmup=20,
                                                    sync=torch.cuda.synchronize))
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(args.calls):
                        step()
                    torch.cuda.synchronize()
                print(f"\n=== {sname} | {path} | {impl}: {wall:.1f} us per call (call latency) ===")
                avg = prof.key_averages()
                print(avg.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                max_name_column_width=60))
                kernels = [e for e in avg if e.device_type.name == "CUDA"]
                total = sum(e.self_device_time_total for e in kernels) / args.calls
                print(f"GPU kernels: {total:.1f} us per call")
                for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:6]:
                    print(f"  {e.self_device_time_total / args.calls:8.1f} us  "
                          f"{e.count / args.calls:4.1f}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
