"""tiledattn compare: a study against a reference's (value, lower, upper) tuples, per point,
method and measure, and TiledAttention's speed ratios; exit 1 on a regression, 2 on bad
input; a table and a figure."""

from __future__ import annotations

import json

import pytest

from tiledattention.cli import main
from tiledattention.study.references import compare

H100_RUN = "benchmarks/results/h100-2026-11-23-bench80-one-run.jsonl.gz"
H100_RERUN = "benchmarks/results/h100-2026-11-23-bench80-w8-table.jsonl.gz"
H100_REPRODUCE = "benchmarks/results/h100-2026-11-24-reproduce-bench-rows.jsonl.gz"
H100_REPEAT = "benchmarks/results/h100-2026-11-24-repeat-bench-rows.jsonl.gz"
H200_REPRODUCE = "benchmarks/results/h200-2026-11-24-reproduce-bench-rows.jsonl.gz"


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


def _verdicts(tmp_path, ref_rows, new_rows):
    checks = compare.compare(compare.load_study(_write(tmp_path, "n.jsonl", new_rows))[0],
                             compare.load_reference(_write(tmp_path, "r.jsonl", ref_rows)))
    return {(c.point, c.method, c.measure): c.verdict for c in checks}, checks


def test_a_call_latency_where_host_time_shows_is_reported_host_bound_not_failed(tmp_path):
    # 20 us of kernel in a 60 us call: the call is the host's; on another machine 100 us
    ref = [_row("p1", "tiledattention", 0.020, 60.0), _row("p1", "torch_sdpa", 0.020, 50.0)]
    new = [_row("p1", "tiledattention", 0.020, 100.0), _row("p1", "torch_sdpa", 0.020, 55.0)]
    verdicts, checks = _verdicts(tmp_path, ref, new)
    assert verdicts[("p1", "tiledattention", "call")] == "host-bound"
    assert verdicts[("p1", "tiledattention ÷ torch_sdpa", "call")] == "host-bound"
    assert verdicts[("p1", "tiledattention", "kernel")] == "pass"


def test_a_call_latency_that_stays_gpu_bound_still_fails_beyond_tolerance(tmp_path):
    # a 1 ms kernel (L2 flushed) runs back to back in 0.6 ms; 0.95 ms later is still GPU-bound
    ref = [_row("p1", "tiledattention", 1.0, 600.0), _row("p1", "torch_sdpa", 1.0, 600.0)]
    new = [_row("p1", "tiledattention", 1.0, 950.0), _row("p1", "torch_sdpa", 1.0, 600.0)]
    verdicts, checks = _verdicts(tmp_path, ref, new)
    assert verdicts[("p1", "tiledattention", "call")] == "regression"
    assert compare.failed(checks)


def test_a_ratio_moved_only_by_its_baseline_is_reported_not_failed(tmp_path):
    ref = [_row("p1", "tiledattention", 1.0, 100.0), _row("p1", "cudnn", 0.8, 100.0)]
    faster_baseline = [_row("p1", "tiledattention", 1.02, 100.0), _row("p1", "cudnn", 0.5, 100.0)]
    verdicts, checks = _verdicts(tmp_path, ref, faster_baseline)
    assert verdicts[("p1", "tiledattention ÷ cudnn", "kernel")] == "baseline changed"
    assert not compare.failed(checks)
    # the same baseline change with TiledAttention past its own bound fails
    both = [_row("p1", "tiledattention", 1.2, 100.0), _row("p1", "cudnn", 0.5, 100.0)]
    verdicts, checks = _verdicts(tmp_path, ref, both)
    assert verdicts[("p1", "tiledattention ÷ cudnn", "kernel")] == "regression"


