"""The study's summary tables, each written as Markdown, CSV and LaTeX.

Table 4: TiledAttention against every baseline (mean, median, geometric mean, win count),
by kernel time and by call latency (``ratios.MEASURES``); per head dim and per regime
(mask x S), both measures per cell; call latency per point; Table 5: best and
runner-up schedule per tuned bucket with the sensitivity; Table 6: a schedule ladder on a
reduced grid; the rows whose status is not ``ok``, grouped by method, status and reason;
and the shapes grid's geometry and unaligned-shape cost (``presentation/shapes.py``); the
tiny Llama's tokens/s per attention implementation (``model_e2e``); the variants against
FlexAttention (``variants``, ``presentation/variants_report.py``). Each ratio table puts
TiledAttention against the fastest fused baseline at each point (``ratios.BEST``, named)
next to every baseline; the headline (and its per head shape and dtype table,
``headline_shapes``) is ``presentation/headline.py``'s.
"""

from __future__ import annotations

import os

from ...bench.grid import head_labels, pinned_label, row_head_label
from ...bench.methods import FUSED, SUBJECT
from .fp8_report import fp8_table
from .hardware import AT_CLOCK, at_clock_cell, at_clock_note, pct_at_clock
from .headline import shape_table
from .headline import table as headline_table
from .ratios import (
    BEST,
    MEASURES,
    RatioSummary,
    baselines,
    compare,
    compare_by,
    counts_text,
    fastest_counts,
    fused_baselines,
    geomean,
    index_rows,
    methods_in,
    pass_of,
    points_of,
    time_of,
    with_best,
)
from .table import Table


def _compared(rows: list[dict]) -> list[str]:
    """The columns of a ratio table: the fastest fused baseline (where there is a fused
    baseline), then each baseline."""
    return ([BEST] if fused_baselines(methods_in(rows)) else []) + baselines(rows)


_SUMMARY_COLUMNS = ["n", "mean", "median", "geomean", "min", "max", "wins"]


def _summary_cells(s: RatioSummary) -> list:
    return [s.n, s.mean, s.median, s.geomean, s.min, s.max, f"{s.wins}/{s.n}"]


def table4(rows: list[dict]) -> Table:
    t = Table("table4_ratios", f"{SUBJECT} speed ÷ baseline speed, matched points",
              ["baseline", "measure"] + _SUMMARY_COLUMNS + ["not compared", "fastest at"])
    best = with_best(rows)
    for b in _compared(rows):
        for measure, (label, _) in MEASURES.items():
            s = compare(best, SUBJECT, b, measure=measure)
            t.rows.append([b, label] + _summary_cells(s) + [s.not_compared] + [
                counts_text(fastest_counts(rows, SUBJECT, measure=measure)) if b == BEST
                else None])
    t.notes.append("ratio > 1: TiledAttention faster. kernel time: CUDA events with host work "
                   "hidden (= the TFLOP/s ratio); call latency: steady-state wall time per "
                   "back-to-back call, host work included (call_us). wins: points with ratio "
                   "> 1. not compared: points where either method has no ok row with that "
                   "measure (see status).")
    if BEST in [r[0] for r in t.rows]:
        t.notes.append(BEST_NOTE)
    return t


# What "fastest fused" means, in every table that has it.
BEST_NOTE = ("fastest fused: at each point, per measure, the fastest ok row among the fused "
             "baselines measured there (the registry's fused methods: not math or eager); "
             "fastest at: the points each one was the fastest at. A point where no fused "
             "baseline is ok is not compared.")


_PAIR_NOTE = ("each cell: kernel-time ratio / call-latency ratio, geometric means (points "
              "compared by kernel time); > 1: TiledAttention faster.")


def _pair(kernel: RatioSummary | None, call: RatioSummary | None) -> str:
    if kernel is None or kernel.n == 0:
        return "—"
    c = f"{call.geomean:.3f}" if call is not None and call.n else "—"
    return f"{kernel.geomean:.3f} / {c} ({kernel.n})"


