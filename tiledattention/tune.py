"""``tiledattn tune``: time candidate schedules per shape and persist the winners.

Every (point, schedule) measurement is appended to a JSON-lines state file and fsynced,
so a run killed at any moment resumes where it stopped. Compile failures and timeouts
are recorded, not fatal; a schedule whose output disagrees with the float64 reference
is rejected. The table written holds, per bucket, the winner, the runner-up and the
sensitivity (how much slower the runner-up is).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import torch

from .flops import attention_flops, tflops_per_s
from .schedules.policy import bucket_for
from .schedules.schedule import Schedule
from .schedules.space import candidates
from .schedules.table import Entry, ScheduleTable
from .timing import L2Flusher, summarize, time_cuda

PAPER_SEQS = (512, 1024, 2048, 4096, 8192)
PAPER_HEAD_DIMS = (64, 96, 128, 160)
QUICK_SPACE = (Schedule(64, 64, 4), Schedule(64, 64, 2), Schedule(64, 128, 2),
               Schedule(64, 128, 1), Schedule(64, 128, 3), Schedule(128, 64, 2),
               Schedule(128, 64, 1), Schedule(128, 128, 1))
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}


@dataclass(frozen=True)
class TunePoint:
    dtype: str
    head_dim: int
    causal: bool
    seq: int
    batch: int
    heads: int
    gqa: int = 1

    def key(self) -> str:
        return (f"{self.dtype}_d{self.head_dim}_{'causal' if self.causal else 'full'}"
                f"_s{self.seq}_b{self.batch}_h{self.heads}_g{self.gqa}")


def paper_grid(seqs=PAPER_SEQS, head_dims=PAPER_HEAD_DIMS, dtypes=("float16", "bfloat16"),
               causals=(False, True), tokens=16384, width=2048) -> list[TunePoint]:
    """B·S = tokens and H·D = width; H = 16 where width/D is not an integer (D=96, 160)."""
    return [TunePoint(dt, d, c, s, max(1, tokens // s), width // d if width % d == 0 else 16)
            for dt in dtypes for c in causals for d in head_dims for s in seqs]


class TuneState:
    """Append-only JSON-lines record of finished measurements."""

    def __init__(self, path: str):
        self.path = path
        self.rows: dict[tuple[str, str], dict] = {}
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut by a crash; its measurement is redone
                    self.rows[(row["point"], row["schedule"])] = row

    def done(self, point: TunePoint, schedule: Schedule) -> bool:
        return (point.key(), schedule.label()) in self.rows

    def record(self, row: dict) -> None:
        self.rows[(row["point"], row["schedule"])] = row
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def measure(point: TunePoint, schedule: Schedule, inputs, reference, *, warmup: int,
            reps: int, flush, compile_timeout: float) -> dict:
    import cuda.tile as ct

    from .api import sdpa

    q, k, v = inputs
    row = {"point": point.key(), "schedule": schedule.label(), **asdict(point),
           "schedule_fields": schedule.as_dict()}
    call = functools.partial(sdpa, q, k, v, causal=point.causal, schedule=schedule,
                             enable_gqa=point.gqa > 1)
    try:
        with ct.compiler_timeout(compile_timeout):
            start = time.perf_counter()
            out = call()
            torch.cuda.synchronize()
            row["first_call_s"] = time.perf_counter() - start
    except Exception as exc:  # compile error or timeout: a result, not a crash
        timeout = "timeout" in str(exc).lower()
        return {**row, "status": "compile_timeout" if timeout else "compile_error",
                "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    got = out[:1, :2].double()
    err = ((got - reference).norm() / reference.norm()).item()
    row["rel_err"] = err
    if not err <= TOLERANCE[point.dtype]:
        return {**row, "status": "wrong"}
    st = summarize(time_cuda(call, warmup=warmup, reps=reps, flush=flush))
    flops = attention_flops(point.batch, point.heads, point.seq, point.seq, point.head_dim,
                            point.causal)
    return {**row, "status": "ok", "tflops": tflops_per_s(flops, st.median_ms),
            **{f"t_{k}": v for k, v in st.as_dict().items()}}


def build_table(points, state: TuneState, cc: str, gpu: str) -> ScheduleTable:
    table = ScheduleTable(meta={"gpu": gpu, "cc": cc, "torch": torch.__version__})
    for p in points:
        rows = [r for (key, _), r in state.rows.items() if key == p.key()]
        ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["tflops"])
        if not ok:
            continue
        bucket = bucket_for(cc=cc, dtype=getattr(torch, p.dtype), head_dim=p.head_dim,
                            causal=p.causal, seq_q=p.seq, seq_kv=p.seq, gqa=p.gqa)
        second = ok[1] if len(ok) > 1 else None
        table.add(Entry(
            bucket=bucket, best=Schedule.from_dict(ok[0]["schedule_fields"]),
            best_tflops=ok[0]["tflops"],
            runner_up=Schedule.from_dict(second["schedule_fields"]) if second else None,
            runner_up_tflops=second["tflops"] if second else None, gpu=gpu,
            candidates=len(rows),
            failed=tuple(f"{r['schedule']}:{r['status']}" for r in rows if r["status"] != "ok"),
        ))
    return table


def run_tune(points, *, space: str, state_path: str, out_path: str, warmup: int = 5,
             reps: int = 20, compile_timeout: float = 120.0, log=sys.stderr) -> int:
    from .reference import naive_attention

    if not torch.cuda.is_available():
        print("tiledattn tune: no CUDA GPU visible; tuning measures on a GPU", file=log)
        return 2
    gpu = torch.cuda.get_device_name()
    cc = "{}.{}".format(*torch.cuda.get_device_capability())
    state = TuneState(state_path)
    flush = L2Flusher()
    plan = [(p, space_for(p.head_dim, space)) for p in points]
    total = sum(len(c) for _, c in plan)
    done = sum(state.done(p, s) for p, c in plan for s in c)
    print(f"tune: {len(points)} points, {total} measurements, {done} already in {state_path}",
          file=log, flush=True)
    try:
        for p, cands in plan:
            todo = [s for s in cands if not state.done(p, s)]
            if not todo:
                continue
            dtype = getattr(torch, p.dtype)
            q = torch.randn(p.batch, p.heads, p.seq, p.head_dim, device="cuda", dtype=dtype)
            k, v = (torch.randn(p.batch, p.heads // p.gqa, p.seq, p.head_dim, device="cuda",
                                dtype=dtype) for _ in range(2))
            ref, _ = naive_attention(q[:1, :2], k[:1, : max(1, 2 // p.gqa)],
                                     v[:1, : max(1, 2 // p.gqa)], causal=p.causal)
            for s in todo:
                row = measure(p, s, (q, k, v), ref, warmup=warmup, reps=reps, flush=flush,
                              compile_timeout=compile_timeout)
                state.record(row)
                done += 1
                rate = f"{row['tflops']:.0f} TFLOP/s" if row["status"] == "ok" else row["status"]
                print(f"[{done}/{total}] {p.key()} {s.label()} {rate}", file=log, flush=True)
    except KeyboardInterrupt:
        print("tune: interrupted; finished measurements are kept, rerun to resume", file=log)
        build_table(points, state, cc, gpu).save(out_path)
        return 130
    table = build_table(points, state, cc, gpu)
    table.save(out_path)
    print(f"tune: wrote {len(table.entries)} buckets to {out_path}", file=log)
    return 0


def space_for(head_dim: int, space: str) -> list[Schedule]:
    from .schedules.space import rejection

    if space == "quick":
        return [s for s in QUICK_SPACE if rejection(s, head_dim) is None]
    if space == "full":
        return candidates(head_dim)[0]
    raise ValueError(f"unknown search space {space!r}; valid: 'quick', 'full'")


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
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
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
