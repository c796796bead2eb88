"""The study's summary tables, each written as Markdown, CSV and LaTeX.

Table 4: TiledAttention against every baseline (mean, median, geometric mean, win count),
by kernel time and by call latency (``ratios.MEASURES``); per head dim and per regime
(mask x S), both measures per cell; call latency per point; Table 5: best and
runner-up schedule per tuned bucket with the sensitivity; Table 6: a schedule ladder on a
reduced grid; the rows whose status is not ``ok``, listed with their reasons; and the
shapes grid's geometry and unaligned-shape cost (``study/shapes.py``); the tiny Llama's
tokens/s per attention implementation (``model_e2e``); the variants against FlexAttention
(``variants``, ``study/variants.py``).
"""

from __future__ import annotations

import os

from ..bench.grid import pinned_label
from ..bench.methods import FUSED, METHODS, SUBJECT
from .ratios import (
    MEASURES,
    RatioSummary,
    compare,
    compare_by,
    index_rows,
    methods_in,
    pass_of,
    passes_in,
    points_of,
)
from .table import Table


def baselines(rows: list[dict]) -> list[str]:
    return [m for m in methods_in(rows) if m != SUBJECT and pinned_label(m) is None]


_SUMMARY_COLUMNS = ["n", "mean", "median", "geomean", "min", "max", "wins"]


def _summary_cells(s: RatioSummary) -> list:
    return [s.n, s.mean, s.median, s.geomean, s.min, s.max, f"{s.wins}/{s.n}"]


def table4(rows: list[dict]) -> Table:
    t = Table("table4_ratios", f"{SUBJECT} speed ÷ baseline speed, matched points",
              ["baseline", "measure"] + _SUMMARY_COLUMNS + ["not compared"])
    for b in baselines(rows):
        for measure, (label, _) in MEASURES.items():
            s = compare(rows, SUBJECT, b, measure=measure)
            t.rows.append([b, label] + _summary_cells(s) + [s.not_compared])
    t.notes.append("ratio > 1: TiledAttention faster. kernel time: CUDA events with host work "
                   "hidden (= the TFLOP/s ratio); call latency: steady-state wall time per "
                   "back-to-back call, host work included (call_us). wins: points with ratio "
                   "> 1. not compared: points where either method has no ok row with that "
                   "measure (see status).")
    return t


_PAIR_NOTE = ("each cell: kernel-time ratio / call-latency ratio, geometric means (points "
              "compared by kernel time); > 1: TiledAttention faster.")


def _pair(kernel: RatioSummary | None, call: RatioSummary | None) -> str:
    if kernel is None or kernel.n == 0:
        return "—"
    c = f"{call.geomean:.3f}" if call is not None and call.n else "—"
    return f"{kernel.geomean:.3f} / {c} ({kernel.n})"


def _pairs_by(rows: list[dict], key) -> dict[str, tuple[dict, dict]]:
    return {b: (compare_by(rows, SUBJECT, b, key), compare_by(rows, SUBJECT, b, key, "call"))
            for b in baselines(rows)}


def by_head_dim(rows: list[dict]) -> Table:
    per = _pairs_by(rows, lambda p: p["head_dim"])
    t = Table("ratios_by_head_dim", f"{SUBJECT} ÷ baseline by head dim: kernel time / call "
              "latency", ["D"] + list(per), notes=[_PAIR_NOTE])
    for d in sorted({p["head_dim"] for p in points_of(rows).values()}):
        t.rows.append([d] + [_pair(k.get(d), c.get(d)) for k, c in per.values()])
    return t


def by_regime(rows: list[dict]) -> Table:
    """Regimes: mask (full/causal) × sequence length, dtypes pooled."""

    def regime(p):
        return ("causal" if p["causal"] else "full", p["seq_q"])

    per = _pairs_by(rows, regime)
    t = Table("ratios_by_regime", f"{SUBJECT} ÷ baseline by mask and S: kernel time / call "
              "latency", ["mask", "S"] + list(per), notes=[_PAIR_NOTE])
    for g in sorted({regime(p) for p in points_of(rows).values()}):
        t.rows.append(list(g) + [_pair(k.get(g), c.get(g)) for k, c in per.values()])
    return t


