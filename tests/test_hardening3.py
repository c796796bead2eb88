"""The third hardening round (issue 38): nothing of the user's is lost and nothing wrong is
published, whatever the environment says: --force and the marker file, the device script's
OUT, compact bundles' rows, compare/reproduce inputs, scaling and config inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hardening import ROOT, _tiny_study, tiny_config
from test_hardening2 import one_line


def _run_cli(*argv: str, env: dict | None = None, cwd: Path | None = None,
             timeout: int = 120) -> subprocess.CompletedProcess:
    """The real ``tiledattn`` in a child process (the environment is the child's own)."""
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tiledattention.cli", *argv],
                          env={**base, **(env or {})}, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


# -- bundle create --force: the marker decides, never $HOME --------------------------------

def test_bundle_create_force_never_removes_a_directory_without_its_marker_whatever_home_says(
        tmp_path):
    study = _tiny_study(tmp_path)
    home = tmp_path / "realhome"  # a user's directory; HOME names somewhere else
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    (home / "thesis.tex").write_text("years of work")
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    proc = _run_cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(home), "--force",
                    env={"HOME": str(tmp_path / "elsewhere")})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "not a bundle tiledattn made" in proc.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    assert not (tmp_path / "realhome.zip").exists()
    # a marker that is not ours (a list, another format) does not make it ours either
    (home / ".tiledattention-bundle").write_text("[]")
    proc = _run_cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(home), "--force")
    assert proc.returncode == 2 and (home / "thesis.tex").exists()


def test_bundle_create_force_never_replaces_a_zip_it_did_not_make(tmp_path):
    study = _tiny_study(tmp_path)
    (tmp_path / "b.zip").write_bytes(b"my archive")
    err = one_line(_cli_inproc("bundle", "create", "--study", str(study), "--config",
                               str(tiny_config(tmp_path)), "--out", str(tmp_path / "b"),
                               "--force"))
    assert "not a bundle zip of tiledattn's" in err
    assert (tmp_path / "b.zip").read_bytes() == b"my archive"
    assert not (tmp_path / "b").exists()


def _cli_inproc(*argv):
    from test_hardening import cli

    return cli(*argv)


# -- scripts/device-study.sh: OUT and GPUS --------------------------------------------------

