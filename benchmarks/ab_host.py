"""Host cost and call latency of this tree's ``sdpa`` against another revision's and
torch's, side by side in one process (eager; no grad and forward+backward), bf16.

Host: ``time_host`` (calls enqueued behind a GPU spin, so only host time counts); call:
``time_calls`` (back-to-back calls, one sync per round). Both sides are called with the same
keywords, interleaved over ``--rounds`` rounds whose order reverses each round (the
2026-11-26 A/B timed the new side first, called through ``is_causal=``, and its first
case read 1.0-1.5x slower for it); medians over all rounds, µs per call.

    python benchmarks/ab_host.py --other .ab/c0601be/tiledattention
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ab_revision import load_other  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.bench.runner import pass_callable  # noqa: E402
from tiledattention.timing import time_calls, time_host  # noqa: E402

SHAPES = {  # name: (B, H, Sq, Skv, D, causal, bool mask)
    "tiny": (1, 1, 128, 128, 64, False, False),
    "prefill B1 H16 S512": (1, 16, 512, 512, 128, True, False),
    "decode B1 H32 Skv1024": (1, 32, 1, 1024, 128, False, False),
    # the causal mask as a compiled transformers model passes it: dense [1, 1, S, S] bool
    "masked prefill B1 H16 S512": (1, 16, 512, 512, 128, False, True),
}


def median(x):
    return sorted(x)[len(x) // 2]


def callables(old, shape):
    b, h, sq, skv, d, causal, masked = shape
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, h, skv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = torch.ones(sq, skv, dtype=torch.bool, device="cuda").tril(skv - sq)[None, None] \
        if masked else None
    # Both sides called alike (the same keyword): an A/B of the revisions, not of the
    # argument spelling.
    sides = {"new": lambda a, b_, c: ta.sdpa(a, b_, c, mask, causal=causal),
             "old": lambda a, b_, c: old.sdpa(a, b_, c, mask, causal=causal),
             "torch": lambda a, b_, c: F.scaled_dot_product_attention(a, b_, c, mask,
                                                                       is_causal=causal)}
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    fns = {n: (lambda f=f: f(q, k, v)) for n, f in sides.items()}
    fns.update({f"{n} fwd+bwd": pass_callable(lambda f=f: f(qg, kg, vg), qg, kg, vg, dout,
                                              "fwd+bwd") for n, f in sides.items()})
    return fns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", required=True, help="the other revision's tiledattention dir")
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds; the sides alternate their order from round to round")
    ap.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    args = ap.parse_args()
    old = load_other(args.other)
    for name in args.shapes:
        shape = SHAPES[name]
        fns = callables(old, shape)
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        host = {n: [] for n in fns}
        call = {n: [] for n in fns}
        for r in range(args.rounds):  # sides interleaved, order reversed every round:
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]  # no side always first
            for n in order:
                f = fns[n]
                host[n] += time_host(f, calls=50 if "bwd" in n else 200,
                                     busy_us_per_call=3000 if "bwd" in n else 300)[0]
                call[n] += time_calls(f, calls=50 if "bwd" in n else 200,
                                      sync=torch.cuda.synchronize)
        host = {n: median(x) for n, x in host.items()}
        call = {n: median(x) for n, x in call.items()}
        print(name, "host us:", {n: round(x, 1) for n, x in host.items()})
        print(name, "call us:", {n: round(x, 1) for n, x in call.items()})


if __name__ == "__main__":
    main()
