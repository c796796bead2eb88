"""Forward+backward kernel time, side by side in one process (issue 37): ours as shipped
("ours": the table's backward, which may reduce-add dQ where that was measured faster),
ours deterministic ("ours-7mm": the table's choice under
``torch.use_deterministic_algorithms``, dQ in its own kernel, seven matmuls), ours with dQ
reduce-added from the dK/dV program (five matmuls, ``schedules.backward.bwd_candidates``)
and, at D > 160, the wide-head candidates; cuDNN (torch SDPA forced to CUDNN_ATTENTION)
and FlashAttention-4 (``flash_attn.cute.flash_attn_func``; a line says so when it is not
importable).

Points follow the study's shape model (``bench.grid.Point.of_tokens``: B*S = 16384 tokens,
H*D = 2048). Before any time is taken, each method's output and dQ, dK, dV at every point
are checked against the float64 reference (``bench.runner``: one head of batch 0, the
project's tolerance table); a wrong method prints FAIL instead of a time. Times:
``timing.time_cuda`` (CUDA events, L2 flushed, host hidden), methods interleaved by round,
the median. TFLOP/s by ``flops.attention_flops`` (fwd+bwd = 3.5x the forward). The ratio is
best baseline time / ours (> 1: ours faster). The kernels (ours and FA4's) are compiled
first by parallel processes into the compilers' disk caches (``bench.precompile``'s worker).

    python benchmarks/bwd_compare.py            # 38 points, ~5 min on an H100
    python benchmarks/bwd_compare.py --quick    # 3 points
    python benchmarks/bwd_compare.py --fa4-site /tmp/site   # FA4 installed with --target
    python benchmarks/bwd_compare.py --head-dims 256       # one head dim's points
    python benchmarks/bwd_compare.py --seqs 512 --head-dims 128   # short sequences, both masks
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEED = 0
BASELINES = ("cudnn", "fa4")
SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def grid(quick: bool, head_dims=None, seqs=None):
    from tiledattention.bench.grid import Point

    if seqs:  # the given lengths at the given head dims (default 64 and 128), both masks
        spec = [("bfloat16", c, d, s) for d in sorted(head_dims or (64, 128))
                for c in (False, True) for s in seqs]
    elif quick:
        spec = [("bfloat16", False, 128, 4096), ("bfloat16", True, 128, 8192),
                ("bfloat16", False, 256, 4096)]
    else:
        spec = [("bfloat16", c, d, s) for d in (64, 128, 256) for c in (False, True)
                for s in (1024, 4096, 8192)]
        spec += [("float16", c, 128, s) for c in (False, True) for s in (1024, 4096, 8192)]
        spec += [(dt, c, 160, s) for dt in ("bfloat16", "float16") for c in (False, True)
                 for s in (1024, 4096, 8192)]
        spec += [("bfloat16", c, 192, 4096) for c in (False, True)]
    from dataclasses import replace

    return [replace(Point.of_tokens(dt, c, d, s), pass_="fwd+bwd") for dt, c, d, s in spec
            if head_dims is None or d in head_dims]


def ours_methods(head_dim: int) -> dict[str, str]:
    """Column name -> the harness's method name (``bench.methods.get_method``)."""
    from tiledattention.bench.grid import pinned_bwd
    from tiledattention.schedules.backward import bwd_candidates

    out = {"ours": "tiledattention", "ours-7mm": "tiledattention"}
    out.update({name: pinned_bwd(s.label()) for name, s in bwd_candidates(head_dim).items()})
    return out


class Harness:
    """A method of ``bench.methods`` run on the point's [B, H, S, D] leaves."""

    def __init__(self, name: str):
        from tiledattention.bench.methods import get_method

        self.method = get_method(name)

    def check(self, point, device):
        self.method.check(point, device)

    def leaves(self, q, k, v):
        return q, k, v

    def run(self, leaves, point):
        return self.method.run(*leaves, point)

    def grads(self, leaves):
        return [t.grad for t in leaves]

    def mode(self):
        return contextlib.nullcontext()


class Deterministic(Harness):
    """Ours under ``torch.use_deterministic_algorithms`` (forward and backward): the
    table's deterministic backward schedule."""

    @contextlib.contextmanager
    def mode(self):
        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)


def in_mode(harness, fn):
    def run():
        with harness.mode():
            return fn()
    return run


class FA4(Harness):
    """FlashAttention-4 in its own [B, S, H, D] layout (contiguous copies of the inputs)."""

    def __init__(self):
        self.func = None

    def check(self, point, device):
        from tiledattention.bench.methods import Unavailable

        if self.func is None:
            try:
                from flash_attn.cute import flash_attn_func
            except Exception as exc:  # noqa: BLE001 - any import failure means: not here
                raise Unavailable(f"flash_attn.cute not importable: {type(exc).__name__}: "
                                  f"{str(exc)[:120]}") from None
            self.func = flash_attn_func

    def leaves(self, q, k, v):
        return [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]

    def run(self, leaves, point):
        out = self.func(*leaves, causal=point.causal)
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)

    def grads(self, leaves):
        return [t.grad.transpose(1, 2) for t in leaves]


