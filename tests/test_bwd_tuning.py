"""The backward's schedule room: labels, rejection, default, search space, table entries,
the policy's fallback, and backward tuning as a client of the harness (all on CPU)."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys

import pytest
import torch

import tiledattention as ta
from tiledattention.bench.config import BenchConfig, validate
from tiledattention.bench.grid import Point, pinned, pinned_bwd, pinned_bwd_label, pinned_label
from tiledattention.bench.methods import get_method
from tiledattention.bench.runner import measure
from tiledattention.bench.store import ResultStore
from tiledattention.errors import ConfigError, ScheduleError
from tiledattention.schedules import policy
from tiledattention.schedules.backward import (
    BWD_QUICK_SPACE,
    BwdSchedule,
    bwd_rejection,
    bwd_space_for,
    default_bwd_schedule,
)
from tiledattention.schedules.schedule import Schedule
from tiledattention.schedules.table import Bucket, Entry, ScheduleTable, TableError
from tiledattention.stages.tune import build_table, merge_into, paper_grid, tune_config, tune_plan


def bucket(**kw):
    base = dict(cc="9.0", dtype="float16", head_dim=128, causal=False, s_bucket=4096, gqa=1)
    return Bucket(**{**base, **kw})


@pytest.mark.parametrize("s", [*BWD_QUICK_SPACE, BwdSchedule(dq="atomic")],
                         ids=lambda s: s.label())
def test_backward_labels_round_trip(s):
    assert BwdSchedule.from_label(s.label()) == s


@pytest.mark.parametrize("label,words", [
    ("kv64x64_q64x64", "not like kv64x64_q64x64_o1"),
    ("kv64x64_q64x64_o1_fast", "not like"),
    ("kv48x64_q64x64_o1", "dkdv_m=48 is not one of"),
    ("kv64x64_q64x64_o9", "occupancy=9 is not in"),
])
def test_bad_backward_labels_are_one_line_schedule_errors(label, words):
    with pytest.raises(ScheduleError, match=words) as info:
        BwdSchedule.from_label(label)
    assert "\n" not in str(info.value)


def test_default_follows_the_backward_tune_and_fits_every_head_dim():
    for causal in (False, True):
        assert default_bwd_schedule(64, causal).label() == "kv128x64_q64x128_o2"
        assert default_bwd_schedule(128, causal).label() == "kv64x64_q64x64_o2"
        assert default_bwd_schedule(160, causal).label() == "kv128x64_q64x128_o2"
        # D > 160: two consumer warp groups (four worker warps spill dK/dV,
        # benchmarks/notes/backward.md §28)
        assert default_bwd_schedule(192, causal).label() == "kv64x64_q64x64_o1_w8"
        assert default_bwd_schedule(256, causal).label() == "kv64x64_q64x64_o1_w8"
    for d in range(8, 257, 8):
        for causal in (False, True):
            s = default_bwd_schedule(d, causal)
            assert s.deterministic
            assert bwd_rejection(s, d) is None, (d, causal, s.label())


def test_four_worker_warps_are_refused_where_the_sass_spilled_dkdv():
    assert "spill" in bwd_rejection(BwdSchedule.from_label("kv64x64_q64x64_o1"), 192)
    assert "spill" in bwd_rejection(BwdSchedule.from_label("kv64x64_q64x64_o2"), 192)
    assert "spill" in bwd_rejection(BwdSchedule.from_label("kv64x64_q64x64_o1"), 256)
    assert bwd_rejection(BwdSchedule.from_label("kv64x64_q64x64_o1_w8"), 256) is None
    assert bwd_rejection(BwdSchedule.from_label("kv128x64_q64x128_o2"), 160) is None


def test_128_key_tiles_are_refused_where_they_measured_slow():
    s = BwdSchedule.from_label("kv64x128_q128x64_o1")
    assert bwd_rejection(s, 64) is None  # the fastest at D=64
    assert "spill" in bwd_rejection(s, 128)  # 1.49-1.57x slower at D=128
    assert "tensor cores" in bwd_rejection(BwdSchedule(64, 32, 64, 64, 1), 64)


def test_backward_search_space_per_head_dim():
    assert len(bwd_space_for(64, "quick")) == 10
    # 128-key dK/dV tiles fit D=128 only over eight worker warps (160 registers a thread).
    assert [s.label() for s in bwd_space_for(128, "quick")] == [
        "kv64x64_q64x64_o1", "kv64x64_q64x64_o2", "kv128x64_q64x128_o1", "kv128x64_q64x128_o2",
        "kv64x128_q128x64_o1_w8", "kv64x128_q128x128_o1_w8", "kv128x64_q64x128_o1_w8",
        "kv64x64_q64x64_o1_w8"]
    # D=256: only 64 query rows and 64 keys over eight worker warps
    assert [s.label() for s in bwd_space_for(256, "quick")] == ["kv64x64_q64x64_o1_w8"]
    assert all(bwd_rejection(s, 96) is None for s in bwd_space_for(96, "full"))
    with pytest.raises(ValueError, match="valid"):
        bwd_space_for(64, "huge")


def test_backward_label_round_trips_worker_warps_and_atomics():
    s = BwdSchedule(64, 128, 128, 64, 1, dq="atomic", worker_warps=8)
    assert s.label() == "kv64x128_q128x64_o1_w8_atomic"
    assert BwdSchedule.from_label(s.label()) == s
    assert s.hints() == {"occupancy": 1, "num_worker_warps": 8}
    with pytest.raises(ScheduleError, match="worker_warps"):
        BwdSchedule(worker_warps=6)


def test_keys_as_rows_is_a_labelled_field_off_by_default_and_in_no_search_space():
    """Keys as the dK/dV MMA rows (``_keyrows``): named by the label, in no search space
    or default, a dK/dV constant."""
    s = BwdSchedule(64, 128, 128, 64, 1, dq="atomic", worker_warps=8, key_rows=True)
    assert s.label() == "kv64x128_q128x64_o1_w8_atomic_keyrows"
    assert BwdSchedule.from_label(s.label()) == s
    assert BwdSchedule.from_label("kv64x64_q64x64_o2_keyrows").key_rows
    assert not BwdSchedule().key_rows and "_keyrows" not in BwdSchedule().label()
    for d in (128, 256):
        for space in ("quick", "full"):
            assert not any(x.key_rows for x in bwd_space_for(d, space))
    for d in (64, 128, 160, 192, 256):
        for causal in (False, True):
            assert not default_bwd_schedule(d, causal).key_rows
    # the dK/dV kernel gets it as a constant; the dQ kernel has no such flag
    from tiledattention.kernel.variant import BwdVariant

    v = BwdVariant("bfloat16", 128, False, s)
    assert v.constants("attention_bwd_dkdv")["KEY_ROWS"] is True
    assert "KEY_ROWS" not in v.constants("attention_bwd_dq")


def test_dkdv_masks_every_causal_query_tile_only_above_d128():
    """MASK_ALL: one causal loop body (the mask on every query tile) where the masked and
    unmasked versions of it would spill (D > 128); full attention never masks."""
    from tiledattention.kernel.variant import BwdVariant

    s = BwdSchedule.from_label("kv64x64_q64x64_o1_w8")
    for d, causal, want in ((256, True, True), (192, True, True), (256, False, False),
                            (128, True, False)):
        assert BwdVariant("bfloat16", d, causal, s).constants(
            "attention_bwd_dkdv")["MASK_ALL"] is want, (d, causal)


def bwd_entry(b, label, tflops=300.0):
    return Entry(bucket=b, best=BwdSchedule.from_label(label), best_tflops=tflops,
                    runner_up=BwdSchedule(), runner_up_tflops=tflops * 0.9, gpu="H100",
                    candidates=4, failed=("kv128x64_q64x128_o2:error",))


def test_table_round_trips_backward_entries_next_to_forward_ones(tmp_path):
    t = ScheduleTable(meta={"gpu": "H100"})
    t.add(Entry(bucket=bucket(), best=Schedule(64, 128, 2), best_tflops=600.0))
    t.add(bwd_entry(bucket(), "kv128x64_q64x128_o1"))
    t.save(str(tmp_path / "t.json"))
    raw = json.loads((tmp_path / "t.json").read_text())
    assert raw["backward"][0]["best"] == "kv128x64_q64x128_o1"
    back = ScheduleTable.load(str(tmp_path / "t.json"))
    assert back.entries == t.entries and back.backward == t.backward
    assert back.lookup_bwd(bucket()) == (BwdSchedule(128, 64, 64, 128, 1), "exact")
    assert back.lookup_bwd(bucket(s_bucket=1024))[1] == "nearest"
    assert back.lookup_bwd(bucket(cc="12.0")) is None


def test_tables_without_backward_entries_load_and_write_as_before(tmp_path):
    for path in policy.shipped_table_paths():
        table = ScheduleTable.load(path)
        assert table.entries
        assert all(bwd_rejection(e.best, e.bucket.head_dim) is None
                   for e in table.backward.values())
    t = ScheduleTable()
    t.add(Entry(bucket=bucket(), best=Schedule(), best_tflops=1.0))
    assert "backward" not in t.to_json()


def test_a_malformed_backward_entry_names_the_file_and_item(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": "tiledattention-schedule-table/1", "entries": [],
                                "backward": [{"bucket": bucket().__dict__, "best": "kv1",
                                              "best_tflops": 1}]}))
    with pytest.raises(TableError, match="backward entry 0 is malformed") as info:
        ScheduleTable.load(str(path))
    assert str(path) in str(info.value)


def test_policy_picks_exact_then_nearest_then_the_default(tmp_path, monkeypatch):
    monkeypatch.setattr(policy, "_capability", lambda index: "9.0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q = torch.empty(4, 16, 4096, 128, dtype=torch.float16, device="meta")
    t = ScheduleTable()
    t.add(bwd_entry(bucket(), "kv64x64_q64x64_o2"))
    # a pick that does not fit its head dim (128-key tiles at D=128) is not used
    t.add(bwd_entry(bucket(causal=True), "kv64x128_q128x64_o1"))
    t.save(str(tmp_path / "mine.json"))
    try:
        ta.set_schedule_table(str(tmp_path / "mine.json"))
        mine = BwdSchedule.from_label("kv64x64_q64x64_o2")
        assert policy.choose_bwd_schedule(q, q, False) == (mine, "exact")
        short = q[:, :, :1000]
        assert policy.choose_bwd_schedule(short, short, False) == (mine, "nearest")
        assert policy.choose_bwd_schedule(q, q, True) == (default_bwd_schedule(128, True),
                                                          "default")
        monkeypatch.setattr(policy, "_capability", lambda index: "12.0")
        policy._choose_bwd.cache_clear()
        assert policy.choose_bwd_schedule(q, q, False) == (default_bwd_schedule(128, False),
                                                           "default")
    finally:
        ta.set_schedule_table(None)


REDUCE_ADD = BwdSchedule.from_label("kv64x128_q128x64_o1_w8_atomic")
SEVEN_MM = BwdSchedule.from_label("kv64x64_q64x64_o2")


def test_a_reduce_add_winner_serves_its_own_bucket_and_never_deterministic_mode():
    t = ScheduleTable()
    t.add(Entry(bucket=bucket(), best=REDUCE_ADD, best_tflops=445.0, runner_up=SEVEN_MM,
                   runner_up_tflops=422.0))
    assert t.lookup_bwd(bucket()) == (REDUCE_ADD, "exact")
    assert t.lookup_bwd(bucket(), deterministic=True) == (SEVEN_MM, "exact")
    # a nearest bucket was not measured with it: the deterministic schedule stands in
    assert t.lookup_bwd(bucket(s_bucket=8192)) == (SEVEN_MM, "nearest")


def test_a_reduce_add_winner_without_a_deterministic_runner_up_is_refused(tmp_path):
    path = tmp_path / "t.json"
    for runner_up in ({}, {"runner_up": "kv64x64_q64x64_o1_atomic", "runner_up_tflops": 1}):
        raw = {"bucket": bucket().__dict__, "best": REDUCE_ADD.label(), "best_tflops": 2,
               **runner_up}
        path.write_text(json.dumps({"format": "tiledattention-schedule-table/1",
                                    "entries": [], "backward": [raw]}))
        with pytest.raises(TableError, match="backward entry 0 .*not deterministic"):
            ScheduleTable.load(str(path))


def test_the_shipped_backward_entries_reach_the_policy():
    """The shipped tables' backward lists are merged like their forward entries (they were
    once dropped, and every call ran ``default_bwd_schedule``)."""
    ta.set_schedule_table(None)
    shipped = {}
    for path in policy.shipped_table_paths():
        shipped.update(ScheduleTable.load(path).backward)
    assert shipped and policy.active_table().backward == shipped


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s", [1024, 4096, 8192])
def test_wide_heads_get_two_consumer_warp_groups_from_the_shipped_table(dtype, causal, s):
    # D = 160 / 192: 128 query rows a step over eight warps (tuned: benchmarks/notes/backward.md
    # §37c); D = 224 /256: 64, since 128 rows lose the warp-group MMAs there, even where the nearest
    # bucket (D = 192 for fp16 D = 224) names them.
    ta.set_schedule_table(None)
    rows128 = BwdSchedule.from_label("kv128x64_q64x128_o1_w8")
    w8 = BwdSchedule.from_label("kv64x64_q64x64_o1_w8")
    for d, want in ((192, rows128), (224, w8), (256, w8)):
        for det in (False, True):
            b = bucket(dtype=dtype, head_dim=d, causal=causal, s_bucket=s)
            assert policy._choose_bwd(b, det)[0] == want, (d, det)


def test_128_query_rows_per_dkdv_step_are_refused_above_d192():
    rows128 = BwdSchedule.from_label("kv128x64_q64x128_o1_w8")
    assert bwd_rejection(rows128, 192) is None
    assert "without warp-group MMAs" in bwd_rejection(rows128, 224)
    assert "without warp-group MMAs" in bwd_rejection(rows128, 256)


KEY_ROWS = BwdSchedule.from_label("kv64x128_q128x64_o1_w8_keyrows")


@pytest.mark.parametrize("d,refused", [(96, False), (128, False), (160, True), (192, True)])
def test_keys_as_rows_over_128_keys_is_refused_where_its_sass_spills(d, refused):
    assert (bwd_rejection(KEY_ROWS, d) is not None) == refused


def test_a_nearest_bucket_whose_pick_cannot_run_the_head_dim_lends_its_runner_up(tmp_path):
    t = ScheduleTable(meta={"gpu": "H100"})
    t.add(Entry(bucket=bucket(), best=KEY_ROWS, best_tflops=449.0,
                   runner_up=BwdSchedule.from_label("kv64x64_q64x64_o2"),
                   runner_up_tflops=393.0, gpu="H100", candidates=3))
    t.save(str(tmp_path / "t.json"))
    ta.set_schedule_table(str(tmp_path / "t.json"))
    try:
        for det in (False, True):
            assert policy._choose_bwd(bucket(head_dim=96), det) == (KEY_ROWS, "nearest")
            assert policy._choose_bwd(bucket(head_dim=160), det) == (
                BwdSchedule.from_label("kv64x64_q64x64_o2"), "nearest")
    finally:
        ta.set_schedule_table(None)


def test_the_shipped_d128_long_buckets_take_keys_as_rows_in_both_modes():
    ta.set_schedule_table(None)
    for dtype in ("bfloat16", "float16"):
        for causal in (False, True):
            for s in (4096, 8192):
                b = bucket(dtype=dtype, causal=causal, s_bucket=s)
                for det in (False, True):
                    assert policy._choose_bwd(b, det) == (KEY_ROWS, "exact"), (b, det)


def test_the_shipped_reduce_add_entries_carry_their_deterministic_runner_up():
    ta.set_schedule_table(None)
    fast = [e for e in policy.active_table().backward.values() if not e.best.deterministic]
    assert {(e.bucket.head_dim, e.bucket.s_bucket) for e in fast} == {(64, 4096), (64, 8192)}
    for e in fast:
        assert e.runner_up.deterministic and e.best_tflops >= 1.03 * e.runner_up_tflops
        assert policy._choose_bwd(e.bucket, True) == (e.runner_up, "exact")
        assert policy._choose_bwd(e.bucket, False) == (e.best, "exact")


@pytest.fixture
def on_h100(monkeypatch):
    monkeypatch.setattr(policy, "_capability", lambda index: "9.0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    ta.set_schedule_table(None)
    yield
    torch.use_deterministic_algorithms(False)


def test_the_policy_follows_torchs_deterministic_mode(on_h100):
    q = torch.empty(2, 32, 8192, 64, dtype=torch.bfloat16, device="meta")
    assert not policy.choose_bwd_schedule(q, q, False)[0].deterministic
    torch.use_deterministic_algorithms(True)
    assert policy.choose_bwd_schedule(q, q, False) == (
        BwdSchedule.from_label("kv128x64_q64x128_o2"), "exact")
    torch.use_deterministic_algorithms(True, warn_only=True)  # still deterministic mode
    assert policy.choose_bwd_schedule(q, q, False)[0].deterministic


def test_the_backward_plan_is_deterministic_under_torchs_switch_and_for_variants(on_h100):
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention import mods as M
    from tiledattention import variants
    from tiledattention.kernel import plan as planning

    q = torch.zeros(1, 2, 4096, 64, dtype=torch.bfloat16)

    def schedule(**kw):
        args = dict(attn_mask=None, has_dlse=False, mods=M.NONE) | kw
        return planning.bwd_plan_for(q, q, args["attn_mask"], False, 0.125,
                                     args["has_dlse"], None, args["mods"]).variant.schedule

    planning.clear()
    assert schedule().label() == "kv64x64_q64x64_o2_atomic"  # measured 8.5-9.3% faster
    torch.use_deterministic_algorithms(True)
    assert schedule().label() == "kv128x64_q64x128_o2"  # the key holds the switch
    torch.use_deterministic_algorithms(False)
    assert schedule().label() == "kv64x64_q64x64_o2_atomic"
    # measured and tested on plain attention only
    assert schedule(mods=M.mods_for(variants.softcap(5.0), None)).deterministic
    assert schedule(has_dlse=True).deterministic
    assert schedule(attn_mask=torch.zeros(4096, 4096, dtype=torch.bool)).deterministic
    planning.clear()


def test_a_variants_backward_takes_the_key_rows_default_not_the_plain_tables_entry(on_h100):
    """The table was tuned on plain attention: its D128 S4096 non-causal pick (128-key
    dK/dV tiles) ran prefix-LM's backward 2x slower than the default on the H100 (5.21 vs
    2.63 ms, the 2026-11-26 reference); a score_mod, mask_mod or block mask gets the default
    with keys as the dK/dV MMA rows (2.5-5.3 % faster on the H200, variants.md §45a), in the
    plan and in the row's description alike."""
    pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")
    from tiledattention import mods as M
    from tiledattention import variants
    from tiledattention.bench.methods import _tiled_describe
    from tiledattention.kernel import plan as planning

    q = torch.zeros(1, 2, 4096, 128, dtype=torch.bfloat16)
    plain = policy.choose_bwd_schedule(q, q, False)[0]
    default = default_bwd_schedule(128, False)
    assert plain != default  # the shipped table has its own pick here
    default = dataclasses.replace(default, key_rows=True)
    assert plain != default
    assert policy.choose_bwd_schedule(q, q, False, variant=True) == (default, "default")
    planning.clear()
    for mods in (M.mods_for(variants.softcap(5.0), None),
                 M.mods_for(None, variants.prefix_lm(torch.tensor([1024])))):
        plan = planning.bwd_plan_for(q, q, None, False, 0.125, False, None, mods)
        assert plan.variant.schedule == default
    assert planning.bwd_plan_for(q, q, None, False, 0.125, False, None,
                                 M.NONE).variant.schedule == plain
    planning.clear()
    from tiledattention.bench.variant_cases import VariantPoint

    point = VariantPoint("bfloat16", False, 128, 4096, 4096, 1, 2, 1, "fwd+bwd",
                         variant="prefix_lm")
    assert _tiled_describe(q, q, q, point)["bwd_schedule"] == default.label()


