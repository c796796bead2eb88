"""The HTML report's landing page as a browser shows it: the report's landing text
(workflow/report/workflow.rst, rendered as Snakemake renders it: Jinja, then docutils) with
the pages `tiledattn report-pages` writes, loaded in headless Chromium: the headline, status
and Table 4 are tables in the page (not downloads), and the page says what was and was not
measured (a CPU study: nothing timed on a GPU). Skips where /usr/bin/chromium is absent
(Debian: `apt-get install -y chromium`; CI installs it as root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tiledattention.cli import main

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
browser = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                             reason=f"{CHROMIUM} absent (apt-get install -y chromium)")


def dump_dom(page: Path) -> str:
    """The DOM Chromium renders from ``page`` (scripts run), as HTML. The virtual-time
    budget makes Chromium run the page's timers and scripts to idle before it dumps (in
    virtual time, so a loaded machine waits as long as an idle one): without it, under a
    concurrent ``xz -9 -T0``, Snakemake's report was dumped while its loading screen still
    stood (CI rehearsal, 2026-12-02)."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             "--virtual-time-budget=60000", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def landing(results: Path, tmp_path: Path) -> Path:
    """The report's landing text, rendered as Snakemake's report renders it, as a page."""
    import jinja2
    from docutils.core import publish_parts

    class Snakemake:
        config = {"results_dir": str(results)}

    text = jinja2.Environment().from_string(
        (ROOT / "workflow/report/workflow.rst").read_text()).render(snakemake=Snakemake)
    body = publish_parts(text, writer_name="html")["html_body"]  # as Snakemake calls it
    page = tmp_path / "landing-page.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{body}"
                    "</body></html>")
    return page


def pages(rows_path: Path, tables: Path, results: Path, manifest: Path | None = None):
    argv = ["report-pages", "--rows", str(rows_path), "--tables", str(tables), "--out",
            str(results / "report")]
    assert main(argv + (["--manifest", str(manifest)] if manifest else [])) == 0


@browser
def test_the_landing_page_shows_the_headline_status_and_table4_as_tables(tmp_path):
    import gzip

    ref = ROOT / "results/reference/h100"
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(gzip.decompress((ref / "data/rows.jsonl.gz").read_bytes()))
    results = tmp_path / "study results"
    pages(rows, ref / "tables", results, ref / "manifest.json")
    dom = dump_dom(landing(results, tmp_path))
    for table in ("headline", "status", "table4_ratios"):
        assert f'<table id="{table}">' in dom, table
    assert "<td>fastest fused baseline, all points</td>" in dom  # the headline's first row
    assert "Timed on NVIDIA H100 80GB HBM3" in dom
    assert "200 prefill point(s) and 63 decode point(s)" in dom
    assert "not measured (no ok row, the status table says why): sdpa_fa4" in dom
    words = " ".join(dom.split())
    assert "ratio to the fastest fused baseline" in words and "ratio to PyTorch SDPA" not in words
    assert "data:" not in dom  # nothing offered as a download


@browser
def test_a_cpu_studys_landing_page_says_nothing_was_timed_on_a_gpu(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in [
        {"point_key": "bfloat16-full-d64-sq128-skv128-b1-h2-g1", "method": m, "status": s,
         "device": "cpu", "seq_q": 128, "seq_kv": 128, "pass": "fwd"}
        for m, s in (("eager", "ok"), ("tiledattention", "unavailable"))]))
    tables = tmp_path / "tables"
    shutil.copytree(ROOT / "results/reference/h100/tables", tables)
    results = tmp_path / "results"
    pages(rows, tables, results)
    dom = dump_dom(landing(results, tmp_path))
    assert "A CPU study: nothing was timed on a GPU." in dom
    assert "not measured (no ok row, the status table says why): tiledattention" in dom


@pytest.mark.parametrize("what", ["rows", "tables"])
def test_report_pages_refuses_a_missing_input_in_one_line(what, tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("")
    argv = {"rows": str(rows if what != "rows" else tmp_path / "none.jsonl"),
            "tables": str(tmp_path if what != "tables" else tmp_path / "none")}
    assert main(["report-pages", "--rows", argv["rows"], "--tables", argv["tables"],
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--{what}" in err and "Traceback" not in err
