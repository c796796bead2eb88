"""Every bad input ends in one line naming it, exit 2, no traceback: the CLI's verbs, YAML
(alias bombs, duplicate keys), configs of impossible points or a million of them, and
files that would hang a read (a FIFO, /dev/zero, JSON nested past the recursion limit)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from speed import scaled  # tests/speed.py
from study_kit import (
    DEEP,
    ROOT,
    TINY,
    _row,
    _shard,
    cli,
    one_line,
    tiny_config,
    within,
)

from tiledattention.bench.config import ConfigError, from_dict, load_config
from tiledattention.bench.runner import run_bench

# 9**9 strings once expanded; an error message that prints the value never ends (grid is
# validated before methods, so the alias is reached first).
BOMB = "methods:\n  - &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  - &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")) + "grid: {seqs: [*i]}\n"


def test_a_yaml_alias_bomb_is_refused_at_once_without_echoing_it(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    budget = scaled(2)  # expanded, the bomb never ends; refused, it takes milliseconds
    start = time.monotonic()
    with pytest.raises(ConfigError, match="line 3: YAML aliases") as info:
        load_config(str(path))
    assert time.monotonic() - start < budget and len(str(info.value)) < 200
    code, err = cli("bench", "--config", str(path), "--out", str(tmp_path / "o"))
    assert code == 2 and "aliases" in err and len(err.splitlines()) == 1


def test_duplicate_yaml_keys_are_refused_naming_the_key(tmp_path):
    path = tiny_config(tmp_path, "seed: 1\nseed: 2\n")
    with pytest.raises(ConfigError, match="key 'seed' is given more than once"):
        load_config(str(path))


def test_an_empty_or_non_mapping_bench_config_is_refused(tmp_path):
    for text, got in (("", "an empty file"), ("- 1\n", "a list")):
        (tmp_path / "c.yaml").write_text(text)
        with pytest.raises(ConfigError, match=f"expected a mapping.*got {got}"):
            load_config(str(tmp_path / "c.yaml"))


@pytest.mark.parametrize("value", [float("nan"), -1.0, float("inf"), 0.0])
def test_non_finite_negative_or_zero_tolerances_are_refused(value):
    with pytest.raises(ConfigError, match=r"rtol_float16: \S+ must be"):
        from_dict({"correctness": {"rtol_float16": value}})


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


def test_a_grid_of_a_million_points_is_refused_with_its_count_and_a_limit_to_raise(
        tmp_path, monkeypatch):
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


@pytest.fixture
def probe_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("ok.yaml").write_text(TINY)
    Path("bomb.yaml").write_text(BOMB)
    Path("dup.yaml").write_text(TINY + "device: cpu\n")
    Path("empty.yaml").write_text("")
    Path("list.yaml").write_text("- 1\n")
    Path("bin.dat").write_bytes(bytes(range(256)) * 8)
    Path("nan.yaml").write_text(TINY + "correctness: {rtol_bfloat16: .nan}\n")
    Path("huge.yaml").write_text(TINY + "seed: 999999999999999999999999999\n")
    Path("afile").write_text("x")
    Path("list.json").write_text("[1]\n")
    Path("rows").mkdir()
    Path("rows/rows-shard0of1.jsonl").write_text('[1]\n{"torn')
    return tmp_path


BAD = [
    "bench --config bomb.yaml", "bench --config dup.yaml", "bench --config empty.yaml",
    "bench --config list.yaml", "bench --config bin.dat", "bench --config nosuch.yaml",
    "bench --config rows", "bench --config nan.yaml", "bench --config huge.yaml",
    "bench --config ok.yaml --out afile", "bench --config ok.yaml --out afile/sub",
    "bench --config ok.yaml --out /sys/tiledattn-probe", "bench --config ok.yaml --shard 2/2",
    "bench --config ok.yaml --shard x", "bench --nosuchflag",
    "sweep --config ok.yaml --shards 2 --only 2", "sweep --config ok.yaml --only 0 0",
    "sweep --config ok.yaml --shards 0", "sweep --config ok.yaml --launcher nope",
    "sweep --config ok.yaml --launcher-options [1]",
    "sweep --config ok.yaml --launcher-options {bad", "sweep --config bomb.yaml",
    "aggregate --rows rows --out a", "aggregate --rows nosuch --out a",
    "aggregate --rows afile --out a", "aggregate --rows rows --out a --expect-shards 3",
    "figures --rows nosuch.jsonl --out f", "figures --rows bin.dat --out f",
    "figures --rows empty.yaml --out f",
    "manifest --runs nosuch --out m.json", "manifest --runs rows --config bomb.yaml --out m",
    "bundle create --study nosuch --config ok.yaml --out b",
    "bundle create --study rows --config bomb.yaml --out b",
    "bundle create --study rows --config empty.yaml --out b",
    "bundle verify nosuch", "bundle verify bin.dat", "bundle verify afile",
    "profile --shape bad --out p", "profile --shape float16:causal:128:4096 --out p --warmup -1",
    "profile --shape float16:causal:128:4096 --out p --tokens 0",
    "profile --shape float16:causal:128:4096 --out afile",
    "offline pack w --torch=--index-url=http://x", "offline pack w --python 3.x",
    "offline pack w --extras nope", "offline pack w --platform a/b",
    "tune --seqs 0", "tune --reps -5", "tune --compile-timeout nan",
    "tune --state afile/x/s.jsonl --out t.json", "check --json rows",
]


@pytest.mark.parametrize("command", BAD)
def test_every_bad_input_ends_in_one_line_and_exit_2(probe_dir, command):
    code, err = cli(*shlex.split(command))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    verb = command.split(" --")[0].split(" ")[0]
    assert lines[0].startswith("tiledattn") and "Traceback" not in err, err
    assert verb in lines[0] or "unrecognized arguments" in lines[0]


def test_bad_input_through_the_installed_command_has_no_traceback(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    run = subprocess.run([sys.executable, "-m", "tiledattention.cli", "bench", "--config",
                          str(tmp_path / "bomb.yaml")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "Traceback" not in run.stderr
