"""The harness on the CPU: statuses, metrics, resumable rows, the manifest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tiledattention.bench import methods as M
from tiledattention.bench import runner
from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import Point, expand
from tiledattention.bench.manifest import capture, now
from tiledattention.bench.runner import run_bench, run_point
from tiledattention.bench.store import ResultStore, read_rows

CPU = torch.device("cpu")
POINT = Point("float32", False, 32, 48, 40, 1, 4, 2)


def cfg(methods, **timing):
    return from_dict({"methods": list(methods), "timing": {"warmup": 1, "reps": 4, "rounds": 2,
                                                           **timing}, "device": "cpu"})


@pytest.fixture
def fake_methods(monkeypatch):
    def oom(q, k, v, p):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    def wrong(q, k, v, p):
        return M.eager_attention(q, k, v, p) + 1.0

    def nan(q, k, v, p):
        return torch.full_like(q, float("nan"))

    def unsupported(point, device):
        raise M.Unsupported("D=32 is not handled")

    def boom(q, k, v, p):
        raise RuntimeError("kernel exploded")

    for m in (M.Method("fake_oom", "", False, oom), M.Method("fake_wrong", "", False, wrong),
              M.Method("fake_nan", "", False, nan),
              M.Method("fake_unsupported", "", False, M.eager_attention, unsupported),
              M.Method("fake_error", "", False, boom)):
        monkeypatch.setitem(M.METHODS, m.name, m)


def test_each_failure_mode_gets_its_status_and_the_run_goes_on(fake_methods):
    names = ["eager", "fake_oom", "fake_wrong", "fake_nan", "fake_unsupported", "fake_error",
             "tiledattention", "flash"]
    rows = {r["method"]: r for r in run_point(POINT, names, cfg(names), CPU, None)}
    assert rows["eager"]["status"] == "ok"
    assert rows["fake_oom"]["status"] == "oom"
    assert rows["fake_wrong"]["status"] == "wrong" and rows["fake_wrong"]["rel_err"] > 0.1
    assert rows["fake_nan"]["status"] == "wrong"
    assert rows["fake_unsupported"] == {**rows["fake_unsupported"], "status": "unsupported",
                                         "reason": "D=32 is not handled"}
    assert rows["fake_error"]["status"] == "error"
    assert "kernel exploded" in rows["fake_error"]["reason"]
    assert rows["tiledattention"]["status"] == "unavailable"
    assert rows["flash"]["status"] == "unavailable"


def test_ok_rows_carry_timings_metrics_and_correctness():
    (row,) = run_point(POINT, ["eager"], cfg(["eager"]), CPU, None)
    assert row["status"] == "ok" and row["correct"] and row["rel_err"] < 1e-5
    t = row["time_ms"]
    assert t["reps"] == 4 and t["min_ms"] <= t["median_ms"] <= t["p95_ms"]
    sec = t["median_ms"] / 1e3
    assert row["flops"] == 4 * 1 * 4 * 48 * 40 * 32
    assert row["tflops"] == pytest.approx(row["flops"] / sec / 1e12)
    assert row["tokens_per_s"] == pytest.approx(1 * 4 * 48 / sec)
    assert row["bytes_moved"] == 4 * 32 * (2 * 4 * 48 + 2 * 2 * 40)
    assert row["ref_heads"] == 4 and row["seed"] == 0 and row["point_key"] == POINT.key()


@pytest.fixture
def one_torch_thread():
    # Two torch threads on CI's two cores, shared with another test worker, made eager's
    # median call slower (5-14 ms) than the 2 ms sleep it is compared with.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_ok_rows_carry_call_latency_of_back_to_back_calls(monkeypatch, one_torch_thread):
    def slow(q, k, v, p):
        time.sleep(0.002)
        return M.eager_attention(q, k, v, p)

    monkeypatch.setitem(M.METHODS, "fake_slow", M.Method("fake_slow", "", False, slow))
    rows = {r["method"]: r for r in run_point(POINT, ["eager", "fake_slow"],
                                              cfg(["eager", "fake_slow"]), CPU, None)}
    slow_row, eager_row = rows["fake_slow"], rows["eager"]
    assert slow_row["call_us"] >= 2000  # every call sleeps 2 ms
    assert slow_row["call_us"] > eager_row["call_us"] > 0
    # One count per point, from the fastest method's time, within the bounds.
    assert slow_row["call_calls"] == eager_row["call_calls"]
    assert runner.CALL_BOUNDS[0] <= eager_row["call_calls"] <= runner.CALL_BOUNDS[1]


def test_a_cpu_point_is_measured_with_one_intra_op_thread_and_the_row_says_so(monkeypatch):
    # With torch's thread per core, each back-to-back call on a shared 2-core machine waited
    # ~3 ms for a descheduled thread (a 30 us call): the smoke bench took 86-235 s.
    seen = []

    def spy(q, k, v, p):
        seen.append(torch.get_num_threads())
        return M.eager_attention(q, k, v, p)

    monkeypatch.setitem(M.METHODS, "spy", M.Method("spy", "", False, spy))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (row,) = run_point(POINT, ["spy"], cfg(["spy"]), CPU, None)
        assert torch.get_num_threads() == 2  # the caller's setting is back
    finally:
        torch.set_num_threads(before)
    assert row["status"] == "ok" and len(seen) > 10 and set(seen) == {runner.CPU_THREADS} == {1}
    assert row["timing"]["cpu_threads"] == 1


def test_a_method_failing_while_timing_call_latency_gets_an_error_row(monkeypatch):
    count = {"n": 0}

    def flaky(q, k, v, p):
        count["n"] += 1
        if count["n"] > 1 + 1 + 2 * 4:  # check call, warm-up, kernel timing: then fails
            raise RuntimeError("fails on the 11th call")
        return M.eager_attention(q, k, v, p)

    monkeypatch.setitem(M.METHODS, "fake_flaky", M.Method("fake_flaky", "", False, flaky))
    (row,) = run_point(POINT, ["fake_flaky"], cfg(["fake_flaky"]), CPU, None)
    assert row["status"] == "error" and "11th call" in row["reason"]
    assert "call_us" not in row


def test_every_method_sees_identical_inputs():
    a = run_point(POINT, ["eager", "math"], cfg(["eager", "math"]), CPU, None)
    assert a[0]["rel_err"] == pytest.approx(a[1]["rel_err"], rel=0.5, abs=1e-6)
    from tiledattention.bench.runner import make_inputs

    q1, _, _ = make_inputs(POINT, 0, CPU)
    q2, _, _ = make_inputs(POINT, 0, CPU)
    assert torch.equal(q1, q2)


def test_store_skips_a_torn_line_and_appends_after_it(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"point_key": "a", "method": "m", "status": "ok"}\n{"point_key": "b", "me')
    store = ResultStore(str(path))
    assert store.done("a", "m") and not store.done("b", "m") and store.torn_lines == 1
    store.append({"point_key": "b", "method": "m", "status": "ok"})
    assert {(r["point_key"]) for r in read_rows(str(path))} == {"a", "b"}


def test_a_run_killed_with_sigkill_resumes_to_every_row_exactly_once(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("grid: {seqs: [128, 256, 384], head_dims: [32, 64], dtypes: [float32],"
                      " causal: [false, true], shape_policy: explicit, batch: 2, heads: 4}\n"
                      "methods: [eager, math, torch_sdpa]\n"
                      "timing: {warmup: 1, reps: 40, rounds: 2}\ndevice: cpu\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tiledattention.cli", "bench", "--config", str(config),
           "--out", str(out)]
    rows_file = out / "rows-shard0of1.jsonl"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if rows_file.exists() and rows_file.read_text().count("\n") >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = rows_file.read_text().count("\n")
    assert 4 <= partial < 36, "kill landed outside the run; the test proves nothing"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [ln for ln in rows_file.read_text().split("\n") if ln.strip()]
    parsed = [json.loads(ln) for ln in lines if ln.startswith("{") and ln.endswith("}")]
    keys = [(r["point_key"], r["method"]) for r in parsed]
    assert len(keys) == len(set(keys)) == 12 * 3
    assert all(r["status"] == "ok" for r in parsed)


def test_manifest_has_the_facts_and_no_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_API_TOKEN", "hunter2-secret")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    c = cfg(["eager"])
    m = capture(c, started=now())
    for key in ("python", "torch", "cuda_runtime", "cudnn", "cuda_tile", "tileiras", "triton",
                "gpu", "host", "git_commit", "git_dirty", "config", "config_hash", "seed",
                "started", "finished", "environment"):
        assert key in m
    assert m["environment"]["SLURM_JOB_ID"] == "4242"
    assert set(m["environment"]) <= {"SLURM_JOB_ID", "CUDA_TILE_CACHE_DIR"}
    assert "hunter2" not in json.dumps(m, default=str)
    assert m["config_hash"] == c.digest()


def test_run_bench_writes_rows_manifest_and_skips_what_is_done(tmp_path, capsys):
    c = from_dict({"grid": {"seqs": [32], "head_dims": [32], "dtypes": ["float32"],
                            "causal": [False], "shape_policy": "explicit"},
                   "methods": ["eager", "flash"], "timing": {"warmup": 0, "reps": 2, "rounds": 1},
                   "device": "cpu"})
    assert run_bench(c, str(tmp_path)) == 0
    assert run_bench(c, str(tmp_path)) == 0  # nothing left to do
    rows = read_rows(str(tmp_path / "rows-shard0of1.jsonl"))
    assert sorted(r["status"] for r in rows) == ["ok", "unavailable"]
    manifest = json.loads((tmp_path / "manifest-shard0of1.json").read_text())
    assert manifest["finished"] and manifest["config_hash"] == c.digest()
    assert "rows by status: ok 1, unavailable 1" in capsys.readouterr().err
    assert os.path.getsize(tmp_path / "rows-shard0of1.jsonl") > 0
    assert len(expand(c)) == 1


def test_a_resumed_run_keeps_the_earlier_runs_stack_and_the_study_sees_them(tmp_path,
                                                                            monkeypatch):
    """Rows measured at one revision and resumed at another: the manifest keeps both, and
    the study's manifest reports the two revisions instead of the last one alone."""
    from tiledattention.study.publication.manifest import load_manifests, merge

    grid = {"seqs": [32, 64], "head_dims": [32], "dtypes": ["float32"], "causal": [False],
            "shape_policy": "explicit"}
    timing = {"warmup": 0, "reps": 2, "rounds": 1}
    first = from_dict({"grid": dict(grid, seqs=[32]), "methods": ["eager"], "timing": timing,
                       "device": "cpu"})
    whole = from_dict({"grid": grid, "methods": ["eager"], "timing": timing, "device": "cpu"})
    monkeypatch.setenv("TILEDATTENTION_SOURCE_REVISION", "a" * 40)
    assert run_bench(first, str(tmp_path)) == 0
    monkeypatch.setenv("TILEDATTENTION_SOURCE_REVISION", "b" * 40)
    assert run_bench(whole, str(tmp_path)) == 0
    manifest = json.loads((tmp_path / "manifest-shard0of1.json").read_text())
    assert manifest["git_commit"] == "b" * 40
    assert [e["git_commit"] for e in manifest["earlier_runs"]] == ["a" * 40]
    study = merge(load_manifests([str(tmp_path)]))
    assert not study["consistent"] and study["mismatches"]["git_commit"] == ["a" * 40, "b" * 40]
    assert study["runs"][0]["resumed"][0]["git_commit"] == "a" * 40
    # a fresh rows file has no earlier runs
    fresh = tmp_path / "fresh"
    assert run_bench(first, str(fresh)) == 0
    assert json.loads((fresh / "manifest-shard0of1.json").read_text())["earlier_runs"] == []


