"""Running a benchmark grid: inputs, correctness, interleaved timing, one row per method."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import time

import torch

from ..flops import tflops_per_s
from ..launchers import jobenv
from ..timing import L2Flusher, as_cuda_graph, summarize, time_calls, time_cpu, time_cuda
from ..tolerance import RTOL, relative_error, rtol_bwd
from .clock import ClockSampler
from .config import FP8, BenchConfig
from .grid import Point, expand, left_out, shard
from .manifest import capture, now
from .methods import Unavailable, Unsupported, fp8_unsupported, get_method
from .store import Lock, ResultStore, RowsError, check_rows
from .variant_cases import reference_kwargs

FORMAT = "tiledattention-bench-row/1"
# Call latency: back-to-back calls per round, enough for ~50 ms at the point's fastest
# kernel time (the end-of-round synchronisation then costs under 1%), within bounds.
CALL_ROUND_S = 0.05
CALL_BOUNDS = (10, 2000)


def no_gpu_reason() -> str | None:
    """Why a GPU stage cannot measure here (None where a CUDA GPU is visible)."""
    if torch.cuda.is_available():
        return None
    import socket

    return f"no CUDA GPU visible on {socket.gethostname()}"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from ..errors import NoGPUError

        raise NoGPUError("device: cuda was requested but no CUDA GPU is visible")
    return torch.device(name)


def _seed_for(seed: int, point: Point) -> int:
    # Identical inputs for every method of a point, different across points.
    return int(hashlib.sha256(f"{seed}:{point.key()}".encode()).hexdigest()[:8], 16)


def make_inputs(point: Point, seed: int, device: torch.device):
    """q, k, v of ``point``, seeded by its key (an FP8 point: its bfloat16 twin's, which
    ``fp8_inputs`` then quantizes)."""
    if point.dtype == FP8:
        point = dataclasses.replace(point, dtype="bfloat16")
    gen = torch.Generator(device=device).manual_seed(_seed_for(seed, point))
    dtype = getattr(torch, point.dtype)

    def rand(heads, seq, dim=point.head_dim):
        return torch.randn(point.batch, heads, seq, dim, generator=gen,
                           device=device, dtype=dtype)

    return rand(point.heads, point.seq_q), rand(point.heads_kv, point.seq_kv), \
        rand(point.heads_kv, point.seq_kv, point.value_dim)


def fp8_inputs(q, k, v):
    """An FP8 point's inputs: each of q, k, v quantized to e4m3 with its per-tensor descale
    (``reference.quantized``); returns ((q8, k8, v8), (dq, dk, dv))."""
    from ..reference import quantized

    pairs = [quantized(t) for t in (q, k, v)]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def _ref_slice(point: Point, max_heads: int) -> tuple[int, int]:
    """(query heads, kv heads) of batch 0 that the reference covers."""
    hq = max(point.gqa, min(point.heads, max_heads) // point.gqa * point.gqa)
    return hq, hq // point.gqa


def reference(q, k, v, point: Point, max_heads: int, descale=None):
    """The float64 output on the reference slice; FP8 inputs (``descale`` given) are
    dequantized first: the reference is exact attention of what the kernels were given."""
    from ..reference import dequantized, naive_attention

    hq, hk = _ref_slice(point, max_heads)
    q, k, v = q[:1, :hq], k[:1, :hk], v[:1, :hk]
    if descale is not None:
        q, k, v = (dequantized(t, d, t.shape[1]) for t, d in zip((q, k, v), descale))
    ref, _ = naive_attention(q, k, v, **reference_kwargs(point, q.device))
    return ref, hq


def make_dout(point: Point, seed: int, device: torch.device):
    """The upstream gradient dO of a backward pass (seeded like the inputs; V's head dim)."""
    gen = torch.Generator(device=device).manual_seed(_seed_for(seed + 1, point))
    return torch.randn(point.batch, point.heads, point.seq_q, point.value_dim, generator=gen,
                       device=device, dtype=getattr(torch, point.dtype))


def reference_grads(q, k, v, dout, point: Point, max_heads: int):
    """(dq, dk, dv) of the float64 naive formula on the reference slice, by autograd."""
    from ..reference import naive_attention

    hq, hk = _ref_slice(point, max_heads)
    q64, k64, v64 = (t.detach()[:1, :h].double().requires_grad_()
                     for t, h in ((q, hq), (k, hk), (v, hk)))
    out, _ = naive_attention(q64, k64, v64, **reference_kwargs(point, q.device))
    out.backward(dout[:1, :hq].double())
    return q64.grad, k64.grad, v64.grad


def compare_grads(q, k, v, refs, point: Point, max_heads: int) -> dict:
    """Each gradient's relative error on the reference slice, judged by ``rtol_bwd``."""
    hq, hk = _ref_slice(point, max_heads)
    bound = rtol_bwd(point.dtype)
    errs = {}
    for name, t, h, ref in zip(("dq", "dk", "dv"), (q, k, v), (hq, hk, hk), refs):
        g = t.grad[:1, :h]
        errs[name] = relative_error(g, ref) if bool(torch.isfinite(g).all()) else math.inf
    worst = max(errs.values())
    return {"grad_rel_err": errs, "grad_rtol": bound,
            "grads_correct": math.isfinite(worst) and worst <= bound}


def pass_callable(run, q, k, v, dout, pass_: str):
    """What one timed call does: the forward; forward and backward; or the backward alone
    (the graph of one forward, replayed with retain_graph). Gradients are reset, not
    accumulated, each call."""
    if pass_ == "fwd":
        return run

    def reset():
        q.grad = k.grad = v.grad = None

    if pass_ == "fwd+bwd":
        def step():
            reset()
            run().backward(dout)
        return step
    out = run()

    def backward():
        reset()
        out.backward(dout, retain_graph=True)
    return backward


def _bytes_moved(point: Point) -> int:
    """Compulsory bytes: forward reads q, k, v and writes out; the backward reads q, k, v,
    out and dO and writes dq, dk, dv (q, k, dq, dk at D; v, out, dO, dv at V's head dim)."""
    elem = torch.finfo(getattr(torch, point.dtype)).bits // 8
    rows_q = point.batch * point.heads * point.seq_q
    rows_kv = point.batch * point.heads_kv * point.seq_kv
    width = point.head_dim + point.value_dim  # one tensor at D and one at D_v
    per = {"fwd": (rows_q + rows_kv) * width, "bwd": 2 * (rows_q + rows_kv) * width}
    total = per["fwd"] * (point.pass_ != "bwd") + per["bwd"] * (point.pass_ != "fwd")
    # FP8 (forward only): 1-byte q, k, v, and the bfloat16 output's second byte per element
    out_extra = rows_q * point.value_dim if point.dtype == FP8 else 0
    return elem * total + out_extra


def rtol_of(cfg: BenchConfig, dtype: str) -> float:
    """The relative error a point's output may have: the config's per dtype; FP8's is
    tolerance.RTOL's (no config key: one would change every config's measure digest)."""
    return RTOL[dtype] if dtype == FP8 else getattr(cfg.correctness, f"rtol_{dtype}")


def compare(out, ref, hq: int, rtol: float) -> dict:
    got = out[:1, :hq].double()
    rel = relative_error(got, ref)
    max_abs = (got - ref).abs().max().item()
    ok = math.isfinite(rel) and bool(torch.isfinite(got).all()) and rel <= rtol
    return {"rel_err": rel, "max_abs_err": max_abs, "rtol": rtol, "correct": ok}


def classify(exc: BaseException) -> tuple[str, str]:
    # Every row this harness records as failed goes through here: a time limit, a stop
    # or an interrupt is the job's, not the method's, and never becomes a row.
    jobenv.reraise(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom", str(exc).splitlines()[0][:300]
    if isinstance(exc, Unavailable):
        return "unavailable", str(exc)
    if isinstance(exc, Unsupported):
        return "unsupported", str(exc)
    from ..errors import InputError

    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, InputError) or "No available kernel" in str(exc):
        return "unsupported", text[:500]
    return "error", text[:500]


# A CPU run measures with one intra-op thread. With torch's default (one per core) every
# op of a call is a parallel region whose barrier waits for each thread; on cores other
# processes also use, a descheduled thread turns a 30 us call into ~3 ms (measured on a
# 2-core machine under load: 3052 vs 32 us per back-to-back bf16 SDPA call at S=64), so
# the call-latency rounds sized for ~50 ms ran 5 s each and measured the machine's load.
CPU_THREADS = 1


@contextlib.contextmanager
def _cpu_threads(device):
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_point(point: Point, methods: list[str], cfg: BenchConfig, device, flush) -> list[dict]:
    """Every method's row at ``point`` (on a CPU with CPU_THREADS intra-op threads)."""
    with _cpu_threads(device):
        return _run_point(point, methods, cfg, device, flush)


def _run_point(point: Point, methods: list[str], cfg: BenchConfig, device, flush) -> list[dict]:
    t = cfg.timing
    rtol = rtol_of(cfg, point.dtype)
    timing = {"warmup": t.warmup, "reps": t.reps, "rounds": t.rounds, "flush_l2": t.flush_l2,
              "cuda_graph": t.cuda_graph}
    if device.type == "cpu":
        timing["cpu_threads"] = CPU_THREADS
    base = {"format": FORMAT, "point_key": point.key(), **point.as_dict(), "seed": cfg.seed,
            "device": str(device), "timing": timing}
    rows = {m: {**base, "method": m} for m in methods}
    backward = point.pass_ != "fwd"
    try:
        q, k, v = make_inputs(point, cfg.seed, device)
        descale = None
        if point.dtype == FP8:
            (q, k, v), descale = fp8_inputs(q, k, v)
        ref, hq = reference(q, k, v, point, cfg.correctness.max_ref_heads, descale)
        if backward:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            dout = make_dout(point, cfg.seed, device)
            grad_refs = reference_grads(q, k, v, dout, point, cfg.correctness.max_ref_heads)
    except Exception as exc:  # OOM while allocating: every method shares the fate
        status, msg = classify(exc)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return [{**r, "status": status, "reason": msg} for r in rows.values()]
    callables, eager = {}, {}
    scopes = {m: get_method(m).scope for m in methods}  # held around each method's calls
    for m in methods:
        method = get_method(m)
        row = rows[m]
        held = contextlib.ExitStack()
        try:
            # A dtype or head shape the method never runs says so on any machine.
            why = fp8_unsupported(method, point) or method.head_limits(
                point.head_dim, point.value_dim, point.pass_)
            if why:
                raise Unsupported(why)
            if method.needs_cuda and device.type != "cuda":
                raise Unavailable("needs a CUDA GPU")
            method.check(point, device)
            if backward and not method.has_backward:
                raise Unsupported(f"{m} has no backward pass")
            held.enter_context(scopes[m]())
            extra = {} if descale is None else {"descale": descale}
            fn = functools.partial(method.run, q, k, v, point, **extra)
            with torch.no_grad():
                out = fn()
            row.update(compare(out, ref, hq, rtol), ref_heads=hq, ref_batch=1)
            row["details"] = method.describe(q, k, v, point)
            geometry = method.geometry(q, k, v, point)
            if geometry is not None:
                row["geometry"] = geometry
            del out
            if not row["correct"]:
                row.update(status="wrong", reason=f"relative error {row['rel_err']:.3e} > "
                           f"{rtol:g} (or non-finite output)")
                continue
            if backward:
                pass_callable(fn, q, k, v, dout, "fwd+bwd")()
                row.update(compare_grads(q, k, v, grad_refs, point,
                                         cfg.correctness.max_ref_heads))
                if not row["grads_correct"]:
                    row.update(status="wrong", reason=f"gradient relative errors "
                               f"{row['grad_rel_err']} > {row['grad_rtol']:g}")
                    continue
                fn = pass_callable(fn, q, k, v, dout, point.pass_)
            eager[m] = fn  # call latency is what an eager caller waits, graph or not
            # Autograd is not captured into CUDA graphs here: backward passes run eager.
            if t.cuda_graph and device.type == "cuda" and not backward:
                fn = as_cuda_graph(fn)
            callables[m] = fn
        except Exception as exc:
            status, msg = classify(exc)
            row.update(status=status, reason=msg)
            if status == "oom":
                torch.cuda.empty_cache()
        finally:
            held.close()
    samples, call_samples, calls = time_methods(callables, eager, scopes, t, device, flush,
                                                rows)
    flops = point.flops()
    nbytes = _bytes_moved(point)
    for m in callables:
        st = summarize(samples[m])
        sec = st.median_ms * 1e-3
        rows[m].update(status="ok", time_ms=st.as_dict(),
                       tflops=tflops_per_s(flops, st.median_ms),
                       tokens_per_s=point.batch * point.heads * point.seq_q / sec,
                       gbytes_per_s=nbytes / sec / 1e9, flops=flops, bytes_moved=nbytes,
                       call_us=statistics.median(call_samples[m]), call_calls=calls)
    return list(rows.values())


def time_methods(callables: dict, eager: dict, scopes: dict, t, device, flush,
                 rows: dict) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """The one timing loop of a point's methods: kernel time (ms, ``time_cuda`` or
    ``time_cpu``) over ``t.rounds`` rounds, methods interleaved, order alternating, then
    call latency (us per back-to-back call of ``eager``). A method that fails while timed
    gets its row's status and leaves ``callables``. Returns (kernel samples, call samples,
    calls per latency round)."""
    samples: dict[str, list[float]] = {m: [] for m in callables}
    clocks: dict[str, list[int]] = {m: [] for m in callables}
    per_round = max(1, t.reps // t.rounds)
    for r in range(t.rounds):
        order = list(callables) if r % 2 == 0 else list(reversed(callables))
        for m in order:
            if m not in callables:
                continue
            try:
                warm = t.warmup if r == 0 else min(2, t.warmup)
                with scopes[m]():
                    if device.type == "cuda":
                        with ClockSampler(device) as clock:
                            samples[m] += time_cuda(callables[m], warmup=warm,
                                                    reps=per_round, flush=flush)
                        clocks[m] += clock.samples
                    else:
                        samples[m] += time_cpu(callables[m], warmup=warm, reps=per_round)
            except Exception as exc:
                status, msg = classify(exc)
                rows[m].update(status=status, reason=msg)
                del callables[m]
    for m in callables:
        if clocks[m]:  # the SM clock the kernel ran at (NVML), for the peak at that clock
            rows[m]["sm_clock_mhz"] = statistics.median(clocks[m])
    calls = _call_count([summarize(samples[m]).median_ms for m in callables])
    call_samples = _time_call_latency({m: eager[m] for m in callables}, calls, t.rounds,
                                      device, rows, callables, scopes)
    return samples, call_samples, calls


def _call_count(kernel_ms: list[float]) -> int:
    fastest = max(min(kernel_ms, default=1.0), 1e-3) * 1e-3
    return int(min(max(CALL_ROUND_S / fastest, CALL_BOUNDS[0]), CALL_BOUNDS[1]))


def _time_call_latency(fns: dict, calls: int, rounds: int, device, rows: dict,
                       callables: dict, scopes: dict) -> dict[str, list[float]]:
    """Microseconds per call (``time_calls``), methods interleaved round by round."""
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    out: dict[str, list[float]] = {m: [] for m in fns}
    for r in range(rounds):
        for m in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            if m not in callables:
                continue
            try:
                with scopes[m]():
                    out[m] += time_calls(fns[m], calls=calls, rounds=1,
                                         warmup=3 if r == 0 else 1, sync=sync)
            except Exception as exc:
                rows[m].update(zip(("status", "reason"), classify(exc)))
                del callables[m]
    return out


class Progress:
    """A bar with ETA on a terminal; plain log lines otherwise (batch jobs, CI)."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.start = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, label: str, rows: list[dict]) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        brief = " ".join(f"{r['method']}={r['tflops']:.1f}" if r.get("status") == "ok"
                         else f"{r['method']}={r['status']}" for r in rows)
        if self.tty:
            width = 30
            fill = int(width * self.done / max(1, self.total))
            self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total}"
                              f" ETA {eta:5.0f}s {label[:40]:40s}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"[{self.done}/{self.total}] {label} {brief} "
                              f"(elapsed {elapsed:.0f}s, ETA {eta:.0f}s)\n")
        self.stream.flush()


def summary_table(rows: list[dict], methods: list[str]) -> str:
    """TFLOP/s per point and method (status where not ok), and the ratios to torch_sdpa by
    kernel time (= TFLOP/s) and by call latency (> 1: tiledattention faster). Columns are
    as wide as their full header (method names are never cut)."""
    by_point: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_point.setdefault(r["point_key"], {})[r["method"]] = r
    key_w = max([len("point"), *map(len, by_point)])
    widths = [max(len("unavailable"), len(m)) for m in methods]  # widest status too
    show_ratio = "tiledattention" in methods and "torch_sdpa" in methods
    ratios = ("kernel ÷", "call ÷")  # torch_sdpa's time ÷ tiledattention's
    head = f"{'point':{key_w}s} " + " ".join(f"{m:>{w}s}" for m, w in zip(methods, widths))
    lines = ["TFLOP/s per point and method (median kernel time; a method that did not run "
             "shows its status)"]
    if show_ratio:
        lines.append("kernel ÷, call ÷: torch_sdpa's kernel time, call latency ÷ "
                     "tiledattention's (> 1: tiledattention faster)")
    lines.append(head + ("  " + "  ".join(ratios) if show_ratio else ""))
    for key, cells in by_point.items():
        vals = []
        for m, w in zip(methods, widths):
            r = cells.get(m)
            vals.append(f"{r['tflops']:{w}.2f}" if r and r.get("status") == "ok"
                        else f"{(r or {}).get('status', '-'):>{w}s}")
        line = f"{key:{key_w}s} " + " ".join(vals)
        a, b = cells.get("tiledattention"), cells.get("torch_sdpa")
        if show_ratio and a and b and a.get("status") == b.get("status") == "ok":
            line += f"  {a['tflops'] / b['tflops']:{len(ratios[0])}.3f}"
            if a.get("call_us") and b.get("call_us"):
                line += f"  {b['call_us'] / a['call_us']:{len(ratios[1])}.3f}"
        lines.append(line)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def measure(plan: list[tuple[Point, list[str]]], cfg: BenchConfig, store: ResultStore,
            device, log, run=None) -> bool:
    """Measure every (point, method) of ``plan`` not yet in ``store``, appending each
    point's rows as it finishes. The one measurement loop: ``tiledattn bench`` and
    ``tiledattn tune`` both run through it. Ctrl-C stops after the current point (twice
    aborts); returns True when stopped early. SIGTERM (a workflow or job stopped at its time
    limit) stops at once (``jobenv.JobStopped``: a cancelled job does not measure on until
    SLURM kills it), and the point it cut is not stored: the signal also reaches the
    point's child processes (a kernel compile), whose failure would otherwise be recorded
    as an error row that a resumed run never measures again. ``run``: how a point's rows
    are measured, ``run_point``'s signature (default: ``run_point``; the workloads stage
    passes its own, whose points are batches of ragged sequences)."""
    run = run or run_point
    todo = [(p, [m for m in methods if not store.done(p.key(), m)]) for p, methods in plan]
    todo = [(p, methods) for p, methods in todo if methods]
    stop = {"requested": False}

    def on_sigint(signum, frame):
        if stop["requested"]:
            raise KeyboardInterrupt
        stop["requested"] = True
        print("\nstopping after the current point (Ctrl-C again to abort)", file=log,
              flush=True)

    def on_sigterm(signum, frame):
        stop["requested"] = stop["terminated"] = True
        if callable(previous_term):  # a job environment's own handler (submitit's) runs too
            previous_term(signum, frame)
        # Not while a row is written, nor while submitit requeues this attempt (its
        # handler ends the attempt itself: ``jobenv.requeue``).
        if stop.get("measuring") and not jobenv.requeueing():
            raise jobenv.JobStopped("SIGTERM while measuring: the point is measured again "
                                    "on resume")

    digest = cfg.measure_digest()
    previous = signal.signal(signal.SIGINT, on_sigint)
    previous_term = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_sigterm)
    flush = L2Flusher() if device.type == "cuda" and cfg.timing.flush_l2 else None
    progress = Progress(len(todo), log)
    try:
        for p, methods in todo:
            if stop["requested"]:
                break
            stop["measuring"] = True
            try:
                rows = run(p, methods, cfg, device, flush)
            except jobenv.JobStopped:
                rows = []  # cut short: nothing of this point is stored
            finally:
                stop["measuring"] = False
            if stop.get("terminated"):
                print(f"\nSIGTERM: stopped; {p.key()} is measured again on resume", file=log,
                      flush=True)
                break
            for row in rows:
                row["recorded"] = now()
                row["config_hash"] = digest
                store.append(row)
            progress.step(p.key(), rows)
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    return stop["requested"]


def run_bench(cfg: BenchConfig, out_dir: str, *, shard_index: int = 0, shard_count: int = 1,
              log=None, remeasure: bool = False) -> int:
    """Run (or resume) one shard of the grid into ``out_dir``; returns an exit code.

    One writer per results file (a second is refused); rows measured under another config
    hash are refused, or with ``remeasure`` set aside and measured again."""
    log = log or sys.stderr
    device = resolve_device(cfg.device)
    os.makedirs(out_dir, exist_ok=True)
    rows_path = os.path.join(out_dir, f"rows-shard{shard_index}of{shard_count}.jsonl")
    with Lock(rows_path, log):
        return _run_locked(cfg, out_dir, shard_index, shard_count, log, device, remeasure)


def resume(store: ResultStore, digest: str, remeasure: bool, log) -> None:
    other = store.other_configs(digest)
    if not other:
        return
    listing = ", ".join(f"{h}: {n}" for h, n in sorted(other.items()))
    if not remeasure:
        raise RowsError(f"{store.path}: {sum(other.values())} rows were measured under another "
                        f"config (hash {listing}; this config {digest}: seed, timing, "
                        "correctness or device changed); use another --out, or --remeasure to "
                        "set them aside and measure again")
    aside = store.set_aside(digest)
    print(f"bench: {sum(other.values())} rows of another config moved to {aside}; measuring "
          "them again", file=log, flush=True)


def _run_locked(cfg, out_dir, shard_index, shard_count, log, device, remeasure) -> int:
    tag = f"shard{shard_index}of{shard_count}"
    store = ResultStore(os.path.join(out_dir, f"rows-{tag}.jsonl"))
    # The file exists even when this shard has no points (more shards than points), so
    # aggregate --expect-shards counts every shard that ran.
    open(store.path, "ab").close()
    digest = cfg.measure_digest()
    resume(store, digest, remeasure, log)
    check_rows(list(store.rows.values()), store.path, store.conflicts)  # resumed rows count
    if store.skipped_lines:
        print(f"bench: skipped {store.skipped_lines} unreadable line(s) of {store.path} (torn "
              "or not a row); their measurements are redone", file=log, flush=True)
    for line in left_out(cfg):  # never vanished without a word
        print(f"bench: {line}", file=log, flush=True)
    points = shard(expand(cfg), shard_index, shard_count)
    done = sum(all(store.done(p.key(), m) for m in cfg.methods) for p in points)
    started = now()
    manifest_path = os.path.join(out_dir, f"manifest-{tag}.json")
    earlier = earlier_runs_of(manifest_path) if store.rows else []
    write_manifest(manifest_path, dict(capture(cfg, started=started), earlier_runs=earlier))
    print(f"bench: {len(points)} points in {tag} on {device}, {done} already "
          f"done in {store.path}", file=log, flush=True)
    try:
        stopped = measure([(p, list(cfg.methods)) for p in points], cfg, store, device, log)
    finally:
        write_manifest(manifest_path, dict(capture(cfg, started=started, finished=now()),
                                        earlier_runs=earlier))
    print(summary_table(list(store.rows.values()), list(cfg.methods)), file=log, flush=True)
    return 130 if stopped else 0


# What a resumed run keeps of the runs that measured its earlier rows: their software stack,
# GPU, revision and times (the study's manifest checks the stack across all of them).
EARLIER_FIELDS = ("tiledattention", "python", "torch", "cuda_runtime", "cudnn", "cuda_tile",
                  "tileiras", "triton", "gpu", "git_commit", "git_dirty", "host", "started",
                  "finished")


def earlier_runs_of(manifest_path: str) -> list[dict]:
    """The runs before this one on the same rows file, from the manifest it replaces."""
    from ..safeio import UnsafeFileError, load_json

    try:
        prev = load_json(manifest_path, what="run manifest")
    except UnsafeFileError:  # none yet, or unreadable: no earlier runs to keep
        return []
    if not isinstance(prev, dict):
        return []
    runs = [r for r in prev.get("earlier_runs") or [] if isinstance(r, dict)]
    return runs + [{k: prev.get(k) for k in EARLIER_FIELDS}]


def write_manifest(path: str, data: dict) -> None:
    """A run manifest, written whole or not at all (fsync, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
