"""``tiledattn tune``: time candidate schedules per shape and persist the winners.

Tuning is a client of the benchmark harness: each candidate is a pinned-schedule method
(``tiledattention@<label>``), measured by ``bench.runner.measure`` like any benchmark
(identical inputs per point, float64 reference, interleaved rounds, L2 flushed), and its
state file is the harness' row store, so a run killed at any moment resumes where it
stopped. A compile failure or timeout is a row with status ``error``, a wrong output a
row with status ``wrong``; neither stops the run. What tuning adds: the candidate space
and the table written per bucket (winner, runner-up and the sensitivity, how much slower
the runner-up is).

``--pass fwd+bwd`` tunes the backward's schedule the same way: each candidate is a
pinned-backward method (``tiledattention@bwd:<label>``, the forward as the table picks it)
timed with the fwd+bwd pass, and the winners become the table's ``backward`` entries. A
run writing into an existing table keeps the half it did not tune (a backward run keeps
the forward entries and meta, a forward run keeps the backward entries).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ..bench.config import (
    INT32,
    BenchConfig,
    GridConfig,
    TimingConfig,
    option,
    section_from_dict,
)
from ..bench.grid import (
    PAPER_DTYPES,
    PAPER_HEAD_DIMS,
    PAPER_SEQS,
    TUNE_PASSES,
    Point,
    expand,
    pinned,
    pinned_bwd,
    pinned_bwd_label,
    pinned_label,
)
from ..bench.store import ResultStore, check_rows
from ..errors import ConfigError
from ..schedules.backward import BwdSchedule, bwd_space_for
from ..schedules.schedule import Schedule
from ..schedules.space import space_for
from ..schedules.table import Entry, ScheduleTable, TableError
from .base import (
    Cli,
    Publish,
    Stage,
    count,
    field_options,
    given,
    json_object,
    launcher_option,
    one_line,
    results_file,
    seconds,
)

# The stage's config section: one frozen dataclass, from which the workflow schema's section
# is generated, the workflow validates the config's section once (``stage_from_dict``) and
# the rule's command line is written (``stage_args``); ``tiledattn tune`` takes its
# defaults from here.
TUNE_SPACES = ("quick", "full")  # schedules.space.SPACES (tests/test_schema.py)


@dataclass(frozen=True)
class TuneConfig:
    """Optional schedule tuning (Table 5), as one launcher job (`tiledattn tune`)."""

    enabled: bool = option(False, "Run `tiledattn tune` and write a schedule table (one launcher "
                           "job: a GPU node under SLURM, a free local GPU; where it finds no GPU "
                           "the table records why).")
    space: str = option("quick", "Candidate schedules to time per shape (quick: 8 that won in "
                        "sweeps; full: every one).", choices=TUNE_SPACES, flag="--space")
    seqs: tuple[int, ...] | None = option(None, "Restrict tuning to these S values (null: the "
                                          "paper's 512..8192).", min=1, max=INT32,
                                          flag="--seqs")
    head_dims: tuple[int, ...] | None = option(None, "Restrict tuning to these head dims (null: "
                                               "64, 96, 128, 160).", min=8, max=INT32,
                                               flag="--head-dims")
    dtypes: tuple[str, ...] | None = option(None, "Restrict tuning to these dtypes (null: "
                                            "both).", choices=PAPER_DTYPES, flag="--dtypes")
    passes: tuple[str, ...] = option(("fwd",), "What is tuned, in order, into one table - fwd, "
                                     "the forward's schedules (Table 5); fwd+bwd, the backward's, "
                                     "timed with forward and backward (the table's backward "
                                     "entries).", choices=TUNE_PASSES, unique=True, flag="--pass")

    def as_dict(self) -> dict:
        return asdict(self)

    def task(self, out_path: str, state_path: str, reps: int = 20,
             compile_timeout: float = 120.0):
        """The stage's launcher job (a GPU node under SLURM, a free local GPU)."""
        return TuneTask(out_path, state_path, self.space, self.seqs or PAPER_SEQS,
                        self.head_dims or PAPER_HEAD_DIMS, self.dtypes or PAPER_DTYPES, reps,
                        compile_timeout, passes=self.passes)


