"""The head shapes past one D (issue 48): D_qk != D_v (MLA training's (192, 128), and
(128, 64)) and D = 512 / (576, 512), side by side with their equal-D neighbours, in one
process (GPU).

Methods per point: ``ta.sdpa``; cuDNN's frontend (``bench.cudnn_fe``, its graph built once
per shape); FlashAttention-4's ``flash_attn_func`` (``--fa4-site`` on
PYTHONPATH, else unavailable; [B, S, H, D]); torch SDPA (its own backend choice: cuDNN,
flash or memory-efficient, as a user gets it). Every output is checked against torch SDPA's
in fp32 first; kernel time by ``timing.time_cuda`` (L2 flushed); TFLOP/s by ``flops.
attention_flops`` (2·Sq·Skv·(D + D_v) per matmul pair); ratios to ``ta`` in the same run.
D > 256 is forward only (the library refuses its backward).

``--sweep fwd|bwd|both``: per shape and causal flag, our candidate schedules side by side
with the baselines in one process (``sweep_fwd_schedules``, ``sweep_bwd_schedules``:
the search spaces of ``schedules.space`` / ``schedules.backward``, only what their
rejection rules accept), each checked against torch in fp32 first (forward output, or
dQ, dK, dV), then one line per point with the best schedule, its ms and its speed
against the fastest baseline. ``--compile-only --shard i/N`` calls each candidate of
every N-th task once and times nothing, to fill ``$CUDA_TILE_CACHE_DIR`` from N
processes before the timed one (``benchmarks/gpu_batch.sh sweep-shapes``).

    python benchmarks/head_shapes.py [--fa4-site /tmp/fa4site] [--seq 4096] [--json out.json]
    python benchmarks/head_shapes.py --sweep both --shapes 192,128 512,512 [--compile-only
        --shard 0/14]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from varlen import backward_row, fa4, table  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.bench import cudnn_fe  # noqa: E402
from tiledattention.flops import attention_flops  # noqa: E402
from tiledattention.schedules.backward import bwd_candidates, bwd_space_for  # noqa: E402
from tiledattention.schedules.space import candidates, space_for  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402
from tiledattention.tolerance import relative_error, rtol_bwd  # noqa: E402

BF16 = torch.bfloat16
# (D_qk, D_v, heads, fwd+bwd): MLA's training shapes beside their equal-D neighbours, then
# the wide ones (forward only).
SHAPES = [(192, 128, 16, True), (192, 192, 16, True), (128, 128, 16, True),
          (128, 64, 16, True), (64, 64, 32, True), (512, 512, 8, False), (576, 512, 8, False)]
BASELINES = ("fa4", "cudnn_fe", "sdpa")
FWD_TOL = 2e-2
# The sweep's forward schedules beside the quick space: eight worker warps over the tiles
# a wide head needs (two consumer warp groups share the fp32 accumulator; past D 256 the
# only schedules that compile without spilling, benchmarks/notes/head-shapes.md §40d), at
# occupancy 1 and 2 and both latency pairs of the full space; ``space.candidates`` drops
# what does not fit (at D 512: 128-row and 128-key tiles, occupancy 2).
WIDE_TILES = ((64, 64), (64, 32), (128, 64), (64, 128), (128, 128))
# Per shape and pass; at D 192 the forward has 23 (the quick space's 9 first), the
# backward 5: every one fits (compile estimate in head-shapes.md §42b).
MAX_CANDIDATES = 24
SWEEPS = {"fwd": ("fwd",), "bwd": ("fwd+bwd",), "both": ("fwd", "fwd+bwd")}


def schedule_dim(dqk: int, dv: int) -> int:
    """The head dim a schedule is checked at: the wider of Q/K's and V's, as
    ``kernel.validate.schedule_head_dim`` checks an explicit schedule."""
    return max(dqk, dv)


def sweep_fwd_schedules(dqk: int, dv: int, limit: int = MAX_CANDIDATES) -> list:
    """The forward schedules the sweep times at (dqk, dv): the quick space's valid ones,
    then the wide extras (``WIDE_TILES``), no repeats, at most ``limit``."""
    d = schedule_dim(dqk, dv)
    wide, _ = candidates(d, tiles=WIDE_TILES, occupancies=(1, 2), worker_warps=(8,))
    return list(dict.fromkeys([*space_for(d, "quick"), *wide]))[:limit]


def sweep_bwd_schedules(dqk: int, dv: int, limit: int = MAX_CANDIDATES) -> list:
    """The backward schedules the sweep times at (dqk, dv): the quick backward space's
    valid ones, then ``bwd_candidates`` (issue 37's, e.g. dQ by reduce-add), at most
    ``limit``."""
    d = schedule_dim(dqk, dv)
    return list(dict.fromkeys([*bwd_space_for(d, "quick"),
                               *bwd_candidates(d).values()]))[:limit]


def parse_shapes(texts) -> list:
    """SHAPES' entries named ``D_qk,D_v`` (None: all); ValueError with one line."""
    if not texts:
        return list(SHAPES)
    known = {f"{e[0]},{e[1]}": e for e in SHAPES}
    bad = [t for t in texts if t not in known]
    if bad:
        raise ValueError(f"--shapes {' '.join(bad)}: not among the known D_qk,D_v pairs "
                         f"{' '.join(known)}")
    return [entry for name, entry in known.items() if name in texts]


def sweep_tasks(shapes, passes, limit: int = MAX_CANDIDATES) -> list:
    """(shape, causal, pass, schedule) of every kernel the sweep runs; schedule None is
    the policy's own (``ta``). A forward-only shape has no fwd+bwd task."""
    tasks = []
    for shape in shapes:
        dqk, dv, _, train = shape
        for causal in (False, True):
            for pass_ in passes:
                if pass_ == "fwd+bwd" and not train:
                    continue
                pick = sweep_fwd_schedules if pass_ == "fwd" else sweep_bwd_schedules
                tasks += [(shape, causal, pass_, s) for s in [None, *pick(dqk, dv, limit)]]
    return tasks


def methods(q, k, v, causal, fa):
    out = {"ta": lambda: ta.sdpa(q, k, v, is_causal=causal),
           "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    reason = cudnn_fe.import_error()
    out["cudnn_fe"] = (f"unavailable: {reason}" if reason
                       else lambda: cudnn_fe.sdpa(q, k, v, causal=causal))
    if callable(fa):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        out["fa4"] = lambda: fa(qt, kt, vt, causal=causal)[0].transpose(1, 2)
    else:
        out["fa4"] = fa
    return out


def leaves(dqk, dv, h, b, s, grad):
    """q, k, v of a point; leaves (``grad``) for varlen.backward_row's forward+backward."""
    q, k = (torch.randn(b, h, s, dqk, device="cuda", dtype=BF16, requires_grad=grad)
            for _ in range(2))
    v = torch.randn(b, h, s, dv, device="cuda", dtype=BF16, requires_grad=grad)
    return q, k, v


def forward_row(row, fn, ref, flush, flops):
    """A method's forward: checked against ``ref`` (fp32), then timed under no_grad."""
    if isinstance(fn, str):
        return dict(row, status=fn)
    try:
        with torch.no_grad():
            err = relative_error(fn(), ref)
            if not err <= FWD_TOL:
                return dict(row, status=f"wrong: rel err {err:.2e}")
            ms = summarize(time_cuda(fn, flush=flush)).median_ms
        return dict(row, status="ok", ms=ms, tflops=flops / ms / 1e9)
    except Exception as exc:  # noqa: BLE001 - one method's failure is a row
        return dict(row, status=f"error: {type(exc).__name__}: {exc}"[:160])


def point(dqk, dv, h, train, causal, b, s, fa, flush):
    q, k, v = leaves(dqk, dv, h, b, s, train)
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=causal)
    base = dict(d=dqk, dv=dv, h=h, causal=causal)
    rows = []
    fns = methods(q, k, v, causal, fa)
    flops = attention_flops(b, h, s, s, dqk, causal, "fwd", head_dim_v=dv)
    for name, fn in fns.items():
        rows.append(forward_row(dict(base, method=name, pass_="fwd"), fn, ref, flush, flops))
        if train and rows[-1]["status"] == "ok":
            # backward_row counts 3.5x the forward's FLOPs: attention_flops' fwd+bwd.
            rows.append(backward_row(dict(base, method=name), name, fns, flops, flush,
                                     q, k, v))
    return rows


def candidate_fn(pass_, schedule, q, k, v, causal):
    """Our call with ``schedule`` given explicitly, the path the tune stage takes: the
    forward's through ``sdpa(schedule=)``, the backward's pinned around the forward (its
    autograd context keeps it, ``kernel.plan.pinned_bwd_schedule``)."""
    if pass_ == "fwd":
        return partial(ta.sdpa, q, k, v, is_causal=causal, schedule=schedule)
    return partial(pinned_forward, schedule, q, k, v, causal)


def pinned_forward(bwd_schedule, q, k, v, causal):
    with ta.pinned_bwd_schedule(bwd_schedule):
        return ta.sdpa(q, k, v, is_causal=causal)


def grad_error(fn, qkv, ref_grads, dout) -> float:
    """The worst relative error of dQ, dK, dV of ``fn``'s output against fp32's."""
    for t in qkv:
        t.grad = None
    with torch.enable_grad():
        torch.autograd.backward(fn(), dout)
    err = max(relative_error(t.grad, r) for t, r in zip(qkv, ref_grads))
    for t in qkv:
        t.grad = None
    return err


def fp32_grads(qkv, causal, dout):
    ref = [t.detach().float().requires_grad_() for t in qkv]
    with torch.enable_grad():
        F.scaled_dot_product_attention(*ref, is_causal=causal).backward(dout.float())
    return [t.grad.double() for t in ref]


def backward_point_row(row, name, fns, flops, flush, qkv, ref_grads, dout):
    """A method's forward+backward: its gradients checked against fp32's, then timed."""
    fn = fns[name]
    if isinstance(fn, str):
        return dict(row, pass_="fwd+bwd", status=fn)
    try:
        err = grad_error(fn, qkv, ref_grads, dout)
    except Exception as exc:  # noqa: BLE001 - one method's failure is a row
        return dict(row, pass_="fwd+bwd", status=f"error: {type(exc).__name__}: {exc}"[:160])
    if not err <= rtol_bwd("bfloat16"):
        return dict(row, pass_="fwd+bwd", status=f"wrong: grad rel err {err:.2e}")
    return backward_row(row, name, fns, flops, flush, *qkv)


def sweep_point(shape, causal, passes, b, s, fa, flush, limit):
    """The rows of one (shape, causal): per pass the baselines, ``ta`` (the policy's
    schedule) and each candidate (method ``fwd@<label>`` / ``bwd@<label>``)."""
    dqk, dv, h, train = shape
    passes = [p for p in passes if train or p == "fwd"]
    qkv = leaves(dqk, dv, h, b, s, "fwd+bwd" in passes)
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(*(t.float() for t in qkv), is_causal=causal)
    flops = attention_flops(b, h, s, s, dqk, causal, "fwd", head_dim_v=dv)
    base = dict(d=dqk, dv=dv, h=h, causal=causal)
    rows = []
    for pass_ in passes:
        fns = methods(*qkv, causal, fa)
        pick, tag = ((sweep_fwd_schedules, "fwd") if pass_ == "fwd"
                     else (sweep_bwd_schedules, "bwd"))
        for sch in pick(dqk, dv, limit):
            fns[f"{tag}@{sch.label()}"] = candidate_fn(pass_, sch, *qkv, causal)
        if pass_ == "fwd":
            rows += [forward_row(dict(base, method=n, pass_=pass_), fn, ref, flush, flops)
                     for n, fn in fns.items()]
            continue
        dout = torch.randn_like(ref, dtype=BF16)
        grads = fp32_grads(qkv, causal, dout)
        rows += [backward_point_row(dict(base, method=n), n, fns, flops, flush, qkv, grads,
                                    dout) for n in fns]
    return rows


def best_line(rows) -> str:
    """The fastest candidate of one (shape, causal, pass), against the fastest baseline
    (speed: baseline ms / ours, issue 48's ratio) and against ``ta`` as it runs today."""
    ok = [r for r in rows if r["status"] == "ok"]
    r0 = rows[0]
    head = f"BEST {r0['d']}/{r0['dv']} {'causal' if r0['causal'] else 'full'} {r0['pass_']}:"
    mine = [r for r in ok if "@" in r["method"]]
    if not mine:
        return f"{head} no candidate ran"
    best = min(mine, key=lambda r: r["ms"])
    cells = [f"{best['method'].split('@')[1]} {best['ms']:.3f} ms"]
    bases = [r for r in ok if r["method"] in BASELINES]
    if bases:
        fast = min(bases, key=lambda r: r["ms"])
        cells.append(f"{fast['ms'] / best['ms']:.2f}x {fast['method']} ({fast['ms']:.3f} ms)")
    now = next((r for r in ok if r["method"] == "ta"), None)
    if now:
        cells.append(f"ta now {now['ms']:.3f} ms (best at {now['ms'] / best['ms']:.2f}x its speed)")
    failed = len([r for r in rows if "@" in r["method"] and r["status"] != "ok"])
    return f"{head} " + " | ".join(cells) + (f" | {failed} candidates failed" if failed else "")


def print_point(rows) -> None:
    """Baselines and ``ta`` on one line, the candidates fastest first on the next."""
    for pass_ in dict.fromkeys(r["pass_"] for r in rows):
        mine = [r for r in rows if r["pass_"] == pass_]
        fixed = [r for r in mine if "@" not in r["method"]]
        table(fixed, ["d", "dv", "h", "causal", "pass_"])
        tried = sorted((r for r in mine if "@" in r["method"]),
                       key=lambda r: r.get("ms", float("inf")))
        print("  " + " | ".join(f"{r['method']} {r['ms']:.3f}" if r.get("ms") else
                                f"{r['method']} {r['status'][:50]}" for r in tried))
        print(best_line(mine), flush=True)


def compile_only(tasks, b, s) -> int:
    """One call of each task's kernels (the forward, or forward and backward), nothing
    timed: the disk cache holds them for the timed process."""
    failed = 0
    for (dqk, dv, h, _), causal, pass_, sch in tasks:
        start = time.perf_counter()
        grad = pass_ == "fwd+bwd"
        qkv = leaves(dqk, dv, h, b, s, grad)
        fn = (candidate_fn(pass_, sch, *qkv, causal) if sch is not None
              else partial(ta.sdpa, *qkv, is_causal=causal))
        try:
            with torch.enable_grad() if grad else torch.no_grad():
                out = fn()
                if grad:
                    out.sum().backward()
            torch.cuda.synchronize()
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - the timed run reports it again as a row
            failed += 1
            status = f"error: {type(exc).__name__}: {exc}"[:160]
        print(f"{dqk}/{dv} causal={causal} {pass_} {sch.label() if sch else 'ta'}: "
              f"{time.perf_counter() - start:.1f} s {status}", flush=True)
    print(f"compiled {len(tasks)} tasks, {failed} failed")
    return 0


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text}: not I/N") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {text}: I must be in [0, N)")
    return i, n


