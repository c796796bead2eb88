"""The reference commands (study/references: compare, reproduce, scaling, systems) under
bad input: what they read is checked before it is trusted, they write nowhere unasked,
and a refusal is one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from study_kit import (
    _make,
    _pair,
    _resum,
    _row,
    _rows_file,
    _study_with_rows,
    cli,
    one_line,
    within,
)


def _compare(tmp_path: Path, new_rows, ref_rows, *extra: str, raw_ref: str | None = None):
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
    new = _rows_file(tmp_path / "new.jsonl", [r for i in range(12)
                                              for r in _pair(f"p{i}", ours=3.0)])
    ref = _rows_file(tmp_path / "ref.jsonl", [r for i in range(12) for r in _pair(f"p{i}")])
    code, err = cli("compare", new, ref, "--out", str(tmp_path / "c"))
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 11, err
    assert lines[-1].startswith("compare: … and 14 more failed checks (all in ")


def test_compare_never_writes_into_or_beside_a_bundle_unasked(tmp_path):
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


def _with_snapshot(src: Path, dest: Path, data: bytes) -> Path:
    import shutil

    shutil.copytree(src, dest)
    (dest / "workflow-snapshot.zip").write_bytes(data)
    _resum(dest, "workflow-snapshot.zip")
    return dest


def test_reproduce_validates_its_arguments_before_anything_runs(tmp_path):
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
    src = _make(_gpu_study(tmp_path), tmp_path / "b", compact=True)
    out = tmp_path / "re"
    err = one_line(cli("reproduce", str(src), "--out", str(out)))
    assert "ran on NVIDIA H100 80GB HBM3 and this machine has no CUDA GPU" in err
    assert "--without-gpu" in err and not out.exists()
    # a dry run (nothing measured) and --without-gpu pass the check
    for extra in ("--snakemake-args=-n", "--without-gpu"):
        code, err = cli("reproduce", str(src), "--out", str(tmp_path / extra), extra)
        assert "no CUDA GPU" not in err


def test_reproduce_refuses_a_snapshot_that_is_not_a_zip_or_too_big_to_unpack(tmp_path):
    import io
    import zipfile

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


def test_reproduce_refuses_a_results_dir_in_the_home_directory_or_a_variable():
    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.references.reproduce import _results_dir

    for d in ("~/x", "~other/x", "$HOME/x", "/abs", "a/../../b"):
        with pytest.raises(StudyError, match="outside the workflow directory"):
            _results_dir({"results_dir": d})
    assert _results_dir({"results_dir": "results/smoke"}) == "results/smoke"


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
    study = tmp_path / "study"
    _run_records(study, start, end, job)
    err = one_line(cli("scaling", str(study), "--out", str(tmp_path / "o")))
    assert words in err and not (tmp_path / "o").exists()


def test_scaling_publishes_a_good_record(tmp_path):
    _run_records(tmp_path / "study")
    assert cli("scaling", str(tmp_path / "study"), "--out", str(tmp_path / "o"))[0] == 0
    assert "| local | 1 |" in (tmp_path / "o" / "scaling.md").read_text()


def test_scaling_refuses_a_run_record_nested_too_deeply_in_one_line(tmp_path):
    # json.loads of a 100k-deep line raised RecursionError through tiledattn scaling.
    study = tmp_path / "study"
    _run_records(study)
    with open(study / "logs" / "runs.jsonl", "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    code, err = cli("scaling", str(study), "--out", str(tmp_path / "o"))
    assert one_line((code, err)).strip() == (
        f"tiledattn scaling: line 3 of {study}/logs/runs.jsonl is not a run record (JSON "
        "nested too deeply)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("change,words", [
    ({"time_ms": {"median_ms": 0}}, "is not a finite positive number"),
    ({"time_ms": {"median_ms": float("inf")}}, "is not a finite positive number"),
    ({"time_ms": {"median_ms": "1.0"}}, "is not a finite positive number"),
    ({"seq_q": None}, "seq_q is missing, not an int"),
    ({"dtype": 16}, "dtype is 16, not a str"),
])
def test_systems_refuses_malformed_rows_in_one_line(tmp_path, change, words):
    a = _rows_file(tmp_path / "a.jsonl", _pair("p0"))
    b = _rows_file(tmp_path / "b.jsonl", [{**_pair("p0")[0], **change}, _pair("p0")[1]])
    assert words in one_line(cli("systems", a, b, "--out", str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("ours,theirs", [(1e308, 1e308), (1e-300, 2.0), (1.0, 1e300)])
def test_systems_refuses_a_time_no_kernel_takes_in_one_line(tmp_path, ours, theirs):
    # Finite but non-physical times overflowed the geomean (a traceback, issue 51).
    a = _rows_file(tmp_path / "a.jsonl", _pair("p0"))
    b = _rows_file(tmp_path / "b.jsonl", _pair("p0", ours, theirs))
    err = one_line(cli("systems", a, b, "--out", str(tmp_path / "o")))
    assert f"{b}: row " in err and "is not a kernel time (0.0001 ms to a day)" in err
    assert not (tmp_path / "o").exists()


def test_systems_keeps_a_ratio_far_below_one_positive(tmp_path):
    # round(1e-06, 3) is 0.0, whose logarithm the geomean cannot take.
    a = _rows_file(tmp_path / "a.jsonl", _pair("p0", 1000.0, 0.001))
    b = _rows_file(tmp_path / "b.jsonl", _pair("p0", 0.001, 1000.0))
    code, err = cli("systems", a, b, "--names", "slow", "fast", "--out", str(tmp_path / "o"))
    assert code == 0, err
    rows = (tmp_path / "o" / "systems.csv").read_text().splitlines()
    # (no clock in these rows: each system's % peak @ clock cell is empty)
    assert rows[1].split(",")[2:] == ["1000.0", "", "1e-06", "0.001", "", "1000000.0", "1e-06"]
