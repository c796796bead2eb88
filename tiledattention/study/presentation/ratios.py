"""Speed ratios of one method against others, matched point by point, for two measures.

ratio = baseline time / subject time, > 1 when the subject is faster. Two times per row:
``kernel`` is the median CUDA-event time with host work hidden (so the kernel ratio equals
subject TFLOP/s / baseline TFLOP/s: one FLOP model at a point); ``call`` is ``call_us``,
the steady-state wall time per call of back-to-back calls, host work included: what a
caller waits. A point enters a comparison only when both methods are ``ok`` there with
that measure; the points where either is not are counted, never dropped silently.

``BEST`` is a baseline no single method is: at each point (and pass), for each measure, the
fastest ok row among the fused baselines (``Method.fused`` in the registry), named in the
row's ``best_of``. ``with_best(rows)`` adds those rows, so every comparison above takes it
like any method; where no fused baseline is ok the row says so and no ratio is made.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ...bench.grid import pinned_label
from ...bench.methods import METHODS, SUBJECT

# measure name: (label, time of a row, None when the row lacks it)
MEASURES: dict[str, tuple[str, Callable[[dict], float | None]]] = {
    "kernel": ("kernel time", lambda r: (r.get("time_ms") or {}).get("median_ms")),
    "call": ("call latency", lambda r: r.get("call_us")),
}


@dataclass(frozen=True)
class RatioSummary:
    subject: str
    baseline: str
    n: int  # points where both are ok
    mean: float | None
    median: float | None
    geomean: float | None
    min: float | None
    max: float | None
    wins: int  # points where the subject is faster (ratio > 1)
    not_compared: int  # points where the subject or the baseline has no ok row

    def as_dict(self) -> dict:
        return dict(self.__dict__)


# The pseudo-method of the fastest fused baseline at each point (never a registry name).
BEST = "fastest fused"
# The fields that place a row at its point (copied onto the BEST row of that point).
_POINT_FIELDS = ("point_key", "dtype", "causal", "head_dim", "head_dim_v", "seq_q", "seq_kv",
                 "batch", "heads", "gqa", "pass", "variant", "device")


def baselines(rows: list[dict]) -> list[str]:
    """The methods of ``rows`` compared with the subject: all but the subject, its pinned
    schedules and ``BEST``, in first-seen order."""
    return [m for m in methods_in(rows) if m not in (SUBJECT, BEST) and pinned_label(m) is None]


def fused_baselines(names) -> list[str]:
    """The methods among ``names`` that count as fused baselines, in registry order: the
    registry's ``fused`` methods other than the subject (a pinned schedule, a model stage's
    implementation or any name the registry does not know never counts)."""
    names = set(names)
    return [m.name for m in METHODS.values() if m.fused and m.name != SUBJECT
            and m.name in names]


def best_rows(rows: list[dict]) -> list[dict]:
    """One ``BEST`` row per point (and pass) where a fused baseline has a row: per measure,
    the fastest of their ok times, ``best_of[measure]`` naming it (tied ones joined with
    "="); status ``none`` with the reasons where none of them is ok with either measure."""
    fused = fused_baselines(methods_in(rows))
    order = {m: i for i, m in enumerate(fused)}
    by_point: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["method"] in order:
            by_point.setdefault((r["point_key"], pass_of(r)), []).append(r)
    out = []
    for cands in by_point.values():
        cands = sorted(cands, key=lambda r: order[r["method"]])
        row = {k: cands[0][k] for k in _POINT_FIELDS if k in cands[0]}
        row.update(method=BEST, best_of={})
        for measure in MEASURES:
            timed = [(t, r["method"]) for r in cands if (t := time_of(r, measure))]
            if timed:
                fastest = min(t for t, _ in timed)
                row["best_of"][measure] = "=".join(m for t, m in timed if t == fastest)
                if measure == "kernel":
                    row["time_ms"] = {"median_ms": fastest}
                else:
                    row["call_us"] = fastest
        if row["best_of"]:
            row["status"] = "ok"
        else:
            row["status"] = "none"
            row["reason"] = "no fused baseline ok here (" + ", ".join(
                f"{r['method']} {r.get('status')}" for r in cands) + ")"
        out.append(row)
    return out


def with_best(rows: list[dict]) -> list[dict]:
    """``rows`` and their ``BEST`` rows (none added twice)."""
    rows = [r for r in rows if r["method"] != BEST]
    return rows + best_rows(rows)


def fastest_counts(rows: list[dict], subject: str, where: Callable[[dict], bool] = lambda p: True,
                   measure: str = "kernel") -> dict[str, int]:
    """Over the points where ``subject`` is compared with ``BEST`` (``rows`` with their BEST
    rows): how often each fused baseline was the fastest, most often first."""
    rows = with_best(rows)
    values, _ = ratios(rows, subject, BEST, where, measure)
    best = {r["point_key"]: r for r in rows if r["method"] == BEST}
    counts: dict[str, int] = {}
    for key in values:
        name = best[key]["best_of"][measure]
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def counts_text(counts: dict[str, int]) -> str:
    """"cudnn 80, flash 20" (— where no point was compared)."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "—"


