"""The committed reference results: what `tiledattn bundle verify` says of them.

results/reference/h100/ is a summary of the reference bundle (its rows, PDFs, profiles,
snapshot, RO-Crate and five PNGs were never committed): the full verification fails on those
20 withheld files, the partial one checks every committed file against the bundle's sums."""

from __future__ import annotations

from tiledattention.cli import main
from tiledattention.study import bundle

H100 = "results/reference/h100"


def test_every_committed_h100_reference_file_matches_the_bundle_sums():
    partial: dict = {}
    assert bundle.verify(H100, partial) == []
    assert "config/study-config.yaml" not in partial["withheld"]  # committed where listed
    assert "data/rows.jsonl" in partial["withheld"]  # the rows were never committed
    assert all(e.startswith(("shapes/", "tables/shapes", "figures/shapes.png")) or
               e in ("bundle-verify.txt", "profile-summary.md") for e in partial["extra"])


def test_the_full_verification_of_the_h100_summary_names_the_withheld_rows(capsys):
    assert main(["bundle", "verify", H100]) == 1
    assert "missing: data/rows.jsonl" in capsys.readouterr().err
    assert main(["bundle", "verify", "--partial", H100]) == 0
    assert "20 listed in SHA256SUMS, not here" in capsys.readouterr().out


def test_the_latex_tables_are_rebuilt_byte_for_byte_from_the_markdown(tmp_path):
    """The reference's .tex files were rebuilt from its .md ones (Table.from_markdown);
    SHA256SUMS (the bundle's, from the node) vouches for every byte."""
    from tiledattention.study import tables
    from tiledattention.study.table import Table

    partial: dict = {}
    assert bundle.verify(H100, partial) == []
    assert not [w for w in partial["withheld"] if w.endswith(".tex")]
    rows = [{"point_key": "p", "method": m, "status": "ok", "head_dim": 64, "seq_q": 512,
             "seq_kv": 512, "batch": 1, "heads": 2, "dtype": "float16", "causal": False,
             "time_ms": {"median_ms": t}, "call_us": 9.5, "tflops": 1.5}
            for m, t in (("tiledattention", 1.0), ("torch_sdpa", 1.25))]
    for t in (tables.table4(rows), tables.headline(rows), tables.status(rows)):
        assert Table.from_markdown(t.name, t.to_markdown()).to_latex() == t.to_latex()
