"""The committed reference results: what `tiledattn bundle verify` says of them.

results/reference/h100/ is a summary of the reference bundle (its rows, PDFs, LaTeX tables,
profiles, snapshot and RO-Crate were never committed): the full verification fails on those
30 withheld files, the partial one checks every committed file against the bundle's sums."""

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
    assert "30 listed in SHA256SUMS, not here" in capsys.readouterr().out
