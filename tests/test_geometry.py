"""Launch geometry (tiledattention/kernel/geometry.py): waves, the last wave's fill and the
padding of tiles, as pure functions of the grid, sizes, tiles and SMs."""

from __future__ import annotations

import pytest

from tiledattention.kernel.geometry import grid_for, launch_geometry


def geo(grid, **kw):
    args = dict(head_dim=128, seq_q=1024, seq_kv=1024, tile_m=64, tile_n=128, sms=132,
                per_sm=1)
    return launch_geometry(grid, **{**args, **kw})


def test_133_programs_on_132_sms_take_two_waves_the_last_one_132th_full():
    g = geo((133, 1, 1))
    assert g.programs == 133 and g.slots == 132
    assert g.waves == pytest.approx(133 / 132)
    assert g.tail_efficiency == pytest.approx(1 / 132)
    assert g.wave_efficiency == pytest.approx(133 / 264)


def test_exact_waves_have_a_full_tail():
    g = geo((132, 2, 1), per_sm=2)
    assert (g.slots, g.waves, g.tail_efficiency, g.wave_efficiency) == (264, 1.0, 1.0, 1.0)


def test_less_than_a_wave_fills_its_share_of_the_slots():
    g = geo((33, 1, 1), per_sm=2)
    assert g.waves == pytest.approx(0.125) and g.tail_efficiency == pytest.approx(0.125)


def test_programs_are_the_product_of_every_grid_axis():
    # A fourth axis (e.g. split-K) is counted without a change in geometry.
    assert geo((16, 32, 2, 4)).programs == 16 * 32 * 2 * 4


def test_clusters_share_the_slots():
    assert geo((10, 1, 1), per_sm=2, num_ctas=2).slots == 132


def test_sequence_tiles_pad_the_last_tile():
    g = geo((17, 1, 1), seq_q=1088, seq_kv=1000)
    assert g.seq_q_padded == 1088 and g.seq_q_pad_fraction == 0.0
    assert g.seq_kv_padded == 1024
    assert g.seq_kv_pad_fraction == pytest.approx(24 / 1024)


@pytest.mark.parametrize("d, padded", [(64, 64), (96, 96), (80, 80), (120, 128), (112, 112),
                                       (8, 16), (240, 256), (208, 208)])
def test_head_dim_padding_follows_the_chunk_plan(d, padded):
    g = geo((1, 1, 1), head_dim=d)
    assert g.head_dim_padded == padded
    assert g.head_dim_pad_fraction == pytest.approx(1 - d / padded)


def test_grid_counts_query_tiles_heads_and_batch():
    assert grid_for(batch=2, heads=16, seq_q=1000, tile_m=64) == (16, 16, 2)


@pytest.mark.parametrize("bad", [dict(sms=0), dict(per_sm=0), dict(num_ctas=0)])
def test_non_positive_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        geo((1, 1, 1), **bad)
