"""Repro 2, timed: does the hand-pipelined forward loop (softmax_mma_overlap.py) run faster?

``softmax_mma_overlap.py`` shows in the SASS that writing the next key tile's S = Q K^T
before this tile's softmax makes tileiras overlap every EX2 with an HGMMA of the same warp
group (66 of 66), where the loop as written overlaps none. This times both forms of that
minimal forward (D = 128, bf16, 128-row query tiles over 128-key tiles, num_worker_warps=8,
no mask) on the GPU, side by side with torch's SDPA (cuDNN) on the same problem, and checks
both outputs against SDPA's. Times: CUDA events over --reps calls after warm-up, median of
--rounds rounds, the three interleaved.

    python benchmarks/repro/overlap_timing.py [--seqs 2048 4096 8192] [--heads 32]
"""

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--heads", type=int, default=32, help="batch x heads (one batch)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("skip: no CUDA device (this reproducer times kernels on a GPU)")
        return
    import cuda.tile as ct
    from softmax_mma_overlap import D, fwd

    kernel = fwd.replace_hints(num_worker_warps=8, occupancy=1)
    print(f"{torch.cuda.get_device_name()} | cuda-tile {ct.__version__} | torch "
          f"{torch.__version__} | D {D} bf16, non-causal, H {args.heads}, ms (TFLOP/s)")
    for s in args.seqs:
        print(f"S {s:5d}: " + one_length(kernel, s, args), flush=True)


def one_length(kernel, s: int, args) -> str:
    import cuda.tile as ct
    import torch
    import torch.nn.functional as F
    from softmax_mma_overlap import D

    stream = torch.cuda.current_stream()
    q, k, v = (torch.randn(args.heads, s, D, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    c = (1 / math.sqrt(D)) / math.log(2)  # the kernel's exp2 units
    outs = {p: torch.empty_like(q) for p in (False, True)}
    runs = {f"cutile {'pipelined' if p else 'as written'}":
            (lambda p=p: ct.launch(stream, (s // 128, args.heads, 1), kernel,
                                   (q, k, v, outs[p], c, p)))
            for p in (False, True)}
    runs["torch SDPA"] = lambda: F.scaled_dot_product_attention(q[None], k[None], v[None])
    ref = F.scaled_dot_product_attention(q[None], k[None], v[None])[0].float()
    times = {n: [] for n in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            for _ in range(3):
                fn()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.reps):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / args.reps)
    flops = 4 * args.heads * s * s * D
    err = {p: ((outs[p].float() - ref).norm() / ref.norm()).item() for p in outs}
    med = {n: statistics.median(t) for n, t in times.items()}
    return ("  ".join(f"{n} {t:.3f} ({flops / t / 1e9:.0f})" for n, t in med.items())
            + f" | err as written {err[False]:.1e}, pipelined {err[True]:.1e}")

if __name__ == "__main__":
    main()