def pass_of(row: dict) -> str:
    """The pass a row timed (rows from before the pass axis are forward)."""
    return row.get("pass", "fwd")


def passes_in(rows: list[dict]) -> list[str]:
    from ...flops import PASSES

    seen = {pass_of(r) for r in rows}
    return [p for p in PASSES if p in seen]


def index_rows(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["point_key"], r["method"]): r for r in rows}


def cells_by_point(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """The rows by point (its key, in first-seen order), then by method."""
    cells: dict[str, dict[str, dict]] = {}
    for r in rows:
        cells.setdefault(r["point_key"], {})[r["method"]] = r
    return cells


def methods_in(rows: list[dict]) -> list[str]:
    """The methods of ``rows``, in first-seen order."""
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r["method"], None)
    return list(seen)


def not_ok_reasons(rows: list[dict]) -> list[str]:
    """One note per (method, status) that did not run, with its first reason."""
    seen: dict[tuple[str, str], str] = {}
    for r in rows:
        if r.get("status") != "ok":
            seen.setdefault((r["method"], r["status"]), " ".join(str(r.get("reason")).split()))
    return [f"{m} {st}: {why}" for (m, st), why in sorted(seen.items())]


def points_of(rows: list[dict]) -> dict[str, dict]:
    """point_key -> one row of that point (for its shape fields), in first-seen order."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["point_key"], r)
    return out


def time_of(row: dict | None, measure: str) -> float | None:
    if not row or row.get("status") != "ok":
        return None
    t = MEASURES[measure][1](row)
    return t if t and t > 0 else None


def ratios(rows: list[dict], subject: str, baseline: str,
           where: Callable[[dict], bool] = lambda p: True,
           measure: str = "kernel") -> tuple[dict[str, float], int]:
    """({point_key: ratio} where both are ok, count of selected points not compared)."""
    idx = index_rows(rows)
    out, missing = {}, 0
    for key, point in points_of(rows).items():
        if not where(point):
            continue
        s, b = idx.get((key, subject)), idx.get((key, baseline))
        if s is None and b is None:
            continue  # neither method was part of this point's run
        ts, tb = time_of(s, measure), time_of(b, measure)
        if ts and tb:
            out[key] = tb / ts
        else:
            missing += 1
    return out, missing


def geomean(values) -> float | None:
    """The geometric mean of positive values (None for none): every study geomean."""
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(subject: str, baseline: str, values: dict[str, float],
              not_compared: int) -> RatioSummary:
    v = list(values.values())
    if not v:
        return RatioSummary(subject, baseline, 0, None, None, None, None, None, 0, not_compared)
    return RatioSummary(subject, baseline, len(v), statistics.fmean(v), statistics.median(v),
                        geomean(v), min(v), max(v),
                        sum(x > 1.0 for x in v), not_compared)


def compare(rows: list[dict], subject: str, baseline: str,
            where: Callable[[dict], bool] = lambda p: True,
            measure: str = "kernel") -> RatioSummary:
    values, missing = ratios(rows, subject, baseline, where, measure)
    return summarize(subject, baseline, values, missing)


def compare_by(rows: list[dict], subject: str, baseline: str,
               key: Callable[[dict], object],
               measure: str = "kernel") -> dict[object, RatioSummary]:
    """One summary per group of points (e.g. per head dim)."""
    groups = {key(p) for p in points_of(rows).values()}
    try:
        groups = sorted(groups)
    except TypeError:  # mixed kinds of keys: any stable order
        groups = sorted(groups, key=str)
    return {g: compare(rows, subject, baseline, lambda p, g=g: key(p) == g, measure)
            for g in groups}
