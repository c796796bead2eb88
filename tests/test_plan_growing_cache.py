"""A decode loop whose KV cache grows by one token per step finds its plan in the cache's
family (``plan.family_key``) instead of building one per step, and the plan it finds is,
field by field (kernels by identity), the one ``build_plan`` builds for that call. CPU
only: the GPU facts are stubbed (an H100: capability 9.0, 132 SMs) and the tensors live
on the meta device (plans read shapes, strides and dtypes, never data)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel import plan as planning
from tiledattention.kernel import validate
from tiledattention.schedules import policy
from tiledattention.schedules.schedule import Schedule
from tiledattention.schedules.table import Bucket, Entry, ScheduleTable

pytest.importorskip("cuda.tile", reason="cuTile (cuda-tile) is not installed")

BF16 = torch.bfloat16
META = "meta"


@pytest.fixture
def h100(monkeypatch):
    """GPU facts stubbed; every build through ``plan_for`` counted; the cache empty."""
    monkeypatch.setattr(validate, "check_device", lambda q: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(planning, "check_gpu", lambda index: None)
    monkeypatch.setattr(planning, "sm_count", lambda index: 132)
    monkeypatch.setattr(policy, "_capability", lambda index: "9.0")
    built = []
    original = planning.build_plan

    def counted(*args):
        built.append(args[1].shape[2])
        return original(*args)

    monkeypatch.setattr(planning, "build_plan", counted)
    planning.clear()
    yield original, built
    planning.clear()


def assert_same_plan(got, want):
    for field in dataclasses.fields(planning.Plan):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if field.name == "launches":  # the kernels by identity, the rest by value
            assert [(x.role, x.grid, x.tail) for x in a] == [(y.role, y.grid, y.tail) for y in b]
            assert [id(x.kernel) for x in a] == [id(y.kernel) for y in b]
        else:
            assert a == b and type(a) is type(b), (field.name, a, b)


def tensor(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device=META)


def decode(h100, *, b=1, hq=32, hkv=8, sq=1, d=128, dtype=BF16, steps=range(1, 5001),
           causal=False, lse=False, schedule=None, variant=None, mask=None, cache=None):
    """Grow the cache step by step; each step's plan against ``build_plan``'s. ``mask``
    (skv -> mask), ``cache`` (None: a dense tensor per step; an int: slices of a
    preallocated cache that long). Returns the builds ``plan_for`` made."""
    build, built = h100
    q = tensor(b, hq, sq, d, dtype=dtype)
    full = None if cache is None else (tensor(b, hkv, cache, d, dtype=dtype),
                                       tensor(b, hkv, cache, d, dtype=dtype))
    for skv in steps:
        if full is None:
            k, v = tensor(b, hkv, skv, d, dtype=dtype), tensor(b, hkv, skv, d, dtype=dtype)
        else:
            k, v = full[0][:, :, :skv], full[1][:, :, :skv]
        m = None if mask is None else mask(skv)
        args = (q, k, v, m, causal, None, hq != hkv, lse, schedule, variant)
        got = planning.plan_for(*args)
        assert_same_plan(got, build(*args))
        assert planning.plan_for(*args) is got  # the next layer of the step: a plain hit
    return built


def test_gqa_decode_over_a_growing_dense_cache_builds_once_per_key_tile_class(h100):
    built = decode(h100)
    # The shipped table's picks and split counts vary over 1..5000; each (bucket, key
    # tiles, even) class is built once: at most two per key tile, far fewer than steps.
    assert len(built) <= 2 * (5000 // 64 + 1) + 8 and len(built) < 5000 / 20


def test_gqa_decode_over_a_sliced_preallocated_cache_with_a_padding_mask(h100):
    built = decode(h100, steps=range(1, 3001), cache=3000,
                   mask=lambda skv: tensor(1, 1, 1, skv, dtype=torch.bool))
    assert len(built) < 3000 / 20


def test_mha_decode_with_a_sliced_additive_mask_and_lse(h100):
    full = tensor(2, 1, 1, 2500, dtype=torch.float32)
    built = decode(h100, b=2, hq=16, hkv=16, d=64, dtype=torch.float16, lse=True,
                   steps=range(1, 2501), cache=2500, mask=lambda skv: full[..., :skv])
    assert len(built) < 2500 / 20


def test_speculative_decode_of_four_tokens_with_a_per_row_mask(h100):
    built = decode(h100, sq=4, steps=range(1, 3001),
                   mask=lambda skv: tensor(1, 1, 4, skv, dtype=BF16))
    assert len(built) < 3000 / 20


def test_causal_queries_over_a_growing_cache(h100):
    built = decode(h100, sq=16, hq=8, hkv=8, causal=True, steps=range(1, 3001))
    assert len(built) < 3000 / 20


def test_an_explicit_schedule_over_a_growing_cache(h100):
    built = decode(h100, schedule=Schedule(64, 128, 2), steps=range(1, 2001))
    assert len(built) <= 2 * (2000 // 128 + 1)


def test_a_score_mod_over_a_growing_cache(h100):
    from tiledattention import mods as M
    from tiledattention import variants

    built = decode(h100, variant=(M.mods_for(variants.softcap(5.0), None), None),
                   steps=range(1, 801))
    assert len(built) < 800 / 10


def test_a_table_bucket_boundary_changes_the_schedule_of_the_family(h100, tmp_path):
    # Causal Sq 16: the longest row visits one key tile at every Skv, so only the bucket
    # tells the plans of 256, 512 and 1024 apart.
    table = ScheduleTable()
    for s_bucket, tile_n in ((256, 64), (512, 128), (1024, 64), (2048, 128)):
        table.add(Entry(Bucket("9.0", "bfloat16", 128, True, s_bucket), Schedule(64, tile_n),
                        100.0))
    table.save(str(tmp_path / "t.json"))
    try:
        ta.set_schedule_table(str(tmp_path / "t.json"))
        decode(h100, sq=16, hq=8, hkv=8, causal=True, steps=range(200, 1100))
    finally:
        ta.set_schedule_table(None)


def test_a_family_hit_skips_no_check_the_new_length_fails(h100):
    q, k, v = tensor(1, 32, 1, 128), tensor(1, 8, 100, 128), tensor(1, 8, 100, 128)
    planning.plan_for(q, k, v, tensor(1, 1, 1, 100, dtype=torch.bool), False, None, True,
                      False, None)
    k2, v2 = tensor(1, 8, 101, 128), tensor(1, 8, 101, 128)
    stale = tensor(1, 1, 1, 100, dtype=torch.bool)  # last step's mask
    with pytest.raises(ta.MaskError, match="axis Skv"):
        planning.plan_for(q, k2, v2, stale, False, None, True, False, None)
    with pytest.raises(ta.ShapeError, match="k and v must agree"):
        planning.plan_for(q, k2, tensor(1, 8, 102, 128), None, False, None, True, False, None)
    with pytest.raises(ta.MaskError, match="rank 1 to 4"):
        planning.plan_for(q, k2, v2, torch.zeros((), device=META), False, None, True, False,
                          None)


def _family(q, k, v, mask=None, variant_key=None):
    key = planning.call_key(q, k, v, mask, False, None, True, False, None)
    if variant_key is not None:
        key = key[:12] + (variant_key,) + key[13:]
    return planning.family_key(key)


def test_dense_and_sliced_caches_share_a_family_but_odd_strides_and_block_masks_do_not():
    q = tensor(1, 32, 1, 128)
    dense = [tensor(1, 8, s, 128) for s in (101, 102)]
    assert _family(q, dense[0], dense[0]) == _family(q, dense[1], dense[1]) is not None
    full = tensor(1, 8, 4096, 128)
    assert _family(q, full[:, :, :101], full[:, :, :101]) == _family(
        q, full[:, :, :102], full[:, :, :102]) != _family(q, dense[0], dense[0])
    # [B, S, H, D] storage viewed as [B, H, S, D]: its strides follow S, no shared family.
    odd = [tensor(1, s, 8, 128).transpose(1, 2) for s in (101, 102)]
    assert _family(q, odd[0], odd[0]) != _family(q, odd[1], odd[1])
    assert _family(q, dense[0], dense[0], variant_key=((), "block")) is None
    assert _family(q, dense[0], dense[1]) is None  # K and V disagree: the checks refuse
    # A mask whose key axis is not Skv keeps its size in the key (the check decides).
    assert _family(q, dense[0], dense[0], tensor(1, 1, 1, 100)) != _family(
        q, dense[1], dense[1], tensor(1, 1, 1, 101))
    assert _family(q, dense[0], dense[0], tensor(1, 1, 1, 101)) == _family(
        q, dense[1], dense[1], tensor(1, 1, 1, 102))


def test_a_growing_decode_keeps_the_cache_bounded(h100, monkeypatch):
    monkeypatch.setattr(planning, "MAX_PLANS", 16)
    build, _ = h100
    q = tensor(1, 32, 1, 128)
    for skv in range(1, 2001):
        k = v = tensor(1, 8, skv, 128)
        args = (q, k, v, None, False, None, True, False, None, None)
        assert_same_plan(planning.plan_for(*args), build(*args))
        assert len(planning._plans) <= 16


def test_the_family_reads_the_schedule_and_variant_where_call_key_puts_them():
    q = torch.empty(1, 4, 1, 64, device="meta")
    marker = ("mods", "block")

    class Named:
        def __init__(self, key):
            self.key = key

    key = planning.call_key(q, q, q, None, False, None, False, False, "a schedule",
                            (Named(marker[0]), Named(marker[1])))
    assert key[planning._KEY_SCHEDULE] == "a schedule"
    assert key[planning._KEY_VARIANT] == marker