def headline(rows: list[dict]) -> Table:
    """The paper's headline comparisons (its abstract and Table 4): against fused SDPA
    overall and per head dim, and against math SDPA and eager attention, each by kernel
    time and by call latency."""
    t = Table("headline", f"Headline: {SUBJECT} ÷ baseline, by kernel time and by call "
              "latency", ["against", "points", "kernel mean", "kernel geomean", "kernel min",
                          "kernel wins", "call geomean", "call min", "call wins"])
    present = set(methods_in(rows))
    training = [p for p in passes_in(rows) if p != "fwd"]
    everything = rows
    rows = [r for r in rows if pass_of(r) == "fwd"]

    def add(label, baseline, where=lambda p: True, rows=rows):
        if baseline in present:
            k = compare(rows, SUBJECT, baseline, where)
            c = compare(rows, SUBJECT, baseline, where, "call")
            t.rows.append([label, k.n, k.mean, k.geomean, k.min, f"{k.wins}/{k.n}",
                           c.geomean, c.min, f"{c.wins}/{c.n}"])

    # One row per method the registry puts in the headline, in registry order.
    for m in METHODS.values():
        if m.headline is None:
            continue
        add(m.headline, m.name)
        if m.headline_by_head_dim:
            for d in sorted({p["head_dim"] for p in points_of(rows).values()}):
                add(f"{m.label}, D={d}", m.name, lambda p, d=d: p["head_dim"] == d)
    # Backward passes: against every baseline measured there (all of them have a backward).
    for pass_ in training:
        sub = [r for r in everything if pass_of(r) == pass_]
        for b in baselines(sub):
            add(f"{b}, {pass_}", b, rows=sub)
    t.notes.append("kernel: CUDA-event time with host work hidden; call: steady-state wall "
                   "time per back-to-back call (call_us), what a caller waits. Rows without a "
                   "pass are the forward; 'fwd+bwd' rows time forward and backward together "
                   "(a training step's attention), 'bwd' the backward alone.")
    return t


def _per_point(rows: list[dict], name: str, title: str, column: str) -> Table:
    """``column`` of every method at every point (its status where not ok; empty where
    an ok row predates the column)."""
    ms = methods_in(rows)
    t = Table(name, title, ["dtype", "mask", "D", "S", "B", "H"] + ms)
    idx = index_rows(rows)
    for key, p in points_of(rows).items():
        cells = []
        for m in ms:
            r = idx.get((key, m))
            cells.append(None if r is None else r.get("status") if r.get("status") != "ok"
                         else None if r.get(column) is None
                         else float(f"{r[column]:.4g}"))
        t.rows.append([p["dtype"], "causal" if p["causal"] else "full", p["head_dim"],
                       p["seq_q"], p["batch"], p["heads"]] + cells)
    return t


def throughput(rows: list[dict]) -> Table:
    """TFLOP/s of every method at every point (status where not ok)."""
    return _per_point(rows, "throughput", "TFLOP/s per point and method (median time)",
                      "tflops")


def call_latency(rows: list[dict]) -> Table:
    """call_us of every method at every point (status where not ok)."""
    t = _per_point(rows, "call_latency",
                   "Call latency per point and method (us per back-to-back call)", "call_us")
    t.notes.append("steady-state wall time per call over back-to-back eager calls, host work "
                   "included; — where the row predates the column.")
    return t


