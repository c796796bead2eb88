"""From rows to a citable record: ratios and tables on hand-made rows, figures, the study
manifest, the bundle and its verification, the profile step without ncu."""

from __future__ import annotations

import json
import math
import os
import shutil
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("rocrate")

import tiledattention  # noqa: E402
from tiledattention.bench.methods import get_method  # noqa: E402
from tiledattention.errors import ScheduleError  # noqa: E402
from tiledattention.schedules.schedule import Schedule  # noqa: E402
from tiledattention.stages.profile import Shape, run_profile, summarize_metrics  # noqa: E402
from tiledattention.study.presentation import figures, tables  # noqa: E402
from tiledattention.study.presentation.frame import StudyError, columns_of, write_rows_table  # noqa: E402
from tiledattention.study.presentation.ratios import compare, compare_by  # noqa: E402
from tiledattention.study.publication import archive, create, manifest, verify  # noqa: E402
from tiledattention.study.publication.metadata import (  # noqa: E402
    Publication,
    citation_cff,
    validate_cff,
    validate_zenodo,
    zenodo,
)


def row(method, d, s, ms, *, status="ok", causal=False, dtype="float16", call_us=None):
    key = f"{dtype}-{'causal' if causal else 'full'}-d{d}-sq{s}-skv{s}-b1-h8-g1"
    r = {"format": "tiledattention-bench-row/1", "point_key": key, "method": method,
         "status": status, "dtype": dtype, "causal": causal, "head_dim": d, "seq_q": s,
         "seq_kv": s, "batch": 1, "heads": 8, "gqa": 1, "seed": 0, "device": "cuda:0"}
    if status == "ok":
        flops = 4 * 8 * s * s * d / (2 if causal else 1)
        r.update(time_ms={"median_ms": ms, "p95_ms": ms * 1.1, "mean_ms": ms, "min_ms": ms,
                          "std_ms": 0.0, "reps": 3},
                 flops=flops, tflops=flops / (ms * 1e-3) / 1e12, gbytes_per_s=1.0,
                 correct=True)
        if call_us is not None:
            r.update(call_us=call_us, call_calls=100)
    else:
        r["reason"] = "needs a CUDA GPU"
    return r


# Subject vs baseline: kernel-time ratios 2.0, 0.5, 1.25 (baseline ms / subject ms) and
# call-latency ratios 0.5, 0.5, 1.25 (baseline call_us / subject call_us); one point where
# the baseline is unavailable, one where neither ran.
HAND = [row("tiledattention", 64, 512, 1.0, call_us=4000.0),
        row("torch_sdpa", 64, 512, 2.0, call_us=2000.0),
        row("tiledattention", 64, 1024, 4.0, call_us=4000.0),
        row("torch_sdpa", 64, 1024, 2.0, call_us=2000.0),
        row("tiledattention", 128, 512, 2.0, call_us=2000.0),
        row("torch_sdpa", 128, 512, 2.5, call_us=2500.0),
        row("tiledattention", 128, 1024, 1.0),
        row("torch_sdpa", 128, 1024, 0, status="unavailable"),
        row("eager", 128, 2048, 3.0)]


def test_ratio_summary_matches_hand_computed_values():
    s = compare(HAND, "tiledattention", "torch_sdpa")
    assert s.n == 3 and s.wins == 2 and s.not_compared == 1
    assert s.mean == pytest.approx((2.0 + 0.5 + 1.25) / 3)
    assert s.median == pytest.approx(1.25)
    assert s.geomean == pytest.approx((2.0 * 0.5 * 1.25) ** (1 / 3))
    assert (s.min, s.max) == (0.5, 2.0)


def test_ratios_by_head_dim_group_points():
    per = compare_by(HAND, "tiledattention", "torch_sdpa", lambda p: p["head_dim"])
    assert per[64].geomean == pytest.approx(1.0) and per[64].wins == 1
    assert per[128].n == 1 and per[128].geomean == pytest.approx(1.25)
    assert per[128].not_compared == 1


def test_call_latency_ratios_use_call_us_and_skip_rows_without_it():
    s = compare(HAND, "tiledattention", "torch_sdpa", measure="call")
    assert s.n == 3 and s.wins == 1 and s.not_compared == 1
    assert s.geomean == pytest.approx((0.5 * 0.5 * 1.25) ** (1 / 3))
    old = [{k: v for k, v in r.items() if k not in ("call_us", "call_calls")} for r in HAND]
    s = compare(old, "tiledattention", "torch_sdpa", measure="call")
    assert s.n == 0 and s.not_compared == 4  # kernel time alone is not a call latency


