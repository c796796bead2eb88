"""The headline comparisons, computed once (``lines``): TiledAttention against the fastest
fused baseline at each point (``ratios.BEST``, naming which baseline that was) and against
each baseline, forward (overall and per head dim), each training pass, and the variants
stage per pass, by kernel time and by call latency. The headline table (``table``) and the
bundle README's sentences (``bench_sentence``, ``variants_sentence``) render these lines;
nothing else computes a headline ratio. Per stage, pass, head shape and dtype
(``by_shape``): where ours is the only method that ran, and where it leads or trails the
fastest fused baseline (table ``headline_shapes``, the README's ``shape_sentences``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...bench.grid import head_labels, row_head_label
from ...bench.methods import FUSED, METHODS, SUBJECT
from .ratios import (
    BEST,
    RatioSummary,
    baselines,
    compare,
    counts_text,
    fastest_counts,
    fused_baselines,
    methods_in,
    pass_of,
    passes_in,
    points_of,
    with_best,
)
from .standing import PASS_NAMES, WORST, alone
from .table import Table
from .variants_report import PASSES, not_ok_reasons, variant_order

COLUMNS = ["against", "points", "kernel mean", "kernel geomean", "kernel min", "kernel wins",
           "call geomean", "call min", "call wins", "fastest fused (kernel time)"]


@dataclass(frozen=True)
class Line:
    stage: str  # "bench" or "variants"
    pass_: str
    baseline: str  # a method, or ratios.BEST
    label: str  # its "against" cell
    kernel: RatioSummary
    call: RatioSummary
    fastest: dict[str, int] | None = None  # BEST: points each fused baseline was fastest at
    head_dim: int | str | None = None  # its head shape's label (grid.head_label)
    dtype: str | None = None
    # by_shape's lines: the points where only ours ran, each with the others' refusals
    alone: tuple[tuple[str, dict[str, str]], ...] = ()

    def cells(self) -> list:
        k, c = self.kernel, self.call
        return [self.label, k.n, k.mean, k.geomean, k.min, f"{k.wins}/{k.n}", c.geomean,
                c.min, f"{c.wins}/{c.n}",
                None if self.fastest is None else counts_text(self.fastest)]


def _line(rows, stage, pass_, baseline, label, where=lambda p: True, **kw) -> Line:
    return Line(stage, pass_, baseline, label, compare(rows, SUBJECT, baseline, where),
                compare(rows, SUBJECT, baseline, where, "call"),
                fastest_counts(rows, SUBJECT, where) if baseline == BEST else None, **kw)


def _head_dims(rows) -> list[int | str]:
    """The head shapes' labels (D, or "192/128" where V's head dim differs)."""
    return head_labels(points_of(rows).values())


def _forward(rows: list[dict]) -> list[Line]:
    """Forward: the fastest fused baseline (overall, per D), then each method the registry
    puts in the headline (its ``headline`` label) or counts as fused, in registry order."""
    present = set(methods_in(rows))
    rows = with_best(rows)
    out = []
    if fused_baselines(present):
        out.append(_line(rows, "bench", "fwd", BEST, "fastest fused baseline, all points"))
        out += [_line(rows, "bench", "fwd", BEST, f"fastest fused, D={d}",
                      lambda p, d=d: row_head_label(p) == d, head_dim=d)
                for d in _head_dims(rows)]
    for m in METHODS.values():
        label = m.headline or (m.label if m.fused else None)
        if m.name == SUBJECT or label is None or m.name not in present:
            continue
        out.append(_line(rows, "bench", "fwd", m.name, label))
        if m.headline_by_head_dim:
            out += [_line(rows, "bench", "fwd", m.name, f"{m.label}, D={d}",
                          lambda p, d=d: row_head_label(p) == d, head_dim=d)
                    for d in _head_dims(rows)]
    return out


def _training(rows: list[dict], pass_: str) -> list[Line]:
    """A training pass: the fastest fused baseline (and per dtype where there are several),
    then every baseline measured there."""
    out = []
    if fused_baselines(methods_in(rows)):
        best = with_best(rows)
        out.append(_line(best, "bench", pass_, BEST, f"fastest fused, {pass_}"))
        dtypes = sorted({r["dtype"] for r in rows if r.get("dtype")})
        if len(dtypes) > 1:
            out += [_line(best, "bench", pass_, BEST, f"fastest fused, {pass_}, {dt}",
                          lambda p, dt=dt: p.get("dtype") == dt, dtype=dt) for dt in dtypes]
    return out + [_line(rows, "bench", pass_, b, f"{b}, {pass_}") for b in baselines(rows)]


def _variants(rows: list[dict]) -> list[Line]:
    """The variants stage per pass: the fastest fused baseline, then each fused baseline
    (by its registry label) — only where something was compared."""
    rows = with_best(rows)
    out = []
    for b in [BEST] + fused_baselines(methods_in(rows)):
        label = "fastest fused" if b == BEST else METHODS[b].label
        for p in PASSES:
            line = _line(rows, "variants", p, b, f"{label} (variants), {p}",
                         lambda point, p=p: point.get("pass", "fwd") == p)
            if line.kernel.n:
                out.append(line)
    return out


def lines(rows: list[dict], variant_rows: list[dict] | None = None) -> list[Line]:
    """Every headline comparison of the benchmark's ``rows`` and the variants stage's."""
    out = _forward([r for r in rows if pass_of(r) == "fwd"])
    for p in passes_in(rows):
        if p != "fwd":
            out += _training([r for r in rows if pass_of(r) == p], p)
    return out + _variants(variant_rows or [])


def by_shape(rows: list[dict], variant_rows: list[dict] | None = None,
             shape_rows: list[dict] | None = None) -> list[Line]:
    """Per stage (the benchmark, the shapes grids, the variants stage), pass, head shape and
    dtype: ours
    against the fastest fused baseline (``kernel.geomean`` > 1: it leads there, < 1: it
    trails; ``fastest``: which baseline was the fastest where) and the points where ours is
    the only method that ran (``alone``: standing.alone, each other's refusal named). A
    group with neither is left out; forward and forward+backward are never one group."""
    out = []
    for stage, stage_rows in (("bench", rows), ("shapes", shape_rows or []),
                              ("variants", variant_rows or [])):
        for p in passes_in(stage_rows):
            here = [r for r in stage_rows if pass_of(r) == p]
            best = with_best(here)
            for d in _shapes(here):
                for dt in sorted({str(r.get("dtype")) for r in here if _shape(r) == d}):
                    def where(point, d=d, dt=dt):
                        return _shape(point) == d and str(point.get("dtype")) == dt
                    ln = _line(best, stage, p, BEST, _group_label(stage, p, d, dt), where,
                               head_dim=d, dtype=dt,
                               alone=tuple(alone([r for r in here if where(r)])))
                    if ln.kernel.n or ln.alone:
                        out.append(ln)
    return out


def _shape(row: dict) -> int | str | None:
    """A row's head shape label (None for a row without a head dim, as hand-made ones)."""
    return row_head_label(row) if "head_dim" in row else None


def _shapes(rows: list[dict]) -> list[int | str | None]:
    """The head shapes of ``rows`` in ``_head_dims``' order, None last where a row has none."""
    return (_head_dims([r for r in rows if "head_dim" in r])
            + ([None] if any("head_dim" not in r for r in rows) else []))


def _group_label(stage: str, pass_: str, head: int | str | None, dtype: str) -> str:
    """"forward D=128 bfloat16", "shapes forward D=512 bfloat16", "variants forward+backward
    D=128 bfloat16"."""
    return (("" if stage == "bench" else f"{stage} ") + PASS_NAMES.get(pass_, pass_)
            + ("" if head is None else f" D={head}") + f" {dtype}")


def standing_word(line: Line) -> str:
    """Where ours stands in a group: leads (geomean > 1), trails (< 1), ties, or — where
    nothing was compared."""
    g = line.kernel.geomean
    return "—" if g is None else "leads" if g > 1 else "trails" if g < 1 else "ties"


def _refused(line: Line) -> str:
    """The other methods at a group's first point only ours ran, those refused alike
    together: "flash, fa4 unsupported (has no FP8 (e4m3) forward here); cudnn_fe
    unavailable (...)"."""
    if not line.alone:
        return ""
    by_why: dict[str, list[str]] = {}
    for m, why in line.alone[0][1].items():
        by_why.setdefault(why, []).append(m)
    return "; ".join(f"{', '.join(ms)} {why}" for why, ms in by_why.items())


SHAPE_COLUMNS = ["group", "points compared", "kernel geomean", "kernel min", "kernel max",
                 "kernel wins", "standing", "fastest fused (kernel time)", "only ours ran",
                 "the others there"]


def shape_table(rows: list[dict], variant_rows: list[dict] | None = None,
                shape_rows: list[dict] | None = None) -> Table:
    """tables/headline_shapes.*: ``by_shape``'s lines, one row per group."""
    t = Table("headline_shapes", f"Headline by head shape and dtype: where {SUBJECT} alone "
              "runs, leads or trails the fastest fused baseline", SHAPE_COLUMNS)
    t_lines = by_shape(rows, variant_rows, shape_rows)
    for ln in t_lines:
        k = ln.kernel
        t.rows.append([ln.label, k.n, k.geomean, k.min, k.max, f"{k.wins}/{k.n}",
                       standing_word(ln), counts_text(ln.fastest or {}), len(ln.alone),
                       _refused(ln) or None])
    t.notes.append("A group: one stage (the benchmark, or 'variants'), pass, head shape "
                   "(D, or D_qk/D_v) and dtype. kernel: the fastest fused baseline's kernel "
                   f"time ÷ {SUBJECT}'s at each point both ran (> 1: {SUBJECT} faster); "
                   "standing: leads where the group's geometric mean is > 1, trails where "
                   "< 1. only ours ran: the points where every other method measured there "
                   "was refused (unsupported, unavailable, failed); the others there: each "
                   "one's status and the first words of its reason at the first such point.")
    if any(ln.stage == "shapes" for ln in t_lines):
        t.notes.append("'shapes' groups: the shapes grids' points (tile and wave "
                       "quantization against SDPA; head shapes and FP8 against the methods "
                       "their grid names).")
    return t


def table(rows: list[dict], variant_rows: list[dict] | None = None,
          workload_rows: list[dict] | None = None) -> Table:
    """The headline table (tables/headline.*); the workloads stage's lines last
    (``workloads_report.headline_lines``)."""
    from .workloads_report import headline_lines

    all_lines = lines(rows, variant_rows)
    t = Table("headline", f"Headline: {SUBJECT} ÷ baseline, by kernel time and by call "
              "latency", COLUMNS, [ln.cells() for ln in all_lines])
    work = headline_lines(workload_rows or [])
    t.rows += [Line("workloads", pass_, "", label, k, c, fastest or None).cells()
               for label, _, pass_, k, c, fastest in work]
    t.notes.append("kernel: CUDA-event time with host work hidden; call: steady-state wall "
                   "time per back-to-back call (call_us), what a caller waits. Rows without a "
                   "pass are the forward; 'fwd+bwd' rows time forward and backward together "
                   "(a training step's attention), 'bwd' the backward alone.")
    if any(ln.stage == "variants" for ln in all_lines):
        t.notes.append("'(variants)' rows: tiledattention's built-in variants against "
                       "FlexAttention and SDPA with a materialised mask over the variants "
                       "stage's points (table variants).")
    if any(ln.baseline == BEST for ln in all_lines):
        t.notes.append(_BEST_NOTE)
    if work:
        t.notes.append("'(workloads: ...)' rows: the workloads stage's packed varlen batches "
                       "and paged KV cache against the fastest baseline at each point (every "
                       "method but ours) and each baseline (tables workloads_*).")
    return t


_BEST_NOTE = ("fastest fused: at each point and pass, per measure, the fastest ok row among "
              "the fused baselines measured there (" + ", ".join(
                  m.name for m in METHODS.values() if m.fused and m.name != SUBJECT)
              + "; not math or eager); its last column counts the points each was the fastest "
              "at by kernel time. A point where no fused baseline is ok is not compared.")


def _find(all_lines, **match) -> Line | None:
    return next((ln for ln in all_lines if all(getattr(ln, k) == v for k, v in match.items())),
                None)


def _summary(s: RatioSummary, what: str = "points") -> str:
    return f"min {s.min:.3f}x, faster at {s.wins}/{s.n} {what}"


def bench_sentence(rows: list[dict], gpu: str) -> str:
    """The README's headline on the benchmark: forward against the fastest fused baseline and
    against automatic dispatch, then each training pass (``gpu``: what it ran on)."""
    all_lines = lines(rows)
    best = _find(all_lines, pass_="fwd", baseline=BEST, head_dim=None)
    fused = _find(all_lines, pass_="fwd", baseline=FUSED, head_dim=None)
    if best is None or not best.kernel.n:
        return (f"Measured on {gpu}. {SUBJECT} and a fused baseline were never both ok at one "
                "point, so no throughput ratio is reported.")
    k, c = best.kernel, best.call
    text = (f"Measured on {gpu}: {SUBJECT} reaches a geometric mean of {k.geomean:.3f}x the "
            f"throughput of the fastest fused baseline at each point (by kernel time "
            f"{_fastest(best)}) over {k.n} forward points{_kinds(rows)} (median "
            f"{k.median:.3f}x, {_summary(k)}) by kernel time (host work hidden)")
    text += ("; call latency was not measured in these rows." if not c.n else
             f"; by call latency (wall time per back-to-back call, host work included) the "
             f"geometric mean is {c.geomean:.3f}x over {c.n} points ({_summary(c)}).")
    if fused is not None and fused.kernel.n:
        k, c = fused.kernel, fused.call
        text += (f" Against PyTorch SDPA alone ({FUSED}, automatic dispatch): "
                 f"{k.geomean:.3f}x ({_summary(k)}) by kernel time"
                 + (f", {c.geomean:.3f}x by call latency." if c.n else "."))
    return text + _training_sentence(all_lines)


def _kinds(rows: list[dict]) -> str:
    """" (100 prefill, 63 decode)": the forward points compared, by kind (decode: Sq < Skv),
    where there are both."""
    from .ratios import ratios

    fwd = [r for r in rows if r.get("pass", "fwd") == "fwd"]
    points = {r["point_key"]: r for r in fwd}
    keys = ratios(with_best(fwd), SUBJECT, BEST)[0]
    decode = sum(points[k]["seq_q"] != points[k]["seq_kv"] for k in keys)
    return f" ({len(keys) - decode} prefill, {decode} decode)" if decode and decode < len(
        keys) else ""


def _fastest(line: Line) -> str:
    return ", ".join(f"{m} at {n}" for m, n in (line.fastest or {}).items()) or "—"


def _training_sentence(all_lines: list[Line]) -> str:
    out = ""
    for p in dict.fromkeys(ln.pass_ for ln in all_lines if ln.stage == "bench"
                           and ln.pass_ != "fwd"):
        mine = [ln for ln in all_lines if (ln.stage, ln.pass_) == ("bench", p)
                and ln.dtype is None and ln.kernel.n]
        parts = []
        for ln in mine:
            k, c = ln.kernel, ln.call
            name = "the fastest fused baseline" if ln.baseline == BEST else ln.baseline
            call = f", call latency {c.geomean:.3f}x" if c.n else ""
            fastest = f"; fastest: {_fastest(ln)}" if ln.baseline == BEST else ""
            parts.append(f"{k.geomean:.3f}x {name} (min {k.min:.3f}x, {k.n} points{call}"
                         f"{fastest})")
        if not parts:
            continue
        what = ("Forward+backward (a training step's attention)" if p == "fwd+bwd" else
                "The backward alone" if p == "bwd" else p)
        per_dtype = [f"{ln.dtype} {ln.kernel.geomean:.3f}x" for ln in all_lines
                     if (ln.stage, ln.pass_, ln.baseline) == ("bench", p, BEST)
                     and ln.dtype and ln.kernel.n]
        out += (f" {what}, geometric mean by kernel time: " + "; ".join(parts) + "."
                + (f" {what} against the fastest fused baseline per dtype: "
                   + ", ".join(per_dtype) + "." if len(per_dtype) > 1 else ""))
    return out


def variants_sentence(variant_rows: list[dict]) -> str:
    """The README's headline on the variants stage (empty without the stage): against the
    fastest fused baseline per pass, naming which it was, then against each baseline by its
    registry name and description (which backend it is)."""
    if not variant_rows:
        return ""
    names = ", ".join(sorted({r["variant"] for r in variant_rows}, key=variant_order))
    all_lines = [ln for ln in lines([], variant_rows)]
    best = [ln for ln in all_lines if ln.baseline == BEST]
    if not best:  # why: the ratio's two sides' reasons first (ours, the fused baselines')
        reasons = not_ok_reasons(variant_rows)
        sides = tuple(f"{m} " for m in [SUBJECT, *fused_baselines(methods_in(variant_rows))])
        why = [w for w in reasons if w.startswith(sides)] or reasons
        return (f" Variants ({names}): no speedup over a fused baseline measured"
                + (f" ({why[0]})." if why else "."))
    parts = [f"{ln.pass_} {ln.kernel.geomean:.3f}x ({_summary(ln.kernel)}) against "
             f"{_fastest(ln)}" for ln in best]
    each = []
    for b in dict.fromkeys(ln.baseline for ln in all_lines if ln.baseline != BEST):
        m = METHODS[b]
        got = ", ".join(f"{ln.pass_} {ln.kernel.geomean:.3f}x" for ln in all_lines
                        if ln.baseline == b)
        each.append(f"{m.label} (`{b}`: {m.description}) {got}")
    return (f" Variants ({names}) against the fastest fused baseline at each point, "
            "geometric-mean speedup by kernel time: " + "; ".join(parts) + ". Against each: "
            + "; ".join(each) + ".")


def shape_sentences(rows: list[dict], variant_rows: list[dict] | None = None,
                    shape_rows: list[dict] | None = None) -> list[str]:
    """The bundle README's paragraph on ``by_shape`` (its lines; empty where it has nothing
    to say): where only ours ran, then where it leads or trails."""
    found = by_shape(rows, variant_rows, shape_rows)
    text = " ".join(s for s in (alone_sentence(found), lead_sentence(found)) if s)
    return [text, ""] if text else []


def alone_sentence(found: list[Line]) -> str:
    """"Only tiledattention ran at 8 points: forward D=512 bfloat16 at 4 (fa4 unsupported
    (...)); ..." (empty where it never ran alone)."""
    groups = [ln for ln in found if ln.alone]
    if not groups:
        return ""
    return (f"Only {SUBJECT} ran at {sum(len(ln.alone) for ln in groups)} points: "
            + "; ".join(f"{ln.label} at {len(ln.alone)} ({_refused(ln)})" for ln in groups)
            + ".")


def lead_sentence(found: list[Line]) -> str:
    """By head shape and dtype, against the fastest fused baseline: how many groups ours
    leads and trails, the best and the worst WORST of each named with the baseline (empty
    where nothing was compared)."""
    compared = [ln for ln in found if ln.kernel.n]
    if not compared:
        return ""
    leads = sorted((ln for ln in compared if standing_word(ln) == "leads"),
                   key=lambda ln: -ln.kernel.geomean)
    trails = sorted((ln for ln in compared if standing_word(ln) == "trails"),
                    key=lambda ln: ln.kernel.geomean)

    def named(side: list[Line], word: str, which: str) -> str:
        if not side:
            return ""
        more = f"{which}: " if len(side) > WORST else ""
        return f" ({more}" + "; ".join(
            f"{ln.label} {ln.kernel.geomean:.3f}x {word} {next(iter(ln.fastest or {'—': 0}))}"
            for ln in side[:WORST]) + ")"

    def count(side: list[Line]) -> str:
        return ("none" if not side else f"all {len(side)}" if len(side) == len(compared) > 1
                else str(len(side)))

    ties = len(compared) - len(leads) - len(trails)
    return (f"By head shape and dtype against the fastest fused baseline (geometric mean by "
            f"kernel time), {SUBJECT} leads in {count(leads)} of {len(compared)} "
            f"groups{named(leads, 'over', 'best')} and trails in {count(trails)}"
            f"{named(trails, 'behind', 'worst')}" + (f", ties in {ties}" if ties else "")
            + " (every group: tables/headline_shapes).")
