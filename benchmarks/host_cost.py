"""What a caller pays per call: ta.sdpa vs F.scaled_dot_product_attention, side by side.

Two tables, both in one run, the implementations interleaved round by round:

paths (issue 26's table): call latency (``timing.time_calls``: back-to-back calls, one
synchronisation per round, median of rounds; host and device both count, the slower sets
the pace) of each way users run attention, on the issue's two shapes where the host
decides (bf16, D 128): prefill B1 H16 S512 causal and decode B1 H32/8 Sq1 Skv1024:

- eager, no grad; eager, forward+backward (dO given, gradients reset per call);
- torch.compile (fullgraph, static shapes), no grad and forward+backward;
- torch.compile(mode="reduce-overhead") (CUDA graphs), forward and forward+backward;
- the drop-in: F.scaled_dot_product_attention inside ``ta.sdpa_mode()`` (entered per
  call), eager, no grad and forward+backward: ours through the mode vs torch without it.

Each cell is "ours vs torch us (ratio)"; the targets: <= 1.3x on every path, <= 1.1x under
torch.compile. Each (shape, path, implementation) is built, checked against torch (output
and, with a backward, gradients) and timed on its own: a failure (a refusal, a compile
error, a graph break under fullgraph, CUDA graphs skipped) is written into its cell and
the table goes on.

host (the eager no-grad forward in detail): three shapes (fp16: a tiny 1x1x128x64, a
prefill B1 H32 S512 D128 causal, a decode B1 H32 Sq1 Skv4096 D128):

- call: as above, --calls back-to-back calls;
- host: time to enqueue --host-calls calls while a spin keeps the GPU busy, so no call
  waits on the device: the host's cost alone (the target: ta <= 1.3x torch);
- also ta.sdpa through its torch.library custom op (the torch.compile path), to show
  what the eager bypass saves.

    python benchmarks/host_cost.py [--tables paths host] [--calls 2000] [--path-calls 200]
                                   [--budget-s 210] [--out results/host_cost.json]

The whole run (both tables, compiles included) is meant to fit one GPU call (< 4 min);
cells left when --budget-s is spent say so instead of running.
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention import api
from tiledattention.timing import time_calls, time_host

SHAPES = {  # name: (B, Hq, Sq, Skv, D, causal)
    "tiny 1x1x128x64": (1, 1, 128, 128, 64, False),
    "prefill B1 H32 S512 D128 causal": (1, 32, 512, 512, 128, True),
    "decode B1 H32 Sq1 Skv4096 D128": (1, 32, 1, 4096, 128, False),
}
TARGET = 1.3
COMPILED_TARGET = 1.1
# The table: name: (B, Hq, Hkv, Sq, Skv, D, causal), bf16.
PATH_SHAPES = {
    "prefill B1 H16 S512 D128 causal": (1, 16, 16, 512, 512, 128, True),
    "decode B1 H32/8 Sq1 Skv1024 D128": (1, 32, 8, 1, 1024, 128, False),
}
# name: (torch.compile mode or None for eager, with a backward)
PATHS = {
    "eager, no grad": (None, False),
    "eager, forward+backward": (None, True),
    "torch.compile, no grad": ("default", False),
    "torch.compile, forward+backward": ("default", True),
    'mode="reduce-overhead", forward': ("reduce-overhead", False),
    'mode="reduce-overhead", forward+backward': ("reduce-overhead", True),
    # Ours: F.scaled_dot_product_attention inside ta.sdpa_mode() (entered per call).
    "drop-in sdpa_mode(), eager, no grad": ("dropin", False),
    "drop-in sdpa_mode(), eager, forward+backward": ("dropin", True),
}


def _ta_causal(causal: bool) -> dict:
    """ta.sdpa's causal keyword: PyTorch's name (``is_causal``) where sdpa takes it."""
    return {"is_causal" if "is_causal" in inspect.signature(ta.sdpa).parameters
            else "causal": causal}


def callables(q, k, v, causal):
    # The op path: what torch.compile and CUDA-graph trees call (validation included).
    def via_op():
        p = api.check_inputs(q, k, v, causal=causal, scale=None, attn_mask=None,
                             enable_gqa=False)
        # schedule "" ("pick for me"), no variant
        return api._attention(q, k, v, None, [], causal, p.scale, False, "", "")[0]

    kw = _ta_causal(causal)
    return {
        "ta.sdpa": lambda: ta.sdpa(q, k, v, **kw),
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "ta via op": via_op,
    }


def measure(shape, args) -> dict:
    b, h, sq, skv, d, causal = shape
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(b, h, skv, d, device="cuda", dtype=torch.float16) for _ in range(2))
    fns = callables(q, k, v, causal)
    ref = fns["torch"]()
    errors = {}
    for name, fn in list(fns.items()):
        try:  # the op's signature is the kernel's business: a changed one is a cell, not a crash
            err = (fn().float() - ref.float()).abs().max().item()
        except Exception as exc:
            errors[name] = _brief(exc)
            del fns[name]
            continue
        if err > 2e-2:
            errors[name] = f"disagrees with torch: max |diff| {err:.3e}"
            del fns[name]
    call = {n: [] for n in fns}
    host = {n: [] for n in fns}
    busy = True
    for r in range(args.rounds):  # interleaved, order alternating: drift hits all alike
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            call[name] += time_calls(fns[name], calls=args.calls, rounds=1,
                                     sync=torch.cuda.synchronize)
            samples, ok = time_host(fns[name], calls=args.host_calls, rounds=1)
            host[name] += samples
            busy = busy and ok
    return {"call_us": {n: statistics.median(v) for n, v in call.items()},
            "host_us": {n: statistics.median(v) for n, v in host.items()},
            "errors": errors, "gpu_stayed_busy": busy}


def breakdown(calls: int = 2000) -> dict[str, float]:
    """Host microseconds of the pieces of one ta.sdpa call (tiny shape, GPU kept busy)."""
    import cuda.tile as ct

    from tiledattention.kernel import launch as launching
    from tiledattention.kernel.plan import call_key, plan_for

    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16)
               for _ in range(3))
    plan = plan_for(q, k, v, None, False, None, False, False, None)
    out = torch.empty_like(q)
    lse, mask = launching._placeholders(q.device, False)
    _, kernel, grid, tail = plan.launches[0]
    args = (q, k, v, out, lse, mask, *tail)
    stream = torch.cuda.current_stream().cuda_stream
    pieces = {
        "api._plain_eager": lambda: api._plain_eager(q),
        "call_key": lambda: call_key(q, k, v, None, False, None, False, False, None),
        "plan_for (hit)": lambda: plan_for(q, k, v, None, False, None, False, False, None),
        "torch.empty (out)": lambda: torch.empty(plan.out_shape, dtype=plan.dtype,
                                                 device=plan.device),
        "raw current stream": lambda: launching._raw_stream(0),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
        "ct.launch, args ready": lambda: ct.launch(stream, grid, kernel, args),
        "launch(plan)": lambda: launching.launch(plan, q, k, v, None, fresh_lse=False),
        "ta.sdpa": lambda: ta.sdpa(q, k, v),
        "F.sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    return {name: statistics.median(time_host(fn, calls=200, rounds=5)[0])
            for name, fn in pieces.items()}


def _brief(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


def _attention(impl: str, causal: bool, gqa: bool):
    if impl == "ta":
        kw = _ta_causal(causal)

        def attend(q, k, v):
            return ta.sdpa(q, k, v, enable_gqa=gqa, **kw)
    else:
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return attend


def _path_call(impl: str, shape, path: str, inputs):
    """(the timed call, its first result: the output, and the gradients with a backward)."""
    from tiledattention.bench.runner import pass_callable

    b, hq, hkv, sq, skv, d, causal = shape
    mode, backward = PATHS[path]
    q, k, v, dout = inputs
    dropin = mode == "dropin" and impl == "ta"
    attend = _attention("torch" if dropin else impl, causal, hq != hkv)
    if mode not in (None, "dropin"):
        attend = torch.compile(attend, fullgraph=True, dynamic=False, mode=mode)
    graphs = mode == "reduce-overhead"
    routing = ta.sdpa_mode() if dropin else None

    def forward():
        if graphs:  # each call a new step of the CUDA-graph tree
            torch.compiler.cudagraph_mark_step_begin()
        if routing is not None:
            with routing:
                return attend(q, k, v)
        return attend(q, k, v)

    if not backward:
        def call():
            with torch.no_grad():
                return forward()
        first = (call().clone(),)
    else:  # the first step by hand, to keep its output (no extra no-grad compile)
        q.grad = k.grad = v.grad = None  # the inputs are shared with the other side
        out = forward()
        out.backward(dout)
        first = (out.detach().clone(), *(t.grad.clone() for t in (q, k, v)))
        call = pass_callable(forward, q, k, v, dout, "fwd+bwd")
    if routing is not None and (routing.fallbacks or not routing.routed):
        raise RuntimeError(f"the mode did not route the call: {routing!r}")
    return call, first


def _path_inputs(shape, backward: bool):
    b, hq, hkv, sq, skv, d, causal = shape
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(h, s):
        t = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        return t.requires_grad_(backward)

    return rand(hq, sq), rand(hkv, skv), rand(hkv, skv), rand(hq, sq).detach()


def _agrees(mine, ref, backward: bool) -> str | None:
    from tiledattention.tolerance import relative_error, rtol, rtol_bwd

    names = ("out", "dq", "dk", "dv") if backward else ("out",)
    for name, a, r in zip(names, mine, ref):
        bound = 2 * (rtol_bwd if name != "out" else rtol)(torch.bfloat16)
        err = relative_error(a.float(), r.double())
        if not err <= bound:
            return f"{name} differs from torch's by {err:.2e} (> {bound:g})"
    return None


def measure_path(shape, path: str, args, deadline: float) -> dict:
    """{impl: {"us": median call latency} or {"error": why}} for ours and torch's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # every path compiles afresh: no recompile limits, no stale graphs
    backward = PATHS[path][1]
    inputs = _path_inputs(shape, backward)
    cells: dict[str, dict] = {}
    calls, firsts = {}, {}
    for impl in ("torch", "ta"):  # torch first: ours is checked against it
        if time.monotonic() > deadline:
            cells[impl] = {"error": "skipped: --budget-s spent"}
            continue
        skips = counters["inductor"]["cudagraph_skips"]
        try:
            calls[impl], firsts[impl] = _path_call(impl, shape, path, inputs)
        except Exception as exc:
            cells[impl] = {"error": _brief(exc)}
            continue
        if counters["inductor"]["cudagraph_skips"] > skips:
            cells[impl] = {"note": f"{'ours' if impl == 'ta' else 'torch'}: CUDA graphs skipped"}
    if "ta" in calls and "torch" in firsts:
        wrong = _agrees(firsts["ta"], firsts["torch"], backward)
        if wrong:
            cells["ta"] = {"error": wrong}
            del calls["ta"]
    samples = {impl: [] for impl in calls}
    for r in range(args.path_rounds):
        for impl in (list(calls) if r % 2 == 0 else list(reversed(calls))):
            if impl not in samples:
                continue
            try:
                samples[impl] += time_calls(calls[impl], calls=args.path_calls, rounds=1,
                                            warmup=5 if r == 0 else 1,
                                            sync=torch.cuda.synchronize)
            except Exception as exc:
                cells[impl] = {"error": _brief(exc)}
                del samples[impl]
    for impl, us in samples.items():
        cells[impl] = {**cells.get(impl, {}), "us": statistics.median(us)}
    return cells


