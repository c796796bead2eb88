"""% of the peak at the measured clock (issue 48 item 4) in the study's tables and figures:
a row with its SM clock gets its share of SMs x clock x FLOP per SM per cycle (a worked
example), a row without one reads — with the footnote saying the clock was not recorded
(never the data sheet's clock instead), the nominal share says it is nominal, and the
committed references' README numbers recompute from their rows."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tiledattention.flops import attention_flops
from tiledattention.study.presentation import tables
from tiledattention.study.presentation.hardware import AT_CLOCK, pct_at_clock

H100 = "NVIDIA H100 80GB HBM3"
ROOT = Path(__file__).resolve().parent.parent


def row(method="tiledattention", ms=1.0, mhz=None, dtype="bfloat16", s=4096, **kw):
    """One ok forward row at B=4, H=16, S=s, D=128 (no mask): FLOP by flops.py's model."""
    key = f"{dtype}-full-d128-sq{s}-skv{s}-b4-h16-g1"
    flops = attention_flops(4, 16, s, s, 128, False)
    r = {"point_key": key, "method": method, "status": "ok", "dtype": dtype, "causal": False,
         "head_dim": 128, "seq_q": s, "seq_kv": s, "batch": 4, "heads": 16, "gqa": 1,
         "pass": "fwd", "flops": flops, "time_ms": {"median_ms": ms, "p95_ms": ms},
         "tflops": flops / (ms * 1e-3) / 1e12, **kw}
    if mhz:
        r["sm_clock_mhz"] = mhz
    return r


def test_a_row_with_its_clock_gets_its_share_of_the_peak_at_that_clock():
    # 4*4*16*4096^2*128 FLOP = 0.5498e12 in 1.25 ms: 439.8 TFLOP/s. The H100's peak at 1500
    # MHz: 132 SMs x 1500e6 x 4096 = 811.0 TFLOP/s, so 54.2% (at the data sheet's 989: 44%).
    r = row(ms=1.25, mhz=1500)
    assert r["tflops"] == pytest.approx(439.80, abs=0.01)
    assert pct_at_clock(r, H100) == pytest.approx(54.23, abs=0.005)
    # fp8: twice the FLOP per cycle at the same clock
    assert pct_at_clock(row(ms=1.25, mhz=1500, dtype="float8_e4m3fn"), H100) == \
        pytest.approx(27.11, abs=0.005)
    t = tables.throughput([r, row("torch_sdpa", ms=1.0, mhz=1600)], H100)
    assert t.columns[-2:] == [f"tiledattention {AT_CLOCK}", f"torch_sdpa {AT_CLOCK}"]
    # torch_sdpa: 549.8 TFLOP/s at 1600 MHz (865.1 TFLOP/s): 63.6%, at its own clock
    assert t.cells()[0][-2:] == ["54.2", "63.6"]
    assert "| 54.2 | 63.6 |" in t.to_markdown()
    assert "not recorded" not in " ".join(t.notes)


def test_a_row_without_a_clock_reads_a_dash_and_the_footnote_says_why():
    t = tables.throughput([row(ms=1.25), row("torch_sdpa", ms=1.0)], H100)
    assert t.cells()[0][-2:] == ["—", "—"]
    note = t.notes[-1]
    assert note.startswith(f"{AT_CLOCK}: ") and "the SM clock was not recorded for these rows" \
        in note and "no nominal clock stands in" in note
    # the nominal share (439.8 / 989 = 44.5%) is printed nowhere in its place
    assert "44.5" not in t.to_markdown() and "44.47" not in t.to_markdown()
    mixed = tables.throughput([row(ms=1.25, mhz=1500), row("torch_sdpa", ms=1.0)], H100)
    assert mixed.cells()[0][-2:] == ["54.2", "—"]
    assert "not recorded for 1 of the 2 ok rows" in mixed.notes[-1]


def test_without_a_gpu_or_a_listed_peak_every_share_is_a_dash_saying_why():
    r = [row(ms=1.25, mhz=1500)]
    assert tables.throughput(r, None).cells()[0][-1] == "—"
    assert "no GPU named (aggregate --manifest)" in tables.throughput(r, None).notes[-1]
    assert "no data-sheet peak listed for NVIDIA H100 PCIe" in tables.throughput(
        r, "NVIDIA H100 PCIe").notes[-1]