def test_a_call_path_slower_at_every_host_bound_point_fails_the_geomean_check(tmp_path):
    """Each host-bound call alone is excused; 30 % more host time at all of them, the
    baselines' unchanged, is TiledAttention's call path and fails."""
    ref, new = [], []
    for i in range(8):
        ref += [_row(f"p{i}", "tiledattention", 0.02, 60.0), _row(f"p{i}", "cudnn", 0.02, 50.0)]
        new += [_row(f"p{i}", "tiledattention", 0.02, 78.0), _row(f"p{i}", "cudnn", 0.02, 50.0)]
    verdicts, checks = _verdicts(tmp_path, ref, new)
    assert verdicts[("p0", "tiledattention", "call")] == "host-bound"
    host = next(c for c in checks if c.point == compare.HOST_POINT)
    assert host.verdict == "regression" and round(host.new, 2) == 1.3
    assert compare.failed(checks) == [host]
    # the same 30 % on the baselines too is the machine's host: it passes
    slow_host = [dict(r, call_us=r["call_us"] * 1.3) for r in ref]
    verdicts, checks = _verdicts(tmp_path, ref, slow_host)
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


# The reference tuples the 2026-11-24 re-runs were made against (the package's references
# until the 2026-11-26 re-run with FA4 and D = 256, whose code's backward table differs):
# a re-run is held against the reference of its own code.
REFERENCE_2026_11_24 = {"h100": "benchmarks/results/h100-2026-11-24-reference-tuples.json.gz",
                        "h200": "benchmarks/results/h200-2026-11-24-reference-tuples.json.gz"}


@pytest.mark.parametrize("run,system", [
    (H100_REPRODUCE, "h100"), (H100_REPEAT, "h100"), (H200_REPRODUCE, "h200")])
def test_re_runs_on_other_machines_of_a_kind_pass_its_reference(run, system):
    """The shipped tolerances hold across machines of one kind: each 2026-11-24 reference
    study's benchmark re-run by tiledattn reproduce (and a repeat of the H100's) on another
    machine (rows cut to what compare reads), against that reference's tuples."""
    import gzip
    import json

    with gzip.open(REFERENCE_2026_11_24[system], "rt") as f:
        ref = json.load(f)
    assert ref["tolerance"] == compare.TOLERANCE
    rows, _ = compare.load_study(run)
    checks = compare.compare(rows, ref)
    assert not compare.failed(checks), [c for c in compare.failed(checks)][:3]
    verdicts = [c.verdict for c in checks if c.stage == "bench"]
    assert verdicts.count("pass") > 2900 and verdicts.count("not measured") == 0
    # the re-runs kept the benchmark's rows only: the reference's other stages are reported
    # not measured, never failed
    others = {c.stage: c.verdict for c in checks if c.stage != "bench"}
    assert set(others) == {"variants", "model"} and set(others.values()) == {"not measured"}


def test_a_compact_bundle_reads_as_a_study_from_its_directory_and_its_zip(tmp_path):
    import shutil

    rows, gpu = compare.load_study("results/reference/h200")
    assert gpu == "NVIDIA H200" and len(rows) > 800
    stages = [compare.stage_of(r) for r in rows]
    assert stages.count("variants") >= 24 and stages.count("model") == 24
    zipped = shutil.make_archive(str(tmp_path / "h200"), "zip", "results/reference", "h200")
    assert compare.load_study(zipped) == (rows, gpu)


def test_compare_never_writes_into_a_bundle_by_default(tmp_path):
    study = tmp_path / "study"
    (study / "bundle").mkdir(parents=True)
    (study / "bundle" / "SHA256SUMS").write_text("")
    (study / "manifest.json").write_text("{}")  # a study's results directory
    assert compare.default_out(str(study / "bundle")) == str(study / "compare")
    assert compare.default_out(str(study)) == str(study / "compare")
    assert compare.default_out(str(tmp_path / "study" / "bundle.zip")) == str(study / "compare")


def _variant_row(method, kernel_ms, call_us, status="ok"):
    return dict(_row("window-bfloat16-causal-d128-sq4096", method, kernel_ms, call_us, status),
                variant="window", **{"pass": "fwd"})


def _model_row(method, ms, phase="prefill", status="ok"):
    return {"point_key": f"llama-tiny|b1|p2048|{phase}", "method": method, "status": status,
            "model": "llama-tiny", "phase": phase, "batch": 1, "time_ms": ms,
            "times_ms": [ms] * 3, "tokens_per_s": 2048 / ms}