ROUNDS = 2  # candidates interleaved round by round, order alternating


def paper_grid(seqs=PAPER_SEQS, head_dims=PAPER_HEAD_DIMS, dtypes=PAPER_DTYPES) -> list[Point]:
    """The paper's grid (bench.grid's tokens policy), optionally restricted."""
    grid = GridConfig(seqs=tuple(seqs), head_dims=tuple(head_dims), dtypes=tuple(dtypes))
    return expand(BenchConfig(grid=grid))


def tune_plan(points: Iterable[Point], space: str,
              pass_: str = "fwd") -> list[tuple[Point, list[str]]]:
    """Per point, the candidates of the space as pinned-schedule methods: the forward's
    schedules, or with ``pass_="fwd+bwd"`` the backward's, timed with that pass."""
    if pass_ not in TUNE_PASSES:
        raise ConfigError(f"tune pass {pass_!r} is not one of {list(TUNE_PASSES)}")
    if pass_ == "fwd":
        return [(p, [pinned(s.label()) for s in space_for(p.head_dim, space)]) for p in points]
    return [(dataclasses.replace(p, pass_=pass_),
             [pinned_bwd(s.label()) for s in bwd_space_for(p.head_dim, space)]) for p in points]


def tune_config(*, warmup: int, reps: int) -> BenchConfig:
    """The harness settings tuning measures with (the grid comes from the plan)."""
    return BenchConfig(methods=("tiledattention",), device="cuda",
                       timing=TimingConfig(warmup=warmup, reps=reps, rounds=ROUNDS))


def _ranked(rows: Iterable[dict], label_of) -> dict[str, list[dict]]:
    """Rows of the candidates ``label_of`` recognises, per point key."""
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        if label_of(r["method"]) is not None:
            by_point.setdefault(r["point_key"], []).append(r)
    return by_point


def _fwd_label(method: str) -> str | None:
    return None if pinned_bwd_label(method) is not None else pinned_label(method)


def build_table(points: Iterable[Point], rows: Iterable[dict], cc: str,
                gpu: str) -> ScheduleTable:
    """Per point's bucket: the fastest correct candidate, the runner-up, the failures —
    forward entries from pinned forward schedules, backward entries from pinned backward
    ones (rows of the points' fwd+bwd keys)."""
    rows = list(rows)
    import torch

    from ..schedules.policy import bucket_for  # torch: loaded where a table is built

    table = ScheduleTable(meta={"gpu": gpu, "cc": cc, "torch": torch.__version__})
    for label_of, parse, pass_ in ((_fwd_label, Schedule.from_label, "fwd"),
                                   (pinned_bwd_label, BwdSchedule.from_label, "fwd+bwd")):
        by_point = _ranked(rows, label_of)
        for p in points:
            tried = by_point.get(dataclasses.replace(p, pass_=pass_).key(), [])
            ok = sorted((r for r in tried if r["status"] == "ok"), key=lambda r: -r["tflops"])
            if not ok:
                continue
            best, second = ok[0], (ok[1] if len(ok) > 1 else None)
            table.add(Entry(
                bucket=bucket_for(cc=cc, dtype=p.dtype, head_dim=p.head_dim, causal=p.causal,
                                  seq_q=p.seq_q, seq_kv=p.seq_kv, gqa=p.gqa),
                best=parse(label_of(best["method"])), best_tflops=best["tflops"],
                runner_up=parse(label_of(second["method"])) if second else None,
                runner_up_tflops=second["tflops"] if second else None, gpu=gpu,
                candidates=len(tried),
                failed=tuple(f"{label_of(r['method'])}:{r['status']}" for r in tried
                             if r["status"] != "ok"),
            ))
    return table


