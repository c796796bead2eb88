"""What a caller pays per call: ta.sdpa vs F.scaled_dot_product_attention, side by side.

Three shapes where host work decides (fp16): a tiny 1x1x128x64, a prefill B1 H32 S512
D128 causal, a decode B1 H32 Sq1 Skv4096 D128. Per shape and implementation, in one run
and interleaved round by round:

- call: steady-state wall time per call, --calls back-to-back calls, one synchronisation
  at the end, median of rounds (host and device both count; the slower one sets the pace);
- host: time to enqueue --host-calls calls while a spin keeps the GPU busy, so no call
  waits on the device: the host's cost alone (the target: ta <= 1.3x torch);
- also ta.sdpa through its torch.library custom op (the torch.compile path), to show
  what the eager bypass saves.

    python benchmarks/host_cost.py [--calls 2000] [--out results/host_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention import api
from tiledattention.timing import time_calls, time_host

SHAPES = {  # name: (B, Hq, Sq, Skv, D, causal)
    "tiny 1x1x128x64": (1, 1, 128, 128, 64, False),
    "prefill B1 H32 S512 D128 causal": (1, 32, 512, 512, 128, True),
    "decode B1 H32 Sq1 Skv4096 D128": (1, 32, 1, 4096, 128, False),
}
TARGET = 1.3


def callables(q, k, v, causal):
    # The op path: what torch.compile and CUDA-graph trees call (validation included).
    def via_op():
        p = api.check_inputs(q, k, v, causal=causal, scale=None, attn_mask=None,
                             enable_gqa=False)
        # schedule "" ("pick for me"), no variant
        return api._attention_fwd(q, k, v, None, [], causal, p.scale, False, "", "")[0]

    return {
        "ta.sdpa": lambda: ta.sdpa(q, k, v, causal=causal),
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "ta via op": via_op,
    }


def measure(shape, args) -> dict:
    b, h, sq, skv, d, causal = shape
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, h, skv, d, device="cuda", dtype=torch.float16) for _ in range(2))
    fns = callables(q, k, v, causal)
    ref = fns["torch"]()
    for name, fn in fns.items():
        err = (fn().float() - ref.float()).abs().max().item()
        if err > 2e-2:
            sys.exit(f"{name} disagrees with torch at {shape}: max |diff| {err:.3e}")
    call = {n: [] for n in fns}
    host = {n: [] for n in fns}
    busy = True
    for r in range(args.rounds):  # interleaved, order alternating: drift hits all alike
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            call[name] += time_calls(fns[name], calls=args.calls, rounds=1,
                                     sync=torch.cuda.synchronize)
            samples, ok = time_host(fns[name], calls=args.host_calls, rounds=1)
            host[name] += samples
            busy = busy and ok
    return {"call_us": {n: statistics.median(v) for n, v in call.items()},
            "host_us": {n: statistics.median(v) for n, v in host.items()},
            "gpu_stayed_busy": busy}


def breakdown(calls: int = 2000) -> dict[str, float]:
    """Host microseconds of the pieces of one ta.sdpa call (tiny shape, GPU kept busy)."""
    import cuda.tile as ct

    from tiledattention.kernel import launch as launching
    from tiledattention.kernel.plan import call_key, plan_for

    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)
               for _ in range(3))
    plan = plan_for(q, k, v, None, False, None, False, False, None)
    out = torch.empty_like(q)
    lse, mask = launching._placeholders(q.device, False)
    args = (q, k, v, out, lse, mask, *plan.tail)
    stream = torch.cuda.current_stream().cuda_stream
    pieces = {
        "api._plain_eager": lambda: api._plain_eager(q),
        "call_key": lambda: call_key(q, k, v, None, False, None, False, False, None),
        "plan_for (hit)": lambda: plan_for(q, k, v, None, False, None, False, False, None),
        "torch.empty (out)": lambda: torch.empty(plan.out_shape, dtype=plan.dtype,
                                                 device=plan.device),
        "raw current stream": lambda: launching._raw_stream(0),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
        "ct.launch, args ready": lambda: ct.launch(stream, plan.grid, plan.kernel, args),
        "launch(plan)": lambda: launching.launch(plan, q, k, v, None, fresh_lse=False),
        "ta.sdpa": lambda: ta.sdpa(q, k, v),
        "F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    return {name: statistics.median(time_host(fn, calls=200, rounds=5)[0])
            for name, fn in pieces.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="back-to-back calls per round")
    ap.add_argument("--host-calls", type=int, default=200,
                    help="calls enqueued behind one GPU spin per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="write every number as JSON here")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the pieces of one call (host us, tiny shape)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_cost: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 2
    results = {}
    with torch.inference_mode():
        for name, shape in SHAPES.items():
            results[name] = measure(shape, args)
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, python {platform.python_version()}; "
          f"call: {args.calls} back-to-back calls, host: {args.host_calls} enqueued behind a "
          f"GPU spin; median of {args.rounds} interleaved rounds (us per call)")
    print(f"{'shape':34s} {'call ta':>8s} {'torch':>8s} {'ta/t':>6s} | {'host ta':>8s} "
          f"{'torch':>8s} {'ta/t':>6s} | {'ta via op':>9s}")
    worst = 0.0
    for name in SHAPES:
        r = results[name]
        c, h = r["call_us"], r["host_us"]
        ratio = h["ta.sdpa"] / h["torch"]
        worst = max(worst, ratio)
        print(f"{name:34s} {c['ta.sdpa']:8.1f} {c['torch']:8.1f} "
              f"{c['ta.sdpa'] / c['torch']:6.2f} | {h['ta.sdpa']:8.1f} {h['torch']:8.1f} "
              f"{ratio:6.2f} | {h['ta via op']:9.1f}"
              + ("" if r["gpu_stayed_busy"] else "  (GPU went idle: host numbers include waits)"))
    if args.breakdown:
        with torch.inference_mode():
            pieces = breakdown()
        results["breakdown_host_us"] = pieces
        print("pieces of one call, host us: " + ", ".join(f"{n} {t:.1f}"
                                                         for n, t in pieces.items()))
    verdict = "meets" if worst <= TARGET else "misses"
    print(f"host cost ta/torch, worst shape: {worst:.2f}x ({verdict} the <= {TARGET}x target)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "args": vars(args),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
