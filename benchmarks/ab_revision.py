"""A/B of this tree's kernels against another revision's, side by side in one process.

The other revision's ``tiledattention`` package (a directory, e.g. from ``git archive REV
tiledattention | tar -x -C .ab/REV``) is imported under the name ``tiledattention_ab`` with
its custom-op namespace renamed, so both register and run. Each point is timed through
the harness's ``time_cuda`` (CUDA events, L2 flushed before each call), the two sides
interleaved over rounds; the forward is checked against float64 and the two sides'
outputs against each other. Prints per-point ratios (this tree / other: > 1 means this
tree is slower) and their geometric mean per pass.

    python benchmarks/ab_revision.py --other .ab/c0601be/tiledattention --grid paper
"""

from __future__ import annotations

import argparse
import importlib
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.bench.runner import pass_callable  # noqa: E402
from tiledattention.timing import L2Flusher, time_cuda  # noqa: E402

TOKENS, WIDTH = 16384, 2048  # the paper grid's B*S and H*D


def load_other(path: str):
    """The other revision's package under a new name and op namespace."""
    tmp = Path(tempfile.mkdtemp()) / "tiledattention_ab"
    shutil.copytree(path, tmp)
    for f in tmp.rglob("*.py"):
        text = f.read_text()
        text = text.replace('"tiledattention::', '"tiledattention_ab::')
        text = text.replace('Library("tiledattention"', 'Library("tiledattention_ab"')
        text = text.replace('torch.ops.tiledattention.', 'torch.ops.tiledattention_ab.')
        text = text.replace("from tiledattention.", "from tiledattention_ab.")
        f.write_text(text)
    sys.path.insert(0, str(tmp.parent))
    return importlib.import_module("tiledattention_ab")


def points(grid: str):
    if grid == "decode":  # split-K's range: grids of few programs (B <= 4), MHA and GQA 4
        for b in (1, 2, 4):
            for hkv in (32, 8):
                for sq in (1, 4, 16):
                    for skv in (1024, 4096, 8192, 32768):
                        yield "bfloat16", 128, False, (sq, skv, hkv), b, 32
        return
    # where the D = 128 table entries are the nearest bucket (benchmarks/notes/backward.md §35b)
    if grid == "d192":
        for dtype in ("float16", "bfloat16"):
            for causal in (False, True):
                for s in (4096, 8192):
                    yield dtype, 192, causal, s, TOKENS // s, 16
        return
    if grid == "d256":  # the tuning table's widest head dim (H = 8: WIDTH / 256)
        for dtype in ("float16", "bfloat16"):
            for causal in (False, True):
                for s in (2048, 8192):
                    yield dtype, 256, causal, s, TOKENS // s, WIDTH // 256
        return
    # the causal dK/dV spill (benchmarks/notes/backward.md §23) and controls beside it
    if grid == "d160":
        for dtype in ("float16", "bfloat16"):
            for d, causal, s in ((160, True, 1024), (160, True, 2048), (160, True, 4096),
                                 (160, False, 4096), (128, True, 4096), (256, True, 2048)):
                yield dtype, d, causal, s, TOKENS // s, 16 if d in (160, 96) else WIDTH // d
        return
    ds = (64, 96, 128, 160) if grid == "paper" else (64, 128)
    ss = (512, 1024, 2048, 4096, 8192) if grid == "paper" else (1024, 4096)
    for dtype in ("float16", "bfloat16"):
        for causal in (False, True):
            for d in ds:
                for s in ss:
                    yield dtype, d, causal, s, TOKENS // s, WIDTH // d if WIDTH % d == 0 else 16


