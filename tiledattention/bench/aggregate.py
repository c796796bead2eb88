"""Concatenating shard rows into one table (the publication issue adds the summaries)."""

from __future__ import annotations

import contextlib
import csv
import glob
import json
import os

from ..safeio import atomic_write
from .store import ResultStore


def flatten(row: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def concat(rows_dir: str, skipped: list[int] | None = None,
           conflicts: list[tuple[str, str]] | None = None) -> list[dict]:
    """Every shard's rows; the count of unreadable lines per file goes to ``skipped``, and
    each (point, method) given twice with different values (in one file or two) to
    ``conflicts`` (an identical repeat is one row)."""
    rows: dict[tuple[str, str], dict] = {}
    for path in sorted(glob.glob(os.path.join(rows_dir, "rows-shard*.jsonl"))):
        store = ResultStore(path)
        if conflicts is not None:
            conflicts += store.conflicts
        for key, row in store.rows.items():
            if key in rows and rows[key] != row and conflicts is not None:
                conflicts.append(key)
            rows.setdefault(key, row)
        if skipped is not None:
            skipped.append(store.skipped_lines)
    return list(rows.values())


def write(rows: list[dict], out_dir: str, *, csv_table: bool = True) -> tuple[str, str]:
    """rows.csv (unless the caller writes its own) and then rows.jsonl in ``out_dir``:
    rows.jsonl, written last, says the rest is there."""
    os.makedirs(out_dir, exist_ok=True)
    jsonl = os.path.join(out_dir, "rows.jsonl")
    table = os.path.join(out_dir, "rows.csv")
    if csv_table:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(jsonl)  # an earlier run's: never beside a newer rows.csv
        flat = [flatten(r) for r in rows]
        columns = sorted({k for r in flat for k in r})
        with atomic_write(table, newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows(flat)
    with atomic_write(jsonl) as f:  # a killed aggregate never leaves half a table
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return jsonl, table


def load_checked(rows_dir: str, skipped: list[int] | None = None,
                 point: bool = False) -> list[dict]:
    """``concat``'s rows, refused in one line (``store.check_rows``) when any cannot be
    published: an impossible number, a mistyped field, a pair given twice differently (with
    ``point``, a missing point field)."""
    from .store import check_rows

    conflicts: list[tuple[str, str]] = []
    rows = concat(rows_dir, skipped=skipped, conflicts=conflicts)
    check_rows(rows, rows_dir, conflicts, point)
    return rows
