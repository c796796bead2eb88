"""tiledattn compare: a study against a reference's (value, lower, upper) tuples, per point,
method and measure, and TiledAttention's speed ratios; exit 1 on a regression, 2 on bad
input; a table and a figure."""

from __future__ import annotations

import json

import pytest

from tiledattention.cli import main
from tiledattention.study import compare

H100_RUN = "benchmarks/results/h100-2026-11-23-bench80-one-run.jsonl.gz"
H100_RERUN = "benchmarks/results/h100-2026-11-23-bench80-w8-table.jsonl.gz"


def _row(point, method, kernel_ms, call_us, status="ok"):
    return {"point_key": point, "method": method, "status": status,
            "time_ms": {"median_ms": kernel_ms}, "call_us": call_us, "reason": "why"}


def _write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def reference(tmp_path):
    return _write(tmp_path, "ref.jsonl", [_row("p1", "tiledattention", 1.0, 100.0),
                                          _row("p1", "torch_sdpa", 1.0, 100.0)])


def test_compare_passes_within_tolerance_and_writes_table_and_figure(tmp_path, reference):
    new = _write(tmp_path, "new.jsonl", [_row("p1", "tiledattention", 1.05, 110.0),
                                         _row("p1", "torch_sdpa", 1.0, 100.0)])
    out = tmp_path / "cmp"
    assert main(["compare", new, reference, "--out", str(out)]) == 0
    for name in ("compare.md", "compare.csv", "compare.png", "compare.pdf"):
        assert (out / name).stat().st_size > 0
    csv = (out / "compare.csv").read_text()
    assert "p1,tiledattention,time,kernel,1.05,1.0,5.0,-10.0,10.0,pass" in csv
    assert "tiledattention ÷ torch_sdpa,ratio,kernel" in csv


def test_compare_exits_1_on_a_subject_slowdown_beyond_tolerance(tmp_path, reference, capsys):
    new = _write(tmp_path, "new.jsonl", [_row("p1", "tiledattention", 1.2, 100.0),
                                         _row("p1", "torch_sdpa", 1.0, 100.0)])
    assert main(["compare", new, reference, "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert "regression: p1 tiledattention kernel +20.0 %" in err
    # a looser tolerance accepts it
    assert main(["compare", new, reference, "--tolerance", "kernel=25",
                 "--out", str(tmp_path / "c")]) == 0


def test_compare_reports_a_baseline_slowdown_without_failing(tmp_path, reference):
    new = _write(tmp_path, "new.jsonl", [_row("p1", "tiledattention", 1.0, 100.0),
                                         _row("p1", "torch_sdpa", 1.5, 100.0)])
    checks = compare.compare(compare.load_study(new)[0], compare.load_reference(reference))
    verdicts = {(c.method, c.measure): c.verdict for c in checks}
    assert verdicts[("torch_sdpa", "kernel")] == "slower"
    assert verdicts[("tiledattention ÷ torch_sdpa", "kernel")] == "faster"
    assert not compare.failed(checks)


def test_compare_fails_a_row_measured_but_not_ok(tmp_path, reference):
    new = _write(tmp_path, "new.jsonl", [_row("p1", "tiledattention", 1.0, 100.0, "error"),
                                         _row("p1", "torch_sdpa", 1.0, 100.0)])
    assert main(["compare", new, reference, "--out", str(tmp_path / "c")]) == 1


@pytest.mark.parametrize("args", [["/no/such/study", "h100"], ["NEW", "no-such-system"],
                                  ["NEW", "h100", "--tolerance", "speed=5"],
                                  ["NEW", "h100", "--tolerance", "-5"]])
def test_compare_exits_2_on_bad_input_with_one_line(tmp_path, reference, capsys, args):
    new = _write(tmp_path, "new.jsonl", [_row("p1", "tiledattention", 1.0, 1.0)])
    args = [new if a == "NEW" else a for a in args]
    assert main(["compare", *args, "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tiledattn compare")


def test_compare_refuses_a_study_with_no_point_in_the_reference(tmp_path, reference, capsys):
    new = _write(tmp_path, "new.jsonl", [_row("other", "tiledattention", 1.0, 1.0)])
    assert main(["compare", new, reference, "--out", str(tmp_path / "c")]) == 2
    assert "nothing to compare" in capsys.readouterr().err


@pytest.mark.parametrize("system", ["h100", "h200"])
def test_each_shipped_reference_is_built_from_the_committed_reference_rows(system):
    """references/<system>.json.gz holds compare.build of results/reference/<system>'s rows
    (a compact bundle: data/rows.jsonl.gz), tuple for tuple."""
    ref = compare.load_reference(system)
    rows, gpu = compare.load_study(f"results/reference/{system}")
    built = compare.build(rows, system=system, source={})
    assert ref["source"]["gpu"] == gpu and ref["tolerance"] == compare.TOLERANCE
    assert ref["entries"] == built["entries"]


def test_a_second_h100_run_passes_a_first_within_the_shipped_tolerances(tmp_path):
    """The shipped tolerances hold for a real repeat on the same kind of machine: another
    day's run of the paper grid, with a re-tuned schedule table, against the first."""
    checks, _ = compare.run(H100_RERUN, H100_RUN, tolerance=None, out=str(tmp_path))
    assert not compare.failed(checks)
    assert sum(c.verdict == "pass" for c in checks) > 700


def test_a_compact_bundle_reads_as_a_study_from_its_directory_and_its_zip(tmp_path):
    import shutil

    rows, gpu = compare.load_study("results/reference/h200")
    assert gpu == "NVIDIA H200" and len(rows) > 800
    zipped = shutil.make_archive(str(tmp_path / "h200"), "zip", "results/reference", "h200")
    assert compare.load_study(zipped) == (rows, gpu)


def test_compare_never_writes_into_a_bundle_by_default(tmp_path):
    study = tmp_path / "study"
    (study / "bundle").mkdir(parents=True)
    (study / "bundle" / "SHA256SUMS").write_text("")
    assert compare.default_out(str(study / "bundle")) == str(study / "compare")
    assert compare.default_out(str(study)) == str(study / "compare")
    assert compare.default_out(str(tmp_path / "study" / "bundle.zip")) == str(study / "compare")
