"""Programmatic dependent launch (``Schedule.pdl``) for short calls: per-call time with and
without, side by side in one process (NOTES "PDL").

With ``pdl`` the attention kernel is launched as a programmatic dependent: it may start while
the previous kernel on the stream finishes (its CTA setup and index math overlap that
kernel's tail) and waits before its first load; it also lets the next PDL launch start
early. The schedule is the table's choice for each shape, with and without ``pdl``.

Per shape, for two loops of --calls calls -- ``independent`` (same q, k, v each call) and
``chain`` (each call's output is the next call's q, so the dependency is real) -- and per
arm (off / pdl), interleaved round by round, median of --rounds:

- eager wall: wall time of the loop / calls, one synchronisation at the end (what an eager
  caller waits; host-bound at these sizes, so PDL can only show where the GPU is the pace);
- eager queued: the loop enqueued behind a GPU spin, CUDA events around it / calls (the
  GPU's pace with the launch queue full: launch gaps included, host hidden);
- graph: the loop captured into one CUDA graph, events around a replay / calls;
- kernel: events around one call behind a spin (no predecessor to overlap: the cost of the
  wait itself).

Correctness: one call's outputs with and without PDL compared bitwise, a 16-step chain
enqueued behind a spin (so the PDL launches really overlap) compared step by step, and the
graphs' last outputs; they must be bitwise equal where one call is (else within
CHAIN_ATOL), or the script exits 1.

    python benchmarks/pdl.py [--calls 200] [--rounds 7] [--shapes prefill,decode] [--out pdl.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tiledattention as ta  # noqa: E402
from tiledattention.schedules import policy  # noqa: E402
from tiledattention.timing import SPIN_CYCLES, time_cuda  # noqa: E402

SHAPES = {  # name: (B, Hq, Sq, Skv, D, causal)
    "prefill": (1, 32, 512, 512, 128, True),  # B1 H32 S512 D128 causal
    "prefill64": (2, 16, 512, 512, 64, False),  # B2 H16 S512 D64
    "decode": (1, 32, 1, 4096, 128, False),  # B1 H32 Sq1 Skv4096 D128 (split-K + combine)
}
ROWS = [("independent", "eager wall"), ("independent", "eager queued"), ("independent", "graph"),
        ("chain", "eager wall"), ("chain", "eager queued"), ("chain", "graph"),
        ("one call", "kernel")]
CHECK_STEPS = 16
# Where one call's outputs already differ bitwise (the PDL cubin's arithmetic was scheduled
# differently), chains are held to this instead: a race reads stale or unwritten data and
# misses it by far more.
CHAIN_ATOL = 2e-2
HOST_US_PER_CALL = 60.0  # spin budget per enqueued call (eager host cost is ~20 us)


def loop(q, k, v, causal, schedule, calls, chain):
    def run():
        x = q
        for _ in range(calls):
            y = ta.sdpa(x if chain else q, k, v, causal=causal, schedule=schedule)
            x = y
        return x
    return run


def spin(calls: int) -> torch.cuda.Event:
    torch.cuda._sleep(int(SPIN_CYCLES * max(1.0, calls * HOST_US_PER_CALL / 1000.0)))
    done = torch.cuda.Event()
    done.record()
    return done


def eager_wall(run, calls) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def events_around(run, calls, spin_calls) -> tuple[float, bool]:
    """(us per call between events, the spin outlasted the enqueue)."""
    torch.cuda.synchronize()
    done = spin(spin_calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    busy = not done.query()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3, busy


def capture(run):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # warm call on a side stream, as torch's graph docs ask
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph, out


def check(q, k, v, causal, schedules) -> dict:
    """Bitwise comparisons of the off and pdl arms (one call; a chain behind a spin)."""
    one = [ta.sdpa(q, k, v, causal=causal, schedule=s) for s in schedules]
    torch.cuda.synchronize()
    chains = []
    for s in schedules:
        spin(CHECK_STEPS)
        outs, x = [], q
        for _ in range(CHECK_STEPS):
            x = ta.sdpa(x, k, v, causal=causal, schedule=s)
            outs.append(x)  # kept: every step is compared, no buffer is reused
        torch.cuda.synchronize()
        chains.append(outs)
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(*chains))
    return {"one_call_equal": torch.equal(*one),
            "one_call_max_diff": (one[0].float() - one[1].float()).abs().max().item(),
            "chain_equal": all(torch.equal(a, b) for a, b in zip(*chains)),
            "chain_max_diff": diff}


def agrees(c: dict) -> bool:
    """Chains (eager and graph) bitwise equal when single calls are; else within CHAIN_ATOL."""
    if c["one_call_equal"]:
        return all(v for k, v in c.items() if k.endswith("_equal"))
    return c["chain_max_diff"] <= CHAIN_ATOL and all(
        v <= CHAIN_ATOL for k, v in c.items() if k.startswith("graph_") and k.endswith("_diff"))


def measure(shape, args) -> dict:
    b, h, sq, skv, d, causal = shape
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, h, skv, d, device="cuda", dtype=torch.float16) for _ in range(2))
    base, how = policy.choose_schedule(q, k, causal)
    arms = {"off": dataclasses.replace(base, pdl=False), "pdl": dataclasses.replace(base, pdl=True)}
    t0 = time.perf_counter()
    for s in arms.values():  # compiles both variants (and the combine for split-K)
        ta.sdpa(q, k, v, causal=causal, schedule=s)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    result = {"schedule": base.label(), "schedule_source": how, "compile_s": compile_s,
              "check": check(q, k, v, causal, list(arms.values())), "us": {}, "busy": True}
    runs = {(lp, arm): loop(q, k, v, causal, s, args.calls, lp == "chain")
            for lp in ("independent", "chain") for arm, s in arms.items()}
    graphs, graph_outs = {}, {}
    for key, run in runs.items():
        try:
            graphs[key], graph_outs[key] = capture(run)
        except Exception as exc:  # report it; the eager rows still stand
            result["graph_error"] = f"{type(exc).__name__}: {exc}"
            graphs = {}
            break
    if graphs:
        for lp in ("independent", "chain"):
            graphs[(lp, "off")].replay()
            graphs[(lp, "pdl")].replay()
            torch.cuda.synchronize()
            a, b = graph_outs[(lp, "off")], graph_outs[(lp, "pdl")]
            result["check"][f"graph_{lp}_equal"] = torch.equal(a, b)
            result["check"][f"graph_{lp}_max_diff"] = (a.float() - b.float()).abs().max().item()
    samples: dict[str, list[float]] = {}

    def add(name, value):
        samples.setdefault(name, []).append(value)

    for r in range(args.rounds):
        keys = list(runs) if r % 2 == 0 else list(reversed(runs))
        for key in keys:
            lp, arm = key
            add(f"{lp}|eager wall|{arm}", eager_wall(runs[key], args.calls))
            us, busy = events_around(runs[key], args.calls, args.calls)
            result["busy"] = result["busy"] and busy
            add(f"{lp}|eager queued|{arm}", us)
            if graphs:
                add(f"{lp}|graph|{arm}", events_around(graphs[key].replay, args.calls, 1)[0])
    for arm, s in arms.items():
        one = loop(q, k, v, causal, s, 1, False)
        samples[f"one call|kernel|{arm}"] = [1e3 * t for t in time_cuda(one, warmup=3, reps=20)]
    result["us"] = {name: statistics.median(vals) for name, vals in samples.items()}
    return result


def report(results: dict, args) -> bool:
    from tiledattention.kernel.toolchain import tileiras_version

    try:
        from importlib.metadata import version
        cutile = version("cuda-tile")
    except Exception:
        cutile = "?"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuda-tile {cutile}, "
          f"tileiras {tileiras_version()}, python {platform.python_version()}; "
          f"{args.calls} calls per loop, median of {args.rounds} interleaved rounds")
    print(f"{'shape':10s} {'loop':12s} {'mode':13s} {'off us':>8s} {'pdl us':>8s} "
          f"{'pdl/off':>8s} {'saved':>7s}")
    ok = True
    for name, r in results.items():
        us = r["us"]
        for lp, mode in ROWS:
            if f"{lp}|{mode}|off" not in us:
                continue  # graph rows when the capture failed
            off, on = us[f"{lp}|{mode}|off"], us[f"{lp}|{mode}|pdl"]
            print(f"{name:10s} {lp:12s} {mode:13s} {off:8.2f} {on:8.2f} {on / off:8.3f} "
                  f"{off - on:7.2f}")
        c = r["check"]
        ok = ok and agrees(c)
        print(f"{name:10s} schedule {r['schedule']} ({r['schedule_source']}), compile "
              f"{r['compile_s']:.1f} s; outputs off vs pdl: "
              + ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in c.items())
              + ("" if r["busy"] else "; spin ended before the enqueue: queued rows include waits")
              + (f"; graph capture failed: {r['graph_error']}" if "graph_error" in r else ""))
    print("outputs with and without PDL: " + ("agree (see the per-shape lines)" if ok
                                               else "DIFFER"))
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"comma-separated subset of {list(SHAPES)}")
    ap.add_argument("--out", help="write every number as JSON here")
    args = ap.parse_args(argv)
    names = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in names if s not in SHAPES]
    if unknown or not names:
        print(f"pdl: unknown shapes {unknown}; valid: {list(SHAPES)}", file=sys.stderr)
        return 2
    if args.calls < 1 or args.rounds < 1:
        print("pdl: --calls and --rounds must be >= 1", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("pdl: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 2
    with torch.inference_mode():
        results = {name: measure(SHAPES[name], args) for name in names}
    ok = report(results, args)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                              "torch": torch.__version__, "args": vars(args),
                                              "results": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
