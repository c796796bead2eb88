"""Schedules are validated once, with the reason, before any compile."""

import pytest

from tiledattention import Schedule, ScheduleError, default_schedule


@pytest.mark.parametrize("kwargs,words", [
    ({"tile_m": 48}, "tile_m=48"), ({"tile_n": 512}, "tile_n=512"),
    ({"occupancy": 0}, "occupancy"), ({"occupancy": 33}, "occupancy"),
    ({"num_ctas": 3}, "num_ctas"), ({"latency_k": 0}, "latency_k"),
    ({"latency_v": 11}, "latency_v"), ({"tile_m": 64.0}, "must be an int"),
    ({"occupancy": True}, "must be an int"), ({"splits": -1}, "splits"),
    ({"splits": 65}, "splits"),
])
def test_invalid_schedules_are_rejected_with_the_reason(kwargs, words):
    with pytest.raises(ScheduleError, match=words):
        Schedule(**kwargs)


def test_unknown_keys_are_rejected_with_the_valid_ones():
    with pytest.raises(ScheduleError, match="valid keys are.*tile_m"):
        Schedule.from_dict({"tile_m": 64, "warps": 4})


def test_round_trip_through_dict():
    s = Schedule(128, 64, 2, 1, 3, 5)
    assert Schedule.from_dict(s.as_dict()) == s


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