def _stages_study(tmp_path, name, bench, variants, model):
    """A study's results directory: aggregate/rows.jsonl, variants/ and model/rows.jsonl."""
    root = tmp_path / name
    for sub, rows in (("aggregate", bench), ("variants", variants), ("model", model)):
        (root / sub).mkdir(parents=True)
        (root / sub / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(root)


def test_compare_holds_the_variants_and_model_stages_rows_too(tmp_path):
    bench = [_row("p1", "tiledattention", 1.0, 100.0), _row("p1", "torch_sdpa", 1.0, 100.0)]
    ref = _stages_study(tmp_path, "ref", bench,
                        [_variant_row("tiledattention", 0.5, 600.0),
                         _variant_row("flex", 0.7, 800.0)],
                        [_model_row("tiledattention", 4.0), _model_row("sdpa", 4.0)])
    same = _stages_study(tmp_path, "same", bench,
                         [_variant_row("tiledattention", 0.52, 610.0),
                          _variant_row("flex", 0.7, 800.0)],
                         [_model_row("tiledattention", 4.4), _model_row("sdpa", 4.0)])
    checks, _ = compare.run(same, ref, tolerance=None, out=str(tmp_path / "c1"))
    by = {(c.stage, c.method, c.measure): c for c in checks}
    assert by[("variants", "tiledattention", "kernel")].verdict == "pass"
    assert by[("variants", "tiledattention ÷ flex", "kernel")].verdict == "pass"
    assert by[("model", "tiledattention", "model")].verdict == "pass"  # +10 %, within 25 %
    assert by[("model", "tiledattention ÷ sdpa", "model")].new == pytest.approx(4.0 / 4.4)
    assert not compare.failed(checks)
    # ours 20 % slower in the variants stage, 40 % in the model: both fail, by stage
    slow = _stages_study(tmp_path, "slow", bench,
                         [_variant_row("tiledattention", 0.6, 600.0),
                          _variant_row("flex", 0.7, 800.0)],
                         [_model_row("tiledattention", 5.6), _model_row("sdpa", 4.0)])
    checks, paths = compare.run(slow, ref, tolerance=None, out=str(tmp_path / "c2"))
    failed = {(c.stage, c.method, c.measure) for c in compare.failed(checks)}
    assert ("variants", "tiledattention", "kernel") in failed
    assert ("model", "tiledattention", "model") in failed
    assert ("model", "tiledattention ÷ sdpa", "model") in failed
    assert not [c for c in compare.failed(checks) if c.stage == "bench"]
    md = (tmp_path / "c2" / "compare.md").read_text()
    # bench: 4 times, 2 ratios and the host-bound calls' geomean (the variants' calls show host)
    assert "Stages: bench 7 checks, 0 failed; variants 6 checks, 2 failed; model 3 checks, 2 " \
        "failed." in md
    assert "| variants: tiledattention | kernel time |" in md
    assert main(["compare", slow, ref, "--out", str(tmp_path / "c3")]) == 1
    # a model row that is not ok where the reference had one fails as any row does
    broken = _stages_study(tmp_path, "broken", bench, [],
                           [_model_row("tiledattention", 4.0, status="error"),
                            _model_row("sdpa", 4.0)])
    checks, _ = compare.run(broken, ref, tolerance=None, out=str(tmp_path / "c4"))
    assert [(c.stage, c.method, c.verdict) for c in compare.failed(checks)] == [
        ("model", "tiledattention", "not ok"), ("model", "tiledattention ÷ sdpa", "not ok")]
    assert {c.verdict for c in checks if c.stage == "variants"} == {"not measured"}


def test_the_shipped_references_hold_the_variants_model_and_workloads_stages():
    # Both hold the workloads stage: measured after the references were made, added by
    # rebundle --add (H200: varlen-paged.md §46a; H100: §55a).
    for system in ("h100", "h200"):
        entries = compare.load_reference(system)["entries"]
        stages = {e.get("stage", "bench") for e in entries}
        assert stages == {"bench", "variants", "model", "workloads"}
        assert sum(e.get("stage") == "workloads" for e in entries) == 273  # its ok rows
        model = [e for e in entries if e.get("stage") == "model"]
        assert len(model) == 24 and all(set(e) == {"point", "method", "stage", "model"}
                                         for e in model)


@pytest.mark.parametrize("gpu,system", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"), ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"), ("nvidia h200", "h200"), ("NVIDIA GH200 480GB", None),
    ("NVIDIA A100-SXM4-80GB", None), ("NVIDIA H20", None), ("NVIDIA H800", None), ("", None),
])
def test_the_gpu_acceptance_test_picks_the_shipped_reference_of_the_gpus_model(gpu, system):
    # tests/gpu/test_compare_gpu.py skipped on an H200 although its reference ships.
    assert compare.shipped_system(gpu) == system