def _pairs_by(rows: list[dict], key) -> dict[str, tuple[dict, dict]]:
    best = with_best(rows)
    return {b: (compare_by(best, SUBJECT, b, key), compare_by(best, SUBJECT, b, key, "call"))
            for b in _compared(rows)}


def _with_note(t: Table, per: dict) -> Table:
    if BEST in per:
        t.notes.append(BEST_NOTE)
    return t


def by_head_dim(rows: list[dict]) -> Table:
    per = _pairs_by(rows, row_head_label)
    t = Table("ratios_by_head_dim", f"{SUBJECT} ÷ baseline by head dim: kernel time / call "
              "latency", ["D"] + list(per), notes=[_PAIR_NOTE])
    for d in head_labels(points_of(rows).values()):
        t.rows.append([d] + [_pair(k.get(d), c.get(d)) for k, c in per.values()])
    return _with_note(t, per)


def by_regime(rows: list[dict]) -> Table:
    """Regimes: mask (full/causal) × sequence length, dtypes pooled."""

    def regime(p):
        return ("causal" if p["causal"] else "full", p["seq_q"])

    per = _pairs_by(rows, regime)
    t = Table("ratios_by_regime", f"{SUBJECT} ÷ baseline by mask and S: kernel time / call "
              "latency", ["mask", "S"] + list(per), notes=[_PAIR_NOTE])
    for g in sorted({regime(p) for p in points_of(rows).values()}):
        t.rows.append(list(g) + [_pair(k.get(g), c.get(g)) for k, c in per.values()])
    return _with_note(t, per)


def headline(rows: list[dict], variant_rows: list[dict] | None = None,
             workload_rows: list[dict] | None = None) -> Table:
    """The paper's headline comparisons (its abstract and Table 4): ``presentation/headline.py``'s
    lines as a table."""
    return headline_table(rows, variant_rows, workload_rows)


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
        t.rows.append([p["dtype"], "causal" if p["causal"] else "full", row_head_label(p),
                       p["seq_q"], p["batch"], p["heads"]] + cells)
    return t


def per_point_ratios(rows: list[dict], gpu: str | None = None) -> Table:
    """At every point and pass: the fastest fused baseline (named), its kernel time and ours,
    the ratio to it, then the ratio to each baseline — kernel time; where no fused baseline
    (or not the subject) is ok, why, and no ratio."""
    others = baselines(rows)
    t = Table("ratios_per_point", f"{SUBJECT} ÷ the fastest fused baseline at each point, "
              "and ÷ each baseline (kernel time)",
              ["dtype", "mask", "D", "S", "B", "H", "pass", "fastest fused", "its ms",
               f"{SUBJECT} ms", f"its {AT_CLOCK}", f"{SUBJECT} {AT_CLOCK}", "× fastest"]
              + [f"× {b}" for b in others],
              notes=[BEST_NOTE, "× : the baseline's median kernel time ÷ ours (> 1: "
                     f"{SUBJECT} faster); a status where that method's row is not ok."])
    idx = index_rows(with_best(rows))
    for key, p in points_of(rows).items():
        ours, best = idx.get((key, SUBJECT)), idx.get((key, BEST))
        ts, tb = _kernel_ms(ours), _kernel_ms(best)
        name = None if best is None else best["best_of"].get("kernel") or "none ok"
        cells = [_ratio(ts, idx.get((key, b))) for b in others]
        its = idx.get((key, name)) if tb else None  # the fastest's own row: its clock
        t.rows.append([p["dtype"], "causal" if p["causal"] else "full", row_head_label(p),
                       p["seq_q"], p["batch"], p["heads"], pass_of(p), name, tb,
                       ts if ts else None if ours is None else ours.get("status"),
                       at_clock_cell(its, gpu), at_clock_cell(ours, gpu),
                       tb / ts if ts and tb else None] + cells)
    t.notes.append(at_clock_note(rows, gpu))
    return t