def sweep(args, shapes) -> int:
    tasks = sweep_tasks(shapes, SWEEPS[args.sweep], args.max_candidates)
    if args.compile_only:
        i, n = parse_shard(args.shard)
        return compile_only(tasks[i::n], args.batch, args.seq)
    fa = fa4(args.fa4_site, "flash_attn_func")
    print("fa4:", "importable" if callable(fa) else fa)
    print(f"-- sweep {args.sweep}: B{args.batch} S{args.seq} bf16, {len(tasks)} kernels of "
          "ours; ms, speed = fastest baseline's ms / the best candidate's")
    flush = L2Flusher()
    rows, best = [], []
    for shape in shapes:
        for causal in (False, True):
            new = sweep_point(shape, causal, SWEEPS[args.sweep], args.batch, args.seq, fa,
                              flush, args.max_candidates)
            print_point(new)
            best += [best_line([r for r in new if r["pass_"] == p])
                     for p in dict.fromkeys(r["pass_"] for r in new)]
            rows += new
    print("-- best per point")
    print("\n".join(best))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fa4-site")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("--shapes", nargs="*", help="D_qk,D_v pairs to run (default: all)")
    ap.add_argument("--sweep", choices=sorted(SWEEPS),
                    help="time our candidate schedules per shape (fwd, fwd+bwd or both)")
    ap.add_argument("--max-candidates", type=int, default=MAX_CANDIDATES,
                    help="per shape and pass, the space's order kept")
    ap.add_argument("--compile-only", action="store_true",
                    help="with --sweep: run each kernel of this shard once, time nothing")
    ap.add_argument("--shard", default="0/1", help="I/N: every N-th sweep task from the I-th")
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
        parse_shard(args.shard)
        if args.compile_only and not args.sweep:
            raise ValueError("--compile-only compiles a sweep's kernels: give --sweep")
    except ValueError as exc:
        print(f"head_shapes.py: {exc}", file=sys.stderr)
        return 2
    if args.sweep:
        return sweep(args, shapes)
    fa = fa4(args.fa4_site, "flash_attn_func")
    print("fa4:", "importable" if callable(fa) else fa)
    flush = L2Flusher()
    rows = []
    print(f"-- B{args.batch} S{args.seq} bf16, ms (ratio to ta), each point as it ends")
    for dqk, dv, h, train in shapes:
        for causal in (False, True):
            new = point(dqk, dv, h, train, causal, args.batch, args.seq, fa, flush)
            table(new, ["d", "dv", "h", "causal", "pass_"])
            sys.stdout.flush()
            rows += new
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