def test_pinned_backward_method_names_round_trip_and_bad_ones_are_one_line():
    name = pinned_bwd("kv64x64_q64x64_o2")
    assert name == "tiledattention@bwd:kv64x64_q64x64_o2"
    assert pinned_bwd_label(name) == "kv64x64_q64x64_o2"
    assert pinned_bwd_label(pinned("64x64_o4_c1_lk2_lv4")) is None
    assert pinned_label(name) == "bwd:kv64x64_q64x64_o2"  # still one of ours in the tables
    assert get_method(name).has_backward
    with pytest.raises(ConfigError, match="^methods: backward schedule label 'kv64' is not"):
        validate(BenchConfig(methods=("tiledattention@bwd:kv64",)))


def test_backward_tuning_plan_times_pinned_backward_schedules_with_fwd_bwd():
    points = paper_grid(seqs=(1024,), head_dims=(64, 128), dtypes=("float16",))
    plan = tune_plan(points, "quick", "fwd+bwd")
    assert [p.pass_ for p, _ in plan] == ["fwd+bwd"] * len(points)
    assert [(p.causal, p.head_dim) for p, _ in plan] == [(p.causal, p.head_dim) for p in points]
    for p, methods in plan:
        assert methods == [pinned_bwd(s.label()) for s in bwd_space_for(p.head_dim, "quick")]
    with pytest.raises(ConfigError, match="not one of"):
        tune_plan(points, "quick", "bwd")