def _kernel_ms(row: dict | None) -> float | None:
    return time_of(row, "kernel")


def _ratio(ours_ms: float | None, row: dict | None):
    """A baseline's time ÷ ours, its status where its row is not ok, None where absent."""
    if row is None:
        return None
    t = time_of(row, "kernel")
    return (t / ours_ms if ours_ms else None) if t else row.get("status")


def throughput(rows: list[dict], gpu: str | None = None) -> Table:
    """TFLOP/s of every method at every point (status where not ok), then each method's %
    of the peak at the SM clock its row recorded."""
    t = _per_point(rows, "throughput", "TFLOP/s per point and method (median time)",
                   "tflops")
    ms, idx = methods_in(rows), index_rows(rows)
    t.columns += [f"{m} {AT_CLOCK}" for m in ms]
    for line, key in zip(t.rows, points_of(rows)):
        line += [at_clock_cell(idx.get((key, m)), gpu) for m in ms]
    t.notes.append(at_clock_note(rows, gpu))
    return t


def call_latency(rows: list[dict]) -> Table:
    """call_us of every method at every point (status where not ok)."""
    t = _per_point(rows, "call_latency",
                   "Call latency per point and method (us per back-to-back call)", "call_us")
    t.notes.append("steady-state wall time per call over back-to-back eager calls, host work "
                   "included; — where the row predates the column.")
    return t


def status(rows: list[dict]) -> Table:
    """The rows that are not ok, one line per (method, status, reason): how many rows and
    at which points (every row of the method, the points when few, else a count and the
    first few). The rows themselves name every point; a line per point is noise here."""
    t = Table("status", "Rows whose status is not ok, by method, status and reason",
              ["method", "status", "reason", "rows", "points"])
    counts: dict[str, int] = {}
    per_method: dict[str, int] = {}
    groups: dict[tuple[str, str, str], list[str]] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        per_method[r["method"]] = per_method.get(r["method"], 0) + 1
        if r["status"] != "ok":
            key = (r["method"], r["status"], str(r.get("reason") or ""))
            groups.setdefault(key, []).append(r["point_key"])
    for (method, st, reason), points in sorted(groups.items()):
        t.rows.append([method, st, reason, len(points),
                       _points_text(points, method, per_method[method])])
    t.notes.append("rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if groups:
        t.notes.append("points: every point of the group when few, else how many and the "
                       f"first {STATUS_EXAMPLES}; the rows (rows.jsonl) name each one.")
    return t


STATUS_EXAMPLES = 3  # points named in a status line of more than STATUS_LISTED points
STATUS_LISTED = 5


def _points_text(points: list[str], method: str, method_rows: int) -> str:
    if len(points) == method_rows and len(points) > 1:
        return f"all {len(points)} rows of {method}"
    if len(points) <= STATUS_LISTED:
        return ", ".join(points)
    return f"{len(points)} points, e.g. " + ", ".join(points[:STATUS_EXAMPLES])


def table5(tune_table: str | None) -> Table:
    t = Table("table5_schedules", "Best and runner-up schedule per tuned bucket",
              ["GPU", "dtype", "mask", "D", "S bucket", "best", "TFLOP/s", "runner-up",
               "TFLOP/s ", "sensitivity", AT_CLOCK])
    if not tune_table or not os.path.exists(tune_table):
        t.notes.append("tuning did not run in this study (config tune.enabled: false); the "
                       "shipped table's own winners are in tiledattention/schedules/tables/.")
        return t
    from ...schedules.table import ScheduleTable

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
                       round(e.sensitivity, 4) if e.sensitivity is not None else None, None])
    t.notes.append(f"from {os.path.basename(tune_table)}; sensitivity: how much slower the "
                   "runner-up is (1 - runner-up / best).")
    t.notes.append(f"{AT_CLOCK}: —: the tuning table keeps each schedule's TFLOP/s, not the "
                   "SM clock it ran at, so no share of the peak at the clock is known (no "
                   "nominal clock stands in for it).")
    return t