def test_table4_lists_every_baseline_by_both_measures_in_all_three_formats(tmp_path):
    t = tables.table4(HAND)
    assert [r[:2] for r in t.rows] == [["fastest fused", "kernel time"],
                                       ["fastest fused", "call latency"],
                                       ["torch_sdpa", "kernel time"],
                                       ["torch_sdpa", "call latency"],
                                       ["eager", "kernel time"], ["eager", "call latency"]]
    sdpa, sdpa_call = t.rows[2], t.rows[3]
    assert sdpa[2] == 3 and sdpa[8] == "2/3" and sdpa[5] == pytest.approx(1.077217345)
    assert sdpa_call[8] == "1/3" and sdpa_call[5] == pytest.approx(0.6786044041)
    # torch_sdpa is the only fused baseline here (eager is not one): the fastest is it
    assert t.rows[0][2:-1] == sdpa[2:-1] and t.rows[0][-1] == "torch_sdpa 3"
    assert t.rows[4][-1] is None
    paths = t.write(str(tmp_path))
    md, csv_text, tex = (Path(p).read_text() for p in paths)
    assert ("| torch_sdpa | kernel time | 3 | 1.250 | 1.250 | 1.077 | 0.500 | 2.000 | 2/3 | 1 | — |"
            in md)
    assert ("| torch_sdpa | call latency | 3 | 0.750 | 0.500 | 0.679 | 0.500 | 1.250 | 1/3 | 1 "
            "| — |" in md)
    assert "torch_sdpa,kernel time,3," in csv_text and "\\begin{tabular}" in tex
    assert "torch\\_sdpa" in tex


def test_headline_has_overall_and_per_head_dim_means():
    t = tables.headline(HAND)
    by = {r[0]: r for r in t.rows}
    overall = by["torch_sdpa (fused SDPA), all points"]
    assert overall[2] == pytest.approx((2 + 0.5 + 1.25) / 3)
    assert overall[6:] == [pytest.approx(0.6786044041), 0.5, "1/3", None]  # call latency
    # torch_sdpa is the only fused baseline: the fastest at every point, named so
    assert by["fastest fused baseline, all points"][1:] == overall[1:-1] + ["torch_sdpa 3"]
    assert by["fastest fused, D=64"][-1] == "torch_sdpa 2"
    assert by["torch_sdpa, D=64"][1:4] == [2, pytest.approx(1.25), pytest.approx(1.0)]
    assert by["torch_sdpa, D=64"][6] == pytest.approx(0.5)
    assert by["torch_sdpa, D=128"][1] == 1
    assert by["eager attention"][1:4] == [0, None, None]  # never ok next to the subject


def test_per_head_dim_and_regime_cells_show_both_ratios():
    t = tables.by_head_dim(HAND)
    assert t.columns == ["D", "fastest fused", "torch_sdpa", "eager"]
    assert t.rows[0] == [64, "1.000 / 0.500 (2)", "1.000 / 0.500 (2)", "—"]
    assert t.rows[1] == [128, "1.250 / 1.250 (1)", "1.250 / 1.250 (1)", "—"]
    regime = {tuple(r[:2]): r[3] for r in tables.by_regime(HAND).rows}
    assert regime[("full", 512)] == f"{math.sqrt(2 * 1.25):.3f} / {math.sqrt(0.5 * 1.25):.3f} (2)"


def test_call_latency_table_lists_call_us_per_point_and_method():
    t = tables.call_latency(HAND)
    assert t.columns[6:] == ["tiledattention", "torch_sdpa", "eager"]
    assert t.rows[0][6:] == [4000.0, 2000.0, None]
    assert t.rows[3][6:] == [None, "unavailable", None]  # ok row without call_us: —


def test_status_table_lists_rows_that_are_not_ok():
    t = tables.status(HAND)
    assert t.columns == ["method", "status", "reason", "rows", "points"]
    assert t.rows == [["torch_sdpa", "unavailable", "needs a CUDA GPU", 1, HAND[7]["point_key"]]]
    assert "ok 8, unavailable 1" in t.notes[0]


def test_status_table_groups_rows_by_method_status_and_reason():
    """One line per (method, status, reason) with its row count: a method unavailable at
    every point is one line ("all N rows of it"), a few points are named, many are counted
    with the first three named."""
    rows = [row("tiledattention", 64, s, 1.0) for s in range(100, 110)]
    rows += [row("fa4", 64, s, 0, status="unavailable") for s in range(100, 110)]
    rows += [{**row("flash", 64, s, 0, status="error"), "reason": "boom" if s < 107 else "oom"}
             for s in range(100, 110)]
    rows += [row("cudnn", 64, s, 1.0, status="ok" if s > 101 else "unsupported")
             for s in range(100, 110)]
    t = tables.status(rows)
    key = [r["point_key"] for r in rows[:10]]
    assert t.rows == [
        ["cudnn", "unsupported", "needs a CUDA GPU", 2, f"{key[0]}, {key[1]}"],
        ["fa4", "unavailable", "needs a CUDA GPU", 10, "all 10 rows of fa4"],
        ["flash", "error", "boom", 7, f"7 points, e.g. {key[0]}, {key[1]}, {key[2]}"],
        ["flash", "error", "oom", 3, f"{key[7]}, {key[8]}, {key[9]}"]]
    assert t.notes[0] == "rows by status: error 10, ok 18, unavailable 10, unsupported 2"
    assert len(t.to_markdown().splitlines()) == 4 + 4 + 3  # title, header, rows, notes