def merge_into(path: str, tuned: ScheduleTable, pass_: str) -> ScheduleTable:
    """``tuned``'s half (forward or backward entries) over the table at ``path``, bucket by
    bucket: a bucket tuned now replaces its entry, every other entry is kept (the other
    half, and buckets this run did not tune or found no correct candidate for), so no run
    ever empties a table; ``tuned`` alone when no file."""
    if not os.path.exists(path):
        return tuned
    old = ScheduleTable.load(path)
    if pass_ == "fwd":
        meta = {k: v for k, v in {**old.meta, **tuned.meta}.items() if k != "unavailable"}
        return ScheduleTable(entries={**old.entries, **tuned.entries}, meta=meta,
                             backward=old.backward)
    meta = {**old.meta, "backward": {k: tuned.meta.get(k) for k in ("gpu", "cc", "torch")}}
    return ScheduleTable(entries=old.entries, meta=meta,
                         backward={**old.backward, **tuned.backward})


def _compiler_timeout(seconds: float):
    try:
        import cuda.tile as ct
    except ImportError:  # the tiledattention method reports the missing toolchain
        return contextlib.nullcontext()
    return ct.compiler_timeout(seconds)


def run_tune(points, *, space: str, state_path: str, out_path: str, warmup: int = 5,
             reps: int = 20, compile_timeout: float = 120.0, pass_: str = "fwd",
             log=sys.stderr) -> int:
    if os.path.exists(out_path):  # merged into after measuring: refuse a bad one first
        try:
            ScheduleTable.load(out_path)
        except TableError as exc:
            print(f"tiledattn tune: --out {exc}", file=log)
            return 2
    import torch

    from ..bench.runner import measure, resolve_device

    if not torch.cuda.is_available():
        print("tiledattn tune: no CUDA GPU visible; tuning measures on a GPU", file=log)
        return 2
    gpu = torch.cuda.get_device_name()
    cc = "{}.{}".format(*torch.cuda.get_device_capability())
    points = list(points)
    plan = tune_plan(points, space, pass_)
    store = ResultStore(state_path)
    check_rows(list(store.rows.values()), state_path, store.conflicts)  # they pick winners
    total = sum(len(methods) for _, methods in plan)
    done = sum(store.done(p.key(), m) for p, methods in plan for m in methods)
    print(f"tune: {len(points)} points, {total} measurements, {done} already in {state_path}",
          file=log, flush=True)
    with _compiler_timeout(compile_timeout):
        stopped = measure(plan, tune_config(warmup=warmup, reps=reps), store,
                          resolve_device("cuda"), log)
    table = build_table(points, store.rows.values(), cc, gpu)
    tuned = len(table.entries if pass_ == "fwd" else table.backward)
    table = merge_into(out_path, table, pass_)
    table.save(out_path)
    if stopped:
        print("tune: interrupted; finished measurements are kept, rerun to resume", file=log)
        return 130
    half = "forward" if pass_ == "fwd" else "backward"
    print(f"tune: wrote {tuned} {half} buckets to {out_path}", file=log)
    return 0


