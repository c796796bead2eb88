"""The workloads stage in the study: one table each for packed varlen forward, varlen
forward+backward, paged decode and chunked prefill (per point: our useful-token TFLOP/s —
GB/s of the K/V read for decode — the fastest baseline there, named, and the speedup over it
and over each baseline), the headline's workloads lines and the bundle README's sentence,
from the stage's rows (``stages/workloads.py``).

Speedup = the baseline's median kernel time ÷ ours (> 1: tiledattention faster). The fastest
baseline at a point is the fastest ok row of every method but ours there (FA4, FlexAttention,
SDPA on the padded batch, our block-mask packing, torch's varlen, FlashInfer: those that ran).
"""

from __future__ import annotations

from ...bench.methods import METHODS, SUBJECT
from .hardware import AT_CLOCK, at_clock_cell, at_clock_note
from .ratios import (
    MEASURES,
    RatioSummary,
    cells_by_point,
    compare,
    methods_in,
    not_ok_reasons,
    time_of,
)
from .table import Table

BEST = "fastest baseline"  # the pseudo-method of the fastest baseline at a point
# The stage's four tables: (name, kind, pass, title).
TABLES = (("workloads_varlen_fwd", "varlen", "fwd", "Packed varlen batches, forward"),
          ("workloads_varlen_fwdbwd", "varlen", "fwd+bwd",
           "Packed varlen batches, forward+backward"),
          ("workloads_decode", "decode", "fwd", "Paged KV cache, decode (one new token)"),
          ("workloads_prefill", "prefill", "fwd", "Paged KV cache, chunked prefill"))
NAMES = tuple(t[0] for t in TABLES)


def baselines(rows: list[dict]) -> list[str]:
    """The methods of ``rows`` other than ours, in registry order (unknown names last)."""
    present = methods_in(rows)
    order = [m for m in METHODS if m in present and m != SUBJECT]
    return order + [m for m in present if m not in order and m not in (SUBJECT, BEST)]


def best_rows(rows: list[dict]) -> list[dict]:
    """One ``BEST`` row per point where a baseline has a row: per measure the fastest ok
    time of the baselines, ``best_of`` naming it; status ``none`` where none is ok."""
    by_point: dict[str, list[dict]] = {}
    for r in rows:
        if r["method"] not in (SUBJECT, BEST):
            by_point.setdefault(r["point_key"], []).append(r)
    out = []
    for cands in by_point.values():
        row = {k: v for k, v in cands[0].items() if k not in (
            "method", "status", "reason", "time_ms", "call_us", "tflops", "gbytes_per_s",
            "details")}
        row.update(method=BEST, best_of={})
        for measure in MEASURES:
            timed = [(t, r) for r in cands if (t := time_of(r, measure))]
            if timed:
                t, fastest = min(timed, key=lambda x: x[0])
                row["best_of"][measure] = fastest["method"]
                if measure == "kernel":
                    row.update(time_ms={"median_ms": t}, tflops=fastest.get("tflops"),
                               gbytes_per_s=fastest.get("gbytes_per_s"))
                else:
                    row["call_us"] = t
        row["status"] = "ok" if row["best_of"] else "none"
        out.append(row)
    return out


def with_best(rows: list[dict]) -> list[dict]:
    rows = [r for r in rows if r["method"] != BEST]
    return rows + best_rows(rows)


def _ms(row: dict | None) -> float | None:
    return time_of(row, "kernel")


