"""Schedules are validated once, with the reason, before any compile."""

import pytest

from tiledattention import Schedule, ScheduleError, default_schedule


@pytest.mark.parametrize("kwargs,words", [
    ({"tile_m": 48}, "tile_m=48"), ({"tile_n": 512}, "tile_n=512"),
    ({"occupancy": 0}, "occupancy"), ({"occupancy": 33}, "occupancy"),
    ({"num_ctas": 3}, "num_ctas"), ({"latency_k": 0}, "latency_k"),
    ({"latency_v": 11}, "latency_v"), ({"tile_m": 64.0}, "must be an int"),
    ({"occupancy": True}, "must be an int"), ({"splits": -1}, "splits"),
    ({"splits": 65}, "splits"), ({"worker_warps": 2}, "worker_warps=2"),
    ({"worker_warps": 8.0}, "must be an int"), ({"pdl": 1}, "pdl must be a bool"),
])
def test_invalid_schedules_are_rejected_with_the_reason(kwargs, words):
    with pytest.raises(ScheduleError, match=words):
        Schedule(**kwargs)


def test_unknown_keys_are_rejected_with_the_valid_ones():
    with pytest.raises(ScheduleError, match="valid keys are.*tile_m"):
        Schedule.from_dict({"tile_m": 64, "warps": 4})


def test_round_trip_through_dict():
    for s in (Schedule(128, 64, 2, 1, 3, 5), Schedule(128, 128, 1, worker_warps=8)):
        assert Schedule.from_dict(s.as_dict()) == s


@pytest.mark.parametrize("schedule", [
    Schedule(64, 128, 2), Schedule(128, 128, 1, worker_warps=8),
    Schedule(128, 64, 2, 1, 3, 3, heavy_first=False, worker_warps=4),
    Schedule(64, 64, 4, heavy_first=False),
    Schedule(128, 128, 1, heavy_first=False, splits=4, worker_warps=8),
    Schedule(64, 128, 2, pdl=True), Schedule(64, 64, 2, heavy_first=False, splits=8, pdl=True),
])
def test_label_round_trips_with_and_without_worker_warps(schedule):
    assert Schedule.from_label(schedule.label()) == schedule


def test_labels_without_worker_warps_keep_their_meaning():
    # rows and tables written before the hint existed name schedules like this
    assert Schedule.from_label("64x128_o2_c1_lk2_lv4") == Schedule(64, 128, 2)
    assert Schedule.from_label("64x128_o2_c1_lk2_lv4").worker_warps is None
    assert Schedule.from_label("128x128_o1_c1_lk2_lv4_w8_natural") == Schedule(
        128, 128, 1, heavy_first=False, worker_warps=8)
    assert Schedule.from_dict({"tile_m": 64, "tile_n": 128, "occupancy": 2}).worker_warps is None
    for bad in ("64x128_o2_c1_lk2_lv4_natural_w8", "64x128_o2_c1_lk2_lv4_w", "128x128_o1_w8"):
        with pytest.raises(ScheduleError, match="not like"):
            Schedule.from_label(bad)
    with pytest.raises(ScheduleError, match="worker_warps=16"):
        Schedule.from_label("128x128_o1_c1_lk2_lv4_w16")


def test_worker_warps_spread_the_registers_so_128_row_tiles_do_not_spill():
    from tiledattention.schedules.space import QUICK_SPACE, rejection

    assert "spill" in rejection(Schedule(128, 128, 1), 128)
    assert rejection(Schedule(128, 128, 1, worker_warps=8), 128) is None
    assert rejection(Schedule(128, 64, 1, worker_warps=8), 256) is None
    assert "spill" in rejection(Schedule(128, 64, 1), 256)
    assert len(QUICK_SPACE) <= 14 and any(s.worker_warps == 8 for s in QUICK_SPACE)


def test_pdl_is_a_label_suffix_and_absent_from_old_labels_and_tables():
    s = Schedule(128, 128, 1, worker_warps=8, pdl=True)
    assert s.label() == "128x128_o1_c1_lk2_lv4_w8_pdl"
    assert Schedule.from_dict(s.as_dict()) == s and s.as_dict()["pdl"] is True
    # Rows and tables written before the field existed read as pdl=False, and a schedule
    # without it writes what they wrote.
    assert "pdl" not in Schedule(64, 128, 2).as_dict()
    assert Schedule.from_label("64x128_o2_c1_lk2_lv4_natural_k4").pdl is False
    with pytest.raises(ScheduleError, match="not like"):
        Schedule.from_label("64x128_o2_c1_lk2_lv4_pdl_natural")


def test_split_count_is_in_the_label_only_when_fixed():
    assert Schedule(64, 64, 2).label() == "64x64_o2_c1_lk2_lv4"  # splits=0: chosen per call
    s = Schedule(64, 64, 2, heavy_first=False, splits=8)
    assert s.label() == "64x64_o2_c1_lk2_lv4_natural_k8"
    assert Schedule.from_label(s.label()) == s
    assert Schedule.from_label("64x128_o2_c1_lk2_lv4_k1").splits == 1
    # Tables written before the field existed load with splits=0.
    old = {k: v for k, v in s.as_dict().items() if k != "splits"}
    assert Schedule.from_dict(old).splits == 0


@pytest.mark.parametrize("d", [8, 32, 64, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_defaults_pass_the_search_spaces_rules_for_their_head_dim(d, causal):
    from tiledattention.schedules.space import rejection

    schedule = default_schedule(d, causal)
    assert rejection(schedule, d) is None, rejection(schedule, d)
    # and the rules can refuse: the same tiles past the register file are rejected
    assert rejection(Schedule(256, 256, 32), d) is not None