def checked(point, harness, leaves, dout, ref, grad_refs) -> str | None:
    """None when the output and each gradient are within the tolerance table, else why."""
    import torch

    from tiledattention.tolerance import relative_error, rtol, rtol_bwd

    for t in leaves:
        t.grad = None
    with harness.mode():
        out = harness.run(leaves, point)
        out.backward(dout)
    torch.cuda.synchronize()
    errs = {"out": (relative_error(out.detach()[:1, :1], ref), rtol(point.dtype))}
    for name, g, r in zip(("dq", "dk", "dv"), harness.grads(leaves), grad_refs):
        errs[name] = (relative_error(g[:1, :1], r), rtol_bwd(point.dtype))
    bad = [f"{n} {e:.2e} > {b:.0e}" for n, (e, b) in errs.items()
           if not (math.isfinite(e) and e <= b)]
    return ", ".join(bad) or None


def _warm_fa4(items: list[dict]) -> list[str]:
    """FA4's kernels of these points into its disk cache (one fwd+bwd call each)."""
    import torch

    from tiledattention.bench.grid import Point
    from tiledattention.bench.runner import make_dout, make_inputs, pass_callable

    fa4, device, bad = FA4(), torch.device("cuda"), []
    for data in items:
        point = Point.from_dict(data)
        try:
            fa4.check(point, device)
            leaves = fa4.leaves(*make_inputs(point, SEED, device))
            pass_callable(lambda x=leaves, p=point: fa4.run(x, p), *leaves,
                          make_dout(point, SEED, device), "fwd+bwd")()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the timed run reports it again, per point
            bad.append(f"fa4 {point.key()}: {type(exc).__name__}: {str(exc)[:160]}")
    return bad


def _warm_group(task) -> list[str]:
    from tiledattention.bench.precompile import _warm

    kind, items, cap = task
    return _warm((items, 0, cap)) if kind == "ours" else _warm_fa4([d for d, _, _ in items])


def precompile(points, workers: int, with_fa4: bool) -> None:
    """Every kernel the run will launch, compiled first by parallel processes: ours into
    cuTile's disk cache, FA4's into its own (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED). One
    task per (dtype, causal, D, method) group, so no two processes compile the same kernels
    (the points of a group differ in S only)."""
    import multiprocessing as mp

    import torch

    groups: dict[tuple, list] = {}
    for p in points:
        names = [("ours", m) for m in dict.fromkeys(ours_methods(p.head_dim).values())]
        for kind, m in names + ([("fa4", "fa4")] if with_fa4 else []):
            groups.setdefault((kind, p.dtype, p.causal, p.head_dim, m), []).append(
                (p.as_dict(), (m,), SEED))
    workers = max(1, min(workers, len(groups)))
    cap = torch.cuda.mem_get_info()[0] // (2 * workers)
    tasks = [(key[0], items, cap) for key, items in groups.items()]
    start = time.monotonic()
    with mp.get_context("spawn").Pool(workers) as pool:
        bad = [b for part in pool.imap_unordered(_warm_group, tasks) for b in part]
    print(f"# precompile: {len(groups)} (method, dtype, causal, D) groups, {workers} "
          f"processes, {time.monotonic() - start:.0f}s, {len(bad)} failed", flush=True)
    for b in bad:
        print(f"#   {b}", flush=True)


