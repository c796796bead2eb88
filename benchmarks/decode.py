"""Decode and small grids: kernel time of tiledattention vs torch SDPA side by side
(CUDA-graph replay, L2 flushed before each replay, methods interleaved over rounds), every
output checked against the float64 reference first.

The decode grid has one definition, the ``decode`` section of a bench config
(``tiledattention.bench.grid.decode_points``): ``--grid`` reads it from
config/bench-decode.yaml (or ``--grid-config``), the same points the study's
``tiledattn bench --config config/bench-decode.yaml`` measures into rows. What this script
adds that the harness cannot: ``--targets``, the issue's explicit cases (B4 H8 is not on
the H 32 grid; D = 256 prefill); ``--sweep``, split counts and tiles pinned per case with
the plan's split count and packing printed (``--cases worst --splits 1 2 4 8``: the grid's
two weakest points); ``--headdim``, the D = 256/192 schedule candidates with worker-warp
hints.

    python benchmarks/decode.py [--targets] [--grid] [--headdim] [--sweep] [--out rows.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.kernel import plan as planning
from tiledattention.kernel.launch import launch
from tiledattention.reference import naive_attention
from tiledattention.schedules.space import rejection
from tiledattention.timing import L2Flusher, as_cuda_graph, time_cuda
from tiledattention.tolerance import relative_error, rtol

# (name, B, Hq, Hkv, Sq, Skv, D, dtype, causal)
TARGETS = [
    ("decode B4 H8 Skv4096", 4, 8, 8, 1, 4096, 128, "bfloat16", False),
    ("decode B1 H32 Skv4096", 1, 32, 32, 1, 4096, 128, "bfloat16", False),
    ("decode B16 H32/8 Skv8192", 16, 32, 8, 1, 8192, 128, "bfloat16", False),
    ("D256 B2 H8 S1000", 2, 8, 8, 1000, 1000, 256, "bfloat16", False),
    ("D256 B2 H8 S1000 causal", 2, 8, 8, 1000, 1000, 256, "bfloat16", True),
]
GRID_CONFIG = "config/bench-decode.yaml"


def decode_grid(path: str = GRID_CONFIG):
    """The decode section's points of the bench config at ``path``, as cases."""
    from tiledattention.bench.config import load_config
    from tiledattention.bench.grid import decode_points

    cfg = load_config(path)
    if not cfg.decode.enabled:
        raise SystemExit(f"{path}: decode.enabled is false; no decode grid to run")
    return [(f"grid sq{p.seq_q} skv{p.seq_kv} b{p.batch} h{p.heads}/{p.heads // p.gqa}",
             p.batch, p.heads, p.heads // p.gqa, p.seq_q, p.seq_kv, p.head_dim, p.dtype,
             p.causal) for p in decode_points(cfg.decode)]