def _sums(bundle) -> None:
    """SHA256SUMS of every file in ``bundle`` as it is now (a bundle as made)."""
    import hashlib

    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    (bundle / "SHA256SUMS").write_text("".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(bundle).as_posix()}\n"
        for p in files))


def _edited(bundle, rel) -> None:
    """One row of ``rel`` edited after the bundle was made (its SHA256SUMS line left)."""
    import gzip

    path = bundle / rel
    data = gzip.decompress(path.read_bytes()) if rel.endswith(".gz") else path.read_bytes()
    lines = data.decode().splitlines(keepends=True)
    row = json.loads(lines[0])
    row["recorded"] = "edited"  # times untouched: the comparison alone would PASS
    data = "".join([json.dumps(row) + "\n", *lines[1:]]).encode()
    path.write_bytes(gzip.compress(data) if rel.endswith(".gz") else data)


@pytest.fixture(params=["compact", "full"])
def bundle(request, tmp_path):
    """(a copy of the committed H200 reference, the rows file that holds its rows): compact
    as committed, or full (data/rows.jsonl plain, every file in SHA256SUMS)."""
    import gzip
    import shutil

    copy = tmp_path / "h200"
    shutil.copytree("results/reference/h200", copy)
    if request.param == "compact":
        return copy, "data/rows.jsonl.gz"
    gz = copy / "data" / "rows.jsonl.gz"
    (copy / "data" / "rows.jsonl").write_bytes(gzip.decompress(gz.read_bytes()))
    gz.unlink()
    _sums(copy)
    return copy, "data/rows.jsonl"


@pytest.mark.parametrize("side", ["new", "reference"])
@pytest.mark.parametrize("form", ["directory", "zip"])
def test_compare_refuses_a_bundle_that_fails_its_checksums_in_one_line(
        bundle, side, form, tmp_path, capsys):
    """Rows edited after the bundle was made (SHA256SUMS no longer vouches for them): exit 2,
    one line naming the file, nothing PASSed, on either side, as directory or zip."""
    import shutil

    copy, rel = bundle
    ref_copy = tmp_path / "ref"
    shutil.copytree(copy, ref_copy)
    args = [str(copy), str(ref_copy)] if side == "new" else [str(ref_copy), str(copy)]
    assert main(["compare", *args, "--out", str(tmp_path / "ok")]) == 0  # as made: compared
    _edited(copy, rel)
    if form == "zip":
        zipped = shutil.make_archive(str(tmp_path / "edited"), "zip", str(tmp_path), "h200")
        args = [a if a != str(copy) else zipped for a in args]
    capsys.readouterr()
    assert main(["compare", *args, "--out", str(tmp_path / "cmp")]) == 2
    out, err = capsys.readouterr()
    assert "PASS" not in out and len(err.strip().splitlines()) == 1, (out, err)
    assert f"changed: {rel} (checksum differs)" in err and "fails its checksums" in err
    assert not (tmp_path / "cmp").exists()


def test_the_compare_figure_names_the_gpu_of_the_new_rows(tmp_path, monkeypatch):
    # issue 50: every figure names the GPU; the comparison's did not
    from tiledattention.study.presentation import plotting

    titles = []
    monkeypatch.setattr(plotting, "save", lambda fig, out, name, record=True:
                        titles.append(fig._suptitle.get_text()) or [])
    ref = "results/reference/h200"
    assert main(["compare", ref, ref, "--out", str(tmp_path / "cmp")]) == 0
    assert titles and titles[0].startswith("NVIDIA H200"), titles
