"""The committed references (results/reference/h100, h200): compact bundles of the reference
study, each with its rows. `tiledattn bundle verify` passes on what is committed, and the
published tables, the shipped advice data's sources and the headline recompute from the
committed rows."""

from __future__ import annotations

import json
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
    """Rows, Markdown tables, the workflow and the package's wheel: no figures, no CSV or
    LaTeX tables (they rebuild from the rows), no package source in the snapshot (the
    wheel, source/, holds the recorded revision's)."""
    import zipfile

    names = set(archive.tree_files(os.path.join(ROOT, ref)))
    assert {"data/rows.jsonl.gz", "data/ladder-rows.jsonl.gz", "data/model-rows.jsonl.gz",
            "data/variants-rows.jsonl.gz", "data/shapes-g0-rows.jsonl.gz",
            "data/shapes-g1-rows.jsonl.gz", "workflow-snapshot.zip",
            "tables/status.md", "tables/table4_ratios.md"} <= names
    assert [n for n in names if n.startswith("source/")] == \
        [json.loads(_read(ref, archive.MARKER))["source"]["wheel"]]
    assert not [n for n in names if n.startswith("figures/") or n.endswith(
        (".parquet", ".csv", ".tex"))]
    with zipfile.ZipFile(os.path.join(ROOT, ref, "workflow-snapshot.zip")) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert {"Snakefile", "workflow", "config", "profiles", "pyproject.toml"} <= tops
    assert not tops & set(archive.SNAPSHOT_SOURCE)
    commit = json.loads(_read(ref, "manifest.json"))["stack"]["git_commit"]
    shallow = subprocess.run(["git", "-C", ROOT, "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True)
    if shallow.returncode == 0 and shallow.stdout.strip() == "false":  # whole history here
        assert subprocess.run(["git", "-C", ROOT, "cat-file", "-e", f"{commit}^{{commit}}"],
                              capture_output=True).returncode == 0, \
            f"{commit}: the recorded revision is not in this repository's history"


@pytest.mark.parametrize("ref", REFERENCES)
def test_reproduce_lays_out_a_committed_references_workflow(ref, tmp_path):
    """tiledattn reproduce on a committed (compact) reference: its snapshot's workflow and
    exact config laid out, no package source (the installed one runs, as for any bundle)."""
    from tiledattention.study.references import reproduce

    out = tmp_path / "re"
    rec, profile, _, continued = reproduce.prepare(os.path.join(ROOT, ref), str(out))
    assert (out / "Snakefile").is_file() and (out / "workflow" / "rules").is_dir()
    assert (out / "config" / "study-config.yaml").read_bytes() == rec.config
    assert profile == os.path.join("profiles", "local") and not continued
    assert not (out / "tiledattention").exists()
    readme = _read(ref, "README.md")
    wheel = json.loads(_read(ref, archive.MARKER))["source"]["wheel"]
    assert f'python -m pip install "{wheel}[gpu,workflow]"' in readme and "git clone" not in readme


def _read(ref: str, rel: str) -> str:
    with open(os.path.join(ROOT, ref, rel), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("ref", REFERENCES)
def test_a_committed_status_table_groups_the_rows_that_are_not_ok(ref):
    """One line per (method, status, reason), not one per row: sdpa_fa4's 263 unavailable
    rows are one line."""
    status = Table.from_markdown("status", _read(ref, "tables/status.md"))
    assert status.columns == ["method", "status", "reason", "rows", "points"]
    assert [r[:2] + r[3:] for r in status.rows] == [
        ["sdpa_fa4", "unavailable", "263", "all 263 rows of sdpa_fa4"]]
    assert status.notes[0] == "rows by status: ok 1315, unavailable 263"


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
    assert "CSV and LaTeX rebuild from the rows" in (copy / "README.md").read_text()
    readme = (copy / "README.md").read_text()
    block = readme.split("## Figures and tables from the rows", 1)[1]
    script = block.split("```bash\n", 1)[1].split("```", 1)[0]
    run = subprocess.run(["bash", "-e", "-c", script], cwd=copy, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rebuilt = tmp_path / "rebuilt-bundle"  # one per bundle, named after its directory
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
    # The CSV and LaTeX a compact bundle leaves out come back, each its Markdown table's.
    for name in sorted(os.listdir(copy / "tables")):
        stem = name.removesuffix(".md")
        md = Table.from_markdown(stem, (rebuilt / "aggregate" / "tables" / name).read_text())
        assert (rebuilt / "aggregate" / "tables" / f"{stem}.tex").read_text() == \
            md.to_latex(), stem
        csv = _csv_table(stem, (rebuilt / "aggregate" / "tables" / f"{stem}.csv").read_text())
        assert csv.columns == md.columns and len(csv.rows) == len(md.rows), stem
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
    rows it adds to a table published without their kind: the fastest fused baseline's,
    and the shapes grids' groups of the headline by head shape; its notes include
    ``want``'s, in order."""
    assert got.title == want.title, name
    assert set(want.columns) <= set(got.columns), (name, want.columns, got.columns)
    kinds = [k for k in ("fastest fused", "shapes ")
             if not any(str(r[0]).startswith(k) for r in want.rows)]
    rows = [r for r in got.rows if not str(r[0]).startswith(tuple(kinds))]
    assert len(rows) == len(want.rows), name
    at = [got.columns.index(c) for c in want.columns]
    for w, g in zip(want.rows, rows):
        for c, i, cell in zip(want.columns, at, w):
            assert g[i] == cell or _same_to_the_last_digit(cell, g[i]), (name, c, w, g)
    notes = iter(got.notes)
    assert all(any(_same_note(n, m) for m in notes) for n in want.notes), (
        name, want.notes, got.notes)


def _same_note(want: str, got: str) -> bool:
    """The same note, or the same but for baselines registered since in a list that names
    the registry's methods ("(torch_sdpa, flash, cudnn, ...; not math or eager)"): every
    published name still there, in its order, and the text around the list unchanged."""
    import re

    if want == got:
        return True
    listing = r"\((?:[a-z0-9_]+, )+[a-z0-9_]+"
    w, g = re.search(listing, want), re.search(listing, got)
    if not (w and g and want[:w.start()] == got[:g.start()]
            and want[w.end():] == got[g.end():]):
        return False
    names = iter(g[0][1:].split(", "))
    return all(n in names for n in w[0][1:].split(", "))


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


def _whole_history() -> bool:
    run = subprocess.run(["git", "-C", ROOT, "rev-parse", "--is-shallow-repository"],
                         capture_output=True, text=True)
    return run.returncode == 0 and run.stdout.strip() == "false"


@pytest.mark.skipif(not _whole_history(), reason="a shallow clone: the recorded revision's "
                    "source is not in it")
def test_rebundle_makes_a_committed_reference_again_keeping_what_it_published(tmp_path):
    """python -m tiledattention.study.references.rebundle (how the references are made
    again): the rows, tables, manifest, config and the recorded revision's wheel byte for
    byte; the bundle verifies."""
    import shutil

    from tiledattention.study.references import rebundle

    copy = tmp_path / "h200"
    shutil.copytree(os.path.join(ROOT, REFERENCES[1]), copy)
    before = dict(ln.split("  ", 1)[::-1] for ln in (copy / "SHA256SUMS").read_text()
                  .splitlines())
    assert rebundle.main([str(copy)]) == 0
    after = dict(ln.split("  ", 1)[::-1] for ln in (copy / "SHA256SUMS").read_text()
                 .splitlines())
    kept = {rel for rel in before if rel.startswith(rebundle.KEPT + ("source/",))}
    assert kept and {rel: after.get(rel) for rel in kept} == {rel: before[rel] for rel in kept}
    assert verify.verify(str(copy)) == []


@pytest.mark.skipif(not _whole_history(), reason="a shallow clone: the recorded revision's "
                    "source is not in it")
def test_rebundle_names_the_repository_the_reference_records_not_the_checkouts(tmp_path):
    """A reference whose marker records a repository is made again naming that one (README,
    Zenodo and CFF metadata), whatever remote the checkout that runs rebundle has."""
    from tiledattention.study.references import rebundle

    copy = _copy(tmp_path, REFERENCES[0])
    url = "https://example.org/recorded/tiledattention"
    marker = copy / rebundle.MARKER
    recorded = json.loads(marker.read_text())
    recorded["source"]["repository"] = url
    marker.write_text(json.dumps(recorded))
    assert rebundle.main([str(copy)]) == 0
    assert url in (copy / "README.md").read_text()
    assert url in (copy / ".zenodo.json").read_text()
    assert url in (copy / "CITATION.cff").read_text()
    assert json.loads(marker.read_text())["source"]["repository"] == url
    assert verify.verify(str(copy)) == []


def test_rebundle_never_removes_a_file_the_reference_does_not_list(tmp_path, capsys):
    import shutil

    from tiledattention.study.references import rebundle

    copy = tmp_path / "h100"
    shutil.copytree(os.path.join(ROOT, REFERENCES[0]), copy)
    (copy / "notes.txt").write_text("mine")
    sums = (copy / "SHA256SUMS").read_text()
    assert rebundle.main([str(copy)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.txt" in err[0] and "move them away" in err[0]
    assert (copy / "notes.txt").read_text() == "mine" and (copy / "SHA256SUMS").read_text() \
        == sums


def test_a_published_note_may_gain_baselines_registered_since_but_lose_or_reorder_none():
    note = "fastest fused: x (torch_sdpa, flash, cudnn; not math or eager); y."
    assert _same_note(note, note.replace("flash, cudnn", "flash, cudnn_fe, cudnn"))
    assert not _same_note(note, note.replace("flash, ", ""))
    assert not _same_note(note, note.replace("torch_sdpa, flash", "flash, torch_sdpa"))
    assert not _same_note(note, note.replace("x (", "z ("))
    assert not _same_note(note, note.replace("); y.", "); z."))



# The workloads stage as first measured for the H200 reference (2026-12-03, revision
# 9b02838): its rows were the reference's data/workloads-rows.jsonl.gz up to REMEASURED, its
# run manifest this file.
WORKLOADS_MANIFEST = "benchmarks/results/h200-2026-12-03-s62-workloads-manifest.json.gz"
BEFORE_WORKLOADS = "9b02838e9fbfb3bc11e160c23eb44336bb83a544"  # h200 without the stage
REMEASURED = "ee4795ccd27c6b76cf9005f0ba6f9c21d4e2766d"  # h200 with the first rows, the last
# The stage measured again (2026-12-04, revision 3393d3a; benchmarks/notes/varlen-paged.md
# §49b): its rows were the reference's up to REMEASURED_AGAIN, its run manifest this.
WORKLOADS_AGAIN_MANIFEST = "benchmarks/results/h200-2026-12-04-s65-workloads-manifest.json.gz"
REMEASURED_AGAIN = "858015f3db252c1f357e132afadecfe550f1fd23"  # h200 with the second rows
# The paged points measured a third time (2026-12-04, revision 858015f, resumed from the
# second run's other rows; varlen-paged.md §50c): its rows are the reference's
# data/workloads-rows.jsonl.gz, its run manifest this.
WORKLOADS_THIRD_MANIFEST = "benchmarks/results/h200-2026-12-04-s66-workloads-manifest.json.gz"


# The shapes grids the H200 reference gained since (issue 48 item 4): the sweeps' rows are
# its data/shapes-g<N>-rows.jsonl.gz, their run manifests these files.
SHAPES_MANIFESTS = {g: f"benchmarks/results/h200-2026-12-03-s63-shapes-g{g}-manifest.json.gz"
                    for g in (2, 3)}


def _measured_workloads(tmp_path) -> str:
    """The H200 workloads stage's output directory (rows and run manifest), as it ran
    last: the rows the reference holds."""
    return _measured(tmp_path / "measured", "workloads-rows.jsonl.gz", "rows.jsonl",
                     WORKLOADS_THIRD_MANIFEST, "manifest-workloads.json")


def _earlier_measured_workloads(tmp_path, name: str, commit: str, manifest: str,
                                ref: str = REFERENCES[1]) -> str:
    """A reference's (the H200's unless said) workloads stage's output directory as an
    earlier run left it (its rows from the reference at ``commit``, the last one holding
    them: a whole clone's history)."""
    out = _measured(tmp_path / name, "workloads-rows.jsonl.gz", "rows.jsonl", manifest,
                    "manifest-workloads.json", ref)
    import gzip

    rows = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:{ref}/data/"
                           "workloads-rows.jsonl.gz"], capture_output=True, check=True).stdout
    with open(os.path.join(out, "rows.jsonl"), "wb") as f:
        f.write(gzip.decompress(rows))
    return out


def _measured_shapes_grid(tmp_path, g: int) -> str:
    """The H200 shapes grid g's sweep directory (rows and run manifest), as it ran."""
    return _measured(tmp_path / f"sweep-g{g}", f"shapes-g{g}-rows.jsonl.gz",
                     "rows-shard0of1.jsonl", SHAPES_MANIFESTS[g], "manifest-shard0of1.json")


def _measured(out, data: str, rows: str, manifest: str, manifest_name: str,
              ref: str = REFERENCES[1]) -> str:
    import gzip
    import shutil

    out.mkdir()
    for src, name in ((os.path.join(ROOT, ref, "data", data), rows),
                      (os.path.join(ROOT, manifest), manifest_name)):
        with gzip.open(src, "rb") as g, open(out / name, "wb") as f:
            shutil.copyfileobj(g, f)
    return str(out)


def _sums_of(ref) -> dict[str, str]:
    return dict(ln.split("  ", 1)[::-1] for ln in (ref / "SHA256SUMS").read_text().splitlines())


@pytest.mark.skipif(not _whole_history(), reason="a shallow clone: the H200 reference as "
                    "it was before its workloads stage is not in it")
def test_rebundle_adds_a_stage_measured_since_and_keeps_what_was_published(tmp_path):
    """The H200 reference as it was before (revision 9b02838) with --add workloads=... and
    the two shapes grids measured since (--add shapes-g2=... shapes-g3=...), then the
    workloads stage measured again twice (--replace workloads=...), gains their rows and tables
    (every table made again by the newer source) exactly as committed; every row it
    published stays byte for byte, the manifest keeps its runs and adds the new ones
    (resumed: their first calls' stacks too; the replaced run moved to replaced_runs), the
    config keeps its sections and adds the stage's and the grids."""
    import gzip
    import io
    import tarfile

    import yaml

    from tiledattention.stages import stage_from_dict
    from tiledattention.study.references import rebundle

    archived = subprocess.run(["git", "-C", ROOT, "archive", BEFORE_WORKLOADS, REFERENCES[1]],
                              capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archived)) as tar:
        tar.extractall(tmp_path, filter="data")
    ref = tmp_path / REFERENCES[1]
    before = _sums_of(ref)
    old_manifest = json.loads((ref / "manifest.json").read_text())
    old_config = yaml.safe_load((ref / "config" / "study-config.yaml").read_text())
    assert "workloads" not in old_config
    first_rows = _earlier_measured_workloads(tmp_path, "measured-first", REMEASURED,
                                             WORKLOADS_MANIFEST)
    assert rebundle.main(["--add", f"workloads={first_rows}",
                          *[a for g in (2, 3) for a in
                            ("--add", f"shapes-g{g}={_measured_shapes_grid(tmp_path, g)}")],
                          str(ref)]) == 0
    first = json.loads((ref / "manifest.json").read_text())["runs"][-3]
    second_rows = _earlier_measured_workloads(tmp_path, "measured-second", REMEASURED_AGAIN,
                                              WORKLOADS_AGAIN_MANIFEST)
    assert rebundle.main(["--replace", f"workloads={second_rows}", str(ref)]) == 0
    second = json.loads((ref / "manifest.json").read_text())["runs"][-1]
    assert rebundle.main(["--replace", f"workloads={_measured_workloads(tmp_path)}",
                          str(ref)]) == 0
    after = _sums_of(ref)
    kept = {rel for rel in before if rel.startswith(rebundle.KEPT)
            and not rel.startswith(rebundle.GROWN)}
    assert {"data/rows.jsonl.gz", "data/variants-rows.jsonl.gz"} <= kept
    assert {rel: after.get(rel) for rel in kept} == {rel: before[rel] for rel in kept}
    published = _sums_of_committed()  # the stage's rows and every table, as committed
    new = {rel for rel in after
           if rel.startswith(("data/workloads", "data/shapes-g2", "data/shapes-g3", "tables/"))}
    assert {"tables/workloads_decode.md", "tables/fp8.md", "data/shapes-g3-rows.jsonl.gz"} <= new
    assert {rel: after[rel] for rel in new} == {rel: published[rel] for rel in new}
    assert after["manifest.json"] == published["manifest.json"]
    manifest = json.loads((ref / "manifest.json").read_text())
    assert manifest["runs"][:-3] == old_manifest["runs"]
    assert manifest["replaced_runs"] == [first, second]
    for run, path in zip(manifest["runs"][-3:], [*SHAPES_MANIFESTS.values(),
                                                 WORKLOADS_THIRD_MANIFEST]):
        with gzip.open(os.path.join(ROOT, path)) as f:
            measured = json.load(f)
        assert run["config_hash"] == measured["config_hash"]
        assert len(run["resumed"]) == len(measured["earlier_runs"]) >= 1
    assert BEFORE_WORKLOADS in manifest["mismatches"]["git_commit"]
    config = yaml.safe_load((ref / "config" / "study-config.yaml").read_text())
    assert {k: v for k, v in config.items() if k != "workloads"} == {
        **old_config, "shapes": {**old_config["shapes"], "grids": config["shapes"]["grids"]}}
    assert config["shapes"]["grids"][:2] == old_config["shapes"]["grids"]
    assert len(config["shapes"]["grids"]) == 4
    assert stage_from_dict("workloads", config["workloads"]).digest() == \
        manifest["runs"][-1]["config_hash"] == first["config_hash"]
    assert verify.verify(str(ref)) == []


@pytest.mark.skipif(not _whole_history(), reason="a shallow clone: the recorded revision's "
                    "source is not in it")
def test_rebundle_replaces_a_stage_measured_again_and_keeps_every_other_row(tmp_path):
    """--replace workloads=DIR: the stage's rows are DIR's, its run moves to replaced_runs
    and DIR's run is recorded; every other row and every table of another stage stays byte
    for byte (here DIR holds the rows the reference has, so its tables stay too)."""
    from tiledattention.study.references import rebundle

    ref = _copy(tmp_path, REFERENCES[1])
    before = _sums_of(ref)
    old = json.loads((ref / "manifest.json").read_text())
    assert rebundle.main(["--replace", f"workloads={_measured_workloads(tmp_path)}",
                          str(ref)]) == 0
    after = _sums_of(ref)
    same = {rel for rel in before if rel.startswith(("data/", "tables/", "config/"))}
    assert "data/workloads-rows.jsonl.gz" in same
    assert {rel: after.get(rel) for rel in same} == {rel: before[rel] for rel in same}
    manifest = json.loads((ref / "manifest.json").read_text())
    workloads = [r for r in old["runs"] if r["manifest"].startswith("workloads/")]
    assert manifest["replaced_runs"] == [*old.get("replaced_runs", []), *workloads]
    assert manifest["runs"] == [r for r in old["runs"] if r not in workloads] + workloads
    assert verify.verify(str(ref)) == []


def _sums_of_committed() -> dict[str, str]:
    from pathlib import Path

    return _sums_of(Path(ROOT, REFERENCES[1]))


def _copy(tmp_path, ref: str):
    import shutil

    copy = tmp_path / os.path.basename(ref)
    shutil.copytree(os.path.join(ROOT, ref), copy)
    return copy


# The H100 reference as committed before it gained the workloads stage (varlen-paged.md
# §55a): a reference without the stage, for the refusals that need one.
H100_BEFORE_WORKLOADS = "540a5c849e0078cf4bb7c58d81e9cb245ff3c9c3"
H100_WORKLOADS_MANIFEST = "benchmarks/results/h100-2026-12-05-s71-workloads-manifest.json.gz"
H100_FIRST_ROWS = "d5fadbd2970efd05c72a637cc8abec6abaeca75d"  # h100 with the first rows, the last
# Ours measured again at 86cf9c7 (2026-12-05, resumed from the first run's other rows;
# varlen-paged.md §57a): its rows are the reference's, its run manifest this.
H100_AGAIN_MANIFEST = "benchmarks/results/h100-2026-12-05-s73-workloads-manifest.json.gz"
needs_history = pytest.mark.skipif(not _whole_history(), reason="a shallow clone: the H100 "
                                   "reference as it was before its workloads stage is not in it")


def _h100_before_workloads(tmp_path):
    import io
    import tarfile

    archived = subprocess.run(["git", "-C", ROOT, "archive", H100_BEFORE_WORKLOADS,
                               REFERENCES[0]], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archived)) as tar:
        tar.extractall(tmp_path / "before", filter="data")
    return tmp_path / "before" / REFERENCES[0]


@needs_history
def test_rebundle_adds_the_h100_workloads_stage_exactly_as_committed(tmp_path):
    """The H100 reference as it was before, with --add workloads=DIR (the first run's rows
    and manifest as measured) and then --replace workloads=DIR (ours measured again), is
    the committed one: the rows it published stay byte for byte; every file comes out as
    committed, the README and the metadata too (they name the repository the reference
    records, none, not the checkout's git remote); the workflow snapshot's entries too
    (the zip's file times are the clone's); the first run moves to replaced_runs."""
    from pathlib import Path

    from tiledattention.study.references import rebundle

    ref = _h100_before_workloads(tmp_path)
    before = _sums_of(ref)
    first = _earlier_measured_workloads(tmp_path, "measured-first", H100_FIRST_ROWS,
                                        H100_WORKLOADS_MANIFEST, REFERENCES[0])
    assert rebundle.main(["--add", f"workloads={first}", str(ref)]) == 0
    first_run = json.loads((ref / "manifest.json").read_text())["runs"][-1]
    again = _measured(tmp_path / "measured-again", "workloads-rows.jsonl.gz", "rows.jsonl",
                      H100_AGAIN_MANIFEST, "manifest-workloads.json", REFERENCES[0])
    assert rebundle.main(["--replace", f"workloads={again}", str(ref)]) == 0
    after, published = _sums_of(ref), _sums_of(Path(ROOT, REFERENCES[0]))
    snapshot = "workflow-snapshot.zip"  # its entries carry the clone's file times
    assert {k: v for k, v in after.items() if k != snapshot} == {
        k: v for k, v in published.items() if k != snapshot}
    assert "data/workloads-rows.jsonl.gz" in after and set(after) == set(published)
    assert _zip_entries(ref / snapshot) == _zip_entries(Path(ROOT, REFERENCES[0], snapshot))
    kept = {rel for rel in before if rel.startswith("data/")}
    assert {rel: after[rel] for rel in kept} == {rel: before[rel] for rel in kept}
    manifest = json.loads((ref / "manifest.json").read_text())
    assert manifest["replaced_runs"] == [first_run]
    assert manifest["mismatches"]["cuda_tile"] == ["1.7.0", None]  # call 1 lacked cuTile
    assert verify.verify(str(ref)) == []


def _zip_entries(path) -> dict[str, int]:
    import zipfile

    with zipfile.ZipFile(path) as z:
        return {i.filename: i.CRC for i in z.infolist()}


@pytest.mark.parametrize("ref,says", [
    (REFERENCES[0], "measured on NVIDIA H200, the study on NVIDIA H100"),
    (REFERENCES[1], "holds the workloads stage's rows already"),
])
def test_rebundle_adds_no_stage_of_another_gpu_model_nor_one_it_holds(tmp_path, capsys, ref,
                                                                        says):
    copy = _copy(tmp_path, ref)
    verb = "--replace" if ref == REFERENCES[0] else "--add"  # the H100 holds it: replaced
    assert says in _rebundle_refused([verb, f"workloads={_measured_workloads(tmp_path)}"],
                                     copy, capsys)


@pytest.mark.parametrize("verb", ["--add", "--replace"])
def test_rebundle_takes_no_stage_measured_with_another_section(tmp_path, capsys, verb):
    if verb == "--add" and not _whole_history():
        pytest.skip("a shallow clone: the H100 reference before its workloads stage is "
                    "not in it")
    out = tmp_path / "workloads"  # run here, one decode point: not the reference's section
    assert main(["workloads", "--config", os.path.join(ROOT, "config", "reference.yaml"),
                 "--out", str(out), "--kinds", "decode", "--decode-batches", "1",
                 "--page-sizes", "16", "--launcher", "debug"]) == 0
    capsys.readouterr()
    ref = _h100_before_workloads(tmp_path) if verb == "--add" else _copy(tmp_path,
                                                                         REFERENCES[0])
    err = _rebundle_refused([verb, f"workloads={out}"], ref, capsys)
    assert err.startswith(f"rebundle: {verb} workloads:") and "another config" in err


def test_rebundle_adds_no_shapes_grid_measured_with_another_grid(tmp_path, capsys):
    import yaml

    out, config = tmp_path / "sweep", tmp_path / "small.yaml"  # a sweep of another grid
    config.write_text(yaml.safe_dump({
        "grid": {"seqs": [64], "head_dims": [64], "dtypes": ["float32"], "causal": [False],
                 "shape_policy": "explicit", "batch": 1, "heads": 1},
        "methods": ["torch_sdpa"], "timing": {"warmup": 0, "reps": 1, "rounds": 1}}))
    assert main(["bench", "--config", str(config), "--out", str(out)]) == 0
    capsys.readouterr()
    err = _rebundle_refused(["--add", f"shapes-g2={out}"], _copy(tmp_path, REFERENCES[0]),
                            capsys)
    assert err.startswith("rebundle: --add shapes-g2:") and "another config" in err


@pytest.mark.parametrize("args,says", [
    (["--add", "workloads"], "give STAGE=DIR"),
    (["--add", "nosuch=x"], "has no nosuch section to record"),
    (["--add", "tune=x"], "not a GPU stage with rows of its own"),
    (["--add", "workloads=x", "--config", "no/such.yaml"], "no/such.yaml: cannot read it"),
    (["--replace", "workloads=no/such/dir"], "not the stage's output directory"),
    (["--add", "shapes-g3=x"], "the next one it can gain is shapes-g2"),
    (["--add", "shapes-g9=x"], "has no shapes grid 9"),
    (["--add", "shapes-g2=no/such/dir"], "not a shapes grid's sweep directory"),
    (["--replace", "shapes-g1=x"], "a shapes grid is not replaced"),
    (["--replace", "workloads"], "give STAGE=DIR"),
    (["--add", "workloads=x", "--replace", "workloads=y"], "both name workloads"),
])
def test_rebundle_refuses_an_add_it_cannot_read(tmp_path, capsys, args, says):
    assert says in _rebundle_refused(args, _copy(tmp_path, REFERENCES[0]), capsys)


@needs_history
@pytest.mark.parametrize("args,says", [
    (["--add", "workloads=no/such/dir"], "not the stage's output directory"),
    (["--replace", "workloads=x"], "holds no workloads stage's rows"),
])
def test_rebundle_refuses_a_stage_a_reference_without_it_cannot_take(tmp_path, capsys, args,
                                                                      says):
    assert says in _rebundle_refused(args, _h100_before_workloads(tmp_path), capsys)


def _rebundle_refused(args, ref, capsys) -> str:
    from tiledattention.study.references import rebundle

    sums = (ref / "SHA256SUMS").read_text()
    assert rebundle.main([*args, str(ref)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (ref / "SHA256SUMS").read_text() == sums
    return err[0]
