"""Tune the backward's schedule on a GPU over a small grid, merged into a schedule table.

    python benchmarks/tune_backward.py --table tiledattention/schedules/tables/h100.json.gz \\
        --out $OUT/h100.json.gz --state $OUT/tune-bwd-state.jsonl [--seqs 1024 4096] \\
        [--head-dims 64 96 128 160] [--dtypes float16 bfloat16] [--workers 14]

Two steps. (1) Compile: every (dtype, D, causal, candidate) runs one forward+backward of its
point in one of ``--workers`` processes with the candidate pinned, so cuTile's disk cache
(``$CUDA_TILE_CACHE_DIR``) holds every kernel before timing starts (serially the ~100
variants take ~15 min; compiling is CPU-bound, the GPU idles). (2) Measure: ``tune.run_tune``
with the fwd+bwd pass, through the harness like ``tiledattn tune --pass fwd+bwd``, into a
copy of ``--table`` whose forward entries are kept; the backward winners become its
``backward`` entries. The state file resumes a stopped run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

T0 = time.time()


def log(*parts):
    print(f"[{time.time() - T0:6.1f}s]", *parts, flush=True)


def _warm(tasks):
    import cuda.tile as ct
    import torch

    import tiledattention as ta
    from tiledattention.kernel.plan import pinned_bwd_schedule
    from tiledattention.schedules.backward import BwdSchedule

    bad = []
    for dtype, d, causal, label, b, h, s, timeout in tasks:
        try:
            with ct.compiler_timeout(timeout):
                q = torch.randn(b, h, s, d, device="cuda", dtype=getattr(torch, dtype),
                                requires_grad=True)
                with pinned_bwd_schedule(BwdSchedule.from_label(label)):
                    ta.sdpa(q, q, q, causal=causal).sum().backward()
                torch.cuda.synchronize()
        except Exception as exc:  # recorded; the tune run records it again as a row
            bad.append(f"{dtype} d{d} causal={causal} {label}: {type(exc).__name__} "
                       f"{str(exc)[:160]}")
    return bad


def precompile(plan, workers: int, timeout: float) -> None:
    from tiledattention.bench.grid import pinned_bwd_label

    seen = {}
    for p, methods in plan:
        for m in methods:
            key = (p.dtype, p.head_dim, p.causal, pinned_bwd_label(m))
            seen.setdefault(key, (p.batch, p.heads, p.seq_q, timeout))
    tasks = [k + v for k, v in seen.items()]
    chunks = [tasks[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        bad = sum(pool.map(_warm, chunks), [])
    log(f"precompiled {len(tasks)} backward variants, {len(bad)} failed", *bad[:8])


def summary(points, rows) -> None:
    """Per point: each candidate's fwd+bwd TFLOP/s (or status), the winner first."""
    import dataclasses

    from tiledattention.bench.grid import pinned_bwd_label

    for p in points:
        key = dataclasses.replace(p, pass_="fwd+bwd").key()
        mine = [r for r in rows if r["point_key"] == key and pinned_bwd_label(r["method"])]
        mine.sort(key=lambda r: -(r.get("tflops") or 0))
        cells = [f"{pinned_bwd_label(r['method'])}="
                 + (f"{r['tflops']:.0f}" if r["status"] == "ok" else r["status"]) for r in mine]
        print(f"{key:48s} " + " ".join(cells), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True, help="table whose forward entries are kept")
    ap.add_argument("--out", required=True, help="merged table to write")
    ap.add_argument("--state", required=True, help="the harness' row file (resumes)")
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 96, 128, 160])
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--space", default="quick")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--compile-timeout", type=float, default=90.0)
    args = ap.parse_args()

    import torch

    from tiledattention.bench import runner
    from tiledattention.bench.store import ResultStore
    from tiledattention.schedules.table import ScheduleTable
    from tiledattention.stages.tune import paper_grid, run_tune, tune_plan

    log("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    points = paper_grid(seqs=args.seqs, head_dims=args.head_dims, dtypes=args.dtypes)
    plan = tune_plan(points, args.space, "fwd+bwd")
    precompile(plan, args.workers, args.compile_timeout)
    if os.path.abspath(args.table) != os.path.abspath(args.out):
        ScheduleTable.load(args.table).save(args.out)  # .json or .json.gz either side
    runner.CALL_ROUND_S = 0.005  # tuning ranks by kernel time: short call-latency rounds
    code = run_tune(points, space=args.space, state_path=args.state, out_path=args.out,
                    reps=args.reps, compile_timeout=args.compile_timeout, pass_="fwd+bwd",
                    log=sys.stdout)
    summary(points, list(ResultStore(args.state).rows.values()))
    log("tune exit", code)
    return code


if __name__ == "__main__":
    sys.exit(main())
