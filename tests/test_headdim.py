"""Head dims split into power-of-two chunks the kernel can address exactly."""

import pytest

from tiledattention.headdim import MIN_CHUNK, plan_head_dim, supported_head_dim


@pytest.mark.parametrize("d", range(8, 257, 8))
def test_every_multiple_of_8_has_an_addressable_plan(d):
    plan = plan_head_dim(d)
    widths = plan.widths
    assert 1 <= len(widths) <= 3 and plan.padded >= d
    assert all(w >= MIN_CHUNK and w & (w - 1) == 0 for w in widths)
    assert list(widths) == sorted(widths, reverse=True)
    offset = 0
    for w in widths:
        assert offset % w == 0  # tile-index addressing: chunk c is tile offset/w
        offset += w
    assert plan.padded - d < widths[-1]  # only the last chunk carries padding
    next_pow2 = 1 << (d - 1).bit_length()
    assert plan.padded <= max(next_pow2, MIN_CHUNK)


@pytest.mark.parametrize("d,widths", [(64, (64,)), (96, (64, 32)), (128, (128,)),
                                      (160, (128, 32)), (192, (128, 64)), (256, (256,))])
def test_paper_head_dims_are_split_without_padding(d, widths):
    plan = plan_head_dim(d)
    assert plan.widths == widths and plan.exact and plan.waste == 0.0


@pytest.mark.parametrize("d", [0, 4, 12, 100, 584, 1024, 64.0])
def test_unsupported_head_dims_are_refused(d):
    assert not supported_head_dim(d)
    with pytest.raises(ValueError):
        plan_head_dim(d)
