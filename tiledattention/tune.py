"""``tiledattn tune``: time candidate schedules per shape and persist the winners.

Tuning is a client of the benchmark harness: each candidate is a pinned-schedule method
(``tiledattention@<label>``), measured by ``bench.runner.measure`` like any benchmark
(identical inputs per point, float64 reference, interleaved rounds, L2 flushed), and its
state file is the harness' row store, so a run killed at any moment resumes where it
stopped. A compile failure or timeout is a row with status ``error``, a wrong output a
row with status ``wrong``; neither stops the run. What tuning adds: the candidate space
and the table written per bucket (winner, runner-up and the sensitivity, how much slower
the runner-up is).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .bench.config import BenchConfig, GridConfig, TimingConfig
from .bench.grid import (
    PAPER_DTYPES,
    PAPER_HEAD_DIMS,
    PAPER_SEQS,
    Point,
    expand,
    pinned,
    pinned_label,
)
from .bench.runner import measure, resolve_device
from .bench.store import ResultStore
from .schedules.policy import bucket_for
from .schedules.schedule import Schedule
from .schedules.space import space_for
from .schedules.table import Entry, ScheduleTable

ROUNDS = 2  # candidates interleaved round by round, order alternating


def paper_grid(seqs=PAPER_SEQS, head_dims=PAPER_HEAD_DIMS, dtypes=PAPER_DTYPES) -> list[Point]:
    """The paper's grid (bench.grid's tokens policy), optionally restricted."""
    grid = GridConfig(seqs=tuple(seqs), head_dims=tuple(head_dims), dtypes=tuple(dtypes))
    return expand(BenchConfig(grid=grid))


def tune_plan(points: Iterable[Point], space: str) -> list[tuple[Point, list[str]]]:
    """Per point, the candidates of the space as pinned-schedule methods."""
    return [(p, [pinned(s.label()) for s in space_for(p.head_dim, space)]) for p in points]


def tune_config(*, warmup: int, reps: int) -> BenchConfig:
    """The harness settings tuning measures with (the grid comes from the plan)."""
    return BenchConfig(methods=("tiledattention",), device="cuda",
                       timing=TimingConfig(warmup=warmup, reps=reps, rounds=ROUNDS))


def build_table(points: Iterable[Point], rows: Iterable[dict], cc: str,
                gpu: str) -> ScheduleTable:
    """Per point's bucket: the fastest correct candidate, the runner-up, the failures."""
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        if pinned_label(r["method"]) is not None:
            by_point.setdefault(r["point_key"], []).append(r)
    table = ScheduleTable(meta={"gpu": gpu, "cc": cc, "torch": torch.__version__})
    for p in points:
        tried = by_point.get(p.key(), [])
        ok = sorted((r for r in tried if r["status"] == "ok"), key=lambda r: -r["tflops"])
        if not ok:
            continue
        best, second = ok[0], (ok[1] if len(ok) > 1 else None)
        table.add(Entry(
            bucket=bucket_for(cc=cc, dtype=p.dtype, head_dim=p.head_dim, causal=p.causal,
                              seq_q=p.seq_q, seq_kv=p.seq_kv, gqa=p.gqa),
            best=Schedule.from_label(pinned_label(best["method"])),
            best_tflops=best["tflops"],
            runner_up=Schedule.from_label(pinned_label(second["method"])) if second else None,
            runner_up_tflops=second["tflops"] if second else None, gpu=gpu,
            candidates=len(tried),
            failed=tuple(f"{pinned_label(r['method'])}:{r['status']}" for r in tried
                         if r["status"] != "ok"),
        ))
    return table


def _compiler_timeout(seconds: float):
    try:
        import cuda.tile as ct
    except ImportError:  # the tiledattention method reports the missing toolchain
        return contextlib.nullcontext()
    return ct.compiler_timeout(seconds)


def run_tune(points, *, space: str, state_path: str, out_path: str, warmup: int = 5,
             reps: int = 20, compile_timeout: float = 120.0, log=sys.stderr) -> int:
    if not torch.cuda.is_available():
        print("tiledattn tune: no CUDA GPU visible; tuning measures on a GPU", file=log)
        return 2
    gpu = torch.cuda.get_device_name()
    cc = "{}.{}".format(*torch.cuda.get_device_capability())
    points = list(points)
    plan = tune_plan(points, space)
    store = ResultStore(state_path)
    total = sum(len(methods) for _, methods in plan)
    done = sum(store.done(p.key(), m) for p, methods in plan for m in methods)
    print(f"tune: {len(points)} points, {total} measurements, {done} already in {state_path}",
          file=log, flush=True)
    with _compiler_timeout(compile_timeout):
        stopped = measure(plan, tune_config(warmup=warmup, reps=reps), store,
                          resolve_device("cuda"), log)
    table = build_table(points, store.rows.values(), cc, gpu)
    table.save(out_path)
    if stopped:
        print("tune: interrupted; finished measurements are kept, rerun to resume", file=log)
        return 130
    print(f"tune: wrote {len(table.entries)} buckets to {out_path}", file=log)
    return 0


def no_gpu_reason() -> str | None:
    """Why tuning cannot measure here (None where a CUDA GPU is visible)."""
    if torch.cuda.is_available():
        return None
    import socket

    return f"no CUDA GPU visible on {socket.gethostname()}"


@dataclass(frozen=True)
class TuneTask:
    """``run_tune`` as a picklable job, so a launcher puts it on a GPU (a SLURM GPU node,
    a local GPU). Without a GPU it writes an empty table whose ``meta.unavailable`` says
    why, and the study goes on (Table 5 and the bundle README report it); a requeued job
    resumes from the state file."""

    out_path: str
    state_path: str
    space: str = "quick"
    seqs: tuple[int, ...] = PAPER_SEQS
    head_dims: tuple[int, ...] = PAPER_HEAD_DIMS
    dtypes: tuple[str, ...] = PAPER_DTYPES
    reps: int = 20
    compile_timeout: float = 120.0
    job_name: str = "tiledattn-tune"

    def __call__(self) -> dict:
        for path in (self.state_path, self.out_path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        reason = no_gpu_reason()
        if reason:
            ScheduleTable(meta={"unavailable": reason}).save(self.out_path)
            print(f"tune: not run: {reason}", file=sys.stderr)
            return {"status": "unavailable", "reason": reason, "out": self.out_path}
        points = paper_grid(seqs=self.seqs, head_dims=self.head_dims, dtypes=self.dtypes)
        code = run_tune(points, space=self.space, state_path=self.state_path,
                        out_path=self.out_path, reps=self.reps,
                        compile_timeout=self.compile_timeout)
        if code != 0:
            raise RuntimeError(f"tiledattn tune stopped with exit code {code}")
        return {"status": "ok", "out": self.out_path}

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self)
