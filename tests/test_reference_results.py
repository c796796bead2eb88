"""The committed references (results/reference/h100, h200): compact bundles of the reference
study, each with its rows. `tiledattn bundle verify` passes on what is committed, and the
published tables, the shipped advice data's sources and the headline recompute from the
committed rows."""

from __future__ import annotations

import os
import subprocess

import pytest

from tiledattention.cli import main
from tiledattention.study.presentation.table import Table
from tiledattention.study.publication import archive, verify

REFERENCES = ["results/reference/h100", "results/reference/h200"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("ref", REFERENCES)
def test_every_committed_reference_verifies_as_a_whole_bundle(ref, capsys):
    assert verify.verify(os.path.join(ROOT, ref)) == []
    assert main(["bundle", "verify", os.path.join(ROOT, ref)]) == 0
    assert "bundle verify: OK" in capsys.readouterr().out


@pytest.mark.parametrize("ref", REFERENCES)
def test_a_committed_reference_holds_its_rows_and_no_figures(ref):
    names = set(archive.tree_files(os.path.join(ROOT, ref)))
    assert {"data/rows.jsonl.gz", "data/ladder-rows.jsonl.gz", "data/model-rows.jsonl.gz",
            "data/variants-rows.jsonl.gz", "data/shapes-g0-rows.jsonl.gz",
            "data/shapes-g1-rows.jsonl.gz", "workflow-snapshot.zip"} <= names
    assert not [n for n in names if n.startswith("figures/") or n.endswith(".parquet")]


@pytest.mark.parametrize("ref", REFERENCES)
def test_the_committed_tables_rebuild_from_the_committed_rows(ref, tmp_path):
    """The bundle README's own commands, run as written (the figures too), with today's code:
    every number of every committed table again, the same to a float's last digit (the
    node's math library may round the last one otherwise). Today's tables may add to them —
    the comparisons with the fastest fused baseline (its rows, "fastest fused ...", and its
    columns), a column for a baseline the rows hold, notes — but change nothing they
    published; each committed LaTeX table is its Markdown table's."""
    copy = tmp_path / "bundle"
    subprocess.run(["cp", "-r", os.path.join(ROOT, ref), str(copy)], check=True)
    readme = (copy / "README.md").read_text()
    block = readme.split("## Figures and tables from the rows", 1)[1]
    script = block.split("```bash\n", 1)[1].split("```", 1)[0]
    run = subprocess.run(["bash", "-e", "-c", script], cwd=copy, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rebuilt = tmp_path / "rebuilt"
    assert len(list((rebuilt / "figures").glob("*.png"))) >= 10
    for name in sorted(os.listdir(copy / "tables")):
        want, got = (copy / "tables" / name).read_text(), \
            (rebuilt / "aggregate" / "tables" / name).read_text()
        stem, ext = name.rsplit(".", 1)
        if ext == "md":
            _holds(Table.from_markdown(stem, want), Table.from_markdown(stem, got), name)
        elif ext == "csv":
            _holds(_csv_table(stem, want), _csv_table(stem, got), name)
        else:  # the LaTeX of the committed Markdown, byte for byte
            md = (copy / "tables" / f"{stem}.md").read_text()
            assert want == Table.from_markdown(stem, md).to_latex(), name
    head = Table.from_markdown("headline", (rebuilt / "aggregate" / "tables" /
                                            "headline.md").read_text())
    assert head.rows[0][0] == "fastest fused baseline, all points"
    assert (rebuilt / "aggregate" / "tables" / "ratios_per_point.md").is_file()


def _csv_table(name: str, text: str) -> Table:
    import csv
    import io

    lines = list(csv.reader(io.StringIO(text)))
    return Table(name, "", lines[0], lines[1:])


def _holds(want: Table, got: Table, name: str) -> None:
    """``got`` publishes every cell of ``want`` (by row, and by column name), less only the
    rows of the fastest fused baseline it adds to a table published without them; its notes
    include ``want``'s, in order."""
    assert got.title == want.title, name
    assert set(want.columns) <= set(got.columns), (name, want.columns, got.columns)
    added = not any(str(r[0]).startswith("fastest fused") for r in want.rows)
    rows = [r for r in got.rows if not (added and str(r[0]).startswith("fastest fused"))]
    assert len(rows) == len(want.rows), name
    at = [got.columns.index(c) for c in want.columns]
    for w, g in zip(want.rows, rows):
        for c, i, cell in zip(want.columns, at, w):
            assert g[i] == cell or _same_to_the_last_digit(cell, g[i]), (name, c, w, g)
    notes = iter(got.notes)
    assert all(any(n == m for m in notes) for n in want.notes), (name, want.notes, got.notes)


def _same_to_the_last_digit(a: str, b: str) -> bool:
    import re

    num = r"-?\d+\.\d+(?:e-?\d+)?"
    if re.sub(num, "#", a) != re.sub(num, "#", b):
        return False
    return all(float(x) == pytest.approx(float(y), rel=1e-12)
               for x, y in zip(re.findall(num, a), re.findall(num, b)))


def test_the_advice_data_builds_from_a_compact_reference(tmp_path):
    from tiledattention.study.advice import advise as advice

    data = advice.build(os.path.join(ROOT, REFERENCES[0]), str(tmp_path / "h100.json"))
    by = {}
    for p in data["points"]:
        by[p["source"]] = by.get(p["source"], 0) + 1
    assert by["reference"] > 80 and by["shapes"] > 0  # forward points, with decode
    assert "data/rows.jsonl.gz" in data["sources"]["reference"]
