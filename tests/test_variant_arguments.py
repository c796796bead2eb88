"""Arguments of the built-in variants and sdpa's flags refused in one typed line
(issue 38: a negative or NaN window, a zero cap, a string for enable_gqa)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import tiledattention as ta  # noqa: E402
from tiledattention import variants  # noqa: E402
from tiledattention.errors import InputError, TiledAttentionError  # noqa: E402


@pytest.mark.parametrize("left", [-5, 0, math.nan, 2.5, "8", True, None])
def test_sliding_window_refuses_a_window_that_is_not_a_positive_int(left):
    with pytest.raises(ta.VariantError, match=r"sliding_window: left must be an int >= 1"):
        variants.sliding_window(left)


def test_sliding_window_refuses_a_negative_look_ahead():
    with pytest.raises(ta.VariantError, match=r"right must be an int >= 0, got -1"):
        variants.sliding_window(8, -1)
    assert variants.sliding_window(8, 0) is not None


@pytest.mark.parametrize("cap", [0, -1.0, math.nan, math.inf, "30", False])
def test_softcap_refuses_a_cap_that_is_not_finite_and_positive(cap):
    with pytest.raises(ta.VariantError, match=r"softcap: cap must be a finite number > 0"):
        variants.softcap(cap)


@pytest.mark.parametrize("flag", ["no", 1, None, "False"])
def test_enable_gqa_must_be_a_bool(flag):
    q = torch.randn(1, 4, 8, 64, dtype=torch.float16)
    k = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(InputError, match=r"enable_gqa must be a bool, got"):
        ta.sdpa(q, k, k, enable_gqa=flag)


def test_variant_errors_are_tiledattention_errors():
    assert issubclass(ta.VariantError, TiledAttentionError)
