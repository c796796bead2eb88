"""Speed ratios of one method against others, matched point by point, for two measures.

ratio = baseline time / subject time, > 1 when the subject is faster. Two times per row:
``kernel`` is the median CUDA-event time with host work hidden (so the kernel ratio equals
subject TFLOP/s / baseline TFLOP/s: one FLOP model at a point); ``call`` is ``call_us``,
the steady-state wall time per call of back-to-back calls, host work included: what a
caller waits. A point enters a comparison only when both methods are ``ok`` there with
that measure; the points where either is not are counted, never dropped silently.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

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


def pass_of(row: dict) -> str:
    """The pass a row timed (rows from before the pass axis are forward)."""
    return row.get("pass", "fwd")


def passes_in(rows: list[dict]) -> list[str]:
    from ..flops import PASSES

    seen = {pass_of(r) for r in rows}
    return [p for p in PASSES if p in seen]


def index_rows(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["point_key"], r["method"]): r for r in rows}


def methods_in(rows: list[dict]) -> list[str]:
    """The methods of ``rows``, in first-seen order."""
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r["method"], None)
    return list(seen)


def points_of(rows: list[dict]) -> dict[str, dict]:
    """point_key -> one row of that point (for its shape fields), in first-seen order."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["point_key"], r)
    return out


def _time(row: dict | None, measure: str) -> float | None:
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
        ts, tb = _time(s, measure), _time(b, measure)
        if ts and tb:
            out[key] = tb / ts
        else:
            missing += 1
    return out, missing


def summarize(subject: str, baseline: str, values: dict[str, float],
              not_compared: int) -> RatioSummary:
    v = list(values.values())
    if not v:
        return RatioSummary(subject, baseline, 0, None, None, None, None, None, 0, not_compared)
    return RatioSummary(subject, baseline, len(v), statistics.fmean(v), statistics.median(v),
                        math.exp(statistics.fmean(math.log(x) for x in v)), min(v), max(v),
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
