"""SM clock, power and throughput while one attention kernel runs back to back.

Tests whether the boost-clock gap to cuDNN (benchmarks/notes/forward.md §8: 0.97x at locked base
clocks, 0.95x in the benchmark) comes from clocks under load: each method runs alone for --seconds
while nvidia-smi samples SM clock, power and the active throttle reasons every 100 ms. Shapes,
inputs and methods are the benchmark harness' (tiledattention/bench): one point of the
paper grid's tokens policy.

    python benchmarks/clocks_under_load.py --d 128 --s 4096
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from tiledattention.bench.grid import Point
from tiledattention.bench.methods import get_method
from tiledattention.bench.runner import make_inputs
from tiledattention.flops import attention_flops, tflops_per_s

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"


def run(method: str, point: Point, inputs, seconds: float) -> dict:
    run_method = get_method(method).run
    q, k, v = inputs

    def fn():
        return run_method(q, k, v, point)

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
    flops = attention_flops(point.batch, point.heads, point.seq_q, point.seq_kv,
                            point.head_dim, point.causal)
    return {"method": method, "point": point.key(), "ms_per_call": round(ms, 4),
            "tflops": round(tflops_per_s(flops, ms), 1),
            "sm_clock_mhz_median": statistics.median(float(x[0]) for x in samples),
            "power_w_median": statistics.median(float(x[1]) for x in samples),
            "throttle_reasons": sorted({x[2] for x in samples})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128, help="head dim")
    ap.add_argument("--s", type=int, default=4096, help="sequence length")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--seconds", type=float, default=6.0, help="per method and repeat")
    ap.add_argument("--json", help="write the samples here")
    args = ap.parse_args()
    point = Point.of_tokens(args.dtype, args.causal, args.d, args.s)
    inputs = make_inputs(point, 0, torch.device("cuda"))
    out = [run(m, point, inputs, args.seconds)
           for m in ("tiledattention", "torch_sdpa", "tiledattention", "torch_sdpa")]
    for r in out:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