def ratio_rows(rows: list[dict], gpu: str | None = None) -> list[dict]:
    """One record per point: its shape, our row's throughput, the fastest baseline (name, or
    why there is none) and the speedup over it, per baseline its speedup or its status, and
    ours and the fastest's % of the peak at their rows' SM clocks (``gpu``'s peak)."""

    others = baselines(rows)
    out = []
    for cells in cells_by_point(with_best(rows)).values():
        p = next(r for r in cells.values())
        ours, best = cells.get(SUBJECT), cells.get(BEST)
        t_ours, t_best = _ms(ours), _ms(best)
        rec = {k: p.get(k) for k in ("point_key", "kind", "pass", "dtype", "causal",
                                     "head_dim", "heads", "heads_kv", "tokens", "batch",
                                     "page_size", "chunk", "seqs_q", "seqs_kv", "length_dist",
                                     "lengths_seed")}
        rec.update(ours_status=None if ours is None else ours.get("status"),
                   ours_tflops=ours.get("tflops") if t_ours else None,
                   ours_gbs=ours.get("gbytes_per_s") if t_ours else None,
                   ours_ms=t_ours,
                   best=None if best is None else best["best_of"].get("kernel") or "none ok",
                   best_tflops=best.get("tflops") if t_best else None,
                   best_gbs=best.get("gbytes_per_s") if t_best else None,
                   x_best=t_best / t_ours if t_ours and t_best else None,
                   x={m: _ratio(t_ours, cells.get(m)) for m in others},
                   ours_pct=at_clock_cell(ours, gpu),
                   best_pct=at_clock_cell(cells.get(best["best_of"].get("kernel")), gpu)
                   if t_best else None)
        out.append(rec)
    return out


def _ratio(ours_ms: float | None, row: dict | None):
    """A baseline's time ÷ ours; its status where its row is not ok; None where absent."""
    if row is None:
        return None
    t = _ms(row)
    return (t / ours_ms if ours_ms else None) if t else row.get("status")


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _shape(r: dict) -> list:
    heads = f"{r['heads']}/{r['heads_kv']}"
    if r["kind"] == "varlen":
        return [r["dtype"], "causal" if r["causal"] else "full", r["head_dim"], heads,
                r["tokens"], len(r["seqs_q"]), max(r["seqs_q"])]
    return [r["dtype"], r["batch"], r["page_size"], r["head_dim"], heads,
            sum(r["seqs_q"]), round(_mean(r["seqs_kv"])), max(r["seqs_kv"])]


_SHAPE = {"varlen": ["dtype", "mask", "D", "H/Hkv", "tokens", "docs", "longest"],
          "paged": ["dtype", "B", "page", "D", "H/Hkv", "new tokens", "context mean",
                    "context max"]}


def workload_table(rows: list[dict], name: str, kind: str, pass_: str, title: str,
                   gpu: str | None = None) -> Table:

    mine = [r for r in rows if r.get("kind") == kind and r.get("pass", "fwd") == pass_]
    others = baselines(mine)
    decode = kind == "decode"
    unit = "GB/s" if decode else "TFLOP/s"
    t = Table(name, f"Workloads: {title}: {SUBJECT} against the fastest baseline "
              "(kernel time)", _SHAPE["varlen" if kind == "varlen" else "paged"]
              + [f"ours {unit}", "ours ms", f"ours {AT_CLOCK}", "fastest baseline",
                 f"its {unit}", f"its {AT_CLOCK}", "× fastest"]
              + [f"× {m}" for m in others])
    if not mine:
        t.notes.append("no such points in this study (config workloads.enabled: false, or "
                       f"workloads.kinds/passes without {kind} {pass_}).")
        return t
    for r in sorted(ratio_rows(mine, gpu), key=_order):
        t.rows.append(_shape(r) + [
            (r["ours_gbs"] if decode else r["ours_tflops"]) or r["ours_status"],
            r["ours_ms"], r["ours_pct"], r["best"],
            r["best_gbs"] if decode else r["best_tflops"], r["best_pct"],
            r["x_best"]] + [r["x"][m] for m in others])
    t.notes += notes(mine, decode)
    t.notes.append(at_clock_note(mine, gpu) + (" Decode is bound by memory, not the tensor "
                                               "cores: a small share is expected." if decode
                                               else ""))
    return t


def _order(r: dict):
    return (r["dtype"], r["causal"], r["head_dim"], r["heads_kv"], r["tokens"] or 0,
            r["batch"], r["page_size"] or 0)


