"""The variants' backward schedules side by side (issue 47 item 5): forward+backward of each
built-in variant of the study's variants stage (``bench/variant_cases``) with its backward
pinned to each candidate schedule (``pinned_bwd_schedule``; the forward is the table's),
interleaved rounds in one process, kernel time with L2 flushed. Every candidate's
gradients are compared with those of ``default_bwd_schedule`` (the variants' schedule until
benchmarks/notes/variants.md §45a; the policy now takes ``key_rows_bwd_schedule``, the
``_keyrows`` candidate below). GPU.

    python benchmarks/variant_bwd_ab.py            # B8 H16 S4096 D128 bf16, issue 47's point
    python benchmarks/variant_bwd_ab.py --seqs 1024 4096 --head-dims 64 128
    for v in window softcap alibi; do python benchmarks/variant_bwd_ab.py --variants $v \
        --compile-only & done; wait      # compile in parallel first, then time

A candidate that ``bwd_rejection`` refuses for the head dim is skipped with the reason.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from packed_ab import pinned_rounds, rel_diff  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.bench.variant_cases import VARIANTS  # noqa: E402
from tiledattention.schedules.backward import BwdSchedule, bwd_rejection, default_bwd_schedule  # noqa: E402
from tiledattention.timing import L2Flusher  # noqa: E402

# The plain causal table's pick at S 4096 D 128 on both references, and the default with
# keys as the MMA rows (the packed backward's, benchmarks/notes/varlen-paged.md §43c).
CANDIDATES = ("kv64x128_q128x64_o1_w8_keyrows", "kv64x128_q128x64_o1_w8",
              "kv64x64_q64x64_o2_keyrows", "kv128x64_q64x128_o2")


def variant_step(name, batch, heads, seq, d):
    """One forward+backward of a built-in variant, as a closure returning dq, dk, dv."""
    parts = VARIANTS[name].build(batch, heads, seq, torch.device("cuda"))
    q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16)
               .requires_grad_() for _ in range(3))
    dout = torch.randn_like(q.detach())

    def step():
        o = ta.sdpa(q, k, v, **parts.ours)
        return torch.autograd.grad(o, (q, k, v), dout)
    return step, VARIANTS[name].causal


def compare(name, batch, heads, seq, d, labels, rounds, flush, compile_only=False):
    step, causal = variant_step(name, batch, heads, seq, d)
    schedules = [default_bwd_schedule(d, causal)]
    for label in labels:
        s = BwdSchedule.from_label(label)
        why = bwd_rejection(s, d)
        if why:
            print(f"  {name} D {d}: {label} skipped: {why}")
        elif s not in schedules:
            schedules.append(s)
    if compile_only:  # fill the kernel cache (parallel processes, one variant each)
        for s in schedules:
            with ta.pinned_bwd_schedule(s):
                step()
        return
    ms, grads = pinned_rounds(step, schedules, rounds, flush)
    for s, t, g in zip(schedules, ms, grads):
        print(f"{name} B{batch} H{heads} S{seq} D{d} {s.label():34s} {t:7.3f} ms  "
              f"x{ms[0] / t:.3f} of default  max rel |dgrad - default's| "
              f"{rel_diff(g, grads[0]):.1e}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=["window", "softcap", "alibi",
                                                     "documents", "prefix_lm"],
                   choices=sorted(VARIANTS))
    p.add_argument("--seqs", type=int, nargs="+", default=[4096])
    p.add_argument("--head-dims", type=int, nargs="+", default=[128])
    p.add_argument("--tokens", type=int, default=32768, help="B x S, as the variants stage")
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--compile-only", action="store_true",
                   help="one call per schedule, no timing (fills CUDA_TILE_CACHE_DIR)")
    a = p.parse_args()
    flush = L2Flusher()
    for seq in a.seqs:
        for d in a.head_dims:
            for name in a.variants:
                compare(name, max(1, a.tokens // seq), 2048 // d, seq, d, a.candidates,
                        a.rounds, flush, a.compile_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
