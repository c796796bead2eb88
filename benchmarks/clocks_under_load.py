"""SM clock, power and throughput while one attention kernel runs back to back.

Tests whether the boost-clock gap to cuDNN (NOTES §8: 0.97x at locked base clocks, 0.95x in
the benchmark) comes from clocks under load: each method runs alone for --seconds while
nvidia-smi samples SM clock, power and the active throttle reasons every 100 ms.

    python benchmarks/clocks_under_load.py --d 128 --s 4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

import tiledattention as ta
from tiledattention.flops import attention_flops
from tiledattention.torch_backends import torch_sdpa

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


def run(method: str, q, k, v, causal: bool, seconds: float) -> dict:
    fn = (lambda: ta.sdpa(q, k, v, causal=causal)) if method == "tiledattention" else (
        lambda: torch_sdpa(q, k, v, causal=causal))
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,"
                            "nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
    start, calls = time.perf_counter(), 0
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            fn()
        calls += 50
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = [x for x in (line.split(", ") for line in smi.communicate()[0].splitlines())
               if len(x) == 3]
    samples = samples[len(samples) // 5:]  # drop the ramp
    ms = begin.elapsed_time(end) / calls
    b, h, s, d = q.shape
    return {"method": method, "ms_per_call": round(ms, 4),
            "tflops": round(attention_flops(b, h, s, s, d, causal) / (ms * 1e-3) / 1e12, 1),
            "sm_clock_mhz_median": statistics.median(float(x[0]) for x in samples),
            "power_w_median": statistics.median(float(x[1]) for x in samples),
            "throttle_reasons": sorted({x[2] for x in samples})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    b, h = 16384 // args.s, 2048 // args.d
    q, k, v = (torch.randn(b, h, args.s, args.d, device="cuda", dtype=torch.float16)
               for _ in range(3))
    out = [run(m, q, k, v, args.causal, args.seconds)
           for m in ("tiledattention", "torch_sdpa", "tiledattention", "torch_sdpa")]
    for r in out:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