def measure(point, harnesses, args, flush) -> tuple[dict, dict]:
    """(ms per column that ran, failure text per column that did not; "today": the
    table's backward schedule) at one point."""
    import torch

    from tiledattention.bench.methods import Unavailable, Unsupported
    from tiledattention.bench.runner import (
        make_dout,
        make_inputs,
        pass_callable,
        reference,
        reference_grads,
    )
    from tiledattention.schedules.policy import choose_bwd_schedule
    from tiledattention.timing import time_cuda

    device = torch.device("cuda")
    q, k, v = make_inputs(point, SEED, device)
    dout = make_dout(point, SEED, device)
    ref, _ = reference(q, k, v, point, 1)
    grad_refs = reference_grads(q, k, v, dout, point, 1)
    fns, why = {}, {}
    for col, h in harnesses.items():
        try:
            h.check(point, device)
            leaves = h.leaves(*(t.detach().clone().requires_grad_() for t in (q, k, v)))
            bad = checked(point, h, leaves, dout, ref, grad_refs)
        except (Unavailable, Unsupported) as exc:
            why[col] = f"skip ({exc})"
            continue
        except Exception as exc:  # noqa: BLE001 - one method's error is its row, not the run's
            why[col] = f"ERROR {type(exc).__name__}: {str(exc)[:160]}"
            continue
        if bad:
            why[col] = f"FAIL {bad}"
            continue
        fns[col] = in_mode(h, pass_callable(lambda h=h, leaves=leaves: h.run(leaves, point),
                                            *leaves, dout, "fwd+bwd"))
    samples: dict[str, list[float]] = {c: [] for c in fns}
    for r in range(args.rounds):
        for col, fn in fns.items():
            samples[col] += time_cuda(fn, warmup=args.warmup if r == 0 else 1, reps=args.reps,
                                      flush=flush)
    schedule, how = choose_bwd_schedule(q, k, point.causal, False)  # the backward "ours" ran
    det = choose_bwd_schedule(q, k, point.causal, True)[0]  # and "ours-7mm"
    why["today"] = f"{schedule.label()} ({how})" + (
        "" if det == schedule else f", deterministic {det.label()}")
    return {c: statistics.median(s) for c, s in samples.items()}, why


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 points")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--fa4-site", help="a pip --target directory holding flash-attn-4")
    ap.add_argument("--head-dims", help="only these head dims, e.g. 128,256")
    ap.add_argument("--seqs", help="these sequence lengths instead of the grid's, e.g. 512,1024")
    args = ap.parse_args(argv)
    if args.fa4_site:
        extra = [args.fa4_site, os.path.join(args.fa4_site, "nvidia_cutlass_dsl",
                                             "dsl_packages")]
        sys.path[:0] = extra
        # the precompile processes too
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [*extra, *filter(None, [os.environ.get("PYTHONPATH")])])
    # FA4 keeps its compiled kernels on disk, so its precompile processes help this one.
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    import torch

    if not torch.cuda.is_available():
        print("bwd_compare: no CUDA GPU visible")
        return 2
    from tiledattention.bench.methods import Unavailable
    from tiledattention.flops import attention_flops, tflops_per_s
    from tiledattention.timing import L2Flusher

    points = grid(args.quick, args.head_dims and {int(x) for x in args.head_dims.split(",")},
                  args.seqs and [int(x) for x in args.seqs.split(",")])
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}; fwd+bwd kernel time, median of "
          f"{args.rounds}x{args.reps}, L2 flushed; ratio = best baseline ms / ours ms",
          flush=True)
    fa4 = FA4()
    try:
        fa4.check(points[0], torch.device("cuda"))
    except Unavailable as exc:
        print(f"# fa4: skipped, {exc}", flush=True)
        fa4 = None
    if not args.no_precompile:
        precompile(points, args.workers, fa4 is not None)
    flush = L2Flusher()
    ratios: dict[str, list[float]] = {}
    start = time.monotonic()
    for p in points:
        ours = ours_methods(p.head_dim)
        harnesses = {col: (Deterministic if col == "ours-7mm" else Harness)(name)
                     for col, name in ours.items()}
        harnesses["cudnn"] = Harness("cudnn")
        if fa4 is not None:
            harnesses["fa4"] = fa4
        ms, why = measure(p, harnesses, args, flush)
        flops = attention_flops(p.batch, p.heads, p.seq_q, p.seq_kv, p.head_dim, p.causal,
                                "fwd+bwd")
        name = (f"{SHORT[p.dtype]} {'causal' if p.causal else 'full'} D{p.head_dim} "
                f"S{p.seq_q} B{p.batch} H{p.heads} [table: {why['today']}]")
        cells = [f"{c} {ms[c]:.3f}ms {tflops_per_s(flops, ms[c]):.0f}TF" if c in ms
                 else f"{c} {why[c]}" for c in harnesses]
        base = min((ms[b] for b in BASELINES if b in ms), default=None)
        tail = ""
        if base is not None:
            for c in ours:
                if c in ms:
                    ratios.setdefault(c, []).append(base / ms[c])
            best = min((ms[c] for c in ours if c in ms), default=None)
            if best is not None:
                ratios.setdefault("ours-best", []).append(base / best)
                tail = " |" + "".join(f" {c}/best-baseline {base / ms[c]:.3f}"
                                      for c in ("ours", "ours-7mm") if c in ms) + \
                    f" best-ours/best-baseline {base / best:.3f}"
        print(f"{name}: " + "; ".join(cells) + tail, flush=True)
    for c, rs in ratios.items():
        g = math.exp(statistics.fmean(math.log(r) for r in rs))
        print(f"geomean {c} vs best baseline: {g:.3f} over {len(rs)} points (min {min(rs):.3f})")
    print(f"# timed in {time.monotonic() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
