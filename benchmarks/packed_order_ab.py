"""An A/B of a packed or paged call's switch of ``tiledattention.kernel.workload`` (the
launch order, ``PAGED_HEAVY_FIRST``, ``VARLEN_HEAD_BLOCKS``, ``VARLEN_BWD_HEAD_BLOCKS``,
``VARLEN_HEAVY_MAP``: heads fastest on one grid axis in blocks, sequence-major maps by
keys where a tile's work follows them; a key tile's pages in one MMA operand,
``PAGE_JOIN_BELOW``, ``MAX_PAGE_SPAN``, ``PAGE_KEYS_GATHERED``, ``GATHER_TILE``,
``PAGE_GATHER_BELOW``, ``GATHER_MAX_Q``; a paged decode's splits and schedule,
``PAGED_SKIP_EMPTY``, ``PAGED_SPLIT_KEYS``, ``PAGED_DECODE_WORKER_WARPS``,
``PAGED_DECODE_OCCUPANCY``; a gathered chunked prefill's schedule,
``GATHERED_PREFILL_SCHEDULE``; the packed forward's whole-array loads and Out's store,
``PACKED_FWD_WHOLE``, ``PACKED_FWD_SCATTER_OUT``; the packed backward's stores,
``PACKED_BWD_SCATTER_OUT``) on the workloads stage's own points
(``config/reference.yaml``'s section: lognormal documents, ragged contexts), beside
FlashAttention-4: ours with the switch off and on, FA4, interleaved in rounds in one
process, kernel time with L2 flushed. Each point's outputs
(and gradients) of the two settings are compared bit for bit, and each against the float64
reference as the stage checks its rows. GPU.

    python benchmarks/packed_order_ab.py --switch PAGED_HEAVY_FIRST --kinds prefill
    python benchmarks/packed_order_ab.py --switch VARLEN_HEAVY_MAP --kinds varlen --masks full
    python benchmarks/packed_order_ab.py --switch VARLEN_HEAD_BLOCKS --kinds varlen --passes fwd

    python benchmarks/packed_order_ab.py --switch PAGE_JOIN_BELOW --values 0 32 \\
        --kinds prefill --pages 16 --passes fwd
    python benchmarks/packed_order_ab.py --switch PACKED_FWD_WHOLE --kinds varlen prefill
    python benchmarks/packed_order_ab.py --switch PACKED_FWD_SCATTER_OUT \\
        --set PACKED_FWD_WHOLE=True --kinds varlen prefill
    python benchmarks/packed_order_ab.py --switch PACKED_BWD_SCATTER_OUT --kinds varlen \\
        --passes fwd+bwd
    python benchmarks/packed_order_ab.py --switch PAGED_DECODE_OCCUPANCY --values 0 2 \\
        --kinds decode --passes fwd
    python benchmarks/packed_order_ab.py --switch GATHERED_PREFILL_SCHEDULE \\
        --values "''" "'64x128_o1_c1_lk2_lv4_w4'" --set GATHER_MAX_Q=1024 \\
        --kinds prefill --pages 16 --passes fwd

benchmarks/notes/varlen-paged.md §48a, §49a and §50a-§50e have the predictions and what they
measured; §51b and §51d-§51f the predictions of the last four.
"""
import argparse
import ast
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiledattention.bench import workload_cases as wc  # noqa: E402
from tiledattention.bench.methods import get_method  # noqa: E402
from tiledattention.kernel import workload as W  # noqa: E402
from tiledattention.stages.workloads import (  # noqa: E402
    WorkloadsConfig,
    _compared,
    _grads_compared,
    _step,
    points,
)
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402


def prepared(point, inputs, name):
    """(timed callable, its result as a flat tuple of tensors) of one method at a point."""
    prep = get_method(name).workload(inputs, point)
    if point.pass_ == "fwd":
        return prep.call, lambda: (prep.packed(prep.call()),)
    step = _step(prep)

    def result():
        step()
        return tuple(prep.grads())
    return step, result


def checked(point, inputs, results: dict) -> dict:
    """Each arm's result against the float64 reference, as the stage checks a row: the
    output (fwd) or dQ, dK, dV (fwd+bwd) on its reference heads. Bit-identical arms can
    still both be wrong, and a faster arm that reads the wrong keys is not a gain."""
    correctness = WorkloadsConfig().bench_config().correctness
    backward = point.pass_ != "fwd"
    ref, grad_refs = wc.reference(inputs, point, correctness.max_ref_heads, backward)
    hq, hk = wc.ref_heads(point, correctness.max_ref_heads)
    if backward:
        return {k: _grads_compared(r, grad_refs, hq, hk, point.dtype)["grads_correct"]
                for k, r in results.items()}
    rtol = getattr(correctness, f"rtol_{point.dtype}")
    return {k: _compared(r[0][:, :hq], ref, rtol)["correct"] for k, r in results.items()}