def test_every_table_of_a_kernels_time_or_throughput_has_the_column():
    rows = [row(ms=1.25, mhz=1500), row("torch_sdpa", ms=1.0, mhz=1600)]
    per = tables.per_point_ratios(rows, H100)
    at = per.columns.index(f"its {AT_CLOCK}")
    assert per.columns[at - 2:at + 2] == ["its ms", "tiledattention ms", f"its {AT_CLOCK}",
                                          f"tiledattention {AT_CLOCK}"]
    assert per.cells()[0][at:at + 2] == ["63.6", "54.2"]  # the fastest (torch_sdpa), ours
    from tiledattention.study.presentation.shapes import shapes_table
    from tiledattention.study.presentation.variants_report import variants_table
    from tiledattention.study.presentation.workloads_report import tables as workloads

    shapes = shapes_table(rows, H100)
    assert shapes.cells()[0][-2:] == ["54.2", "63.6"]
    assert f"ours {AT_CLOCK}" in variants_table([]).columns
    for t in workloads([]):
        assert [f"ours {AT_CLOCK}", f"its {AT_CLOCK}"] == [c for c in t.columns if AT_CLOCK in c]
    assert tables.table5(None).columns[-1] == AT_CLOCK
    ladder = tables.table6([row("tiledattention@64x64", ms=1.25, mhz=1500),
                            row("tiledattention@64x64", ms=1.25, mhz=1500, s=2048),
                            row("torch_sdpa", ms=1.0, mhz=1600)], H100)
    # its rows: 54.23% (S=4096) and 13.56% (S=2048: a quarter of the FLOP in the same 1.25 ms),
    # each at its own clock: geomean 27.1%
    assert ladder.cells()[0][-1] == "27.1"


def test_the_figures_draw_the_share_at_the_measured_clock_and_none_without_it(monkeypatch):
    pytest.importorskip("matplotlib")
    from tiledattention.study.presentation import figures

    figs = {}

    def keep(fig, out_dir, name):
        fig.canvas.draw()
        figs[name] = fig
        return [name]

    monkeypatch.setattr(figures, "_save", keep)
    clocked = [row(m, ms=ms * s / 4096, mhz=mhz, s=s) for s in (1024, 2048, 4096)
               for m, ms, mhz in (("tiledattention", 1.25, 1500), ("torch_sdpa", 1.0, 1600))]
    figures.throughput_vs_seq(clocked, "unused", H100)
    figures.utilisation(clocked, "unused", H100)
    ax = figs["throughput_fwd_d128"].axes[0]
    labels = [c.get_ylabel() for c in ax.child_axes]
    assert labels == ["% of peak at 1600 MHz"]  # the panel's rows' median clock
    bars = " ".join(t.get_text() for t in figs["utilisation"].axes[0].texts)
    assert "550 TFLOP/s (56% nominal; 64% at 1600 MHz)" in bars  # 549.8 / 989, / 865.1
    legend = " ".join(t.get_text() for t in figs["utilisation"].legends[0].get_texts())
    assert "nominal peak 989 TFLOP/s (data sheet" in legend
    figs.clear()
    figures.throughput_vs_seq([{**r, "sm_clock_mhz": None} for r in clocked], "unused", H100)
    assert figs["throughput_fwd_d128"].axes[0].child_axes == []
    import matplotlib.pyplot as plt

    plt.close("all")


# --- the committed references' README numbers, recomputed from their committed rows ------

REFERENCES = ("h100", "h200")


def _rows(ref: str, name: str = "rows") -> list[dict]:
    with gzip.open(ROOT / "results" / "reference" / ref / "data" / f"{name}.jsonl.gz",
                   "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


@pytest.mark.parametrize("ref", REFERENCES)
def test_every_number_of_a_references_readme_summary_recomputes_from_its_rows(ref):
    """The bundle README's headline, its Table 4 and its best-throughput line (the shares of
    the peak): each number is today's code's from the committed rows; the wording may have
    moved on, the numbers may not (one that differs fails here)."""
    from tiledattention.study.presentation import workloads_report
    from tiledattention.study.presentation.hardware import utilisation_sentence
    from tiledattention.study.presentation.headline import bench_sentence, variants_sentence
    from tiledattention.study.presentation.ratios import pass_of

    readme = (ROOT / "results" / "reference" / ref / "README.md").read_text()
    gpu = json.loads((ROOT / "results" / "reference" / ref / "manifest.json").read_text())[
        "gpu"]["name"]
    rows = _rows(ref)
    headline = readme.split("## Headline\n\n", 1)[1].split("\n", 1)[0]
    workloads = _rows(ref, "workloads-rows") if (
        ROOT / "results" / "reference" / ref / "data" / "workloads-rows.jsonl.gz").exists() else []
    assert _numbers(headline) == _numbers(
        bench_sentence(rows, gpu) + variants_sentence(_rows(ref, "variants-rows"))
        + (workloads_report.sentence(workloads) if workloads else ""))
    # Table 4 ends where the next section or subsection (a README made since: the
    # standing block, "### Where tiledattention leads ...") begins.
    table4 = readme.split("### ", 1)[1].split("\n#", 1)[0]
    want = tables.table4([r for r in rows if pass_of(r) == "fwd"]).to_markdown()
    assert _numbers(table4) == _numbers(want.split("\n", 1)[1])
    best = next(ln for ln in readme.splitlines() if ln.startswith("Best prefill throughput"))
    assert _numbers(best) == _numbers(utilisation_sentence(rows, gpu))
    assert "% at " not in utilisation_sentence(rows, gpu)  # no clock in these rows