def _device_study(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """The script up to its packing, on the CPU: no kit, a stand-in ``snakemake`` on PATH
    that finishes at once, RESULTS naming a prepared results directory."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "snakemake").write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 9.0\nexit 0\n")
    (stub / "snakemake").chmod(0o755)
    base = {"PATH": f"{stub}:/usr/bin:/bin", "KIT": str(tmp_path / "no-kit"),
            "SITE": str(tmp_path / "site"), "RESULTS": str(tmp_path / "results" / "smoke"),
            "PRECOMPILE": "0", "TILEDATTENTION_SOURCE_REVISION": "x"}
    return subprocess.run(["bash", "scripts/device-study.sh", "config/smoke.yaml", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**base, **env})


def test_device_study_never_splits_or_deletes_a_file_in_out_it_did_not_make(tmp_path):
    results = tmp_path / "results" / "smoke"
    results.mkdir(parents=True)
    (results / "rows.bin").write_bytes(os.urandom(17 << 20))  # a packed study over 16 MiB
    out = tmp_path / "out"
    out.mkdir()
    mine = os.urandom(17 << 20)
    (out / "dataset.bin").write_bytes(mine)
    run = _device_study(tmp_path, OUT=str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "dataset.bin").read_bytes() == mine
    assert sorted(p.name for p in out.iterdir() if p.name != "dataset.bin") != []
    (sub,) = [p for p in out.iterdir() if p.is_dir()]
    assert sub.name.startswith("device-study-") and f"writing into {sub}" in run.stderr
    parts = sorted(sub.glob("smoke-results.tar.gz.part*"))
    assert len(parts) == 2 and not (sub / "smoke-results.tar.gz").exists()
    # a second run into its own (marked) directory packs there again, splitting only its own
    run = _device_study(tmp_path, OUT=str(sub))
    assert run.returncode == 0 and len(list(sub.glob("smoke-results.tar.gz.part*"))) == 2
    assert not [p for p in sub.iterdir() if p.is_dir()]


@pytest.mark.parametrize("env,words", [({"OUT": "FILE"}, "exists and is not a directory"),
                                       ({"GPUS": "00"}, "GPUS must be a positive whole"),
                                       ({"GPUS": "0"}, "GPUS must be a positive whole"),
                                       ({"GPUS": "2x"}, "GPUS must be a positive whole")])
def test_device_study_refuses_out_naming_a_file_and_a_zero_gpu_count(tmp_path, env, words):
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    f = tmp_path / "file"
    f.write_text("mine")
    env = {k: str(f) if v == "FILE" else v for k, v in env.items()}
    run = _device_study(tmp_path, **{"OUT": str(tmp_path / "out"), **env})
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert words in run.stderr and f.read_text() == "mine"


# -- Compact and full bundles: the rows against what the bundle says of them ---------------

def _study_with_rows(tmp_path: Path, n: int = 8) -> Path:
    from test_hardening2 import _row

    from tiledattention.study.publication import manifest

    study = _tiny_study(tmp_path)
    run = {"config_hash": "c", "measure_hash": "h", "started": "2026-01-01T00:00:00+00:00"}
    (study / "manifest.json").write_text(json.dumps(manifest.merge(
        {"a": run}, config={"results_dir": "x"})))
    rows = [_row(f"p{i}", tflops=1.0 + i) for i in range(n)]
    (study / "aggregate" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                            for r in rows))
    from tiledattention.study.presentation.frame import write_rows_table

    write_rows_table(rows, str(study / "aggregate"))
    return study


def _make(study: Path, out: Path, compact: bool) -> Path:
    from tiledattention.study.publication import create
    from tiledattention.study.publication.metadata import Publication

    return Path(create.create(str(study), str(out), config={"results_dir": "x"},
                              config_name="c.yaml", repo_root=str(ROOT),
                              publication=Publication(), compact=compact)["dir"])


def _resum(out: Path, rel: str) -> None:
    """SHA256SUMS rewritten for ``rel`` (added when new): a tamperer's checksums."""
    import hashlib

    digest = hashlib.sha256((out / rel).read_bytes()).hexdigest()
    lines = [ln for ln in (out / "SHA256SUMS").read_text().splitlines()
             if not ln.endswith(f"  {rel}")]
    (out / "SHA256SUMS").write_text("\n".join(lines + [f"{digest}  {rel}"]) + "\n")


def _gz(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, mtime=0)


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


def test_a_killed_aggregate_leaves_no_rows_without_tables_and_create_needs_the_tables(
        tmp_path, monkeypatch):
    from test_hardening import cli
    from test_hardening2 import _row, _shard

    import tiledattention.study.presentation.tables as tables
    from tiledattention.study.presentation.frame import StudyError

    rows_dir = _shard(tmp_path / "rows", [_row(f"p{i}") for i in range(4)])
    agg = tmp_path / "study" / "aggregate"
    assert cli("aggregate", "--rows", str(rows_dir), "--out", str(agg))[0] == 0
    assert (agg / "rows.jsonl").exists() and (agg / "tables" / "status.md").exists()

    def killed(*a, **k):
        raise KeyboardInterrupt  # stopped while writing the tables

    monkeypatch.setattr(tables, "write_all", killed)
    assert cli("aggregate", "--rows", str(rows_dir), "--out", str(agg))[0] != 0
    assert not (agg / "rows.jsonl").exists()  # the earlier one is gone, no new one yet
    monkeypatch.undo()
    # --rows-only wrote rows.jsonl and rows.csv but no tables: not a study to publish
    study = _study_with_rows(tmp_path / "s2")
    import shutil

    shutil.rmtree(study / "aggregate" / "tables")
    from tiledattention.study.presentation.workloads_report import NAMES as WORKLOADS

    n = len(tables.NAMES) - len(WORKLOADS)  # a study without the workloads stage
    with pytest.raises(StudyError, match=f"lacks {n} of the study's {n} tables"):
        _make(study, tmp_path / "b", compact=True)


def test_bundle_create_refuses_a_study_file_whose_name_holds_a_newline(tmp_path):
    from tiledattention.study.presentation.frame import StudyError

    study = _study_with_rows(tmp_path)
    (study / "aggregate" / "tables" / "evil\nname.md").write_text("x")
    with pytest.raises(StudyError, match="control character"):
        _make(study, tmp_path / "b", compact=True)
    assert not (tmp_path / "b").exists()


# -- compare and reproduce: what they read, where they write ---------------------------------

def _rows_file(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _pair(key: str, ours: float = 1.0, theirs: float = 2.0) -> list[dict]:
    from test_hardening2 import _row

    return [_row(key, "tiledattention", time_ms={"median_ms": ours}),
            _row(key, "torch_sdpa", time_ms={"median_ms": theirs})]


def _compare(tmp_path: Path, new_rows, ref_rows, *extra: str, raw_ref: str | None = None):
    from test_hardening import cli

    new = _rows_file(tmp_path / "new.jsonl", new_rows)
    ref = tmp_path / "ref.jsonl"
    if raw_ref is not None:
        ref.write_text(raw_ref)
    else:
        _rows_file(ref, ref_rows)
    return cli("compare", new, str(ref), *extra)


@pytest.mark.parametrize("case,words", [
    ("nan", "kernel time nan is not a finite positive number"),
    ("inf", "kernel time inf is not a finite positive number"),
    ("string", "kernel time '2.0' is not a finite positive number"),
    ("bare", "time_ms must be an object of times"),
    ("list-key", "point_key and method must be strings"),
    ("conflict", "(p0, tiledattention) is given twice with different values"),
])
def test_compare_refuses_a_reference_it_cannot_trust_in_one_line(tmp_path, case, words):
    from test_hardening2 import _row

    good = _pair("p0")
    bad = {"nan": '{"median_ms": NaN}', "inf": '{"median_ms": Infinity}',
           "string": '{"median_ms": "2.0"}', "bare": "2.0"}
    if case in bad:
        line = json.dumps(_row("p0", "tiledattention")).replace(
            '"time_ms": {"median_ms": 2.0}', f'"time_ms": {bad[case]}')
        raw = line + "\n" + json.dumps(good[1]) + "\n"
    elif case == "list-key":
        raw = json.dumps({**good[0], "point_key": ["p0"]}) + "\n"
    else:
        raw = "".join(json.dumps(r) + "\n" for r in good + [{**good[0], "tflops": 9.0}])
    err = one_line(_compare(tmp_path, _pair("p0", ours=2.0), None, "--out",
                            str(tmp_path / "c"), raw_ref=raw))
    assert words in err


def test_compare_refuses_a_study_without_tiledattention_rows(tmp_path):
    err = one_line(_compare(tmp_path, _pair("p0")[1:], _pair("p0"), "--out",
                            str(tmp_path / "c")))
    assert "no TiledAttention rows at all" in err


def test_compare_tolerance_two_bare_numbers_and_a_measure_twice_are_refused(tmp_path):
    for tol in (["10", "25"], ["kernel=10", "kernel=20"], ["10", "call=25"]):
        err = one_line(_compare(tmp_path, _pair("p0"), _pair("p0"), "--tolerance", *tol,
                                "--out", str(tmp_path / "c")))
        assert "--tolerance" in err
    assert not (tmp_path / "c").exists()
    from tiledattention.study.references.compare import parse_tolerance

    assert parse_tolerance(["kernel=10", "call=25"]) == {"kernel": 0.10, "call": 0.25}


def test_compare_says_how_many_failed_checks_it_did_not_print(tmp_path):
    from test_hardening import cli

    new = _rows_file(tmp_path / "new.jsonl", [r for i in range(12)
                                              for r in _pair(f"p{i}", ours=3.0)])
    ref = _rows_file(tmp_path / "ref.jsonl", [r for i in range(12) for r in _pair(f"p{i}")])
    code, err = cli("compare", new, ref, "--out", str(tmp_path / "c"))
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 11, err
    assert lines[-1].startswith("compare: … and 14 more failed checks (all in ")


def test_compare_never_writes_into_or_beside_a_bundle_unasked(tmp_path):
    from test_hardening import cli

    src = _make(_study_with_rows(tmp_path), tmp_path / "refs" / "h100", compact=True)
    before = sorted(p.name for p in (tmp_path / "refs").iterdir())
    # a bundle outside a study (a committed reference): no default place to write
    err = one_line(cli("compare", str(src), "h100"))
    assert "name where the comparison goes with --out" in err
    for out in (src, src / "tables" / "c"):  # --out inside a bundle
        err = one_line(cli("compare", str(src), "h100", "--out", str(out)))
        assert "inside the bundle" in err
    assert sorted(p.name for p in (tmp_path / "refs").iterdir()) == before
    from tiledattention.study.publication import verify

    assert verify.verify(str(src)) == []


def test_compare_reads_no_fifo_and_no_malformed_manifest(tmp_path):
    from test_hardening import cli
    from test_hardening2 import within

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with within(20):
        assert "special file" in one_line(cli("compare", str(fifo), "h100", "--out",
                                              str(tmp_path / "c")))
        assert "special file" in one_line(cli("systems", str(fifo), str(fifo), "--out",
                                              str(tmp_path / "s")))
    study = tmp_path / "study"
    (study / "aggregate").mkdir(parents=True)
    _rows_file(study / "aggregate" / "rows.jsonl", _pair("p0"))
    for manifest, words in (([], "manifest.json is not a JSON object"),
                            ({"gpu": "H100"}, "manifest.json's gpu is not an object")):
        (study / "manifest.json").write_text(json.dumps(manifest))
        assert words in one_line(cli("compare", str(study), "h100", "--out",
                                     str(tmp_path / "c")))


def _gpu_study(tmp_path: Path) -> Path:
    from tiledattention.study.publication import manifest

    study = _study_with_rows(tmp_path)
    run = {"config_hash": "c", "measure_hash": "h", "started": "2026-01-01T00:00:00+00:00",
           "gpu": {"name": "NVIDIA H100 80GB HBM3"}}
    (study / "manifest.json").write_text(json.dumps(manifest.merge(
        {"a": run}, config={"results_dir": "x"})))
    return study


def test_reproduce_validates_its_arguments_before_anything_runs(tmp_path):
    from test_hardening import cli

    src = _make(_study_with_rows(tmp_path), tmp_path / "b", compact=True)
    out = tmp_path / "re"
    for args, words in ((["--tolerance", "abc"], "'abc' is not a number of percent"),
                        (["--reference", str(tmp_path / "nope")], "neither a bundle"),
                        (["--out", str(src / "inner")], "inside the bundle")):
        argv = ["reproduce", str(src), "--snakemake-args=-n", *args]
        if "--out" not in args:
            argv += ["--out", str(out)]
        assert words in one_line(cli(*argv))
    assert not out.exists() and not (src / "inner").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA GPU is visible")
def test_reproduce_of_a_gpu_bundle_without_a_gpu_is_refused_up_front(tmp_path):
    from test_hardening import cli

    src = _make(_gpu_study(tmp_path), tmp_path / "b", compact=True)
    out = tmp_path / "re"
    err = one_line(cli("reproduce", str(src), "--out", str(out)))
    assert "ran on NVIDIA H100 80GB HBM3 and this machine has no CUDA GPU" in err
    assert "--without-gpu" in err and not out.exists()
    # a dry run (nothing measured) and --without-gpu pass the check
    for extra in ("--snakemake-args=-n", "--without-gpu"):
        code, err = cli("reproduce", str(src), "--out", str(tmp_path / extra), extra)
        assert "no CUDA GPU" not in err


def _with_snapshot(src: Path, dest: Path, data: bytes) -> Path:
    import shutil

    shutil.copytree(src, dest)
    (dest / "workflow-snapshot.zip").write_bytes(data)
    _resum(dest, "workflow-snapshot.zip")
    return dest


def test_reproduce_refuses_a_snapshot_that_is_not_a_zip_or_too_big_to_unpack(tmp_path):
    import io
    import zipfile

    from test_hardening import cli

    src = _make(_study_with_rows(tmp_path), tmp_path / "b", compact=True)
    bad = _with_snapshot(src, tmp_path / "notzip", b"not a zip at all")
    assert "workflow-snapshot.zip: not a readable zip" in one_line(
        cli("reproduce", str(bad), "--out", str(tmp_path / "r1")))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("profiles/local/config.yaml", "cores: 1\n")
        z.writestr("Snakefile", b"\0" * (65 << 20))  # 65 MiB of zeros, 64 KiB packed
    big = _with_snapshot(src, tmp_path / "big", buf.getvalue())
    err = one_line(cli("reproduce", str(big), "--out", str(tmp_path / "r2")))
    assert "Snakefile holds 68157440 bytes, over the limit" in err
    assert not (tmp_path / "r2" / "Snakefile").exists()


def test_reproduce_refuses_a_manifest_of_the_wrong_shape(tmp_path):
    import shutil

    from test_hardening import cli

    src = _make(_study_with_rows(tmp_path), tmp_path / "b", compact=True)
    for n, (manifest, words) in enumerate((([], "verify refuses it first"),
                                           ({"stack": "x"}, "stack is not an object"),
                                           ({"container": [1]}, "container is not an object"),
                                           ({"gpu": 5}, "gpu is not an object"))):
        dest = tmp_path / f"m{n}"
        shutil.copytree(src, dest)
        (dest / "manifest.json").write_text(json.dumps(manifest))
        _resum(dest, "manifest.json")
        err = one_line(cli("reproduce", str(dest), "--out", str(tmp_path / f"r{n}")))
        assert words in err if n else "manifest.json: not a JSON object" in err


# -- scaling and systems: what they read ----------------------------------------------------

def _run_records(study: Path, start: dict | None = None, end: dict | None = None,
                 job: dict | None = None) -> None:
    from tiledattention.study import timeline

    (study / "logs").mkdir(parents=True, exist_ok=True)
    j = {"rule": "bench_shard", "gpu": True, "start": 1.0, "end": 5.0, **(job or {})}
    recs = [{"format": timeline.FORMAT, "event": "start", "run": "r", "time": 0.0,
             "gpus": 1, "launcher": "local", **(start or {})},
            {"format": timeline.FORMAT, "event": "end", "run": "r", "time": 6.0,
             "status": "ok", "jobs": [j], **(end or {})}]
    (study / timeline.NAME).write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.parametrize("start,end,job,words", [
    ({"gpus": -2}, None, None, "gpus -2 is not a positive whole number"),
    ({"gpus": 0}, None, None, "gpus 0 is not a positive whole number"),
    ({"gpus": "2"}, None, None, "gpus '2' is not a positive whole number"),
    ({"time": float("inf")}, None, None, "not finite times in order"),
    ({"time": "0"}, None, None, "not finite times in order"),
    (None, {"time": 10.0}, {"end": "5"}, "finite start and end times"),
    (None, None, {"start": 9.0}, "finite start and end times in order"),
    (None, None, {"rule": None}, "lacks a rule"),
    (None, {"jobs": {"a": 1}}, None, "jobs is not a list"),
    ({"run": ["r"]}, None, None, "malformed run records"),
])
def test_scaling_refuses_malformed_run_records_in_one_line(tmp_path, start, end, job, words):
    from test_hardening import cli

    study = tmp_path / "study"
    _run_records(study, start, end, job)
    err = one_line(cli("scaling", str(study), "--out", str(tmp_path / "o")))
    assert words in err and not (tmp_path / "o").exists()


def test_scaling_publishes_a_good_record(tmp_path):
    from test_hardening import cli

    _run_records(tmp_path / "study")
    assert cli("scaling", str(tmp_path / "study"), "--out", str(tmp_path / "o"))[0] == 0
    assert "| local | 1 |" in (tmp_path / "o" / "scaling.md").read_text()


@pytest.mark.parametrize("change,words", [
    ({"time_ms": {"median_ms": 0}}, "is not a finite positive number"),
    ({"time_ms": {"median_ms": float("inf")}}, "is not a finite positive number"),
    ({"time_ms": {"median_ms": "1.0"}}, "is not a finite positive number"),
    ({"seq_q": None}, "seq_q is missing, not an int"),
    ({"dtype": 16}, "dtype is 16, not a str"),
])
def test_systems_refuses_malformed_rows_in_one_line(tmp_path, change, words):
    from test_hardening import cli

    a = _rows_file(tmp_path / "a.jsonl", _pair("p0"))
    b = _rows_file(tmp_path / "b.jsonl", [{**_pair("p0")[0], **change}, _pair("p0")[1]])
    assert words in one_line(cli("systems", a, b, "--out", str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("ours,theirs", [(1e308, 1e308), (1e-300, 2.0), (1.0, 1e300)])
def test_systems_refuses_a_time_no_kernel_takes_in_one_line(tmp_path, ours, theirs):
    # Finite but non-physical times overflowed the geomean (a traceback, issue 51).
    from test_hardening import cli

    a = _rows_file(tmp_path / "a.jsonl", _pair("p0"))
    b = _rows_file(tmp_path / "b.jsonl", _pair("p0", ours, theirs))
    err = one_line(cli("systems", a, b, "--out", str(tmp_path / "o")))
    assert f"{b}: row " in err and "is not a kernel time (0.0001 ms to a day)" in err
    assert not (tmp_path / "o").exists()


def test_systems_keeps_a_ratio_far_below_one_positive(tmp_path):
    # round(1e-06, 3) is 0.0, whose logarithm the geomean cannot take.
    from test_hardening import cli

    a = _rows_file(tmp_path / "a.jsonl", _pair("p0", 1000.0, 0.001))
    b = _rows_file(tmp_path / "b.jsonl", _pair("p0", 0.001, 1000.0))
    code, err = cli("systems", a, b, "--names", "slow", "fast", "--out", str(tmp_path / "o"))
    assert code == 0, err
    rows = (tmp_path / "o" / "systems.csv").read_text().splitlines()
    assert rows[1].split(",")[2:] == ["1000.0", "1e-06", "0.001", "1000000.0", "1e-06"]


def test_scaling_refuses_a_run_record_nested_too_deeply_in_one_line(tmp_path):
    # json.loads of a 100k-deep line raised RecursionError through tiledattn scaling.
    from test_hardening import cli

    study = tmp_path / "study"
    _run_records(study)
    with open(study / "logs" / "runs.jsonl", "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    code, err = cli("scaling", str(study), "--out", str(tmp_path / "o"))
    assert one_line((code, err)).strip() == (
        f"tiledattn scaling: line 3 of {study}/logs/runs.jsonl is not a run record (JSON "
        "nested too deeply)")
    assert not (tmp_path / "o").exists()


# -- config: refusals in one line ---------------------------------------------------------

def _snakemake_n(tmp_path: Path, extra: str) -> subprocess.CompletedProcess:
    import shutil

    cfg = tmp_path / "extra.yaml"
    cfg.write_text(f"results_dir: {tmp_path / 'results'}\n{extra}")
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    return subprocess.run([snakemake, "-n", "--cores", "1", "--configfile", "config/smoke.yaml",
                           str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("extra,words", [
    ("benchh: {}\n", "config: unknown key(s) ['benchh']"),
    ("shapes: {enabled: true, grids: []}\n", "config: shapes: enabled with no grids"),
    ("bench: {grid: {seqs: [0]}}\n", "config: grid.seqs: 0 must be >= 1"),
])
def test_a_bad_study_config_ends_the_workflow_in_one_line_exit_2(tmp_path, extra, words):
    run = _snakemake_n(tmp_path, extra)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [ln for ln in run.stderr.strip().splitlines() if "config:" in ln or "Error" in ln]
    assert lines == [next(ln for ln in lines if words in ln)], run.stderr[-2000:]
    assert "WorkflowError" not in run.stderr and "File \"" not in run.stderr


def test_a_grid_of_a_million_points_is_refused_with_its_count_and_a_limit_to_raise(
        tmp_path, monkeypatch):
    from test_hardening import cli

    from tiledattention.bench.config import ConfigError, from_dict

    big = {"grid": {"seqs": list(range(1, 1001)), "head_dims": list(range(8, 1008)),
                    "dtypes": ["float16"], "causal": [False]}}
    with pytest.raises(ConfigError, match=r"up to 1000000 points .* TILEDATTN_MAX_POINTS="
                                          r"1000000 to run it anyway"):
        from_dict(big)
    cfg = tmp_path / "big.yaml"
    cfg.write_text(json.dumps({**big, "methods": ["eager"], "device": "cpu"}))
    assert "over the limit of 20000" in one_line(cli("bench", "--config", str(cfg), "--out",
                                                     str(tmp_path / "o")))
    monkeypatch.setenv("TILEDATTN_MAX_POINTS", "1000000")
    assert from_dict(big).grid.seqs[-1] == 1000  # raised: accepted


def test_publication_of_the_wrong_shape_is_one_line(tmp_path):
    from test_hardening import cli

    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.publication.metadata import Publication

    for bad, words in (("str", "publication: a mapping"),
                       ({"keywords": "attention"}, "publication.keywords: a list"),
                       ({"title": 5}, "publication.title: a string"),
                       ({"creators": "me"}, "publication.creators: a list")):
        with pytest.raises(StudyError, match=words):
            Publication.from_dict(bad, "0.1.0")
    study = _study_with_rows(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("results_dir: x\npublication: 'str'\n")
    assert "publication: a mapping" in one_line(cli(
        "bundle", "create", "--study", str(study), "--config", str(cfg), "--out",
        str(tmp_path / "b")))


def test_reproduce_refuses_a_results_dir_in_the_home_directory_or_a_variable():
    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.references.reproduce import _results_dir

    for d in ("~/x", "~other/x", "$HOME/x", "/abs", "a/../../b"):
        with pytest.raises(StudyError, match="outside the workflow directory"):
            _results_dir({"results_dir": d})
    assert _results_dir({"results_dir": "results/smoke"}) == "results/smoke"


def test_device_study_never_removes_a_site_directory_it_did_not_install(tmp_path):
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "x-1.0-py3-none-any.whl").write_bytes(b"not really")
    site = tmp_path / "mysite"
    site.mkdir()
    (site / "mine.py").write_text("years of work")
    run = _device_study(tmp_path, OUT=str(tmp_path / "out"), KIT=str(kit), SITE=str(site))
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "holds files this script did not install" in run.stderr
    assert (site / "mine.py").read_text() == "years of work"
