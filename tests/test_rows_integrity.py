"""Rows are never mixed, torn or silently wrong: one config per results file and study,
one writer at a time, atomic writes (a killed bench, aggregate or writer leaves the old
file or the new), unreadable lines counted, and every published number finite and
physical or refused naming the row."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from study_kit import (
    ROOT,
    _create,
    _make,
    _row,
    _shard,
    _study_with_rows,
    _tiny_study,
    cli,
    one_line,
    tiny_config,
)

from tiledattention.bench.config import load_config
from tiledattention.bench.runner import run_bench
from tiledattention.bench.store import read_rows


def test_resume_under_a_changed_seed_is_refused_and_remeasure_sets_old_rows_aside(tmp_path):
    from tiledattention.bench.store import RowsError

    out = tmp_path / "out"
    assert run_bench(load_config(str(tiny_config(tmp_path))), str(out)) == 0
    changed = load_config(str(tiny_config(tmp_path, "seed: 7\n")))
    with pytest.raises(RowsError, match="measured under another config.*--remeasure"):
        run_bench(changed, str(out))
    assert run_bench(changed, str(out), remeasure=True) == 0
    rows = read_rows(str(out / "rows-shard0of1.jsonl"))
    assert [r["config_hash"] for r in rows] == [changed.measure_digest()]
    assert [r["seed"] for r in rows] == [7]
    assert len(list(out.glob("stale-rows-shard0of1-*.jsonl"))) == 1


def test_a_second_bench_into_the_same_results_file_is_refused(tmp_path):
    from tiledattention.bench.store import Lock

    out = tmp_path / "out"
    out.mkdir()
    with Lock(str(out / "rows-shard0of1.jsonl")):
        code, err = cli("bench", "--config", str(tiny_config(tmp_path)), "--out", str(out))
    assert code == 2 and "another tiledattn bench is writing" in err
    assert not (out / "rows-shard0of1.jsonl").exists()


def test_bench_skips_a_valid_json_line_that_is_not_a_row(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rows-shard0of1.jsonl").write_text("[1]\nnull\n")
    code, err = cli("bench", "--config", str(tiny_config(tmp_path)), "--out", str(out))
    assert code == 0 and "skipped 2 unreadable line(s)" in err
    assert [r["method"] for r in read_rows(str(out / "rows-shard0of1.jsonl"))] == ["eager"]


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


def test_aggregate_refuses_rows_of_two_configs(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    for i, h in enumerate(("aaa", "bbb")):
        (rows / f"rows-shard{i}of2.jsonl").write_text(json.dumps(
            {"point_key": f"p{i}", "method": "eager", "status": "ok", "config_hash": h}) + "\n")
    code, err = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"),
                    "--rows-only")
    assert code == 2 and "2 different configs (aaa: 1 rows, bbb: 1 rows)" in err
    assert not (tmp_path / "a").exists()


def test_aggregate_counts_unreadable_lines_and_fails_on_zero_rows(tmp_path):
    rows = tmp_path / "rows"
    rows.mkdir()
    good = {"point_key": "p", "method": "eager", "status": "ok", "config_hash": "h"}
    (rows / "rows-shard0of1.jsonl").write_text('[1, 2]\n"text"\n{"point_key": "torn\n'
                                               + json.dumps(good) + "\n")
    code, err = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "a"),
                    "--rows-only")
    assert code == 0 and "skipped 3 unreadable line(s)" in err
    (rows / "rows-shard0of1.jsonl").write_text("[1]\n")
    code, err = cli("aggregate", "--rows", str(rows), "--out", str(tmp_path / "b"),
                    "--rows-only")
    assert code == 2 and "no rows in" in err and "1 unreadable lines" in err


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


def test_a_killed_aggregate_leaves_no_rows_without_tables_and_create_needs_the_tables(
        tmp_path, monkeypatch):
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
