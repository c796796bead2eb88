"""A/B of a changed backward kernel file against the package's, side by side in one process.

``--alt FILE`` is a copy of ``tiledattention/kernel/backward.py`` with one change. Per case
(a paper-grid point), both sides run the backward pass (``pass: bwd``: the graph of one
forward replayed, as the harness times it) with the schedule the policy picks, their
kernels taken from the package's module or from FILE; calls are interleaved round by round
with the L2 flushed (``timing.time_cuda``), and each side's dQ/dK/dV is checked against
float64 autograd (the harness' ``reference_grads``/``compare_grads``) first.
``--precompile N`` fills cuTile's disk cache in N processes before timing.

    python benchmarks/ab_backward.py --alt /tmp/backward_alt.py --precompile 14
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import multiprocessing as mp
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.bench.grid import Point  # noqa: E402
from tiledattention.bench.runner import (  # noqa: E402
    compare_grads,
    make_dout,
    pass_callable,
    reference_grads,
)
from tiledattention.kernel import backward, bwd_plan  # noqa: E402
from tiledattention.timing import L2Flusher, time_cuda  # noqa: E402

TOKENS, WIDTH = 16384, 2048  # the paper grid's B*S and H*D


def paper_point(dtype: str, d: int, causal: bool, s: int) -> Point:
    heads = WIDTH // d if WIDTH % d == 0 else 16
    return Point(dtype=dtype, head_dim=d, causal=causal, seq_q=s, seq_kv=s,
                 batch=TOKENS // s, heads=heads, pass_="bwd")


DEFAULT_CASES = [paper_point("float16", d, True, s) for d in (64, 96, 128, 160)
                 for s in (1024, 4096)] + [paper_point("float16", 160, False, 4096)]


def load_alt(path: str):
    # Named inside the kernel package so the file's relative imports resolve as the original's.
    spec = importlib.util.spec_from_file_location("tiledattention.kernel._ab_backward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Sides:
    """Switches the backward's kernels (and its plan cache) between the two modules."""

    def __init__(self, alt_path: str):
        self.modules = {"main": backward, "alt": load_alt(alt_path)}
        self.plans = {name: {} for name in self.modules}
        self.current = "main"

        @functools.cache
        def kernel_for(name, kernel, occupancy):
            return getattr(self.modules[name], kernel).replace_hints(occupancy=occupancy)

        bwd_plan.kernel_for = lambda kernel, occupancy: kernel_for(self.current, kernel,
                                                                   occupancy)

    def use(self, name: str) -> None:
        self.current = name
        bwd_plan._plans = self.plans[name]


def inputs(p: Point):
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = getattr(torch, p.dtype)
    q, k, v = (torch.randn(p.batch, p.heads, p.seq_q, p.head_dim, device="cuda", generator=g)
               .to(dt).requires_grad_() for _ in range(3))
    return q, k, v, make_dout(p, 0, torch.device("cuda"))


def backward_call(p: Point, q, k, v, dout):
    return pass_callable(lambda: ta.sdpa(q, k, v, causal=p.causal), q, k, v, dout, "bwd")


def run_case(p: Point, sides: Sides, rounds: int, reps: int) -> dict:
    q, k, v, dout = inputs(p)
    refs = reference_grads(q, k, v, dout, p, max_heads=2)
    calls, checks = {}, {}
    for name in sides.modules:
        sides.use(name)
        calls[name] = backward_call(p, q, k, v, dout)
        calls[name]()
        torch.cuda.synchronize()
        checks[name] = compare_grads(q, k, v, refs, p, max_heads=2)
    flush = L2Flusher()
    samples = {name: [] for name in calls}
    for r in range(rounds):
        for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            sides.use(name)
            samples[name] += time_cuda(calls[name], warmup=2, reps=reps, flush=flush)
    ms = {name: statistics.median(s) for name, s in samples.items()}
    del q, k, v, dout, refs
    torch.cuda.empty_cache()
    return {"point": p.key(), "main_ms": ms["main"], "alt_ms": ms["alt"],
            "alt_over_main": ms["alt"] / ms["main"],
            "grads_ok": {n: c["grads_correct"] for n, c in checks.items()},
            "grad_rel_err": {n: max(c["grad_rel_err"].values()) for n, c in checks.items()}}


def _warm(args) -> str:
    alt_path, p = args
    sides = Sides(alt_path)
    q, k, v, dout = inputs(p)
    try:
        for name in sides.modules:
            sides.use(name)
            backward_call(p, q, k, v, dout)()
        torch.cuda.synchronize()
        return ""
    except Exception as exc:  # reported, then the timed run shows it again
        return f"{p.key()}: {type(exc).__name__}: {str(exc)[:200]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--alt", required=True, help="the changed copy of kernel/backward.py")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--precompile", type=int, default=0, metavar="N",
                    help="compile every case's kernels in N processes first")
    args = ap.parse_args(argv)
    if args.precompile:
        with mp.get_context("spawn").Pool(args.precompile) as pool:
            bad = [b for b in pool.map(_warm, [(args.alt, p) for p in DEFAULT_CASES]) if b]
        print(f"precompiled {len(DEFAULT_CASES)} cases, {len(bad)} failed", *bad, sep="\n",
              flush=True)
    sides = Sides(args.alt)
    print(f"{'point':44s} {'main ms':>9s} {'alt ms':>9s} {'alt/main':>9s}  grads ok (err)")
    for p in DEFAULT_CASES:
        r = run_case(p, sides, args.rounds, args.reps)
        print(f"{r['point']:44s} {r['main_ms']:9.3f} {r['alt_ms']:9.3f} "
              f"{r['alt_over_main']:9.3f}  {r['grads_ok']} {r['grad_rel_err']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