def inputs(b, hq, hkv, sq, skv, d, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = getattr(torch, dtype)
    q = torch.randn(b, hq, sq, d, device="cuda", generator=g).to(dt)
    k = torch.randn(b, hkv, skv, d, device="cuda", generator=g).to(dt)
    v = torch.randn(b, hkv, skv, d, device="cuda", generator=g).to(dt)
    return q, k, v


def kernel_ms(fns: dict, rounds=3, reps=20) -> dict:
    flush = L2Flusher()
    graphs = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        graphs[name] = as_cuda_graph(fn)
    samples = {n: [] for n in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            samples[name] += time_cuda(graphs[name], warmup=2, reps=reps, flush=flush)
    return {n: statistics.median(s) for n, s in samples.items()}


def checked(fn, q, k, v, causal):
    out = fn()
    torch.cuda.synchronize()
    n = min(q.shape[0], 2)
    ref, _ = naive_attention(q[:n], k[:n], v[:n], causal=causal)
    err = relative_error(out[:n], ref)
    return err, err <= rtol(q.dtype)


def run_case(case, variants=None):
    name, b, hq, hkv, sq, skv, d, dtype, causal = case
    q, k, v = inputs(b, hq, hkv, sq, skv, d, dtype)
    gqa = hq != hkv

    def torch_fn():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    fns = {"torch": torch_fn}
    tuned = planning.plan_for(q, k, v, None, causal, None, gqa, False, None).variant.schedule
    for label, sched, hints in (variants or [("ours", None, None)]):
        if isinstance(sched, int):  # a split count on the tuned table's schedule
            sched = dataclasses.replace(tuned, splits=sched)
            label = f"tuned_k{sched.splits}"
        p = planning.plan_for(q, k, v, None, causal, None, gqa, False, sched)
        if hints:
            p = dataclasses.replace(p, kernel=p.kernel.replace_hints(**hints))
        fns[label] = (lambda p=p: launch(p, q, k, v, None)[0])
        fns[label].desc = (f"{p.variant.schedule.label()} splits={p.splits_per_head}"
                           f"{' packed' if p.packed_shape else ''}"
                           f"{' ' + str(hints) if hints else ''}")
    rows = []
    errs = {}
    for label, fn in fns.items():
        if label != "torch":
            errs[label] = checked(fn, q, k, v, causal)
    ms = kernel_ms(fns)
    for label in fns:
        if label == "torch":
            continue
        err, ok = errs[label]
        rows.append(dict(case=name, method=label, desc=fns[label].desc,
                         ours_us=ms[label] * 1e3, torch_us=ms["torch"] * 1e3,
                         ratio=ms["torch"] / ms[label], rel_err=err, ok=ok))
        print(f"{name:32s} {label:10s} {fns[label].desc:44s} ours {ms[label]*1e3:8.1f} us  "
              f"torch {ms['torch']*1e3:8.1f} us  ratio {ms['torch']/ms[label]:5.2f}  "
              f"err {err:.1e}{'' if ok else ' WRONG'}", flush=True)
    torch.cuda.empty_cache()
    return rows


def headdim_variants(d):
    S = ta.Schedule
    out = [("ours", None, None)]
    # splits=1: a prefill grid of ~1 wave is not a split-K case (run 1 split 128x64 by 3).
    for s in (S(64, 128, 1, splits=1), S(64, 128, 2, splits=1), S(128, 64, 1, splits=1),
              S(64, 256, 1, splits=1), S(128, 128, 1, splits=1)):
        if rejection(s, d) is None:
            out.append((s.label(), s, None))
    out += [("128x64_o1_w8", S(128, 64, 1, splits=1), {"num_worker_warps": 8})]
    return out


# Split-count and tile sweep on the decode targets and the weakest grid points of run 1.
SWEEP_CASES = TARGETS[:3] + [
    ("grid sq1 skv1024 b1 h32/8", 1, 32, 8, 1, 1024, 128, "bfloat16", False),
    ("grid sq1 skv8192 b1 h32/8", 1, 32, 8, 1, 8192, 128, "bfloat16", False),
    ("grid sq1 skv32768 b1 h32/32", 1, 32, 32, 1, 32768, 128, "bfloat16", False),
    ("grid sq1 skv32768 b8 h32/8", 8, 32, 8, 1, 32768, 128, "bfloat16", False),
]


# The decode grid's two weakest points on the H100 (benchmarks/notes/decode.md §14): packed GQA, one
# program per KV head, 4 and 32 splits of 2 key tiles each chosen by the policy.
WORST_CASES = SWEEP_CASES[3:5]
# Issue 37 item 3: single-sequence GQA decode (B1, Hq 32 / Hkv 8, D 128) over the cache lengths
# the issue names; the policy's split count is printed beside each pinned one.
B1GQA_CASES = [(f"b1 h32/8 skv{n}", 1, 32, 8, 1, n, 128, "bfloat16", False)
               for n in (1024, 8192, 32768)]
SPLITS = (1, 4, 8, 16, 32)


def sweep_variants(splits=SPLITS):
    """The tuned plan; its schedule at each split count (only the split count changes);
    64x128 o3 at each split count and 64x64 o4 at the larger ones (twice the key tiles, so
    the same split count keeps more tiles per split)."""
    S = ta.Schedule
    out = [("ours", None, None)] + [(f"tuned_k{k}", k, None) for k in splits]
    for base, counts in ((S(64, 128, 3), splits), (S(64, 64, 4), [k for k in splits if k >= 8])):
        for k in counts:
            s = dataclasses.replace(base, splits=k)
            out.append((s.label(), s, None))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", action="store_true")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--headdim", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--grid-config", default=GRID_CONFIG,
                    help="bench config whose decode section --grid runs")
    ap.add_argument("--grid-from", type=int, default=0, help="skip the first N grid points")
    ap.add_argument("--cases", choices=("all", "worst", "b1gqa"), default="all",
                    help="--sweep: every sweep case, the grid's two weakest points, or B1 GQA")
    ap.add_argument("--splits", type=int, nargs="+", default=list(SPLITS),
                    help="--sweep: the split counts to pin")
    ap.add_argument("--out")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = []
    if args.targets:
        for case in TARGETS:
            rows += run_case(case)
    if args.headdim:
        for d in (256, 192):
            for causal in (False, True):
                case = (f"D{d} B2 H8 S1000{' causal' if causal else ''}", 2, 8, 8, 1000, 1000,
                        d, "bfloat16", causal)
                try:
                    rows += run_case(case, headdim_variants(d))
                except Exception as exc:  # a candidate that fails to compile: say so, go on
                    print(f"{case[0]}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    if args.sweep:
        cases = {"all": SWEEP_CASES, "worst": WORST_CASES, "b1gqa": B1GQA_CASES}[args.cases]
        for case in cases:
            rows += run_case(case, sweep_variants(args.splits))
            best = max((r for r in rows if r["case"] == case[0]), key=lambda r: r["ratio"])
            print(f"  best: {best['desc']} ratio {best['ratio']:.2f}", flush=True)
    if args.grid:
        for case in decode_grid(args.grid_config)[args.grid_from:]:
            rows += run_case(case)
        worst = min((r for r in rows if r["case"].startswith("grid")), key=lambda r: r["ratio"])
        print(f"worst grid point: {worst['case']} ratio {worst['ratio']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
