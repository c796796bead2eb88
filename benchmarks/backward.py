"""Forward+backward time of tiledattention next to torch SDPA (auto and forced FLASH),
side by side in one process, on points of the paper's grid; also the gradients' errors.

    python benchmarks/backward.py [--seqs 1024 4096] [--head-dims 64 128] [--dtypes float16]

Per point and method: the median of the fwd+bwd time (L2 flushed before each repetition,
methods interleaved by round, ``timing.time_cuda``) and the ratio to each baseline
(> 1: tiledattention faster). The FLOP count is ``flops.attention_flops(..., pass_="fwd+bwd")``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

import tiledattention as ta
from tiledattention.bench.grid import PAPER_DTYPES, PAPER_HEAD_DIMS, PAPER_SEQS, Point
from tiledattention.flops import attention_flops, tflops_per_s
from tiledattention.kernel.bwd_plan import BwdSchedule, pinned_bwd_schedule
from tiledattention.reference import naive_attention
from tiledattention.timing import L2Flusher, time_cuda
from tiledattention.tolerance import relative_error, rtol_bwd
from tiledattention.torch_backends import torch_sdpa


def step(method, q, k, v, dout, causal):
    pinned = None
    if method.startswith("tiledattention@"):  # a pinned backward schedule
        pinned = BwdSchedule.from_label(method.split("@")[1])

    def run():
        q.grad = k.grad = v.grad = None
        if method.startswith("tiledattention"):
            out = ta.sdpa(q, k, v, causal=causal)
            with pinned_bwd_schedule(pinned):
                out.backward(dout)
            return
        else:
            out = torch_sdpa(q, k, v, causal=causal, backend=None if method == "torch_sdpa"
                             else method)
        out.backward(dout)
    return run


def grad_errors(q, k, v, dout, causal):
    step("tiledattention", q, k, v, dout, causal)()
    got = (q.grad[:1, :2], k.grad[:1, :2], v.grad[:1, :2])
    q64, k64, v64 = (t.detach()[:1, :2].double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64, v64, causal=causal)[0].mul(dout[:1, :2].double()).sum().backward()
    return [relative_error(g, r.grad) for g, r in zip(got, (q64, k64, v64))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=list(PAPER_SEQS))
    ap.add_argument("--head-dims", type=int, nargs="+", default=list(PAPER_HEAD_DIMS))
    ap.add_argument("--dtypes", nargs="+", default=list(PAPER_DTYPES))
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--methods", nargs="+", default=["tiledattention", "torch_sdpa", "flash"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    flush = L2Flusher()
    rows = []
    for dtype in args.dtypes:
        for causal in map(bool, args.causal):
            for d in args.head_dims:
                for s in args.seqs:
                    p = Point.of_tokens(dtype, causal, d, s)
                    g = torch.Generator(device="cuda").manual_seed(s * 1000 + d)
                    q, k, v, dout = (torch.randn(p.batch, p.heads, s, d, device="cuda",
                                                 generator=g, dtype=getattr(torch, dtype))
                                     for _ in range(4))
                    q, k, v = (t.requires_grad_() for t in (q, k, v))
                    errs = grad_errors(q, k, v, dout, causal)
                    fns, times = {}, {}
                    for m in args.methods:
                        try:
                            fns[m] = step(m, q, k, v, dout, causal)
                            fns[m]()
                            times[m] = []
                        except Exception as exc:  # e.g. FLASH refusing a head dim
                            times[m] = f"{type(exc).__name__}: {str(exc)[:80]}"
                    live = [m for m in args.methods if isinstance(times[m], list)]
                    for r in range(args.rounds):
                        for m in (live if r % 2 == 0 else live[::-1]):
                            times[m] += time_cuda(fns[m], warmup=3 if r == 0 else 1,
                                                  reps=args.reps, flush=flush)
                    med = {m: statistics.median(t) if isinstance(t, list) else t
                           for m, t in times.items()}
                    flops = attention_flops(p.batch, p.heads, s, s, d, causal, pass_="fwd+bwd")
                    row = {"point": p.key(), "ms": med, "grad_rel_err": errs,
                           "grads_ok": all(e <= rtol_bwd(dtype) for e in errs),
                           "tflops": {m: tflops_per_s(flops, t) for m, t in med.items()
                                      if isinstance(t, float)}}
                    rows.append(row)
                    ratios = {m: med[m] / med["tiledattention"] for m in live
                              if m != "tiledattention" and "tiledattention" in live}
                    row["ratio"] = ratios
                    print(f"{p.key():42s} ta={med.get('tiledattention')!s:.6} "
                          + " ".join(f"{m}={r:.3f}" for m, r in ratios.items())
                          + f" err={max(errs):.2e}", flush=True)
    for base in args.methods[1:]:
        rs = [r["ratio"][base] for r in rows if base in r["ratio"]]
        if rs:
            print(f"fwd+bwd vs {base}: geomean {math.exp(statistics.fmean(map(math.log, rs))):.3f}"
                  f" min {min(rs):.3f} n={len(rs)}")
    print(f"gradients within tolerance: {sum(r['grads_ok'] for r in rows)}/{len(rows)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
