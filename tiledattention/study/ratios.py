"""Throughput ratios of one method against others, matched point by point.

ratio = baseline median time / subject median time (= subject TFLOP/s / baseline TFLOP/s:
both use the same FLOP model at a point). A point enters a comparison only when both
methods are ``ok`` there; the points where either is not are counted, never dropped
silently.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass


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


def index_rows(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["point_key"], r["method"]): r for r in rows}


def points_of(rows: list[dict]) -> dict[str, dict]:
    """point_key -> one row of that point (for its shape fields), in first-seen order."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["point_key"], r)
    return out


def _ok(row: dict | None) -> bool:
    return bool(row) and row.get("status") == "ok" and row["time_ms"]["median_ms"] > 0


def ratios(rows: list[dict], subject: str, baseline: str,
           where: Callable[[dict], bool] = lambda p: True) -> tuple[dict[str, float], int]:
    """({point_key: ratio} where both are ok, count of selected points not compared)."""
    idx = index_rows(rows)
    out, missing = {}, 0
    for key, point in points_of(rows).items():
        if not where(point):
            continue
        s, b = idx.get((key, subject)), idx.get((key, baseline))
        if s is None and b is None:
            continue  # neither method was part of this point's run
        if _ok(s) and _ok(b):
            out[key] = b["time_ms"]["median_ms"] / s["time_ms"]["median_ms"]
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
            where: Callable[[dict], bool] = lambda p: True) -> RatioSummary:
    values, missing = ratios(rows, subject, baseline, where)
    return summarize(subject, baseline, values, missing)


def compare_by(rows: list[dict], subject: str, baseline: str,
               key: Callable[[dict], object]) -> dict[object, RatioSummary]:
    """One summary per group of points (e.g. per head dim)."""
    groups = {key(p) for p in points_of(rows).values()}
    try:
        groups = sorted(groups)
    except TypeError:  # mixed kinds of keys: any stable order
        groups = sorted(groups, key=str)
    return {g: compare(rows, subject, baseline, lambda p, g=g: key(p) == g) for g in groups}
