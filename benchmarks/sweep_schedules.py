"""Time candidate schedules at the benchmark's shapes (fp16) and print the best per point.

A first, hand-sized search that seeds ``default_schedule``; ``tiledattn tune`` (the
tuning issue) replaces it with a persisted, per-GPU table. Compile failures are
recorded, not fatal; a schedule whose output is wrong is rejected.

    python benchmarks/sweep_schedules.py [--out sweep.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys

import torch

import tiledattention as ta
from tiledattention.flops import attention_flops, tflops_per_s
from tiledattention.schedules.policy import choose_schedule
from tiledattention.timing import L2Flusher, summarize, time_cuda

POINTS = [(64, 1024, True), (64, 4096, False), (128, 1024, False), (128, 1024, True),
          (128, 4096, False), (128, 4096, True), (96, 4096, False), (96, 4096, True),
          (160, 4096, False), (160, 4096, True)]
CANDIDATES = [ta.Schedule(64, 64, 4), ta.Schedule(64, 64, 2), ta.Schedule(128, 64, 2),
              ta.Schedule(128, 64, 1), ta.Schedule(64, 128, 2), ta.Schedule(128, 128, 1),
              ta.Schedule(128, 32, 2), ta.Schedule(64, 32, 4), ta.Schedule(128, 64, 2, 1, 3, 3),
              ta.Schedule(64, 64, 4, 1, 3, 5)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--heavy-first-ab", action="store_true",
                    help="only causal points: each default schedule with heavy_first on/off")
    ap.add_argument("--ab", metavar="FIELD",
                    help="paper (D, S) points, both causal modes: the tuned schedule with the "
                         "boolean Schedule FIELD flipped")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    points, cands = POINTS, CANDIDATES
    if args.heavy_first_ab:
        points = [(d, s, True) for d in (64, 96, 128, 160) for s in (512, 1024, 4096)]
    if args.ab:
        points = [(d, s, c) for c in (False, True) for d in (64, 96, 128, 160)
                  for s in (512, 1024, 2048, 4096, 8192)]
    flush = L2Flusher()
    results = []
    for d, s, causal in points:
        if args.heavy_first_ab:
            base = ta.default_schedule(d, causal)
            cands = [base, dataclasses.replace(base, heavy_first=False)]
        b, h = 16384 // s, 2048 // d if 2048 % d == 0 else 16
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
        if args.ab:
            base = choose_schedule(q, k, causal)[0]
            flipped = dataclasses.replace(base, **{args.ab: not getattr(base, args.ab)})
            cands = [base, flipped]
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        flops = attention_flops(b, h, s, s, d, causal)
        rows = []
        for sched in cands:
            row = {"D": d, "S": s, "causal": causal, "schedule": sched.label()}
            try:
                out = ta.sdpa(q, k, v, causal=causal, schedule=sched)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                if not err < (5e-3 if dtype == torch.float16 else 2e-2):
                    row.update(status="wrong", rel_err=err)
                else:
                    call = functools.partial(ta.sdpa, q, k, v, causal=causal, schedule=sched)
                    st = summarize(time_cuda(call, warmup=5, reps=20, flush=flush))
                    row.update(status="ok", tflops=tflops_per_s(flops, st.median_ms),
                               median_ms=st.median_ms, rel_err=err)
            except Exception as exc:  # compile failure of one candidate is a result
                row.update(status="error", error=f"{type(exc).__name__}: {str(exc)[:200]}")
            rows.append(row)
        results += rows
        ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["tflops"])
        line = "  ".join(f"{r['schedule']}={r['tflops']:.0f}" for r in ok[:5])
        bad = [f"{r['schedule']}:{r['status']}" for r in rows if r["status"] != "ok"]
        print(f"D{d} S{s} {'causal' if causal else 'full  '}  {line}  {bad or ''}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