def run_point(point, switch, values, rounds, flush, fa4: bool) -> dict:
    default = getattr(W, switch)
    inputs = wc.make_inputs(point, 0, torch.device("cuda"))
    ours, ours_result = prepared(point, inputs, "tiledattention")
    timed = {"off": ours, "on": ours}
    if fa4:
        timed["fa4"] = prepared(point, inputs, "fa4")[0]
    ms = {k: [] for k in timed}
    results = {}
    for _ in range(rounds):
        for k, fn in timed.items():
            if k in ("off", "on"):
                setattr(W, switch, values[k == "on"])
                results[k] = tuple(t.clone() for t in ours_result())
            ms[k].append(summarize(time_cuda(fn, warmup=3, reps=10, flush=flush)).median_ms)
    setattr(W, switch, default)
    best = {k: min(v) for k, v in ms.items()}
    same = all(torch.equal(a, b) for a, b in zip(results["off"], results["on"]))
    correct = checked(point, inputs, results)
    return {"point": point.key(), "kind": point.kind, "pass": point.pass_,
            "causal": point.causal, "head_dim": point.head_dim, "gqa": point.gqa,
            "tokens": sum(point.seqs_q), "batch": point.batch, "page": point.page_size,
            "ms": best, "rounds_ms": ms, "bit_identical": same, "correct": correct,
            "gain": best["off"] / best["on"],
            "on_vs_fa4": best.get("fa4", float("nan")) / best["on"],
            "off_vs_fa4": best.get("fa4", float("nan")) / best["off"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switch", required=True, choices=[
        "PAGED_HEAVY_FIRST", "VARLEN_HEAD_BLOCKS", "VARLEN_BWD_HEAD_BLOCKS", "VARLEN_HEAVY_MAP",
        "PAGE_JOIN_BELOW", "MAX_PAGE_SPAN", "PAGED_SKIP_EMPTY", "PAGED_SPLIT_KEYS",
        "GATHER_TILE", "PAGE_GATHER_BELOW", "PAGE_KEYS_GATHERED", "GATHER_MAX_Q",
        "PAGED_DECODE_WORKER_WARPS", "PAGED_DECODE_OCCUPANCY", "PAGED_DECODE_OCCUPANCY_FROM",
        "GATHERED_PREFILL_SCHEDULE",
        "PACKED_FWD_WHOLE", "PACKED_FWD_SCATTER_OUT", "PACKED_BWD_SCATTER_OUT"])
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="another switch held at VALUE (a Python literal) in both arms")
    p.add_argument("--pages", nargs="+", type=int, help="only these page sizes (paged kinds)")
    p.add_argument("--values", nargs=2, default=["False", "True"],
                   help="off and on (Python literals)")
    p.add_argument("--masks", nargs="+", default=["full", "causal"], choices=["full", "causal"])
    p.add_argument("--kinds", nargs="+", default=["varlen", "prefill"],
                   choices=["varlen", "prefill", "decode"])
    p.add_argument("--passes", nargs="+", default=["fwd", "fwd+bwd"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-fa4", action="store_true")
    p.add_argument("--out", help="write the rows as JSON here")
    a = p.parse_args()
    for held in a.set:
        name, _, value = held.partition("=")
        if not hasattr(W, name):
            p.error(f"--set {held}: workload has no switch {name}")
        setattr(W, name, ast.literal_eval(value))
    flush = L2Flusher()
    rows = []
    for point in points(WorkloadsConfig()):
        if point.kind not in a.kinds or point.pass_ not in a.passes:
            continue
        if point.dtype != "bfloat16" or ("causal" if point.causal else "full") not in a.masks:
            continue
        if a.pages and point.page_size and point.page_size not in a.pages:
            continue
        values = [ast.literal_eval(v) for v in a.values]
        r = run_point(point, a.switch, values, a.rounds, flush, not a.no_fa4)
        rows.append(r)
        print(f"{r['kind']:7s} {r['pass']:7s} {'causal' if r['causal'] else 'full':6s} "
              f"D{r['head_dim']} gqa{r['gqa']} tok {r['tokens']:6d} B {r['batch']:3d} "
              f"page {r['page'] or 0:3d}: off {r['ms']['off']:.3f} on {r['ms']['on']:.3f} ms "
              f"gain {r['gain']:.3f}  fa4 {r['ms'].get('fa4', float('nan')):.3f} ms "
              f"(on/fa4 x{r['on_vs_fa4']:.3f}, off/fa4 x{r['off_vs_fa4']:.3f})  "
              f"bit-identical {r['bit_identical']}  float64 ok off {r['correct']['off']} "
              f"on {r['correct']['on']}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
