"""The Snakemake report's pages: what the study measured (and did not), the headline, the
status and the key tables as HTML, so that the report shows them in the page instead of
offering their CSV as a download.

``landing.html`` is a fragment the report's landing text includes (workflow/report/
workflow.rst); ``<table>.html`` are whole pages the report shows in its viewer. Built from
the aggregate's Markdown tables (as written, not recomputed), its rows and the manifest's
GPU name: ``tiledattn report-pages``.
"""

from __future__ import annotations

import html
import os

from ...safeio import write_text
from .table import Table

# The tables the report shows as HTML, in the order the landing page gives them.
PAGES = ("headline", "status", "table4_ratios")
STYLE = ("<style>.tiledattn table{border-collapse:collapse;font-size:12px;margin:6px 0}"
         ".tiledattn th,.tiledattn td{border:1px solid #bbb;padding:2px 6px;text-align:left}"
         ".tiledattn th{background:#eee}.tiledattn p.note{font-size:11px;color:#444}</style>")


def table_html(t: Table) -> str:
    """One table: its title, header, cells (as the Markdown prints them) and notes."""
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>"
                   for r in t.rows)
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in t.notes)
    return (f'<h3>{esc(t.title)}</h3><table id="{esc(t.name)}"><thead><tr>{head}</tr>'
            f"</thead><tbody>{body}</tbody></table>{notes}")


def measured_html(rows: list[dict], gpu: str | None) -> str:
    """What was and was not measured, from the rows: on which GPU, how many prefill and
    decode points and passes, which methods had ok rows; a study whose rows were all timed
    on the CPU says that nothing was timed on a GPU."""
    ok = [r for r in rows if r.get("status") == "ok"]
    on_gpu = [r for r in ok if str(r.get("device", "")).startswith("cuda")]
    methods_ok = sorted({r["method"] for r in ok})
    not_ok = sorted({r["method"] for r in rows} - set(methods_ok))
    points = {r["point_key"]: r for r in rows}
    decode = sum(1 for p in points.values() if p.get("seq_q") != p.get("seq_kv"))
    passes = sorted({r.get("pass", "fwd") for r in rows})
    esc = html.escape
    if not on_gpu:
        lead = ("<strong>A CPU study: nothing was timed on a GPU.</strong> The numbers below "
                "are the CPU methods' wall-clock times; they check the pipeline, not the "
                "kernel. ")
    else:
        lead = f"<strong>Timed on {esc(gpu or 'a GPU (name not recorded)')}</strong>: "
    text = (f"{lead}{len(points) - decode} prefill point(s) and {decode} decode point(s), "
            f"passes {esc(', '.join(passes))}; methods with ok rows: "
            f"{esc(', '.join(methods_ok) or 'none')}")
    if not_ok:
        text += f"; not measured (no ok row, the status table says why): {esc(', '.join(not_ok))}"
    return f"<p>{text}.</p>"


def landing_html(rows: list[dict], tables: dict[str, Table], gpu: str | None) -> str:
    """The report's landing fragment: what was measured, then the key tables."""
    parts = [STYLE, '<div class="tiledattn">', "<h2>What was measured</h2>",
             measured_html(rows, gpu)]
    parts += [table_html(tables[n]) for n in PAGES if n in tables]
    return "".join(parts + ["</div>"]) + "\n"


def page_html(t: Table) -> str:
    """One table as a whole page (the report's viewer shows it)."""
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>"
            f"{html.escape(t.title)}</title>{STYLE}</head><body><div class=\"tiledattn\">"
            f"{table_html(t)}</div></body></html>\n")


def write_pages(rows: list[dict], tables_dir: str, out_dir: str,
                gpu: str | None = None) -> list[str]:
    """``out_dir``/landing.html and one page per table of PAGES the aggregate wrote."""
    tables = {}
    for name in PAGES:
        path = os.path.join(tables_dir, f"{name}.md")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                tables[name] = Table.from_markdown(name, f.read())
    os.makedirs(out_dir, exist_ok=True)
    out = [os.path.join(out_dir, "landing.html")]
    write_text(out[0], landing_html(rows, tables, gpu))
    for name, t in tables.items():
        out.append(os.path.join(out_dir, f"{name}.html"))
        write_text(out[-1], page_html(t))
    return out