def test_backward_tuning_runs_through_the_harness_and_resumes(tmp_path):
    point = Point("float16", False, 64, 128, 128, 1, 4)
    plan = tune_plan([point], "quick", "fwd+bwd")
    store = ResultStore(str(tmp_path / "state.jsonl"))
    cfg = tune_config(warmup=1, reps=2)
    assert measure(plan, cfg, store, torch.device("cpu"), io.StringIO()) is False
    assert {r["status"] for r in store.rows.values()} == {"unavailable"}
    assert {r["pass"] for r in store.rows.values()} == {"fwd+bwd"}
    measure(plan, cfg, ResultStore(store.path), torch.device("cpu"), io.StringIO())
    assert len((tmp_path / "state.jsonl").read_text().splitlines()) == len(plan[0][1])


def test_backward_winners_become_backward_entries_merged_into_the_forward_table(tmp_path):
    (p,) = paper_grid(seqs=(1024,), head_dims=(64,), dtypes=("float16",))[:1]
    (pb, _), = tune_plan([p], "quick", "fwd+bwd")
    store = ResultStore(str(tmp_path / "state.jsonl"))
    for label, status, tf in (("kv64x64_q64x64_o1", "ok", 300.0),
                              ("kv64x128_q128x64_o1", "ok", 370.0),
                              ("kv64x128_q128x64_o2", "wrong", None)):
        store.append({"point_key": pb.key(), "method": pinned_bwd(label), "status": status,
                      **({"tflops": tf} if tf else {})})
    store.append({"point_key": pb.key(), "method": "tiledattention", "status": "ok",
                  "tflops": 999.0})
    table = build_table([p], store.rows.values(), "9.0", "H100")
    assert not table.entries
    (entry,) = table.backward.values()
    assert entry.best.label() == "kv64x128_q128x64_o1"
    assert entry.runner_up.label() == "kv64x64_q64x64_o1"
    assert entry.failed == ("kv64x128_q128x64_o2:wrong",) and entry.candidates == 3
    fwd = ScheduleTable(meta={"gpu": "H100", "note": "forward"})
    fwd.add(Entry(bucket=entry.bucket, best=Schedule(64, 128, 2), best_tflops=600.0))
    fwd.save(str(tmp_path / "h100.json"))
    merged = merge_into(str(tmp_path / "h100.json"), table, "fwd+bwd")
    assert merged.entries == fwd.entries and merged.backward == table.backward
    assert merged.meta["note"] == "forward" and merged.meta["backward"]["gpu"] == "H100"
    merged.save(str(tmp_path / "h100.json"))
    # and a later forward run that tuned nothing keeps both halves (no run empties a table)
    again = merge_into(str(tmp_path / "h100.json"), ScheduleTable(), "fwd")
    assert again.backward == table.backward and again.entries == fwd.entries


