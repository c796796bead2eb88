"""The tuning table: buckets, lookup (exact, nearest, fallback, override) and bad files."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from study_kit import cli

import tiledattention as ta
from tiledattention.bench.grid import Point, pinned
from tiledattention.bench.runner import measure
from tiledattention.bench.store import ResultStore
from tiledattention.schedules import policy
from tiledattention.schedules.schedule import Schedule
from tiledattention.schedules.space import QUICK_SPACE, candidates, rejection
from tiledattention.schedules.table import Bucket, Entry, ScheduleTable, TableError, seq_bucket
from tiledattention.stages.tune import build_table, paper_grid, tune_config, tune_plan


def bucket(**kw):
    base = dict(cc="9.0", dtype="float16", head_dim=128, causal=False, s_bucket=4096, gqa=1)
    return Bucket(**{**base, **kw})


def table_with(*entries):
    t = ScheduleTable()
    for b, s in entries:
        t.add(Entry(bucket=b, best=s, best_tflops=500.0, runner_up=Schedule(),
                    runner_up_tflops=450.0))
    return t


@pytest.mark.parametrize("sq,skv,want", [(1, 1, 256), (1, 4096, 4096), (4097, 17, 8192),
                                         (1000, 1000, 1024), (10 ** 6, 1, 16384)])
def test_seq_bucket_is_the_next_power_of_two_clamped(sq, skv, want):
    assert seq_bucket(sq, skv) == want


def test_exact_bucket_wins_over_nearest():
    fast = Schedule(64, 128, 2)
    t = table_with((bucket(), fast), (bucket(s_bucket=8192), Schedule(128, 64, 2)))
    assert t.lookup(bucket()) == (fast, "exact")


def test_nearest_bucket_prefers_same_causality_and_close_sizes():
    a, b = Schedule(64, 128, 2), Schedule(64, 64, 4)
    t = table_with((bucket(s_bucket=2048), a), (bucket(causal=True, s_bucket=4096), b))
    assert t.lookup(bucket(s_bucket=4096)) == (a, "nearest")
    assert t.lookup(bucket(causal=True, s_bucket=1024)) == (b, "nearest")


def test_other_gpus_entries_are_never_used():
    t = table_with((bucket(cc="10.0"), Schedule(64, 128, 2)))
    assert t.lookup(bucket()) is None


def test_sensitivity_is_the_runner_up_slowdown():
    e = Entry(bucket=bucket(), best=Schedule(), best_tflops=500.0, runner_up=Schedule(64, 128),
              runner_up_tflops=400.0)
    assert e.sensitivity == pytest.approx(0.2)


def test_table_round_trips_through_its_file(tmp_path):
    t = table_with((bucket(), Schedule(64, 128, 2)), (bucket(dtype="bfloat16"), Schedule()),
                   (bucket(head_dim=64), Schedule(128, 128, 2, worker_warps=8)))
    t.save(str(tmp_path / "t.json"))
    back = ScheduleTable.load(str(tmp_path / "t.json"))
    assert back.entries == t.entries


def test_entries_written_before_worker_warps_load_as_the_compilers_choice(tmp_path):
    old = {"format": "tiledattention-schedule-table/1", "meta": {}, "entries": [{
        "bucket": {"cc": "9.0", "dtype": "float16", "head_dim": 128, "causal": False,
                   "s_bucket": 4096, "gqa": 1},
        "best": {"tile_m": 64, "tile_n": 128, "occupancy": 2, "num_ctas": 1, "latency_k": 2,
                 "latency_v": 4, "heavy_first": True}, "best_tflops": 620.0}]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (entry,) = ScheduleTable.load(str(tmp_path / "old.json")).entries.values()
    assert entry.best == Schedule(64, 128, 2) and entry.best.worker_warps is None
    # and a schedule left to the compiler is written as before
    assert "worker_warps" not in entry.to_json()["best"]


@pytest.mark.parametrize("content,words", [
    (None, "cannot read"), ("{not json", "not valid JSON"), ('{"format": "x"}', "'format'"),
    ('{"format": "tiledattention-schedule-table/1", "entries": [{"bucket": {}}]}',
     "entry 0 is malformed"),
])
def test_bad_table_files_raise_table_error_naming_the_file(tmp_path, content, words):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TableError, match=words) as info:
        ScheduleTable.load(str(path))
    assert str(path) in str(info.value)


def test_policy_uses_a_user_table_then_falls_back_to_the_default(tmp_path, monkeypatch):
    monkeypatch.setattr(policy, "_capability", lambda index: "9.0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q = torch.empty(4, 16, 4096, 128, dtype=torch.float16, device="meta")
    mine = Schedule(128, 128, 1, 1, 3, 3, worker_warps=8)
    table_with((bucket(), mine)).save(str(tmp_path / "mine.json"))
    try:
        ta.set_schedule_table(str(tmp_path / "mine.json"))
        assert policy.choose_schedule(q, q, False) == (mine, "exact")
        monkeypatch.setattr(policy, "_capability", lambda index: "12.0")
        policy._choose.cache_clear()
        assert policy.choose_schedule(q, q, False) == (ta.default_schedule(128, False),
                                                       "default")
    finally:
        ta.set_schedule_table(None)


def test_environment_variable_points_at_a_user_table(tmp_path, monkeypatch):
    mine = Schedule(64, 32, 2)
    table_with((bucket(), mine)).save(str(tmp_path / "env.json"))
    monkeypatch.setenv(policy.ENV_VAR, str(tmp_path / "env.json"))
    try:
        ta.set_schedule_table(None)  # reload: the variable is read once per load
        assert policy.active_table().lookup(bucket()) == (mine, "exact")
    finally:
        monkeypatch.delenv(policy.ENV_VAR)
        ta.set_schedule_table(None)


def test_a_gzipped_table_round_trips_and_its_bytes_depend_only_on_the_table(tmp_path):
    import gzip

    t = table_with((bucket(), Schedule(64, 128, 2)), (bucket(head_dim=64), Schedule()))
    t.save(str(tmp_path / "t.json"))
    t.save(str(tmp_path / "t.json.gz"))
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()) == \
        (tmp_path / "t.json").read_bytes()
    assert ScheduleTable.load(str(tmp_path / "t.json.gz")).entries == t.entries
    first = (tmp_path / "t.json.gz").read_bytes()
    t.save(str(tmp_path / "t.json.gz"))  # no timestamp inside: a re-save is the same bytes
    assert (tmp_path / "t.json.gz").read_bytes() == first


@pytest.mark.parametrize("kind,words", [
    ("plain", "not a gzip file"), ("cut", "cut short"), ("bomb", "unpacks to more than"),
    ("empty", "not valid JSON")])
def test_bad_gzipped_tables_raise_table_error_naming_the_file(tmp_path, kind, words):
    import gzip

    from tiledattention.schedules import table as table_module

    path = tmp_path / "bad.json.gz"
    good = gzip.compress(b'{"format": "tiledattention-schedule-table/1"}')
    path.write_bytes({"plain": b"{}", "cut": good[:20], "empty": gzip.compress(b""),
                      "bomb": gzip.compress(b" " * (table_module.TABLE_MAX + 2))}[kind])
    with pytest.raises(TableError, match=words) as info:
        ScheduleTable.load(str(path))
    assert str(path) in str(info.value)


def test_shipped_tables_load_and_hold_only_valid_schedules():
    # Shipped gzipped (tiledattention/schedules/tables/*.json.gz, package data).
    assert [p.rsplit("/", 1)[1] for p in policy.shipped_table_paths()] == ["h100.json.gz"]
    for path in policy.shipped_table_paths():
        assert len(ScheduleTable.load(path).entries) >= 98
        for entry in ScheduleTable.load(path).entries.values():
            assert rejection(entry.best, entry.bucket.head_dim) is None


@pytest.mark.parametrize("d", [64, 96, 128, 160, 256])
def test_search_space_rejects_with_reasons(d):
    valid, rejected = candidates(d)
    assert valid and all(isinstance(s, Schedule) for s in valid)
    assert all("register" in r or "tensor cores" in r for r in rejected)


def test_explicit_schedule_past_the_register_file_is_refused():
    from tiledattention.kernel.validate import Problem, resolve_schedule

    problem = Problem(1, 1, 1, 16, 16, 256, False, 0.0625)
    with pytest.raises(ta.ScheduleError, match="register"):
        resolve_schedule(Schedule(256, 256, 4), problem)


def test_paper_grid_has_80_points_with_fixed_tokens_and_width():
    grid = paper_grid()
    assert len(grid) == 80
    assert all(p.batch * p.seq_q == 16384 and p.seq_kv == p.seq_q for p in grid)
    assert {(p.head_dim, p.heads) for p in grid} == {(64, 32), (96, 16), (128, 16), (160, 16)}


def test_tuning_measures_pinned_methods_through_the_harness_and_resumes(tmp_path):
    point = Point("float16", True, 64, 128, 128, 1, 4)
    plan = tune_plan([point], "quick")
    methods = plan[0][1]
    assert methods == [pinned(s.label()) for s in QUICK_SPACE if rejection(s, 64) is None]
    store = ResultStore(str(tmp_path / "state.jsonl"))
    log = io.StringIO()
    cfg = tune_config(warmup=1, reps=2)
    assert measure(plan, cfg, store, torch.device("cpu"), log) is False
    # On a CPU every candidate is a row saying why it did not run, and a rerun measures
    # nothing again: the state is the harness' row store.
    assert {r["status"] for r in store.rows.values()} == {"unavailable"}
    assert sorted(m for _, m in store.rows) == sorted(methods)
    again = ResultStore(store.path)
    measure(plan, cfg, again, torch.device("cpu"), log)
    assert len((tmp_path / "state.jsonl").read_text().splitlines()) == len(methods)


def test_tuning_table_has_winner_runner_up_sensitivity_and_failures(tmp_path):
    p = paper_grid(seqs=(512,), head_dims=(64,), dtypes=("float16",))[0]
    store = ResultStore(str(tmp_path / "state.jsonl"))
    for s, status, tf in ((Schedule(64, 64, 4), "ok", 400.0), (Schedule(64, 128, 2), "ok", 450.0),
                          (Schedule(128, 128, 1), "error", None)):
        store.append({"point_key": p.key(), "method": pinned(s.label()), "status": status,
                      **({"tflops": tf} if tf else {})})
    store.append({"point_key": p.key(), "method": "torch_sdpa", "status": "ok", "tflops": 900.0})
    with open(store.path, "a") as f:
        f.write('{"point_key": "torn')  # a crash mid-write
    again = ResultStore(store.path)
    assert again.torn_lines == 1
    table = build_table([p], again.rows.values(), "9.0", "H100")
    (entry,) = table.entries.values()
    assert entry.best == Schedule(64, 128, 2) and entry.runner_up == Schedule(64, 64, 4)
    assert entry.sensitivity == pytest.approx(1 - 400 / 450)
    assert entry.failed == ("128x128_o1_c1_lk2_lv4:error",) and entry.candidates == 3
    assert json.loads(json.dumps(table.to_json()))["entries"][0]["bucket"]["s_bucket"] == 512


def test_tune_without_a_gpu_never_replaces_an_existing_table(tmp_path):
    import torch

    from tiledattention.schedules.backward import BwdSchedule
    from tiledattention.schedules.schedule import Schedule
    from tiledattention.schedules.table import Bucket, Entry, ScheduleTable
    from tiledattention.stages.tune import TuneTask

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the task would tune instead")
    table = ScheduleTable(meta={"gpu": "H100"})
    bucket = Bucket("9.0", "float16", 64, False, 512)
    table.add(Entry(bucket, Schedule(64, 128, 2), 500.0))
    table.add(Entry(bucket, BwdSchedule.from_label("kv64x64_q64x64_o1"), 300.0))
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


# Points the shipped H100 table resolved to before its forward and backward entries became
# one class (captured on the old code over 2048 buckets, every kind): (cc, dtype, head dim,
# causal, S bucket, GQA) -> (forward, backward, deterministic backward), each (label, how).
SHIPPED_POINTS = [
    (("9.0", "float16", 128, True, 4096, 1),
     ("64x128_o3_c1_lk2_lv4", "exact"), ("kv64x128_q128x64_o1_w8_keyrows", "exact"),
     ("kv64x128_q128x64_o1_w8_keyrows", "exact")),
    (("9.0", "bfloat16", 64, False, 4096, 1),
     ("128x64_o2_c1_lk2_lv4_w8", "exact"), ("kv64x64_q64x64_o2_atomic", "exact"),
     ("kv128x64_q64x128_o2", "exact")),
    (("9.0", "bfloat16", 64, False, 1024, 4),
     ("64x64_o4_c1_lk2_lv4", "nearest"), ("kv128x64_q64x128_o2", "nearest"),
     ("kv128x64_q64x128_o2", "nearest")),
    (("9.0", "float16", 96, False, 512, 1),
     ("128x64_o2_c1_lk2_lv4", "exact"), ("kv64x64_q64x64_o2", "nearest"),
     ("kv64x64_q64x64_o2", "nearest")),
    (("9.0", "bfloat16", 256, True, 16384, 8),
     ("128x128_o1_c1_lk2_lv4_w8", "nearest"), ("kv64x64_q64x64_o1_w8", "nearest"),
     ("kv64x64_q64x64_o1_w8", "nearest")),
    (("8.0", "float16", 128, True, 4096, 1),
     ("64x128_o2_c1_lk2_lv4", "default"), ("kv64x64_q64x64_o2", "default"),
     ("kv64x64_q64x64_o2", "default")),
]


@pytest.mark.parametrize("point,fwd,bwd,det", SHIPPED_POINTS)
def test_shipped_table_resolves_each_kind_to_the_schedule_it_did(monkeypatch, point, fwd,
                                                                   bwd, det):
    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    policy.set_schedule_table(None)
    bucket = Bucket(*point)
    got = [(s.label(), how) for s, how in (policy._choose(bucket),
                                           policy._choose_bwd(bucket, False),
                                           policy._choose_bwd(bucket, True))]
    assert got == [fwd, bwd, det]


def test_shipped_table_saves_back_to_its_own_bytes(tmp_path):
    """One entry class, one loader, one writer: what loads writes the same file again."""
    for path in policy.shipped_table_paths():
        table = ScheduleTable.load(path)
        assert {e.backward for e in table.entries.values()} == {False}
        assert {e.backward for e in table.backward.values()} == {True}
        out = tmp_path / "again.json.gz"
        table.save(str(out))
        assert out.read_bytes() == Path(path).read_bytes()