def test_table5_reads_winner_runner_up_and_sensitivity(tmp_path):
    best = Schedule(64, 128, 2).as_dict()
    ru = Schedule(64, 64, 4).as_dict()
    path = tmp_path / "t.json"
    # Read through ScheduleTable.load (bounded, validated): a real table's format and cc.
    path.write_text(json.dumps({"format": "tiledattention-schedule-table/1",
                                "entries": [{"bucket": {"dtype": "float16", "causal": True,
                                                        "head_dim": 128, "s_bucket": 4096,
                                                        "cc": "9.0"},
                                             "gpu": "H100", "best": best, "best_tflops": 500.0,
                                             "runner_up": ru, "runner_up_tflops": 450.0,
                                             "sensitivity": 0.1}]}))
    t = tables.table5(str(path))
    assert t.rows[0][5:] == ["64x128_o2_c1_lk2_lv4", 500.0, "64x64_o4_c1_lk2_lv4", 450.0, 0.1,
                             None]  # % peak @ clock: the tuning table records no clock
    assert "not the SM clock it ran at" in t.notes[-1]
    assert tables.table5(None).rows == [] and "did not run" in tables.table5(None).notes[0]


def test_table6_ladder_geomeans_each_step_against_fused():
    lad = [row("tiledattention@64x64_o1_c1_lk2_lv4", 64, 512, 4.0),
           row("tiledattention@64x64_o1_c1_lk2_lv4", 64, 1024, 1.0),
           row("tiledattention", 64, 512, 1.0), row("tiledattention", 64, 1024, 1.0),
           row("torch_sdpa", 64, 512, 2.0), row("torch_sdpa", 64, 1024, 2.0)]
    t = tables.table6(lad)
    assert [r[1] for r in t.rows] == ["64x64_o1_c1_lk2_lv4", "tuned table"]
    assert t.rows[0][3] == pytest.approx(math.sqrt(0.5 * 2.0))
    assert t.rows[1][3] == pytest.approx(2.0)


def test_undocumented_columns_are_refused():
    with pytest.raises(StudyError, match="undocumented columns \\['surprise'\\]"):
        columns_of([{**HAND[0], "surprise": 1}])


def test_rows_table_writes_parquet_csv_and_dictionary(tmp_path):
    import pandas as pd

    paths = write_rows_table(HAND, str(tmp_path))
    frame = pd.read_parquet(paths["parquet"])
    assert len(frame) == len(HAND) and "time_ms.median_ms" in frame.columns
    assert "`time_ms.median_ms` | ms |" in Path(paths["columns"]).read_text()


def test_figures_are_written_and_non_empty_with_and_without_data(tmp_path):
    written = figures.write_all(HAND, str(tmp_path / "full"))
    empty = figures.write_all([row("eager", 64, 128, 1.0)], str(tmp_path / "cpu"))
    names = {os.path.basename(p) for p in written}
    # exactly the figures the workflow expects (it lists them from figures.names)
    assert names == {f"{n}.{ext}" for n in figures.names([64, 128]) for ext in ("png", "pdf")}
    for p in written + empty:
        with open(p, "rb") as f:
            head = f.read(8)
        assert head.startswith(b"\x89PNG") or head.startswith(b"%PDF"), p
        assert os.path.getsize(p) > 5000, p