def table6(ladder_rows: list[dict], gpu: str | None = None) -> Table:
    """Each ladder step's geometric-mean TFLOP/s and its ratio to fused SDPA."""
    t = Table("table6_ladder", "Schedule ladder on the reduced grid",
              ["step", "schedule", "geomean TFLOP/s", f"÷ {FUSED} (geomean)", "n",
               "÷ fastest fused (geomean)", f"geomean {AT_CLOCK}"])
    if not ladder_rows:
        t.notes.append("no ladder in this study (config ladder.enabled: false).")
        return t
    steps = [m for m in methods_in(ladder_rows) if pinned_label(m) is not None or m == SUBJECT]
    best = with_best(ladder_rows)
    for i, m in enumerate(steps, 1):
        ok = [r for r in ladder_rows if r["method"] == m and r["status"] == "ok"]
        geo = geomean(r["tflops"] for r in ok)
        s = compare(ladder_rows, m, FUSED)
        label = pinned_label(m) or "tuned table"
        pcts = [pct_at_clock(r, gpu) for r in ok]
        at = geomean(pcts) if ok and None not in pcts else None  # every row's own clock
        t.rows.append([i, label, geo, s.geomean, len(ok), compare(best, m, BEST).geomean,
                       None if at is None else f"{at:.1f}"])
    t.notes.append("÷ fastest fused: against the fastest fused baseline at each point of the "
                   "ladder's grid (" + (counts_text(fastest_counts(ladder_rows, steps[-1]))
                                        if steps else "—") + ").")
    t.notes.append(at_clock_note(ladder_rows, gpu) + " The geomean is over a step's ok "
                   "rows, each at its own clock; — where any of them has none.")
    return t


def model_e2e(model_rows: list[dict]) -> Table:
    """Tokens/s of the tiny Llama per batch, phase and attention implementation, and the
    ratio to transformers' built-in sdpa (``bench/model.py``)."""
    t = Table("model_e2e", "Tiny Llama end to end: tokens/s per attention implementation",
              ["B", "phase", "implementation", "tokens/s", "÷ sdpa", "status",
               "÷ fastest fused", "fastest fused"])
    if not model_rows:
        t.notes.append("no model benchmark in this study (config model.enabled: false).")
        return t
    ref = {(r["batch"], r["phase"]): r["tokens_per_s"] for r in model_rows
           if r["method"] == "sdpa" and r["status"] == "ok"}
    fastest: dict[tuple, tuple[float, str]] = {}
    for r in model_rows:  # the highest tokens/s among the fused implementations (ties: first)
        k = (r["batch"], r["phase"])
        if r["status"] == "ok" and model_fused(r["method"]) and \
                r["tokens_per_s"] > fastest.get(k, (0.0, ""))[0]:
            fastest[k] = (r["tokens_per_s"], r["method"])
    for r in sorted(model_rows, key=lambda r: (r["batch"], r["phase"] != "prefill")):
        ok = r["status"] == "ok"
        base = ref.get((r["batch"], r["phase"]))
        best, name = fastest.get((r["batch"], r["phase"]), (None, "none ok"))
        t.rows.append([r["batch"], r["phase"], r["method"], r["tokens_per_s"] if ok else None,
                       r["tokens_per_s"] / base if ok and base else None,
                       "ok" if ok else f"{r['status']}: {r.get('reason', '')}",
                       r["tokens_per_s"] / best if ok and best else None, name])
    first = model_rows[0]
    t.notes.append(f"4 layers, hidden 2048, 16/4 heads, D 128, bf16, random weights; prompt "
                   f"{first['prompt']} tokens, {first.get('steps') or '—'} greedy decode "
                   f"steps, median of {first['reps']} interleaved reps. prefill: one forward "
                   "(CUDA events); decode: the step loop with a KV cache, host included. "
                   "÷ sdpa > 1: faster than transformers' built-in sdpa path.")
    t.notes.append("÷ fastest fused: tokens/s ÷ the fastest fused implementation's at that "
                   "batch and phase (named; transformers' eager is not fused).")
    return t