def _cell(cells: dict) -> tuple[str, float | None]:
    ours, theirs = cells.get("ta", {}), cells.get("torch", {})
    if "us" in ours and "us" in theirs:
        ratio = ours["us"] / theirs["us"]
        notes = "; ".join(c["note"] for c in (ours, theirs) if "note" in c)
        return (f"{ours['us']:.1f} vs {theirs['us']:.1f} us ({ratio:.2f}x)"
                + (f" [{notes}]" if notes else "")), ratio
    parts = [f"{who}: " + (f"{c['us']:.1f} us" if "us" in c else c.get("error", "not run"))
             for who, c in (("ours", ours), ("torch", theirs))]
    return "; ".join(parts), None


def paths_table(args, deadline: float) -> tuple[dict, list[str]]:
    results = {shape: {} for shape in PATH_SHAPES}
    for path in args.paths:
        for name, shape in PATH_SHAPES.items():
            try:
                results[name][path] = measure_path(shape, path, args, deadline)
            except Exception as exc:  # inputs, reset: the row says so, the table goes on
                results[name][path] = {"ta": {"error": _brief(exc)}}
            print(f"host_cost: {path} | {name}: {_cell(results[name][path])[0]}",
                  file=sys.stderr, flush=True)
    lines = [f"| path | {' | '.join(PATH_SHAPES)} |", "|---|" + "---|" * len(PATH_SHAPES)]
    verdicts = []
    for path in args.paths:
        row = [_cell(results[name][path]) for name in PATH_SHAPES]
        lines.append(f"| {path} | " + " | ".join(text for text, _ in row) + " |")
        target = COMPILED_TARGET if PATHS[path][0] in ("default", "reduce-overhead") else TARGET
        ratios = [r for _, r in row if r is not None]
        if len(ratios) < len(row):
            verdicts.append(f"{path}: not measured on every shape")
        else:
            worst = max(ratios)
            verdicts.append(f"{path}: worst {worst:.2f}x "
                            f"({'meets' if worst <= target else 'misses'} <= {target}x)")
    return results, lines + [""] + verdicts