def run_passes(points, *, passes: Iterable[str], **kwargs) -> int:
    """``run_tune`` for each pass in order into the same table (the state file holds both:
    a point's key names its pass); the first exit code other than 0 stops it."""
    points = list(points)
    for pass_ in passes:
        code = run_tune(points, pass_=pass_, **kwargs)
        if code != 0:
            return code
    return 0


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
    passes: tuple[str, ...] = ("fwd",)

    def __call__(self) -> dict:
        for path in (self.state_path, self.out_path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        from ..bench.runner import no_gpu_reason

        reason = no_gpu_reason()
        if reason:
            if os.path.lexists(self.out_path):  # a table tuned before: never replaced by none
                reason += f"; {self.out_path} is kept as it was"
            else:
                ScheduleTable(meta={"unavailable": reason}).save(self.out_path)
            print(f"tune: not run: {reason}", file=sys.stderr)
            return {"status": "unavailable", "reason": reason, "out": self.out_path}
        points = paper_grid(seqs=self.seqs, head_dims=self.head_dims, dtypes=self.dtypes)
        code = run_passes(points, passes=self.passes, space=self.space,
                          state_path=self.state_path, out_path=self.out_path, reps=self.reps,
                          compile_timeout=self.compile_timeout)
        if code != 0:
            raise RuntimeError(f"tiledattn tune stopped with exit code {code}")
        return {"status": "ok", "out": self.out_path}

    def checkpoint(self, *args, **kwargs):
        # submitit calls this on preemption / time limit: requeue the same task.
        from ..launchers import jobenv

        return jobenv.requeue(self)


def _run(cfg: TuneConfig, out_path: str, state_path: str, **kwargs) -> int:
    """The stage's in-process run: its config's grid through every pass in order."""
    return run_passes(paper_grid(seqs=cfg.seqs or PAPER_SEQS,
                                 head_dims=cfg.head_dims or PAPER_HEAD_DIMS,
                                 dtypes=cfg.dtypes or PAPER_DTYPES),
                      passes=cfg.passes, space=cfg.space, state_path=state_path,
                      out_path=out_path, **kwargs)


# `tiledattn tune`: its options (its config's fields, ``base.field_options``; the harness
# settings and the files below are no config field) and its handler.
def add_arguments(p) -> None:
    p.add_argument("--grid", choices=("paper",), default="paper",
                   help="paper: S x D x fp16/bf16 x causal/not, B*S = 16384, H*D = 2048")
    field_options(p, TuneConfig)
    p.add_argument("--state", default="results/tune-state.jsonl",
                   help="the harness' row file of finished measurements (resume from it)")
    p.add_argument("--out", default="results/schedule-table.json", help="tuning table to write")
    p.add_argument("--reps", type=count(1), default=20, help="timed calls per candidate")
    p.add_argument("--compile-timeout", type=seconds, default=120.0,
                   help="seconds a candidate may compile before it is recorded as failed")
    launcher_option(p)


def _tune(args) -> int:
    import os

    cfg = section_from_dict(TuneConfig, "tune", given(args, TuneConfig))
    if args.launcher:
        return _tune_through_launcher(args, cfg)
    for path in (args.state, args.out):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return _run(cfg, args.out, args.state, reps=args.reps,
                compile_timeout=args.compile_timeout)


def _tune_through_launcher(args, cfg: TuneConfig) -> int:
    import os

    from ..launchers import run_step

    task = cfg.task(os.path.abspath(args.out), os.path.abspath(args.state), args.reps,
                    args.compile_timeout)
    folder = os.path.join(os.path.dirname(task.out_path), "logs")
    options = json_object(args.launcher_options, "--launcher-options")
    result = run_step(args.launcher, options, folder, task)
    if result["status"] != "ok":
        print(f"tiledattn tune: not run: {result['reason']}", file=sys.stderr)
    return 0


# `tiledattn tune --help`
HELP = ("time candidate schedules per shape bucket on this GPU and write the tuning table "
        "(resumable)")


def not_run(out_dir: str, checked) -> list[str]:
    """The bundle README's bullet where the tuning table records why it did not run
    (``checked``: the study's guard on a path it reads)."""
    path = results_file(out_dir, "schedule-table.json", checked)
    why = path and ScheduleTable.load(path).meta.get("unavailable")
    return [f"- tuning (Table 5): not run: {one_line(why)}"] if why else []


STAGE = Stage("tune", TuneConfig, _run, TuneTask,
              publish=Publish(copies=("schedule-table.json",), not_run=not_run),
              cli=Cli(HELP, add_arguments, _tune))
