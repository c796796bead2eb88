"""The second hardening round (issue 29), one test per class of fault: nothing the user
wrote is lost, nothing outside the study or untracked leaks into a bundle, no read hangs or
blows memory, nothing impossible is published or vanishes silently, and a refusal is one
line without a traceback."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_hardening import ROOT, _create, _tiny_study, cli, tiny_config

from tiledattention.bench.config import ConfigError, from_dict
from tiledattention.bench.runner import run_bench

DEEP = "[" * 100_000 + "]" * 100_000  # nests past Python's recursion limit


@contextlib.contextmanager
def within(seconds: int):
    """Fail (instead of hanging the suite) when the block blocks longer than ``seconds``."""
    def hung(signum, frame):
        raise AssertionError(f"blocked for more than {seconds}s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def one_line(code_err, code: int = 2) -> str:
    code_, err = code_err
    assert code_ == code and len(err.strip().splitlines()) == 1, (code_, err)
    assert "Traceback" not in err
    return err


def _row(key: str, method: str = "eager", **extra) -> dict:
    point = {"dtype": "float32", "causal": False, "head_dim": 32, "seq_q": 32, "seq_kv": 32,
             "batch": 1, "heads": 2, "gqa": 1}
    return {"format": "tiledattention-bench-row/1", "point_key": key, "method": method,
            "status": "ok", "config_hash": "h", "tflops": 1.0,
            "time_ms": {"median_ms": 2.0}, **point, **extra}


def _shard(d: Path, rows: list[dict], name: str = "rows-shard0of1.jsonl") -> Path:
    d.mkdir(exist_ok=True)
    (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


# -- Hangs: every file a command reads is a regular file, capped, parsed without recursion --

def test_a_fifo_dev_zero_or_deep_json_is_refused_in_one_line_wherever_a_command_reads(
        tmp_path, monkeypatch):
    from tiledattention.safeio import UnsafeFileError, load_json, read_bytes
    from tiledattention.schedules import policy
    from tiledattention.schedules.table import ScheduleTable, TableError

    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo")
    Path("deep.json").write_text(DEEP)
    with within(20):
        for path, why in (("fifo", "special file"), ("/dev/zero", "special file"),
                          (".", "is a directory")):
            with pytest.raises(UnsafeFileError, match=why):
                read_bytes(path, cap=1 << 20)
        with pytest.raises(UnsafeFileError, match="nested too deeply"):
            load_json("deep.json")
        # the schedule table a process loads from $TILEDATTENTION_SCHEDULE_TABLE
        for path in ("fifo", "/dev/zero", "deep.json"):
            with pytest.raises(TableError):
                ScheduleTable.load(path)
        monkeypatch.setenv(policy.ENV_VAR, "/dev/zero")
        with pytest.raises(TableError, match="special file"):
            policy._load_active()
        # a config, a rows file, a tuning table, a run manifest, through the CLI
        one_line(cli("bench", "--config", "fifo", "--out", "o"))
        one_line(cli("bench", "--config", "/dev/zero", "--out", "o"))
        os.makedirs("rows")
        os.mkfifo("rows/rows-shard0of1.jsonl")
        assert "special file" in one_line(cli("aggregate", "--rows", "rows", "--out", "a"))
        os.remove("rows/rows-shard0of1.jsonl")
        Path("rows/rows-shard0of1.jsonl").write_text(DEEP + "\n")  # a line, not a row
        assert "1 unreadable lines" in one_line(cli("aggregate", "--rows", "rows",
                                                     "--out", "a"))
        _shard(tmp_path / "ok", [_row("p")])
        _, err = cli("aggregate", "--rows", "ok", "--out", "agg", "--rows-only")
        for table in ("/dev/zero", "deep.json"):
            one_line(cli("figures", "--rows", "agg/rows.jsonl", "--out", "f",
                         "--tune-table", table))
        one_line(cli("sweep", "--config", str(tiny_config(tmp_path)), "--launcher-options",
                     "[" * 50_000 + "]" * 50_000))
        os.makedirs("runs")
        os.mkfifo("runs/manifest-shard0of1.json")
        one_line(cli("manifest", "--runs", "runs", "--out", "m.json"))
        # bundle verify of a directory: special and deep metadata are findings, not hangs
        from tiledattention.study.publication import verify

        b = tmp_path / "b"
        b.mkdir()
        os.mkfifo(b / ".zenodo.json")
        (b / "CITATION.cff").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
        (b / "ro-crate-metadata.json").write_text(DEEP)
        (b / "SHA256SUMS").write_text("")
        problems = verify.verify(str(b))
    assert "special file: .zenodo.json (only regular files allowed)" in problems
    assert ".zenodo.json is missing" in problems
    assert any(p.startswith("CITATION.cff: not valid YAML") for p in problems), problems
    assert any("ro-crate-metadata.json does not parse" in p for p in problems), problems


# -- Loss and silently wrong: writes are atomic; a killed step leaves nothing half-written --

def test_a_killed_writer_leaves_the_old_file_or_the_new_never_a_truncated_one(tmp_path):
    from tiledattention.safeio import atomic_write

    target = tmp_path / "rows.csv"
    target.write_text("the old, complete table\n")
    with pytest.raises(RuntimeError), atomic_write(str(target)) as f:
        f.write("half a ta")
        raise RuntimeError("killed")
    assert target.read_text() == "the old, complete table\n"
    assert os.listdir(tmp_path) == ["rows.csv"]  # no temporary file left behind
    # aggregate SIGKILLed in the middle of writing rows.jsonl: no rows.jsonl at all
    rows = _shard(tmp_path / "rows", [_row(f"p{i}") for i in range(5)])
    code = ("import json, os, signal, sys\n"
            "import tiledattention.bench.aggregate as agg\n"
            "calls = []\n"
            "def dumps(*a, **k):\n"
            "    calls.append(1)\n"
            "    if len(calls) == 3:\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return json.dumps(*a, **k)\n"
            "agg.json = type('J', (), {'dumps': staticmethod(dumps)})\n"
            "from tiledattention.cli import main\n"
            f"main(['aggregate', '--rows', {str(rows)!r}, '--out', {str(tmp_path / 'a')!r},"
            " '--rows-only'])\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == -signal.SIGKILL
    assert not (tmp_path / "a" / "rows.jsonl").exists()
    # a torn rows.jsonl (as the old aggregate left it) is never published
    study = _tiny_study(tmp_path)
    agg = study / "aggregate" / "rows.jsonl"
    agg.write_text(agg.read_text() + '{"point_key": "q", "meth')
    from tiledattention.study.presentation.frame import StudyError

    with pytest.raises(StudyError, match="unreadable line.*run the aggregate step again"):
        _create(study, tmp_path / "bundle")
    # a hidden build dir of a killed bundle create is removed by the next run
    agg.write_text(agg.read_text().rsplit("\n", 1)[0] + "\n")
    stale = tmp_path / ".bundle.building-killed"
    (stale / "data").mkdir(parents=True)
    _create(study, tmp_path / "bundle")
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.glob(".bundle*")) == [".bundle.lock"]


def test_tune_without_a_gpu_never_replaces_an_existing_table(tmp_path):
    import torch

    from tiledattention.schedules.backward import BwdSchedule
    from tiledattention.schedules.schedule import Schedule
    from tiledattention.schedules.table import Bucket, BwdEntry, Entry, ScheduleTable
    from tiledattention.stages.tune import TuneTask

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the task would tune instead")
    table = ScheduleTable(meta={"gpu": "H100"})
    bucket = Bucket("9.0", "float16", 64, False, 512)
    table.add(Entry(bucket, Schedule(64, 128, 2), 500.0))
    table.add(BwdEntry(bucket, BwdSchedule.from_label("kv64x64_q64x64_o1"), 300.0))
    out = tmp_path / "schedule-table.json"
    table.save(str(out))
    before = out.read_bytes()
    for passes in (("fwd",), ("fwd+bwd",), ("fwd", "fwd+bwd")):
        result = TuneTask(str(out), str(tmp_path / "state.jsonl"), seqs=(512,),
                          head_dims=(64,), dtypes=("float16",), passes=passes)()
        assert result["status"] == "unavailable" and "is kept as it was" in result["reason"]
        assert out.read_bytes() == before
    code, _ = cli("tune", "--seqs", "512", "--head-dims", "64", "--out", str(out),
                  "--state", str(tmp_path / "s.jsonl"), "--pass", "fwd+bwd")
    assert code == 2 and out.read_bytes() == before


def test_bundle_create_force_never_replaces_a_directory_in_the_study_or_the_checkout(
        tmp_path):
    from tiledattention.study.presentation.frame import StudyError

    study = _tiny_study(tmp_path)
    (study / "aggregate" / "notes.md").write_text("mine")
    before = sorted(p.name for p in study.rglob("*"))
    err = one_line(cli("bundle", "create", "--study", str(study), "--config",
                       str(tiny_config(tmp_path)), "--out", str(study / "aggregate"),
                       "--force"))
    assert "inside the study directory, --force never replaces" in err
    assert sorted(p.name for p in study.rglob("*")) == before
    repo = tmp_path / "repo"
    (repo / "profiles" / "mine").mkdir(parents=True)
    (repo / "profiles" / "mine" / "config.yaml").write_text("account: secret\n")
    with pytest.raises(StudyError, match="inside the source checkout"):
        _create(study, repo / "profiles", repo=repo, force=True)
    assert (repo / "profiles" / "mine" / "config.yaml").exists()
    # a new directory (or our own bundle) inside the study is still where bundles go
    out = _create(study, study / "bundle", force=True)
    assert _create(study, study / "bundle", force=True)["dir"] == out["dir"]


# -- Leaks ----------------------------------------------------------------------------------

def test_nothing_untracked_or_outside_the_study_goes_into_a_bundle(tmp_path):
    from tiledattention.study.presentation.frame import StudyError
    from tiledattention.study.publication import create, verify

    repo = tmp_path / "repo"  # a source tree without .git
    for rel, text in (("Snakefile", "x"), ("config/config.yaml", "a: 1"),
                      ("config/mine.yaml", "token: hunter2"),
                      ("profiles/slurm/config.yaml", "x: 1"),
                      ("profiles/mycluster/config.yaml", "account: hunter2"),
                      ("workflow/rules/bench.smk", "rule x:")):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    files, how = create.snapshot_files(str(repo))
    assert files == ["Snakefile", "config/config.yaml", "profiles/slurm/config.yaml",
                     "workflow/rules/bench.smk"] and "allow-list" in how
    outside = tmp_path / "outside.txt"
    outside.write_text("hunter2")
    study = _tiny_study(tmp_path)
    (study / "figures").mkdir()
    (study / "figures" / "leak.png").symlink_to(outside)
    with pytest.raises(StudyError, match="leak.png is a link to .*outside the study"):
        _create(study, tmp_path / "b", repo=repo)
    (study / "figures" / "leak.png").unlink()
    os.mkfifo(study / "figures" / "pipe.png")
    with within(20), pytest.raises(StudyError, match="pipe.png is not a regular file"):
        _create(study, tmp_path / "b", repo=repo)
    (study / "figures" / "pipe.png").unlink()
    (study / "figures" / "fine.png").write_text("png")
    (study / "figures" / "alias.png").symlink_to(study / "figures" / "fine.png")  # inside
    out = Path(_create(study, tmp_path / "b", repo=repo)["dir"])
    with zipfile.ZipFile(out / "workflow-snapshot.zip") as z:
        assert b"hunter2" not in b"".join(z.read(n) for n in z.namelist())
    assert (out / "figures" / "alias.png").read_text() == "png"
    assert verify.verify(str(out)) == []


def test_the_shipped_snapshot_allow_list_names_every_tracked_config_and_profile():
    from tiledattention.study.publication import archive

    run = subprocess.run(["git", "-C", str(ROOT), "ls-files", "config", "profiles"],
                         capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout:
        pytest.skip("not a git checkout: the tracked files cannot be listed here")
    assert set(run.stdout.split()) <= set(archive.SNAPSHOT_SHIPPED), \
        "add the new tracked file to archive.SNAPSHOT_SHIPPED"


# -- Silently wrong: every published number finite and physical, or refused with why --------

@pytest.mark.parametrize("bad, why", [
    ({"tflops": float("nan")}, "tflops is nan"),
    ({"tflops": float("inf")}, "tflops is inf"),
    ({"time_ms": {"median_ms": -1.0}}, "time_ms.median_ms is -1.0"),
    ({"time_ms": {"median_ms": 0.0}}, "time_ms.median_ms is 0.0 in an ok row"),
    ({"seq_q": -32}, "seq_q is -32"),
    ({"seq_q": 0}, "seq_q is 0"),
    ({"tflops": "12.5"}, "tflops is '12.5', not a number"),
    ({"status": None}, "'status' is missing"),
    ({"head_dim": None}, "head_dim is None (must be an integer >= 1)"),
])
def test_a_row_with_an_impossible_or_mistyped_value_is_refused_naming_it(tmp_path, bad,
                                                                         why):
    row = {**_row("p1"), **bad}
    rows = _shard(tmp_path / "rows", [_row("p0"), row])
    err = one_line(cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a")))
    assert f"p1 eager: {why}" in err and "1 row(s) cannot be published" in err
    assert not (tmp_path / "a").exists()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "rows.jsonl").write_text(json.dumps(_row("p0")) + "\n"
                                               + json.dumps(row) + "\n")
    err = one_line(cli("figures", "--rows", str(tmp_path / "a" / "rows.jsonl"), "--out",
                       str(tmp_path / "f")))
    assert why in err and not (tmp_path / "f").exists()  # refused before plotting


def test_a_resumed_bench_refuses_a_row_it_could_not_publish_before_printing_it(tmp_path):
    config = tiny_config(tmp_path)
    out = tmp_path / "o"
    assert cli("bench", "--config", str(config), "--out", str(out))[0] == 0
    rows = out / "rows-shard0of1.jsonl"
    digest = json.loads(rows.read_text())["config_hash"]
    with rows.open("a") as f:
        f.write(json.dumps({"point_key": "zz", "method": "eager", "tflops": "12",
                            "config_hash": digest}) + "\n")
    err = one_line(cli("bench", "--config", str(config), "--out", str(out)))
    assert "zz eager: 'status' is missing" in err


def test_a_wrong_rows_infinite_error_is_published_as_why_it_is_wrong(tmp_path):
    # A kernel that returns NaN: the harness records rel_err NaN and grad errors inf, status
    # wrong. That is the measurement, listed in the status table, not a fault of the file.
    wrong = {**_row("p1"), "status": "wrong", "reason": "output not finite",
             "rel_err": float("nan"), "grad_rel_err": {"dq": float("inf")}}
    rows = _shard(tmp_path / "rows", [_row("p0"), wrong])
    code, _ = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"))
    assert code == 0
    status = (tmp_path / "a" / "tables" / "status.md").read_text()
    assert "| eager | wrong | output not finite | 1 | p1 |" in status
    _shard(rows, [_row("p0"), {**wrong, "status": "ok"}])  # but never in an ok row
    err = one_line(cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "b")))
    assert "rel_err is nan" in err


def test_a_pair_measured_twice_with_different_values_is_reported_not_picked(tmp_path):
    rows = _shard(tmp_path / "rows", [_row("p0")], "rows-shard0of2.jsonl")
    _shard(rows, [_row("p0", tflops=9.0)], "rows-shard1of2.jsonl")
    err = one_line(cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"),
                       "--rows-only"))
    assert "p0 eager: given more than once with different values" in err
    _shard(rows, [_row("p0")], "rows-shard1of2.jsonl")  # the same row twice: one row
    code, _ = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"),
                  "--rows-only")
    assert code == 0 and len((tmp_path / "a" / "rows.jsonl").read_text().splitlines()) == 1


def test_a_reason_with_newlines_or_pipes_stays_one_markdown_table_row():
    from tiledattention.study.presentation import tables

    bad = {**_row("p0"), "status": "error", "reason": "line one\nline | two\n\nthree"}
    md = tables.status([bad]).to_markdown()
    (line,) = [ln for ln in md.splitlines() if ln.startswith("| eager")]
    assert line == "| eager | error | line one line \\| two three | 1 | p0 |"
    assert "\n\n" not in tables.status([bad]).to_latex()


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


# -- Valid input accepted, impossible input named ------------------------------------------

def test_a_study_with_more_shards_than_points_aggregates(tmp_path):
    config = tiny_config(tmp_path)
    out = tmp_path / "rows"
    for i in range(3):  # one grid point, three shards: two of them empty
        code, _ = cli("bench", "--config", str(config), "--out", str(out), "--shard",
                      f"{i}/3")
        assert code == 0
    code, err = cli("aggregate", "--rows", str(out), "--out", str(tmp_path / "a"),
                    "--expect-shards", "3", "--rows-only")
    assert code == 0 and "1 rows" in err


def test_points_that_cannot_exist_are_refused_or_reported_never_dropped_silently(tmp_path):
    import io

    grid = {"seqs": [8], "head_dims": [8], "dtypes": ["float32"], "causal": [False],
            "shape_policy": "explicit", "batch": 1, "heads": 2}
    with pytest.raises(ConfigError, match=r"grid.gqa: ratio 3 divides no query head count"):
        from_dict({"grid": {**grid, "gqa": [1, 3]}})
    dec = {"enabled": True, "heads": 2, "head_dims": [8], "seqs_q": [1], "batches": [1],
           "dtypes": ["float32"], "gqa": [1]}
    with pytest.raises(ConfigError, match=r"decode.gqa: \[3\] do not divide decode.heads"):
        from_dict({"grid": grid, "decode": {**dec, "gqa": [1, 3]}})
    with pytest.raises(ConfigError, match="every point's K and V exceed"):
        from_dict({"grid": grid, "decode": {**dec, "seqs_kv": [1 << 20],
                                            "max_kv_gib": 1e-6}})
    # K+V at Skv = 8: 2 x 2 heads x 8 x 8 x 4 B = 1 KiB, under the cap; Skv = 4096 over it
    cfg = from_dict({"grid": grid, "methods": ["eager"], "device": "cpu",
                     "timing": {"warmup": 0, "reps": 1, "rounds": 1},
                     "decode": {**dec, "seqs_kv": [8, 4096], "max_kv_gib": 1e-6}})
    log = io.StringIO()
    assert run_bench(cfg, str(tmp_path / "o"), log=log) == 0
    assert ("bench: left out 1 decode point(s) whose K and V exceed decode.max_kv_gib = 1e-06"
            in log.getvalue())
    tokens = from_dict({"grid": {"seqs": [512], "head_dims": [64, 96], "gqa": [1, 32],
                                 "dtypes": ["float16"], "causal": [False]}})
    from tiledattention.bench.grid import left_out

    assert left_out(tokens) == ["left out 1 grid point(s) at D=96: GQA ratio(s) [32] do not "
                                "divide H=16"]


def test_register_refuses_an_empty_name():
    from tiledattention.errors import InputError
    from tiledattention.integrations.transformers import register

    for name in ("", "  ", " tiled"):
        with pytest.raises(InputError, match="must be a non-empty string"):
            register(name)


# -- Tracebacks ------------------------------------------------------------------------------

def test_a_second_sweep_into_one_directory_is_one_line_without_a_traceback(tmp_path):
    from tiledattention.bench.store import Lock
    from tiledattention.launchers.base import job_error

    out = tmp_path / "out"
    out.mkdir()
    with Lock(str(out / "rows-shard1of2.jsonl")):
        err = one_line(cli("sweep", "--config", str(tiny_config(tmp_path)), "--out",
                           str(out), "--shards", "2"))
    assert "another tiledattn bench is writing" in err and "rows-shard1of2" in err
    assert not (out / "logs").exists()  # nothing was submitted
    # a job that failed anyway (a race): its error, not submitit's wrapped traceback
    trace = ("Job (task=0) failed during processing with trace:\n---\nTraceback (most "
             "recent call last):\n  File \"x.py\", line 1, in <module>\n"
             "tiledattention.bench.store.RowsError: another tiledattn bench is writing x\n"
             "---\nYou can check full logs with 'job.stderr(0)'\n")
    assert job_error(trace) == "RowsError: another tiledattn bench is writing x"