# The model stage names transformers' attention implementations; these are the registry's.
MODEL_METHODS = {"sdpa": "torch_sdpa"}


def model_fused(impl: str) -> bool:
    """Whether a model-stage implementation counts as a fused baseline: the registry's
    ``fused`` of its method (transformers' ``eager`` is not; an implementation the registry
    does not know, e.g. a flash-attention kernel, is); never the subject."""
    from ...bench.methods import METHODS

    if impl == SUBJECT:
        return False
    m = METHODS.get(MODEL_METHODS.get(impl, impl))
    return m.fused if m is not None else True


# The tables write_all writes, by file stem (the workflow lists its outputs from here).
NAMES = ("headline", "headline_shapes", "table4_ratios", "ratios_by_head_dim",
         "ratios_by_regime", "ratios_per_point",
         "table5_schedules", "table6_ladder", "throughput", "call_latency", "status", "fp8",
         "shapes", "shapes_cost", "model_e2e", "variants",
         "variants_summary", "workloads_varlen_fwd", "workloads_varlen_fwdbwd",
         "workloads_decode", "workloads_prefill")


def _shapes_tables(rows: list[dict], gpu: str | None) -> list[Table]:
    from .shapes import shapes_cost_table, shapes_table

    return [shapes_table(rows, gpu), shapes_cost_table(rows)]


def _variants_tables(rows: list[dict], gpu: str | None) -> list[Table]:
    from .variants_report import variants_summary, variants_table

    return [variants_table(rows, gpu), variants_summary(rows)]


def _workloads_tables(rows: list[dict], gpu: str | None) -> list[Table]:
    from .workloads_report import tables

    return tables(rows, gpu)


# The tables each stage's own rows become, by stage name (``stages.STAGES``' rows records;
# write_all takes their rows by it), in the order they are written after the benchmark's;
# each takes (rows, gpu): the GPU whose peak the % peak @ clock columns use.
STAGE_TABLES = {
    "ladder": lambda rows, gpu: [table6(rows, gpu)],
    "shapes": _shapes_tables,
    "model": lambda rows, gpu: [model_e2e(rows)],
    "variants": _variants_tables,
    "workloads": _workloads_tables,
}


def write_all(rows: list[dict], out_dir: str, *, tune_table: str | None = None,
              stage_rows: dict[str, list[dict]] | None = None,
              gpu: str | None = None) -> list[str]:
    """Every table: the benchmark rows' and each stage's (``stage_rows``: their rows by
    stage name; a stage left out writes its tables empty, saying so); ``gpu``: the GPU's
    name as the manifest records it, whose peak the % peak @ clock columns use (None: —)."""
    stage_rows = stage_rows or {}
    paths = []
    # The ratio tables compare forward rows, as before the pass axis; the headline adds
    # the backward passes and the variants stage's points, and the per-point tables list
    # every pass's rows.
    fwd = [r for r in rows if pass_of(r) == "fwd"]
    for table in (headline(rows, stage_rows.get("variants"), stage_rows.get("workloads")),
                  shape_table(rows, stage_rows.get("variants"), stage_rows.get("shapes")),
                  table4(fwd),
                  by_head_dim(fwd), by_regime(fwd), per_point_ratios(rows, gpu),
                  table5(tune_table), throughput(rows, gpu), call_latency(rows), status(rows),
                  fp8_table(rows + (stage_rows.get("shapes") or []), gpu),
                  *[t for name, tables in STAGE_TABLES.items()
                    for t in tables(stage_rows.get(name) or [], gpu)]):
        paths += table.write(out_dir)
    return paths