def measure(fns: dict, rounds: int, reps: int) -> dict:
    if rounds == 0:  # --compile-only: one call of each, nothing timed
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        return {n: float("nan") for n in fns}
    flush = L2Flusher()
    samples = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name] += time_cuda(fn, warmup=2, reps=reps, flush=flush)
    return {n: sorted(v)[len(v) // 2] for n, v in samples.items()}


def kernel_times(fn, calls: int = 5) -> str:
    """The GPU kernels of one call of ``fn`` by name, µs each (mean of ``calls``), in the
    order they first ran: which kernel of a pass moved."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name.split("(")[0][:40]
            totals[name] = totals.get(name, 0.0) + e.device_time / calls
    return ", ".join(f"{n} {t:.0f}" for n, t in totals.items())


def tensors(dtype, d, s, b, h):
    """q, k, v of a point; ``s`` is S, or (Sq, Skv, Hkv) for a decode point."""
    dt = getattr(torch, dtype)
    sq, skv, hkv = s if isinstance(s, tuple) else (s, s, h)
    q = torch.randn(b, h, sq, d, device="cuda", dtype=dt)
    k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=dt) for _ in range(2))
    return q, k, v


def case(other, dtype, d, causal, s, b, h, passes, rounds, reps):
    q, k, v = tensors(dtype, d, s, b, h)
    gqa = q.shape[1] != k.shape[1]
    kw = dict(causal=causal, enable_gqa=gqa)  # both sides called alike
    new = ta.sdpa(q, k, v, **kw)
    old = other.sdpa(q, k, v, **kw)
    diff = ((new.double() - old.double()).norm() / old.double().norm()).item()
    rows = {}
    if "fwd" in passes:
        rows["fwd"] = measure({"new": lambda: ta.sdpa(q, k, v, **kw),
                               "old": lambda: other.sdpa(q, k, v, **kw)}, rounds, reps)
    if "fwd+bwd" in passes:
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        dout = torch.randn_like(q)
        rows["fwd+bwd"] = measure({
            "new": pass_callable(lambda: ta.sdpa(qg, kg, vg, **kw), qg, kg, vg, dout,
                                 "fwd+bwd"),
            "old": pass_callable(lambda: other.sdpa(qg, kg, vg, **kw), qg, kg, vg, dout,
                                 "fwd+bwd")}, rounds, reps)
        if KERNELS[0] and rounds:
            for side, impl in (("new", ta), ("old", other)):
                print(f"  {side} kernels µs: " + kernel_times(pass_callable(
                    lambda impl=impl: impl.sdpa(qg, kg, vg, **kw), qg, kg, vg, dout,
                    "fwd+bwd")), flush=True)
    return diff, rows


KERNELS = [False]  # --kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="the other revision's tiledattention dir")
    ap.add_argument("--grid", default="quick",
                    choices=("paper", "quick", "d160", "d192", "d256", "decode"))
    ap.add_argument("--head-dims", help="only these head dims, e.g. 128")
    ap.add_argument("--seqs", help="only these sequence lengths (S, or Skv for decode)")
    ap.add_argument("--shard", default="0/1", help="I/N: every N-th point from the I-th")
    ap.add_argument("--compile-only", action="store_true",
                    help="call each side once per point (fills the disk caches), time nothing:"
                         " run N shards in parallel before the timed run")
    ap.add_argument("--passes", nargs="+", default=["fwd", "fwd+bwd"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--kernels", action="store_true",
                    help="also print each side's kernels with their times (fwd+bwd)")
    args = ap.parse_args()
    KERNELS[0] = args.kernels
    other = load_other(args.other)
    ratios: dict[str, list[float]] = {p: [] for p in args.passes}
    print(f"{'point':34s} {'pass':8s} {'new ms':>8s} {'old ms':>8s} {'new/old':>8s} diff")
    dims = {int(x) for x in args.head_dims.split(",")} if args.head_dims else None
    seqs = {int(x) for x in args.seqs.split(",")} if args.seqs else None
    shard, shards = (int(x) for x in args.shard.split("/"))
    chosen = [p for p in points(args.grid) if not (
        (dims and p[1] not in dims)
        or (seqs and (p[3][1] if isinstance(p[3], tuple) else p[3]) not in seqs))]
    for dtype, d, causal, s, b, h in chosen[shard::shards]:
        if args.compile_only:
            case(other, dtype, d, causal, s, b, h, args.passes, 0, 0)
            continue
        diff, rows = case(other, dtype, d, causal, s, b, h, args.passes, args.rounds,
                          args.reps)
        for p, t in rows.items():
            r = t["new"] / t["old"]
            ratios[p].append(r)
            name = (f"{dtype} D{d} {'causal' if causal else 'full'} S{s} B{b} H{h}"
                    if not isinstance(s, tuple) else
                    f"decode Sq{s[0]} Skv{s[1]} B{b} H{h}/{s[2]}")
            print(f"{name:34s} {p:8s} {t['new']:8.3f} {t['old']:8.3f} {r:8.3f} {diff:.1e}",
                  flush=True)
    for p, rs in ratios.items():
        if not rs:
            continue
        gm = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"{p}: new/old kernel time geomean {gm:.4f} over {len(rs)} points "
              f"(min {min(rs):.3f}, max {max(rs):.3f})")


if __name__ == "__main__":
    main()