def test_ctrl_c_stops_after_the_current_point_with_complete_rows(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("grid: {seqs: [128, 256, 384], head_dims: [32, 64], dtypes: [float32],"
                      " causal: [false, true], shape_policy: explicit, batch: 2, heads: 4}\n"
                      "methods: [eager, math]\ntiming: {warmup: 1, reps: 40, rounds: 2}\n"
                      "device: cpu\n")
    out = tmp_path / "out"
    rows_file = out / "rows-shard0of1.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "tiledattention.cli", "bench", "--config",
                             str(config), "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (rows_file.exists() and rows_file.read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "stopping after the current point" in err
    rows = [json.loads(ln) for ln in rows_file.read_text().splitlines()]
    assert 2 <= len(rows) < 24 and len(rows) % 2 == 0  # whole points only: 2 methods each


def test_sigterm_stops_without_storing_the_point_it_cut(tmp_path, monkeypatch):
    """A budget's SIGTERM also kills the point's compiler; that point's rows (an error) are
    not stored, so a resumed run measures it again."""
    c = from_dict({"grid": {"seqs": [32, 64], "head_dims": [32], "dtypes": ["float32"],
                            "causal": [False], "shape_policy": "explicit"},
                   "methods": ["eager"], "timing": {"warmup": 0, "reps": 2, "rounds": 1},
                   "device": "cpu"})
    real = runner.run_point
    calls = []

    def cut_second(point, methods, cfg, device, flush):
        calls.append(point.key())
        rows = real(point, methods, cfg, device, flush)
        if len(calls) == 2:  # the signal lands while the second point runs
            os.kill(os.getpid(), signal.SIGTERM)
            rows = [dict(r, status="error", reason="CompilerExecutionError: Return code -15")
                    for r in rows]
        return rows

    seen = []  # a job environment's own handler (submitit bypasses SIGTERM) still runs
    monkeypatch.setattr(runner, "run_point", cut_second)
    def job_handler(signum, frame):
        seen.append(signum)

    signal.signal(signal.SIGTERM, job_handler)
    try:
        run_bench(c, str(tmp_path))
        assert signal.getsignal(signal.SIGTERM) is job_handler  # restored
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rows = read_rows(str(tmp_path / "rows-shard0of1.jsonl"))
    assert [r["point_key"] for r in rows] == calls[:1] and rows[0]["status"] == "ok"
    assert seen == [signal.SIGTERM]
    monkeypatch.setattr(runner, "run_point", real)
    assert run_bench(c, str(tmp_path)) == 0  # the resumed run measures the cut point
    keys = [r["point_key"] for r in read_rows(str(tmp_path / "rows-shard0of1.jsonl"))]
    assert sorted(keys) == sorted(calls)


def test_bench_summary_says_its_units_and_never_cuts_a_header():
    from tiledattention.bench.runner import summary_table

    pinned = "tiledattention@64x128_o2_c1_lk2_lv4"
    methods = ["tiledattention", "torch_sdpa", pinned, "eager"]
    key = "float16-full-d128-sq4096-skv4096-b4-h16-g1"
    rows = [{"point_key": key, "method": m, "status": "ok", "tflops": t, "call_us": c}
            for m, t, c in (("tiledattention", 600.0, 100.0), ("torch_sdpa", 640.0, 110.0),
                            (pinned, 590.0, 101.0))]
    rows.append({"point_key": key, "method": "eager", "status": "unavailable"})
    text = summary_table(rows, methods)
    title, ratios, head, line, status = text.splitlines()
    assert "TFLOP/s per point" in title and "> 1: tiledattention faster" in ratios
    for m in methods:
        assert f" {m}" in head, m  # whole names, not cut to 12 characters
    # every value ends under the end of its column's header
    for label, value in (("tiledattention", "600.00"), ("torch_sdpa", "640.00"),
                         (pinned, "590.00"), ("eager", "unavailable"),
                         ("kernel ÷", "0.938"), ("call ÷", "1.100")):
        assert head.index(label) + len(label) == line.index(value) + len(value), label
    assert status == "rows by status: ok 3, unavailable 1"
