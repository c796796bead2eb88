"""Every figure of both committed references, rendered from their rows (data/*.jsonl.gz) and
checked as a reviewer reads it: by its data (each plotted series is one pass's rows; no
panel empty) and by the renderer (no two tick labels overlap, measured with the Agg
renderer's text extents; no axis label runs into the title), the GPU named in every title,
and every number drawn on a figure one the bundle's README or tables state."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from tiledattention.bench.methods import METHODS  # noqa: E402
from tiledattention.study.presentation import figures, plotting, shapes  # noqa: E402
from tiledattention.study.presentation.ratios import pass_of  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCES = ["results/reference/h100", "results/reference/h200"]
PASS_WORDS = {"forward": "fwd", "backward": "bwd", "forward+backward": "fwd+bwd"}


def _rows(ref: str, name: str) -> list[dict]:
    path = os.path.join(ROOT, ref, "data", name)
    if not os.path.exists(path):
        return []
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module", params=REFERENCES)
def study(request, tmp_path_factory):
    """(the reference's rows, its figures as drawn by name, the text of its README and
    tables)."""
    import matplotlib.pyplot as plt

    ref = request.param
    drawn: dict[str, object] = {}

    def keep(fig, out_dir, name):
        fig.canvas.draw()  # laid out and rendered by Agg, as savefig would
        drawn[name] = fig
        return [name]

    rows = _rows(ref, "rows.jsonl.gz")
    shape_rows = [r for f in sorted(os.listdir(os.path.join(ROOT, ref, "data")))
                  if f.startswith("shapes-") for r in _rows(ref, f)]
    with open(os.path.join(ROOT, ref, "manifest.json")) as f:
        gpu = json.load(f)["gpu"]["name"]
    with pytest.MonkeyPatch.context() as mp:
        for module, attr in ((figures, "_save"), (plotting, "save"), (shapes, "save")):
            mp.setattr(module, attr, keep)
        figures.write_all(rows, str(tmp_path_factory.mktemp("figures")), gpu=gpu,
                          stage_rows={"ladder": _rows(ref, "ladder-rows.jsonl.gz"),
                                      "shapes": shape_rows,
                                      "variants": _rows(ref, "variants-rows.jsonl.gz"),
                                      "model": _rows(ref, "model-rows.jsonl.gz")})
    text = [Path(ROOT, ref, "README.md").read_text()]
    text += [t.read_text() for t in sorted(Path(ROOT, ref, "tables").iterdir())]
    yield {"rows": rows, "figures": drawn, "gpu": gpu, "text": "\n".join(text)}
    plt.close("all")


def _panels(fig):
    """The data panels: visible axes that are not a colorbar."""
    return [a for a in fig.axes if a.get_visible() and a.get_label() != "<colorbar>"]


def _series(ax):
    """The data lines of a panel: those labelled with a method (not peak or unity lines)."""
    return [ln for ln in ax.lines if ln.get_label() in METHODS and len(ln.get_xdata()) > 0]


def test_every_expected_figure_is_drawn(study):
    rows = study["rows"]
    passes = [p for p in ("fwd", "bwd", "fwd+bwd") if any(pass_of(r) == p for r in rows)]
    want = figures.names(sorted({r["head_dim"] for r in rows if r["seq_q"] == r["seq_kv"]}),
                         passes, any(r["seq_q"] != r["seq_kv"] for r in rows), model=True)
    assert sorted(study["figures"]) == sorted(want)


def test_every_series_is_one_pass_of_the_rows(study):
    """A line of TFLOP/s (or decode GB/s) against S holds the rows of one pass, the pass its
    figure names: forward and forward+backward are never joined."""
    values: dict[str, dict[tuple, set]] = {}
    for r in study["rows"]:
        if r["status"] != "ok":
            continue
        by = values.setdefault(r["method"], {})
        by.setdefault(("tflops", pass_of(r)), set()).add((r["seq_q"], round(r["tflops"], 6)))
        by.setdefault(("gbytes", pass_of(r)), set()).add(
            (r["seq_kv"], round(r["gbytes_per_s"], 6)))
    checked = 0
    for name, fig in study["figures"].items():
        if not name.startswith(("throughput_", "baselines_d128_", "decode")):
            continue
        want = ("fwd" if name == "decode" else
                {figures.slug(p): p for p in PASS_WORDS.values()}[name.split("_")[-2]
                                                                    if name.startswith(
                                                                        "throughput_")
                                                                    else name.split("_")[-1]])
        kind = "gbytes" if name == "decode" else "tflops"
        for ax in _panels(fig):
            for ln in _series(ax):
                pts = {(x, round(y, 6)) for x, y in zip(ln.get_xdata(), ln.get_ydata())}
                owners = [p for (k, p), v in values[ln.get_label()].items()
                          if k == kind and pts <= v]
                assert owners == [want], (name, ln.get_label(), owners)
                checked += 1
    assert checked > 50


def test_every_title_names_the_gpu_and_at_most_one_pass(study):
    for name, fig in study["figures"].items():
        title = fig._suptitle.get_text()
        assert title.startswith(study["gpu"] + ":"), (name, title)
        for ax in _panels(fig):
            words = set(re.findall(r"forward\+backward|forward|backward",
                                   ax.get_title() + " " + title))
            assert len(words) <= 1, (name, words)


def test_no_panel_is_empty(study):
    for name, fig in study["figures"].items():
        for ax in _panels(fig):
            assert ax.lines or ax.patches or ax.images or ax.collections, (name,
                                                                           ax.get_title())
            assert not any("no data" in t.get_text() for t in ax.texts), name


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5 and b.y0 < a.y1 - 0.5


def test_no_tick_labels_overlap_and_no_label_runs_into_the_title(study):
    for name, fig in study["figures"].items():
        renderer = fig.canvas.get_renderer()
        title = fig._suptitle.get_window_extent(renderer)
        for ax in _panels(fig):
            for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
                boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ticks
                         if t.get_visible() and t.get_text()]
                for i, (ta, a) in enumerate(boxes):
                    for tb, b in boxes[i + 1:]:
                        assert not _overlap(a, b), (name, ax.get_title(), ta, tb)
            for label in (ax.yaxis.label, ax.xaxis.label, ax.title):
                if label.get_text():
                    box = label.get_window_extent(renderer)
                    assert not _overlap(box, title), (name, label.get_text())
        for legend in fig.legends:  # below the panels: over no panel, title or note
            box = legend.get_window_extent(renderer)
            for other in [ax.get_tightbbox(renderer) for ax in _panels(fig)] + [
                    t.get_window_extent(renderer) for t in fig.texts if t.get_text()]:
                assert not _overlap(box, other), name


NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])")


def test_every_number_drawn_on_a_figure_is_stated_in_the_readme_or_tables(study):
    """Value labels, notes and legend entries (a peak, a ratio, a bar's value): each number
    is one the README or a table prints, as it prints it."""
    stated = set(NUMBER.findall(study["text"]))
    for name, fig in study["figures"].items():
        texts = [t for t in fig.texts if t is not fig._suptitle]
        texts += [t for ax in _panels(fig) for t in ax.texts]
        texts += [t for lg in fig.legends for t in lg.get_texts()]
        for t in texts:
            for n in NUMBER.findall(t.get_text()):
                assert n in stated, (name, t.get_text(), n)


NO_TORCH = """
import sys
sys.modules["torch"] = None  # any import of torch now raises ImportError
from tiledattention.cli import main
rc = main(sys.argv[1:])
assert "torch" not in [m for m, v in sys.modules.items() if v is not None], "torch imported"
sys.exit(rc)
"""


def test_the_figures_and_tables_rebuild_without_torch(tmp_path):
    """The README's light path (`pip install --no-deps`, the figures extra's packages): the
    rebuild lines run with torch unimportable."""
    import subprocess
    import sys

    ref = Path(ROOT, "results/reference/h200")
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "rows-shard0of1.jsonl").write_bytes(
        gzip.decompress((ref / "data/rows.jsonl.gz").read_bytes()))
    env = {**os.environ, "PYTHONPATH": ROOT, "MPLBACKEND": "Agg"}
    for argv in (["figures", "--rows", str(rows / "rows-shard0of1.jsonl"), "--out",
                  str(tmp_path / "figures"), "--manifest", str(ref / "manifest.json")],
                 ["aggregate", "--rows", str(rows), "--out", str(tmp_path / "aggregate")]):
        out = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True,
                             text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "figures" / "decode.png").stat().st_size > 0
    assert (tmp_path / "aggregate" / "tables" / "headline.md").stat().st_size > 0


def test_the_systems_figure_sets_the_references_side_by_side_with_the_tables_numbers(
        tmp_path, monkeypatch):
    """H100 against H200: one panel per pass, the GPU names in the title, each drawn number
    (the geomeans) one systems.md prints."""
    from tiledattention.study.references import systems

    drawn = {}

    def keep(fig, out_dir, name, record=True):
        fig.canvas.draw()
        drawn[name] = fig
        return [name]

    monkeypatch.setattr(plotting, "save", keep)
    systems.write([os.path.join(ROOT, r) for r in REFERENCES], ["H100", "H200"],
                  str(tmp_path))
    fig = drawn["systems"]
    table = (tmp_path / "systems.md").read_text()
    assert "NVIDIA H100 80GB HBM3" in fig._suptitle.get_text()
    assert "NVIDIA H200" in fig._suptitle.get_text()
    panels = _panels(fig)
    assert [ax.get_title() for ax in panels] == ["forward", "forward+backward"]
    stated = set(NUMBER.findall(table))
    for ax in panels:
        assert ax.texts and all(n in stated for t in ax.texts
                                for n in NUMBER.findall(t.get_text()))
