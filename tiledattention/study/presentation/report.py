"""The study's report from its rows, in one function: the rows as CSV and Parquet, every
table (the headline's from headline.py), and rows.jsonl. ``tiledattn aggregate`` calls it
(so does the workflow's aggregate rule, through the CLI) and so do the tests; the figures
are ``tiledattn figures`` (figures.write_all), the workflow's own rule."""

from __future__ import annotations

import contextlib
import os

from . import tables
from .frame import write_rows_table


def write_report(rows: list[dict], out_dir: str, *, where: str, tune_table: str | None = None,
                 stage_rows: dict[str, list[dict]] | None = None,
                 gpu: str | None = None) -> dict:
    """``out_dir``/rows.csv, rows.parquet, tables/ and rows.jsonl from the checked benchmark
    rows (``where``: their source, for the one-line error) and the other stages' rows
    (``stage_rows``: by stage name, as ``tables.STAGE_TABLES`` takes them); ``gpu``: the
    GPU's name (the manifest's), whose peak the tables' % peak @ clock columns use.
    Returns {"csv": the rows table, "tables": the table files}."""
    from ...bench.aggregate import write
    from ...bench.store import check_rows

    check_rows(rows, where, point=True)  # the tables group rows by their point
    # rows.jsonl last, the earlier one gone first: a killed aggregate never leaves rows.jsonl
    # beside tables and rows.csv it did not write (bundle create needs rows.jsonl).
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(out_dir, "rows.jsonl"))
    table = write_rows_table(rows, out_dir)["csv"]
    paths = tables.write_all(rows, os.path.join(out_dir, "tables"), tune_table=tune_table,
                             stage_rows=stage_rows, gpu=gpu)
    write(rows, out_dir, csv_table=False)
    return {"csv": table, "tables": paths}