def host_table(args, deadline: float) -> tuple[dict, list[str]]:
    results = {}
    with torch.inference_mode():
        for name, shape in SHAPES.items():
            if time.monotonic() > deadline:
                results[name] = {"error": "skipped: --budget-s spent"}
                continue
            try:
                results[name] = measure(shape, args)
            except Exception as exc:
                results[name] = {"error": _brief(exc)}
    lines = [f"call: {args.calls} back-to-back calls, host: {args.host_calls} enqueued behind "
             f"a GPU spin; median of {args.rounds} interleaved rounds (us per call, fp16)",
             f"{'shape':34s} {'call ta':>8s} {'torch':>8s} {'ta/t':>6s} | {'host ta':>8s} "
             f"{'torch':>8s} {'ta/t':>6s} | {'ta via op':>9s}"]
    worst = 0.0
    for name in SHAPES:
        r = results[name]
        c, h = r.get("call_us", {}), r.get("host_us", {})
        if "ta.sdpa" not in h or "torch" not in h:
            why = r.get("error") or "; ".join(f"{n}: {e}" for n, e in r["errors"].items())
            lines.append(f"{name:34s} not measured: {why}")
            worst = float("inf")
            continue
        ratio = h["ta.sdpa"] / h["torch"]
        worst = max(worst, ratio)
        via = f"{h['ta via op']:9.1f}" if "ta via op" in h else "    error"
        lines.append(f"{name:34s} {c['ta.sdpa']:8.1f} {c['torch']:8.1f} "
                     f"{c['ta.sdpa'] / c['torch']:6.2f} | {h['ta.sdpa']:8.1f} {h['torch']:8.1f} "
                     f"{ratio:6.2f} | {via}"
                     + ("" if r["gpu_stayed_busy"] else
                        "  (GPU went idle: host numbers include waits)"))
    if args.breakdown:
        try:
            with torch.inference_mode():
                pieces = breakdown()
            results["breakdown_host_us"] = pieces
            lines.append("pieces of one call, host us: " + ", ".join(
                f"{n} {t:.1f}" for n, t in pieces.items()))
        except Exception as exc:
            lines.append(f"breakdown not measured: {_brief(exc)}")
    verdict = "meets" if worst <= TARGET else "misses"
    lines.append(f"host cost ta/torch, worst shape: {worst:.2f}x ({verdict} the <= {TARGET}x "
                 "target)")
    return results, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", nargs="+", choices=("paths", "host"), default=["paths", "host"])
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
                    metavar="PATH", help=f"rows of the paths table (default all: {list(PATHS)})")
    ap.add_argument("--path-calls", type=int, default=200,
                    help="back-to-back calls per round, paths table")
    ap.add_argument("--path-rounds", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=210.0,
                    help="seconds for the whole run (compiles included); cells left when it "
                    "is spent say so (default 210: one GPU call of 4 minutes)")
    ap.add_argument("--calls", type=int, default=2000, help="back-to-back calls per round")
    ap.add_argument("--host-calls", type=int, default=200,
                    help="calls enqueued behind one GPU spin per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="write every number as JSON here")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the pieces of one call (host us, tiny shape)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("host_cost: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 2
    torch._dynamo.config.recompile_limit = 64
    dev = torch.cuda.get_device_name()
    print(f"# {dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"python {platform.python_version()}")
    out = {"device": dev, "torch": torch.__version__, "args": vars(args)}
    deadline = time.monotonic() + args.budget_s
    if "paths" in args.tables:
        out["paths"], lines = paths_table(args, deadline)
        print(f"\n## Call latency per path (us per call, ours vs torch SDPA; bf16; "
              f"{args.path_calls} back-to-back calls, median of {args.path_rounds} "
              "interleaved rounds)\n")
        print("\n".join(lines))
    if "host" in args.tables:
        out["host"], lines = host_table(args, deadline)
        print("\n## Eager no-grad forward: call latency and host cost\n")
        print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
