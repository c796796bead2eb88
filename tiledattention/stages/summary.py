"""A measured stage's run summary, its log's last table: cells read from its rows here, below
the study's presentation (whose tables compare more: every baseline, geometric means), which
reads the stages and never the reverse.
"""

from __future__ import annotations


def by_point(rows) -> dict[str, dict[str, dict]]:
    """Each point key's rows by method, in the order the points were measured."""
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(r["point_key"], {})[r["method"]] = r
    return out


def median_ms(row: dict | None) -> float | None:
    """A row's median kernel time (ms) where it ran ok, else None."""
    if not row or row.get("status") != "ok":
        return None
    t = (row.get("time_ms") or {}).get("median_ms")
    return t if isinstance(t, (int, float)) and t > 0 else None


def time_or_status(cells: dict, method: str):
    """``method``'s kernel time at a point, or its row's status where it did not run."""
    return median_ms(cells.get(method)) or (cells.get(method) or {}).get("status")


def cell(value, width: int) -> str:
    """A summary cell: a number to 3 decimals, a word (a status) as it is, '—' for none."""
    return f"{value:{width}.3f}" if isinstance(value, float) else f"{value or '—':>{width}s}"


def status_counts(rows) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return "rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