def status(rows: list[dict]) -> Table:
    t = Table("status", "Rows whose status is not ok", ["point", "method", "status", "reason"])
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if r["status"] != "ok":
            t.rows.append([r["point_key"], r["method"], r["status"], r.get("reason", "")])
    t.notes.append("rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return t


def table5(tune_table: str | None) -> Table:
    t = Table("table5_schedules", "Best and runner-up schedule per tuned bucket",
              ["GPU", "dtype", "mask", "D", "S bucket", "best", "TFLOP/s", "runner-up",
               "TFLOP/s ", "sensitivity"])
    if not tune_table or not os.path.exists(tune_table):
        t.notes.append("tuning did not run in this study (config tune.enabled: false); the "
                       "shipped table's own winners are in tiledattention/schedules/tables/.")
        return t
    from ..schedules.table import ScheduleTable

    table = ScheduleTable.load(tune_table)  # bounded, validated: a bad table is one line
    if table.meta.get("unavailable"):  # the tuning job found no GPU
        t.notes.append(f"tuning did not run: {table.meta['unavailable']}.")
        return t
    for e in sorted(table.entries.values(), key=lambda e: (
            e.bucket.dtype, e.bucket.causal, e.bucket.head_dim, e.bucket.s_bucket)):
        b = e.bucket
        t.rows.append([e.gpu, b.dtype, "causal" if b.causal else "full", b.head_dim,
                       b.s_bucket, e.best.label(), round(e.best_tflops, 2),
                       e.runner_up.label() if e.runner_up else None,
                       round(e.runner_up_tflops, 2) if e.runner_up else None,
                       round(e.sensitivity, 4) if e.sensitivity is not None else None])
    t.notes.append(f"from {os.path.basename(tune_table)}; sensitivity: how much slower the "
                   "runner-up is (1 - runner-up / best).")
    return t


def table6(ladder_rows: list[dict]) -> Table:
    """Each ladder step's geometric-mean TFLOP/s and its ratio to fused SDPA."""
    t = Table("table6_ladder", "Schedule ladder on the reduced grid",
              ["step", "schedule", "geomean TFLOP/s", f"÷ {FUSED} (geomean)", "n"])
    if not ladder_rows:
        t.notes.append("no ladder in this study (config ladder.enabled: false).")
        return t
    import math

    steps = [m for m in methods_in(ladder_rows) if pinned_label(m) is not None or m == SUBJECT]
    for i, m in enumerate(steps, 1):
        ok = [r for r in ladder_rows if r["method"] == m and r["status"] == "ok"]
        geo = math.exp(sum(math.log(r["tflops"]) for r in ok) / len(ok)) if ok else None
        s = compare(ladder_rows, m, FUSED)
        label = pinned_label(m) or "tuned table"
        t.rows.append([i, label, geo, s.geomean, len(ok)])
    return t


def model_e2e(model_rows: list[dict]) -> Table:
    """Tokens/s of the tiny Llama per batch, phase and attention implementation, and the
    ratio to transformers' built-in sdpa (``bench/model.py``)."""
    t = Table("model_e2e", "Tiny Llama end to end: tokens/s per attention implementation",
              ["B", "phase", "implementation", "tokens/s", "÷ sdpa", "status"])
    if not model_rows:
        t.notes.append("no model benchmark in this study (config model.enabled: false).")
        return t
    ref = {(r["batch"], r["phase"]): r["tokens_per_s"] for r in model_rows
           if r["method"] == "sdpa" and r["status"] == "ok"}
    for r in sorted(model_rows, key=lambda r: (r["batch"], r["phase"] != "prefill")):
        ok = r["status"] == "ok"
        base = ref.get((r["batch"], r["phase"]))
        t.rows.append([r["batch"], r["phase"], r["method"], r["tokens_per_s"] if ok else None,
                       r["tokens_per_s"] / base if ok and base else None,
                       "ok" if ok else f"{r['status']}: {r.get('reason', '')}"])
    first = model_rows[0]
    t.notes.append(f"4 layers, hidden 2048, 16/4 heads, D 128, bf16, random weights; prompt "
                   f"{first['prompt']} tokens, {first.get('steps') or '—'} greedy decode "
                   f"steps, median of {first['reps']} interleaved reps. prefill: one forward "
                   "(CUDA events); decode: the step loop with a KV cache, host included. "
                   "÷ sdpa > 1: faster than transformers' built-in sdpa path.")
    return t


# The tables write_all writes, by file stem (the workflow lists its outputs from here).
NAMES = ("headline", "table4_ratios", "ratios_by_head_dim", "ratios_by_regime",
         "table5_schedules", "table6_ladder", "throughput", "call_latency", "status",
         "shapes", "shapes_cost", "model_e2e", "variants",
         "variants_summary")


def write_all(rows: list[dict], out_dir: str, *, tune_table: str | None = None,
              ladder_rows: list[dict] | None = None,
              shape_rows: list[dict] | None = None,
              model_rows: list[dict] | None = None,
              variant_rows: list[dict] | None = None) -> list[str]:
    from .shapes import shapes_cost_table, shapes_table
    from .variants import headline_rows, variants_summary, variants_table

    paths = []
    # The ratio tables compare forward rows, as before the pass axis; the headline adds
    # the backward passes, and the per-point tables list every pass's rows.
    fwd = [r for r in rows if pass_of(r) == "fwd"]
    head = headline(rows)
    extra = headline_rows(variant_rows or [])  # the variants stage's own points
    if extra:
        head.rows += extra
        head.notes.append("'(variants)' rows: tiledattention's built-in variants against "
                          "FlexAttention and SDPA with a materialised mask over the variants "
                          "stage's points (table variants).")
    for table in (head, table4(fwd), by_head_dim(fwd), by_regime(fwd),
                  table5(tune_table), table6(ladder_rows or []), throughput(rows),
                  call_latency(rows), status(rows), shapes_table(shape_rows or []),
                  shapes_cost_table(shape_rows or []), model_e2e(model_rows or []),
                  variants_table(variant_rows or []), variants_summary(variant_rows or [])):
        paths += table.write(out_dir)
    return paths
