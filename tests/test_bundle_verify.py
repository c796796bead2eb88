"""bundle verify on an untrusted bundle: it reads nothing outside it, unpacks no zip bomb,
follows no link, leaves no scratch directory, and finds a bundle that disagrees with
itself (rows of two configs, emptied or halved rows, rows.csv edited, sums rewritten)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from study_kit import (
    ROOT,
    _create,
    _gz,
    _make,
    _resum,
    _row,
    _study_with_rows,
    _tiny_study,
)


def _sums(path: Path, entries: dict[str, bytes]) -> None:
    (path / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in entries.items()))


@pytest.mark.parametrize("listed", ["/etc/passwd", "../outside", "/dev/zero", "a/../../x"])
def test_verify_never_reads_a_path_outside_the_bundle(tmp_path, listed):
    from tiledattention.study.publication import verify

    b = tmp_path / "b"
    b.mkdir()
    (tmp_path / "outside").write_text("secret")
    _sums(b, {listed: b"whatever"})
    problems = verify.verify(str(b))
    assert any("is not a path inside the bundle" in p for p in problems), problems


def test_verify_refuses_links_and_special_files_in_a_directory(tmp_path):
    from tiledattention.study.publication import verify

    b = tmp_path / "b"
    b.mkdir()
    os.symlink("/etc/passwd", b / "passwd")
    os.mkfifo(b / "fifo")
    _sums(b, {})
    problems = verify.verify(str(b))
    assert "link: passwd (links are not allowed in a bundle)" in problems
    assert "special file: fifo (only regular files allowed)" in problems


def test_verify_refuses_zip_bombs_links_and_unsafe_names_without_extracting(tmp_path,
                                                                            monkeypatch):
    from tiledattention.study.publication import archive, verify

    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("b/big", b"\0" * (8 << 20))  # 8 MiB of zeros: ratio ~1000
        link = zipfile.ZipInfo("b/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/passwd")
        z.writestr("b/../../evil", b"x")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    problems = verify.verify(str(bomb))
    assert any("compression ratio of b/big" in p for p in problems), problems
    assert any(p.startswith("link: b/link") for p in problems)
    assert any("unsafe zip member name: 'b/../../evil'" in p for p in problems)
    assert not (tmp_path / "evil").exists() and os.listdir(tmp_path / "tmp") == []
    monkeypatch.setattr(archive, "MAX_TOTAL_BYTES", 1 << 20)
    assert f"bytes uncompressed, more than the {1 << 20} allowed" in verify.verify(str(bomb))[0]
    monkeypatch.setattr(archive, "MAX_MEMBERS", 2)
    assert "zip members, more than the 2 allowed" in verify.verify(str(bomb))[0]


def test_verify_removes_its_scratch_dir_when_terminated(tmp_path):
    study = _tiny_study(tmp_path)
    zip_path = _create(study, tmp_path / "bundle")["zip"]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # SIGTERM arrives while verify holds its scratch dir (in the metadata check).
    code = ("import os, signal, sys, time\n"
            "from tiledattention.study.publication import verify\n"
            "def stall(path):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n"
            "verify.check_ro_crate = stall\n"
            f"verify.verify({zip_path!r})\n")
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         timeout=120)
    assert run.returncode in (143, -signal.SIGTERM)
    assert os.listdir(scratch) == [], "the scratch dir outlived the process"


def test_bundle_verify_flags_published_rows_of_two_configs(tmp_path):
    from tiledattention.study.publication import verify

    out = Path(_create(_tiny_study(tmp_path), tmp_path / "bundle")["dir"])
    data = out / "data" / "rows.jsonl"
    data.write_text(data.read_text() + json.dumps({"point_key": "q", "method": "eager",
                                                   "config_hash": "other"}) + "\n")
    lines = [ln for ln in (out / "SHA256SUMS").read_text().splitlines()
             if not ln.endswith("data/rows.jsonl")]
    lines.append(f"{hashlib.sha256(data.read_bytes()).hexdigest()}  data/rows.jsonl")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    assert any("2 different configs" in p for p in verify.verify(str(out)))


def test_bundle_verify_finds_a_bundle_that_disagrees_with_itself(tmp_path):
    from tiledattention.study.publication import manifest, verify

    study = _tiny_study(tmp_path)
    run = {"config_hash": "c", "measure_hash": "h", "started": "2026-01-01T00:00:00+00:00"}
    (study / "manifest.json").write_text(json.dumps(manifest.merge(
        {"a": run}, config={"results_dir": "x"})))
    agg = study / "aggregate"
    rows = [_row("p0"), _row("p1")]
    (agg / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from tiledattention.study.presentation.frame import write_rows_table

    write_rows_table(rows, str(agg))  # rows.csv as aggregate writes it
    src = Path(_create(study, tmp_path / "good")["dir"])
    assert verify.verify(str(src)) == []

    def broken(name: str, change) -> list[str]:
        out = tmp_path / name
        subprocess.run(["cp", "-r", str(src), str(out)], check=True)
        change(out)
        return verify.verify(str(out))

    def resum(out: Path, rel: str) -> None:
        digest = hashlib.sha256((out / rel).read_bytes()).hexdigest()
        lines = [f"{digest}  {rel}" if ln.endswith(f"  {rel}") else ln
                 for ln in (out / "SHA256SUMS").read_text().splitlines()]
        (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")

    def edit(rel: str, text: str):
        def change(out: Path):
            (out / rel).write_text(text)
            resum(out, rel)
        return change

    def duplicate(out: Path):
        sums = (out / "SHA256SUMS").read_text().splitlines()
        (out / "SHA256SUMS").write_text("\n".join(sums + sums[:1]) + "\n")

    def delete(out: Path):
        sums = (out / "SHA256SUMS").read_text().splitlines()
        (out / "SHA256SUMS").write_text("\n".join(s for s in sums if "README.md" not in s)
                                        + "\n")
        (out / "README.md").unlink()

    one_row = json.dumps(rows[0]) + "\n"
    other = json.dumps({**rows[0], "config_hash": "x"}) + "\n" + json.dumps(
        {**rows[1], "config_hash": "x"}) + "\n"
    for name, change, finding in (
            ("dup", duplicate, "is listed twice"),
            ("del", delete, "deleted from SHA256SUMS: README.md"),
            ("cut", edit("data/rows.jsonl", one_row), "rows.csv has 2 rows, rows.jsonl 1"),
            ("torn", edit("data/rows.jsonl", one_row + '{"point'), "cut short"),
            ("cfg", edit("config/study-config.yaml", "results_dir: y\n"),
             "study_config_hash"),
            ("hash", edit("data/rows.jsonl", other), "no run in manifest.json measured"),
            ("nan", edit("data/rows.jsonl", one_row + json.dumps(
                {**rows[1], "tflops": float("nan")}) + "\n"), "tflops is nan")):
        problems = broken(name, change)
        assert any(finding in p for p in problems), (name, problems)


def test_a_compact_bundle_with_emptied_or_halved_rows_fails_verify(tmp_path):
    import gzip
    import shutil

    from tiledattention.study.publication import verify

    src = _make(_study_with_rows(tmp_path), tmp_path / "good", compact=True)
    assert verify.verify(str(src)) == []
    lines = gzip.decompress((src / "data" / "rows.jsonl.gz").read_bytes()).splitlines(True)
    assert len(lines) == 8 and "= 8 rows" in (src / "README.md").read_text()
    cases = {"empty-file": (b"", "no rows"), "gzip-of-nothing": (_gz(b""), "no rows"),
             "half": (_gz(b"".join(lines[:4])), "README.md and data/rows.jsonl.gz disagree")}
    for name, (data, finding) in cases.items():
        out = tmp_path / name
        shutil.copytree(src, out)
        (out / "data" / "rows.jsonl.gz").write_bytes(data)
        _resum(out, "data/rows.jsonl.gz")
        problems = verify.verify(str(out))
        assert any(finding in p for p in problems), (name, problems)
    # half the rows, and the README's count edited to match: the bundle's own list says 8
    out = tmp_path / "half-readme"
    shutil.copytree(src, out)
    (out / "data" / "rows.jsonl.gz").write_bytes(cases["half"][0])
    readme = (out / "README.md").read_text()
    (out / "README.md").write_text(readme.replace("8 benchmark points", "4 benchmark points")
                                   .replace("= 8 rows", "= 4 rows").replace("ok 8", "ok 4"))
    for rel in ("data/rows.jsonl.gz", "README.md"):
        _resum(out, rel)
    assert any("the bundle was made with 8" in p for p in verify.verify(str(out)))
    # a plain rows.jsonl beside the .gz (listed in SHA256SUMS): refused, not the only one read
    out = tmp_path / "beside"
    shutil.copytree(src, out)
    (out / "data" / "rows.jsonl").write_bytes(b"".join(lines))
    _resum(out, "data/rows.jsonl")
    assert any("beside data/rows.jsonl.gz" in p for p in verify.verify(str(out)))


def test_rows_csv_must_agree_with_the_rows_value_for_value(tmp_path):
    import shutil

    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.publication import verify

    study = _study_with_rows(tmp_path)
    src = _make(study, tmp_path / "good", compact=False)
    assert verify.verify(str(src)) == []
    out = tmp_path / "edited"
    shutil.copytree(src, out)
    text = (out / "data" / "rows.csv").read_text()
    assert ",8.0," in text
    (out / "data" / "rows.csv").write_text(text.replace(",8.0,", ",80.0,"))
    _resum(out, "data/rows.csv")
    problems = verify.verify(str(out))
    assert any("rows.csv row 8 (p7, eager): tflops is '80.0' there, 8.0 in rows.jsonl" in p
               for p in problems), problems
    # the same disagreement in the study: bundle create refuses it
    (study / "aggregate" / "rows.csv").write_text(text.replace(",8.0,", ",80.0,"))
    with pytest.raises(StudyError, match="tflops is '80.0' there"):
        _make(study, tmp_path / "b2", compact=False)