def test_the_report_from_rows_is_one_function_and_tiledattn_aggregate_is_it(tmp_path,
                                                                           monkeypatch):
    from tiledattention.cli import main
    from tiledattention.study.presentation import report
    from tiledattention.study.presentation.report import write_report

    shards = tmp_path / "rows"
    shards.mkdir()
    (shards / "rows-shard0of1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HAND))
    calls = []
    monkeypatch.setattr(report, "write_report",
                        lambda *a, **k: calls.append(a[1]) or write_report(*a, **k))
    assert main(["aggregate", "--rows", str(shards), "--out", str(tmp_path / "cli")]) == 0
    assert calls == [str(tmp_path / "cli")]
    done = write_report(HAND, str(tmp_path / "fn"), where="HAND")
    assert {os.path.splitext(os.path.basename(p))[0] for p in done["tables"]} == \
        set(tables.NAMES)
    made = sorted(p.relative_to(tmp_path / "fn") for p in (tmp_path / "fn").rglob("*"))
    assert made == sorted(p.relative_to(tmp_path / "cli") for p in (tmp_path / "cli").rglob("*"))
    for rel in made:  # the same report, byte for byte (Parquet aside: it records its writer)
        if rel.suffix in (".csv", ".md", ".tex", ".jsonl"):
            assert (tmp_path / "fn" / rel).read_bytes() == (tmp_path / "cli" / rel).read_bytes()


def test_tables_written_are_exactly_the_names_the_workflow_expects(tmp_path):
    written = tables.write_all(HAND, str(tmp_path))
    assert {os.path.splitext(os.path.basename(p))[0] for p in written} == set(tables.NAMES)


def test_pinned_schedule_methods_parse_and_bad_labels_are_refused():
    assert Schedule.from_label("64x128_o2_c1_lk2_lv4_natural") == Schedule(
        64, 128, 2, heavy_first=False)
    assert Schedule.from_label(Schedule(128, 64, 3).label()) == Schedule(128, 64, 3)
    assert get_method("tiledattention@64x64_o4_c1_lk2_lv4").name.endswith("lv4")
    with pytest.raises(ScheduleError, match="is not like"):
        Schedule.from_label("64x64")
    with pytest.raises(ScheduleError, match="not one of"):
        get_method("tiledattention@64x48_o4_c1_lk2_lv4")


def _run_manifest(gpu="NVIDIA H100 80GB HBM3", torch="2.11.0"):
    return {"tiledattention": "0.1.0", "python": "3.12", "torch": torch,
            "gpu": {"name": gpu, "compute_capability": "9.0", "driver": "580"},
            "git_commit": "abc", "started": "2026-11-22T10:00:00+00:00",
            "finished": "2026-11-22T10:05:00+00:00", "environment": {}}


def test_manifest_merge_flags_a_mixed_study():
    same = manifest.merge({"a": _run_manifest(), "b": _run_manifest()}, config={"x": 1})
    assert same["consistent"] and same["study_config_hash"] == manifest.config_hash({"x": 1})
    mixed = manifest.merge({"a": _run_manifest(), "b": _run_manifest("NVIDIA A100")})
    assert not mixed["consistent"]
    assert mixed["mismatches"] == {"gpu.name": ["NVIDIA A100", "NVIDIA H100 80GB HBM3"]}
    with pytest.raises(StudyError, match="no run manifests"):
        manifest.merge({})


def test_image_reference_records_a_digest():
    ref = manifest.image_reference("nvcr.io/x/y@sha256:" + "a" * 64)
    assert ref["digest"] == "sha256:" + "a" * 64
    assert manifest.image_reference(None) is None


def _study(tmp_path):
    study = tmp_path / "study"
    agg = study / "aggregate"
    write_rows_table(HAND, str(agg))
    with open(agg / "rows.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in HAND)
    tables.write_all(HAND, str(agg / "tables"))
    figures.write_all(HAND, str(study / "figures"))
    (study / "profile").mkdir()
    (study / "profile" / "summary.md").write_text("# Nsight Compute summary\n")
    # The config the bundle is made with (bundle verify checks the recorded hash).
    merged = manifest.merge({"a": _run_manifest()}, config={"results_dir": "x"})
    (study / "manifest.json").write_text(json.dumps(merged))
    return study


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bundle")
    study = _study(tmp)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = create.create(str(study), str(tmp / "bundle"), config={"results_dir": "x"},
                        config_name="config.yaml", repo_root=root,
                        publication=Publication())
    return out


def test_a_fresh_bundle_verifies_as_directory_and_zip(built):
    assert verify.verify(built["dir"]) == []
    assert verify.verify(built["zip"]) == []
    assert built["files"] <= archive.ZENODO_MAX_FILES
    names = set(os.listdir(built["dir"]))
    assert {"README.md", ".zenodo.json", "CITATION.cff", "ro-crate-metadata.json",
            "SHA256SUMS", "manifest.json", "profiles.zip", "workflow-snapshot.zip"} <= names
    readme = Path(built["dir"], "README.md").read_text()
    assert "geometric mean of 1.077x" in readme and "| torch_sdpa | kernel time | 3 |" in readme
    assert "by call latency" in readme and "geometric mean is 0.679x" in readme
    with zipfile.ZipFile(os.path.join(built["dir"], "workflow-snapshot.zip")) as z:
        assert "Snakefile" in z.namelist() and "workflow/rules/common.smk" in z.namelist()
        # the exact config travels with the workflow: the unpacked snapshot runs as it is
        assert z.read("config/study-config.yaml") == \
            Path(built["dir"], "config", "study-config.yaml").read_bytes()


def test_a_bundle_leaves_out_the_figures_with_nothing_drawn_and_says_why(built):
    """The study without a variants stage or shapes grid: those figures are written (the
    workflow needs them) but the bundle holds only figures with data, and its README names
    the others with why."""
    figs = set(os.listdir(os.path.join(built["dir"], "figures")))
    assert "regime_map_fwd.png" in figs and "throughput_fwd_d64.pdf" in figs
    assert not figs & {"variants.png", "shapes.png", "not-drawn.json"}
    readme = Path(built["dir"], "README.md").read_text()
    assert "- figures: variants not drawn, nothing to draw (no data: no variants stage in " \
           "this study)" in readme
    assert "- figures: shapes not drawn, nothing to draw (no data: no shapes grid" in readme
    assert "- figures: regime_map_fwd not drawn" not in readme


def test_a_tampered_missing_or_added_file_fails_verify_naming_it(built, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(built["dir"], copy)
    with open(copy / "data" / "rows.csv", "a") as f:
        f.write("forged\n")
    os.remove(copy / "figures" / "regime_map_fwd.png")
    (copy / "extra.txt").write_text("x")
    problems = verify.verify(str(copy))
    assert "changed: data/rows.csv (checksum differs)" in problems
    assert "missing: figures/regime_map_fwd.png" in problems
    assert "not in SHA256SUMS: extra.txt" in problems


def test_invalid_metadata_fails_verify(built, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(built["dir"], copy)
    meta = json.loads((copy / ".zenodo.json").read_text())
    meta["upload_type"] = "spreadsheet"
    (copy / ".zenodo.json").write_text(json.dumps(meta))
    problems = verify.verify(str(copy))
    assert any(p.startswith(".zenodo.json: .zenodo.json is invalid: upload_type") for p in
               problems)


@pytest.fixture(scope="module")
def compact(tmp_path_factory):
    """A compact bundle of the hand-made study, through the CLI as a user makes one."""
    from tiledattention.cli import main

    tmp = tmp_path_factory.mktemp("compact")
    study = _study(tmp)
    (tmp / "config.yaml").write_text("results_dir: x\n")
    assert main(["bundle", "create", "--compact", "--study", str(study), "--config",
                 str(tmp / "config.yaml"), "--out", str(tmp / "bundle")]) == 0
    return tmp


def _resum(out: Path, rel: str) -> None:
    """SHA256SUMS made to vouch for ``rel`` as it is now (a forger's bundle)."""
    import hashlib

    digest = hashlib.sha256((out / rel).read_bytes()).hexdigest()
    lines = [f"{digest}  {rel}" if ln.endswith(f"  {rel}") else ln
             for ln in (out / "SHA256SUMS").read_text().splitlines()]
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def test_a_compact_bundle_verifies_and_holds_the_rows_gzipped_without_figures(compact):
    import gzip

    out = compact / "bundle"
    assert verify.verify(str(out)) == [] and verify.verify(str(compact / "bundle.zip")) == []
    names = set(archive.tree_files(str(out)))
    assert "data/rows.jsonl.gz" in names and "workflow-snapshot.zip" in names
    assert not [n for n in names if n.startswith("figures/") or n in (
        "data/rows.jsonl", "data/rows.csv", "data/rows.parquet")]
    assert gzip.decompress((out / "data" / "rows.jsonl.gz").read_bytes()) == \
        (compact / "study" / "aggregate" / "rows.jsonl").read_bytes()
    # the marker, SHA256SUMS and the RO-Crate list exactly what is there
    listed = {ln.split("  ", 1)[1] for ln in (out / "SHA256SUMS").read_text().splitlines()}
    assert listed == names - {"SHA256SUMS"}
    assert set(json.loads((out / archive.MARKER).read_text())["files"]) == names
    crate = json.loads((out / "ro-crate-metadata.json").read_text())
    ids = {e["@id"] for e in crate["@graph"]}
    assert "data/rows.jsonl.gz" in ids and not [i for i in ids if i.startswith("figures/")]
    readme = (out / "README.md").read_text()
    assert "gunzip -c data/rows.jsonl.gz > $R/rows/rows-shard0of1.jsonl" in readme
    assert "tiledattn figures --rows $R/rows/rows-shard0of1.jsonl --out $R/figures" in readme


def _snapshot_tops(bundle) -> set[str]:
    with zipfile.ZipFile(Path(bundle) / "workflow-snapshot.zip") as z:
        return {n.split("/")[0] for n in z.namelist()}


def _install_steps(readme: str) -> list[str]:
    section = readme.split("## How to reproduce", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
            if ln.strip()]


def test_a_compact_bundle_keeps_its_tables_as_markdown_alone(compact, built):
    """Compact: the tables as Markdown alone (CSV and LaTeX rebuild from the rows, the
    README says so); a full bundle keeps all three and the package source."""
    out = compact / "bundle"
    names = set(archive.tree_files(str(out)))
    assert {n for n in names if n.startswith("tables/")} == \
        {f"tables/{n}.md" for n in tables.NAMES}
    assert (compact / "study" / "aggregate" / "tables" / "status.csv").is_file()  # left out
    readme = (out / "README.md").read_text()
    assert "Markdown (their CSV and LaTeX rebuild from the rows, below)" in readme
    assert "every table as Markdown, CSV and LaTeX" in readme
    # "abc", the revision its manifest records, is not this checkout's HEAD: the source stays
    assert "tiledattention" in _snapshot_tops(out)
    full = set(archive.tree_files(built["dir"]))
    assert {"tables/status.csv", "tables/status.tex"} <= full or "tables.zip" in full
    assert {"tiledattention", "README.md"} <= _snapshot_tops(built["dir"])
    wheel = json.loads(Path(built["dir"], archive.MARKER).read_text())["source"]["wheel"]
    assert _install_steps(Path(built["dir"], "README.md").read_text())[0] == \
        f'python -m pip install "{wheel}[gpu,workflow]"   # this run\'s package, from this bundle'


def _repo(path: Path):
    """A git repository with a workflow (Snakefile, pyproject.toml), a package that builds
    (tiledattention/__init__.py saying "recorded") and a ``git`` helper."""
    import subprocess

    path.mkdir()

    def git(*args):
        return subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c",
                               "user.email=t@t", *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    git("init", "-q")
    (path / "Snakefile").write_text("# the workflow\n")
    (path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = '
        '"setuptools.build_meta"\n\n[project]\nname = "tiledattention"\nversion = "0.1.0"\n'
        '\n[tool.setuptools.packages.find]\ninclude = ["tiledattention*"]\n')
    (path / "tiledattention").mkdir()
    (path / "tiledattention" / "__init__.py").write_text('RUN = "recorded"\n')
    git("add", "Snakefile", "pyproject.toml", "tiledattention/__init__.py")
    git("commit", "-q", "-m", "the run")
    return git


def _compact_of(study: Path, repo: Path, commit: str, out: Path) -> dict:
    (study / "manifest.json").write_text(json.dumps(manifest.merge(
        {"a": {**_run_manifest(), "git_commit": commit}}, config={"results_dir": "x"})))
    return create.create(str(study), str(out), config={"results_dir": "x"},
                         config_name="config.yaml", repo_root=str(repo),
                         publication=Publication(), compact=True)


def _wheel_member(bundle: str, rel: str) -> bytes:
    wheel = json.loads(Path(bundle, archive.MARKER).read_text())["source"]["wheel"]
    with zipfile.ZipFile(Path(bundle, wheel)) as z:
        return z.read(rel)


def test_a_bundle_made_at_a_recorded_revision_carries_that_revisions_wheel(tmp_path):
    """Made in a checkout at a revision the manifest records, a compact bundle's snapshot
    holds the workflow without tiledattention/, and source/ holds a wheel of that
    revision's committed tree (not the working tree's later edit), its version labelled
    with the revision; the README installs that wheel: no clone, no checkout around it."""
    repo = tmp_path / "repo"
    git = _repo(repo)
    commit = git("rev-parse", "HEAD")
    (repo / "tiledattention" / "__init__.py").write_text('RUN = "edited after the run"\n')
    out = _compact_of(_study(tmp_path), repo, commit, tmp_path / "ref")
    assert verify.verify(out["dir"]) == [] and verify.verify(out["zip"]) == []
    assert not _snapshot_tops(out["dir"]) & set(archive.SNAPSHOT_SOURCE)
    wheel = f"source/tiledattention-0.1.0+g{commit}-py3-none-any.whl"
    assert json.loads(Path(out["dir"], archive.MARKER).read_text())["source"] == \
        {"wheel": wheel, "revision": commit, "repository": None}
    assert _wheel_member(out["dir"], "tiledattention/__init__.py") == b'RUN = "recorded"\n'
    readme = Path(out["dir"], "README.md").read_text()
    assert _install_steps(readme) == [
        f'python -m pip install "{wheel}[gpu,workflow]"   # this run\'s package, from this '
        "bundle", "tiledattn reproduce . --out ../reproduction --profile local"]
    assert "git clone" not in readme and "rev-parse" not in readme
    assert f"a wheel of revision {commit}, one the manifest records" in readme


def test_a_compact_bundle_keeps_the_source_no_recorded_revision_holds(tmp_path):
    """The snapshot keeps the package source, and the bundle's wheel is the package as it
    ran (no revision in its version), where the checkout is not at a revision the manifest
    records, its workflow files differ from that revision, or a run came from a tree with
    uncommitted changes."""
    repo = tmp_path / "repo"
    git = _repo(repo)
    commit = git("rev-parse", "HEAD")
    study = _study(tmp_path)
    (repo / "Snakefile").write_text("# changed, not committed\n")
    made = [_compact_of(study, repo, commit, tmp_path / "b0")]
    git("commit", "-q", "-am", "later")
    made.append(_compact_of(study, repo, commit, tmp_path / "b1"))  # HEAD is not the run's
    recorded = json.loads((study / "manifest.json").read_text())
    (study / "manifest.json").write_text(json.dumps(
        {**recorded, "stack": {**recorded["stack"], "git_commit": git("rev-parse", "HEAD")},
         "runs_from_dirty_tree": ["a"]}))
    made.append(create.create(str(study), str(tmp_path / "b2"), config={"results_dir": "x"},
                              config_name="config.yaml", repo_root=str(repo),
                              publication=Publication(), compact=True))
    for out in made:
        assert verify.verify(out["dir"]) == []
        assert "tiledattention" in _snapshot_tops(out["dir"]), out["dir"]
        assert _install_steps(Path(out["dir"], "README.md").read_text())[0].startswith(
            'python -m pip install "source/tiledattention-0.1.0-py3-none-any.whl['), out["dir"]
        assert _wheel_member(out["dir"], "tiledattention/__init__.py") == \
            Path(tiledattention.__file__).read_bytes()  # the package that ran: this one


def _without_source(bundle: Path) -> None:
    """``bundle`` as one made before bundles carried their source: no source/, and neither
    SHA256SUMS nor the marker names it."""
    shutil.rmtree(bundle / "source")
    sums = [ln for ln in (bundle / "SHA256SUMS").read_text().splitlines()
            if "  source/" not in ln]
    (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    mark = json.loads((bundle / archive.MARKER).read_text())
    mark["files"] = [f for f in mark["files"] if not f.startswith("source/")]
    del mark["source"]
    (bundle / archive.MARKER).write_text(json.dumps(mark))
    _resum(bundle, archive.MARKER)


def test_a_bundle_without_its_package_source_fails_verify_in_one_line(built, tmp_path, capsys):
    from tiledattention.cli import main

    copy = tmp_path / "b"
    shutil.copytree(built["dir"], copy)
    assert main(["bundle", "verify", str(copy)]) == 0  # with it: verified
    _without_source(copy)
    problems = verify.verify(str(copy))
    assert len(problems) == 1 and problems[0].startswith(
        "missing: the package source (source/tiledattention-*.whl"), problems
    capsys.readouterr()
    assert main(["bundle", "verify", str(copy)]) != 0
    err = capsys.readouterr().err
    assert "bundle verify: missing: the package source" in err and "Traceback" not in err


def test_a_corrupted_gz_row_file_fails_verify_with_one_clear_line(compact, tmp_path):
    out = tmp_path / "b"
    shutil.copytree(compact / "bundle", out)
    gz = out / "data" / "rows.jsonl.gz"
    data = bytearray(gz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    gz.write_bytes(bytes(data))
    assert verify.verify(str(out)) == ["changed: data/rows.jsonl.gz (checksum differs)"]
    _resum(out, "data/rows.jsonl.gz")  # SHA256SUMS forged too: the content check finds it
    problems = verify.verify(str(out))
    assert len(problems) == 1 and problems[0].startswith(
        "data/rows.jsonl.gz: not a whole gzip file"), problems


def test_a_tampered_row_in_a_compact_bundle_fails_verify_with_one_clear_line(compact,
                                                                             tmp_path):
    import gzip

    out = tmp_path / "b"
    shutil.copytree(compact / "bundle", out)
    gz = out / "data" / "rows.jsonl.gz"
    rows = [json.loads(ln) for ln in gzip.decompress(gz.read_bytes()).splitlines()]
    rows[0]["tflops"] = -rows[0]["tflops"]
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    _resum(out, "data/rows.jsonl.gz")
    problems = verify.verify(str(out))
    assert len(problems) == 1 and "data/rows.jsonl.gz" in problems[0] and \
        "tflops" in problems[0], problems


def test_verify_decompresses_a_gz_row_file_no_further_than_the_cap(compact, tmp_path,
                                                                  monkeypatch):
    out = tmp_path / "b"
    shutil.copytree(compact / "bundle", out)
    monkeypatch.setattr(archive, "ROWS_MAX", 100)
    problems = verify.verify(str(out))
    assert problems == ["data/rows.jsonl.gz: over the 100 bytes allowed once decompressed"]


def test_zenodo_and_cff_metadata_validate_and_bad_ones_do_not():
    pub = Publication(title="T")
    validate_zenodo(zenodo(pub, "headline"))
    cff = citation_cff(pub)
    validate_cff(cff)
    assert cff["references"][0]["doi"] == "10.48550/arXiv.2603.01960"
    with pytest.raises(StudyError, match="CITATION.cff is invalid"):
        validate_cff({**cff, "cff-version": "9.9"})
    with pytest.raises(StudyError, match="creators"):
        validate_zenodo({**zenodo(pub, "h"), "creators": []})
    with pytest.raises(StudyError, match="unknown keys \\['author'\\]"):
        Publication.from_dict({"author": "me"}, "0.1")


def test_ro_crate_describes_the_run_as_a_create_action_of_the_workflow(built):
    from rocrate.rocrate import ROCrate

    crate = ROCrate(built["dir"])
    actions = [e for e in crate.get_entities() if e.type == "CreateAction"]
    assert len(actions) == 1 and actions[0]["instrument"].id == "workflow-snapshot.zip"
    assert crate.root_dataset["mainEntity"].id == "workflow-snapshot.zip"
    assert [e.id for e in actions[0]["object"]] == ["config/study-config.yaml"]
    results = {e.id for e in actions[0]["result"]}
    assert "data/rows.parquet" in results and "manifest.json" in results


def _validate_crate(path):
    """roc-validator (PyPI, the RO-Crate community's validator) offline, against the
    Workflow Run Crate 0.5 profile and the profiles it builds on (Process Run Crate,
    Workflow RO-Crate, RO-Crate 1.1). Skipped: the two checks that fetch the JSON-LD context
    from w3id.org (no network here); every other REQUIRED check runs."""
    services = pytest.importorskip("rocrate_validator.services",
                                   reason="roc-validator not installed (pip install "
                                   "'tiledattention[dev]')")
    result = services.validate({"rocrate_uri": path,
                                "profile_identifier": "workflow-run-crate-0.5",
                                "requirement_severity": "REQUIRED", "offline": True,
                                "skip_checks": ["ro-crate-1.1_3.1", "ro-crate-1.1_3.2"]})
    return result.passed(), [f"{i.check.identifier}: {i.message}"
                             for i in result.get_issues()]


def test_ro_crate_passes_the_workflow_run_crate_validator(built):
    passed, issues = _validate_crate(built["dir"])
    assert passed, issues


def test_the_crate_validator_refuses_a_crate_without_its_workflow(built, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(built["dir"], copy)
    meta = json.loads((copy / "ro-crate-metadata.json").read_text())
    root = next(e for e in meta["@graph"] if e["@id"] == "./")
    del root["mainEntity"]
    (copy / "ro-crate-metadata.json").write_text(json.dumps(meta))
    passed, issues = _validate_crate(str(copy))
    assert not passed and any("Main Workflow" in i or "mainEntity" in i for i in issues), issues


def test_ro_crate_names_the_container_image(tmp_path):
    from tiledattention.study.publication.metadata import write_ro_crate

    (tmp_path / "manifest.json").write_text("{}")
    write_ro_crate(str(tmp_path), Publication(), ["manifest.json"],
                   {"container": {"image": "ghcr.io/x/tiledattn:1.0",
                                  "digest": "sha256:" + "b" * 64}}, "snakemake", None, None)
    graph = json.loads((tmp_path / "ro-crate-metadata.json").read_text())["@graph"]
    action = next(e for e in graph if e["@type"] == "CreateAction")
    image = next(e for e in graph if e["@id"] == action["containerImage"]["@id"])
    assert image["@type"] == "ContainerImage" and image["sha256"] == "b" * 64
    assert image["tag"] == "1.0"


def test_profile_without_ncu_records_why_and_succeeds(tmp_path, monkeypatch):
    monkeypatch.setattr("tiledattention.stages.profile.find_ncu", lambda: None)
    code = run_profile([Shape.parse("float16:causal:128:4096")], ["tiledattention"],
                       str(tmp_path))
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["captures"][0]["status"] == "skipped"
    assert "ncu (Nsight Compute) not found" in (tmp_path / "summary.md").read_text()


def test_profile_shapes_and_methods_are_checked():
    with pytest.raises(StudyError, match="expected dtype:mask:D:S"):
        Shape.parse("float16:128:4096")
    with pytest.raises(StudyError, match="valid are"):
        run_profile([Shape.parse("float16:full:64:512")], ["triton"], "/tmp/unused")


def test_ncu_raw_metrics_are_summarized():
    raw = {"Kernel Name": "attention_fwd", "gpu__time_duration.sum": "1,005,000",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed": "71.5",
           "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "64.2",
           "launch__registers_per_thread": "168",
           "launch__shared_mem_per_block_dynamic": "65536",
           "launch__shared_mem_per_block_static": "0",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "2.5",
           "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "0.7",
           "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "1.1"}
    m = summarize_metrics(raw)  # no units row: ncu's raw defaults (ns, bytes)
    assert m["duration_us"] == 1005.0 and m["tensor_pipe_pct"] == 64.2
    assert m["shared_mem_per_block_bytes"] == 65536 and m["registers_per_thread"] == 168
    assert m["top_stalls"] == ["long_scoreboard 2.50", "barrier 1.10", "wait 0.70"]


def test_ncu_units_row_is_honoured():
    raw = {"gpu__time_duration.sum": "980.352", "launch__shared_mem_per_block_static": "81.976",
           "launch__shared_mem_per_block_dynamic": "0", "launch__grid_size": "4,096"}
    units = {"gpu__time_duration.sum": "us", "launch__shared_mem_per_block_static": "Kbyte/block",
             "launch__shared_mem_per_block_dynamic": "byte/block"}
    m = summarize_metrics(raw, units)
    assert m["duration_us"] == 980.352 and m["shared_mem_per_block_bytes"] == 81976
    assert m["grid_size"] == 4096


def test_the_repository_url_comes_from_config_then_pyproject_then_git_remote(tmp_path):
    import subprocess

    from tiledattention.study.publication.metadata import repository_url

    assert repository_url("https://example.org/r", str(tmp_path)) == "https://example.org/r"
    assert repository_url(None, str(tmp_path)) is None  # nothing says: none recorded
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin",
                    "git@github.com:org/repo.git"], check=True)
    assert repository_url(None, str(tmp_path)) == "https://github.com/org/repo"
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.urls]\nRepository = "https://example.org/x"\n')
    assert repository_url(None, str(tmp_path)) == "https://example.org/x"


def test_a_broken_pyproject_is_one_study_error_not_a_traceback(tmp_path):
    from tiledattention.errors import StudyError
    from tiledattention.study.publication.metadata import repository_url

    (tmp_path / "pyproject.toml").write_text('[project\nname = "x"\n')
    with pytest.raises(StudyError, match="pyproject.toml is not readable TOML"):
        repository_url(None, str(tmp_path))
    (tmp_path / "pyproject.toml").write_text('project = "x"\n')  # valid, odd shape: no URL
    assert repository_url(None, str(tmp_path)) is None


def test_citation_and_zenodo_name_the_repository():
    pub = Publication(repository="https://example.org/tiledattention")
    assert citation_cff(pub)["repository-code"] == "https://example.org/tiledattention"
    related = zenodo(pub, "h")["related_identifiers"]
    assert {"identifier": "https://example.org/tiledattention", "relation": "isSupplementTo",
            "scheme": "url", "resource_type": "software"} in related


def test_every_fa4_argument_a_row_can_carry_is_a_documented_column(monkeypatch):
    """The H100 reference re-run stopped at aggregate: FA4 rows carried details.version and
    details.kwargs.* that COLUMNS lacked. Every FA4 form (plain and each variant's) passes."""
    import types

    from tiledattention.bench import methods
    from tiledattention.bench import variant_cases as variants

    monkeypatch.setattr(methods, "fa4_version", lambda: "4.0.0b36")
    forms = [{"causal": False}, {"causal": True}]
    for name, variant in variants.VARIANTS.items():
        parts = variant.build(1, 2, 64, "cpu")
        if parts.fa4 is None and name == "alibi":  # its CuTe DSL form needs cutlass: stand in
            parts = types.SimpleNamespace(fa4={"causal": True, "score_mod": len,
                                               "score_mod_bwd": len, "aux_tensors": [None]})
        if parts.fa4 is not None:
            forms.append(parts.fa4)
    for form in forms:
        monkeypatch.setattr(methods, "_fa4_kwargs", lambda point, device, form=form: form)
        q = types.SimpleNamespace(device="cpu")
        details = methods._fa4_describe(q, q, q, None)
        assert "details.version" in columns_of([{"method": "fa4", "details": details}])
    assert "details.mask" in columns_of([{"details": {"mask": "bool"}}])


def test_a_run_that_lacked_a_package_is_a_mismatch_listed_after_the_versions():
    """A resumed stage whose first call could not import cuTile (its rows of ours were
    measured again) merges with the later run: the field is a mismatch, None last."""
    later = {"cuda_tile": "1.7.0", "torch": "2.11.0", "git_commit": "b" * 40}
    first = dict(later, cuda_tile=None)
    merged = manifest.merge({"stage/manifest-workloads.json": {**later,
                                                                "earlier_runs": [first]}})
    assert not merged["consistent"]
    assert merged["mismatches"] == {"cuda_tile": ["1.7.0", None]}
