"""The FP8 (e4m3) forward against 16-bit attention at the same shape: table ``fp8``.

An FP8 point's inputs are its bf16 twin's quantized (``config/shapes-fp8.yaml``), so the
question a reader has is what FP8 buys over the bf16 kernel a user runs today: ours in FP8
against ours in bf16 and against the fastest fused bf16 baseline at the twin point, with
its error against the float64 reference of the dequantized inputs beside the e4m3 bound
(``tolerance.RTOL``). From every row that holds FP8 points (the benchmark's or a shapes
grid's); a study without them writes the table empty, saying so.
"""

from __future__ import annotations

from ...bench.grid import row_head_label
from ...bench.methods import METHODS, SUBJECT
from .hardware import AT_CLOCK, at_clock_cell, at_clock_note
from .ratios import geomean
from .table import Table

FP8 = "float8_e4m3fn"
TWIN = "bfloat16"
# What places a point apart from its dtype: its twin has all of these equal.
_SHAPE = ("pass", "causal", "head_dim", "head_dim_v", "seq_q", "seq_kv", "batch", "heads", "gqa")


def _ms(row: dict | None) -> float | None:
    ok = row is not None and row.get("status") == "ok"
    return (row.get("time_ms") or {}).get("median_ms") if ok else None


def _shape(row: dict) -> tuple:
    return tuple(row.get(k) for k in _SHAPE)


def _fastest(rows: list[dict]) -> dict | None:
    """The fastest ok fused baseline among ``rows`` (one point's), or None."""
    fused = [r for r in rows if r["method"] != SUBJECT and _ms(r) is not None
             and getattr(METHODS.get(r["method"]), "fused", False)]
    return min(fused, key=_ms, default=None)


def fp8_table(rows: list[dict], gpu: str | None = None) -> Table:
    """Per FP8 point: ours in FP8 and in bf16, their ratio, the fastest bf16 baseline and
    ours in FP8 against it (kernel time), the error and its bound, % peak at the clock."""
    t = Table("fp8", f"FP8 (e4m3) forward: {SUBJECT} against 16-bit attention at the same "
              "shape", ["mask", "D", "S", "B", "H", "fp8 TFLOP/s", "bf16 TFLOP/s",
                        "fp8 ÷ bf16", "fastest bf16", "its TFLOP/s", "fp8 ÷ fastest bf16",
                        "rel. err", "e4m3 bound", f"fp8 {AT_CLOCK}"])
    ours = [r for r in rows if r.get("method") == SUBJECT and r.get("dtype") == FP8]
    if not ours:
        t.notes.append("No FP8 point in this study (config/shapes-fp8.yaml's grid, as a bench "
                       "config or a shapes grid, measures them).")
        return t
    twins: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("dtype") == TWIN:
            twins.setdefault(_shape(r), []).append(r)
    by_d: dict[str, list[float]] = {}
    for r in ours:
        twin = twins.get(_shape(r), [])
        mine = next((x for x in twin if x["method"] == SUBJECT), None)
        best = _fastest(twin)
        fp8_ms = _ms(r)
        over_bf16 = _ms(mine) / fp8_ms if fp8_ms and _ms(mine) else None
        over_best = _ms(best) / fp8_ms if fp8_ms and best else None
        if over_bf16 and r["seq_q"] >= 4096:
            by_d.setdefault(row_head_label(r), []).append(over_bf16)
        t.rows.append([
            "causal" if r["causal"] else "full", row_head_label(r), r["seq_q"], r["batch"],
            r["heads"], r["tflops"] if fp8_ms else r.get("status"),
            (mine or {}).get("tflops") if _ms(mine) else (mine or {}).get("status"),
            over_bf16, (best or {}).get("method"), (best or {}).get("tflops"), over_best,
            r.get("rel_err"), r.get("rtol"), at_clock_cell(r, gpu)])
    t.notes.append("fp8 ÷ bf16, fp8 ÷ fastest bf16: the bf16 row's median kernel time ÷ the "
                   "FP8 row's at the same shape (> 1: FP8 faster); fastest bf16: the fastest "
                   "fused baseline in bf16 there (no FP8 forward of theirs ran here: each "
                   "row says why, tables status). TFLOP/s count the same FLOPs in both "
                   "dtypes. rel. err: against float64 attention of the dequantized inputs; "
                   "e4m3 bound: the tolerance it was checked with.")
    if by_d:
        t.notes.append("fp8 ÷ bf16 at S >= 4096, geometric mean: " + "; ".join(
            f"D={d} {geomean(v):.3f}x ({len(v)} point{'s' * (len(v) != 1)})"
            for d, v in by_d.items()) + ".")
    t.notes.append(at_clock_note(ours, gpu) + " For FP8 the peak is twice bf16's.")
    return t