def test_tune_passes_run_in_order_into_one_table_and_stop_at_the_first_failure(monkeypatch):
    import tiledattention.stages.tune as tune

    calls = []

    def fake_run_tune(points, *, pass_, **kwargs):
        calls.append((pass_, kwargs["out_path"]))
        return 130 if pass_ == "fwd" and kwargs["state_path"] == "stop" else 0

    monkeypatch.setattr(tune, "run_tune", fake_run_tune)
    assert tune.run_passes([], passes=("fwd", "fwd+bwd"), state_path="s", out_path="t") == 0
    assert calls == [("fwd", "t"), ("fwd+bwd", "t")]
    calls.clear()
    assert tune.run_passes([], passes=("fwd", "fwd+bwd"), state_path="stop",
                           out_path="t") == 130
    assert calls == [("fwd", "t")]  # an interrupted forward pass does not start the backward


def test_tune_refuses_an_unknown_pass_with_the_valid_list(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", "tune", "--pass", "fwd",
                          "bwd", "--out", str(tmp_path / "t.json")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()  # argparse quotes the choices by version
    assert "--pass: invalid choice: 'bwd'" in line and "fwd+bwd" in line
    assert not (tmp_path / "t.json").exists()


def test_tune_refuses_a_malformed_out_table_before_measuring(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", "tune", "--pass",
                          "fwd+bwd", "--seqs", "1024", "--head-dims", "64", "--out", str(bad),
                          "--state", str(tmp_path / "s.jsonl")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"tiledattn tune: --out schedule table {bad}: not valid JSON")
    assert bad.read_text() == "{not json"  # nothing the user wrote is lost


def test_rows_of_backward_passes_name_the_backward_schedule_in_documented_columns(monkeypatch):
    from tiledattention.bench.methods import _tiled_describe
    from tiledattention.study.presentation.frame import columns_of

    monkeypatch.setattr(policy, "_capability", lambda index: "9.0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    q = torch.empty(4, 16, 4096, 128, dtype=torch.float16, device="meta")
    point = Point("float16", True, 128, 4096, 4096, 4, 16, 1, "fwd+bwd")
    details = _tiled_describe(q, q, q, point)
    assert details["bwd_schedule"] == policy.choose_bwd_schedule(q, q, True)[0].label()
    assert "bwd_schedule" not in _tiled_describe(q, q, q, Point("float16", True, 128, 4096,
                                                                4096, 4, 16))
    pinned_details = get_method(pinned_bwd("kv64x64_q64x64_o2")).describe(q, q, q, point)
    assert pinned_details["bwd_schedule_source"] == "pinned"
    assert "details.bwd_schedule_source" in columns_of([{"details": pinned_details}])


@pytest.mark.parametrize("d", [64, 96, 128, 160, 192, 256])
def test_every_head_dim_has_five_matmul_candidates_the_register_count_admits(d):
    from tiledattention.schedules.backward import bwd_candidates, bwd_rejection

    named = bwd_candidates(d)
    assert any(s.dq == "atomic" for s in named.values()), named
    for name, s in named.items():
        assert bwd_rejection(s, d) is None, name
        assert name.startswith("5mm") == (s.dq == "atomic"), name


def test_the_reduce_add_share_counts_against_the_dkdv_registers():
    from tiledattention.schedules.backward import _live_bytes

    kernel = BwdSchedule.from_label("kv64x64_q64x64_o1_w8")
    reduce = BwdSchedule.from_label("kv64x64_q64x64_o1_w8_atomic")
    extra = _live_bytes(reduce, 256)["dK/dV"] - _live_bytes(kernel, 256)["dK/dV"]
    assert extra == 4 * 64 * 256


def test_the_delta_pass_zeroes_the_dq_accumulator_only_for_reduce_add():
    from tiledattention.kernel.variant import BwdVariant

    for dq in ("kernel", "atomic"):
        v = BwdVariant("bfloat16", 128, False, BwdSchedule(dq=dq))
        assert v.constants("attention_bwd_delta")["ZERO_DQ"] == (dq == "atomic")
