"""Concatenating shard rows into one table (the publication issue adds the summaries)."""

from __future__ import annotations

import csv
import glob
import json
import os

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


def concat(rows_dir: str, skipped: list[int] | None = None) -> list[dict]:
    """Every shard's rows; the count of unreadable lines per file goes to ``skipped``."""
    rows = []
    for path in sorted(glob.glob(os.path.join(rows_dir, "rows-shard*.jsonl"))):
        store = ResultStore(path)
        rows += list(store.rows.values())
        if skipped is not None:
            skipped.append(store.skipped_lines)
    return rows


def write(rows: list[dict], out_dir: str, *, csv_table: bool = True) -> tuple[str, str]:
    """rows.jsonl and (unless the caller writes its own) rows.csv in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    jsonl = os.path.join(out_dir, "rows.jsonl")
    with open(jsonl, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    table = os.path.join(out_dir, "rows.csv")
    if not csv_table:
        return jsonl, table
    flat = [flatten(r) for r in rows]
    columns = sorted({k for r in flat for k in r})
    with open(table, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(flat)
    return jsonl, table
