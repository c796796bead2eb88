"""Launch one shape a few times per method, for Nsight Compute to capture one launch.

    ncu -k regex:attention_fwd --launch-skip 3 --launch-count 1 \\
        python benchmarks/profile_one.py --method tiledattention
"""

from __future__ import annotations

import argparse

import torch

import tiledattention as ta
from tiledattention.torch_backends import torch_sdpa


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", choices=("tiledattention", "torch_auto"), required=True)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--s", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    b, h = 16384 // args.s, 2048 // args.d if 2048 % args.d == 0 else 16
    q, k, v = (torch.randn(b, h, args.s, args.d, device="cuda", dtype=getattr(torch, args.dtype))
               for _ in range(3))
    for _ in range(5):
        if args.method == "tiledattention":
            ta.sdpa(q, k, v, causal=args.causal)
        else:
            torch_sdpa(q, k, v, causal=args.causal)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