def notes(rows: list[dict], decode: bool = False) -> list[str]:
    out = ["× : the baseline's median kernel time ÷ ours (> 1: tiledattention faster); a "
           "status where its row is not ok. fastest baseline: the fastest ok row at the point "
           "among every method but ours (" + ", ".join(baselines(rows)) + ").",
           "TFLOP/s counts useful tokens only: 4·H·D per attended (query, key) pair of each "
           "sequence, causal pairs counted exactly (bottom-right aligned), padding never "
           "(fwd+bwd: 3.5x the forward). Every row checked against the float64 reference "
           "(all sequences, a slice of heads) before it was timed; L2 flushed before each "
           "timed call, methods interleaved."]
    if decode:
        out.append("GB/s: the K and V of every sequence's context (its tokens, not the rest "
                   "of its last page), q and out, ÷ the median kernel time.")
    if "sdpa_padded" in methods_in(rows):
        out.append("sdpa_padded: torch SDPA on the batch padded to its longest sequence with a "
                   "key-padding (and causal) mask; the padding copies and the mask are made "
                   "before the timed call, so its time is attention alone (over the padding).")
    dists = sorted({r["length_dist"] for r in rows if r.get("length_dist")})
    out += [f"lengths: {d}, seeded per batch (lengths_seed in the rows)." for d in dists]
    return out + not_ok_reasons(rows)


def tables(rows: list[dict], gpu: str | None = None) -> list[Table]:
    return [workload_table(rows, *spec, gpu=gpu) for spec in TABLES]


# The headline: per table, the geometric-mean speedup over the fastest baseline (and which
# it was), then over each baseline.
def headline_lines(rows: list[dict]) -> list[tuple[str, str, str, RatioSummary,
                                                   RatioSummary, dict]]:
    """(label, kind, pass, kernel-time summary, call-latency summary, fastest counts) per
    comparison made (a baseline never ok beside ours gives none)."""
    rows = with_best(rows)
    out = []
    for _, kind, pass_, title in TABLES:
        def where(p, kind=kind, pass_=pass_):
            return p.get("kind") == kind and p.get("pass", "fwd") == pass_

        for b in [BEST] + baselines([r for r in rows if where(r)]):
            k, c = compare(rows, SUBJECT, b, where), compare(rows, SUBJECT, b, where, "call")
            if k.n:
                label = f"{b} (workloads: {title.lower()})"
                out.append((label, kind, pass_, k, c,
                            _fastest(rows, where) if b == BEST else {}))
    return out


def _fastest(rows: list[dict], where) -> dict[str, int]:
    """How often each baseline was the fastest, where ours was compared with it."""
    idx = {(r["point_key"], r["method"]): r for r in rows}
    counts: dict[str, int] = {}
    for r in rows:
        if r["method"] == BEST and r["status"] == "ok" and where(r) and \
                _ms(idx.get((r["point_key"], SUBJECT))):
            name = r["best_of"]["kernel"]
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def sentence(rows: list[dict]) -> str:
    """The bundle README's workloads sentence (empty without the stage): the length
    distributions, then per table the speedup over the fastest baseline, naming it."""
    if not rows:
        return ""
    dists = "; ".join(f"{what} {d}" for what, d in sorted({
        ("documents" if r.get("kind") == "varlen" else "contexts", r["length_dist"])
        for r in rows if r.get("length_dist")}))
    parts = [f"{label.split(' (workloads: ')[1][:-1]} {k.geomean:.3f}x over {k.n} points "
             f"(min {k.min:.3f}x; fastest: " + (", ".join(f"{m} {n}" for m, n in
                                                   fastest.items()) or "—") + ")"
             for label, _, _, k, _, fastest in headline_lines(rows)
             if label.startswith(BEST)]
    text = f" Workloads (lengths: {dists})"
    if not parts:
        reasons = not_ok_reasons(rows)  # ours first, then the strongest baseline's
        why = [w for side in (SUBJECT, "fa4", "sdpa_padded") for w in reasons
               if w.startswith(f"{side} ")] + reasons
        return text + ": no speedup over a baseline measured" + (
            f" ({why[0]})." if why else ".")
    return (text + ", against the fastest baseline at each point, geometric-mean speedup by "
            "kernel time: " + "; ".join(parts) + ".")
