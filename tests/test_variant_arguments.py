"""Arguments of the built-in variants and sdpa's flags refused in one typed line
(issue 38: a negative or NaN window, a zero cap, a string for enable_gqa)."""

from __future__ import annotations

import math
import warnings

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


def _nested():
    """A strided and a jagged nested tensor of two sequences (lengths 8 and 4)."""
    parts = [torch.zeros(2, 8, 64, dtype=torch.float16), torch.zeros(2, 4, 64, dtype=torch.float16)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "prototype stage" note on nested tensors
        return (torch.nested.nested_tensor(parts),
                torch.nested.nested_tensor(parts, layout=torch.jagged))


Q = torch.zeros(1, 2, 8, 64, dtype=torch.float16)


@pytest.mark.parametrize("call,error,words", [
    (lambda: variants.segments_from_lengths([4, -2, 14], device="cpu"), ta.VariantError,
     "segments_from_lengths: lengths[1] must be an int >= 0, got -2"),
    (lambda: variants.segments_from_lengths([4, 2.5], device="cpu"), ta.VariantError,
     "lengths[1] must be an int >= 0, got 2.5"),
    (lambda: variants.segments_from_lengths([], device="cpu"), ta.VariantError,
     "lengths must be a non-empty list of ints"),
    (lambda: variants.segments_from_lengths([0, 0], device="cpu"), ta.VariantError,
     "lengths must hold at least one token"),
    (lambda: ta.block_mask(variants.sliding_window(4), None, None, 8, 8, device="tpu"),
     InputError, "block_mask: device must be a CUDA device ('cuda', 'cuda:0' or a "
                 "torch.device), got 'tpu'"),
    (lambda: ta.block_mask(variants.sliding_window(4), None, None, 8, 8, device=3.5),
     InputError, "block_mask: device must be a CUDA device"),
    (lambda: ta.sdpa(Q, Q, Q, block_mask={}), InputError,
     "block_mask must be made by tiledattention.block_mask(...), got dict"),
    (lambda: ta.sdpa(*[_nested()[0]] * 3), InputError, "q is a nested tensor; sdpa takes "
                                                        "dense [B, H, S, D] tensors"),
    (lambda: ta.sdpa(*[_nested()[1]] * 3), InputError, "q is a nested tensor"),
    (lambda: ta.sdpa(Q, *[_nested()[0]] * 2), InputError, "k is a nested tensor"),
    (lambda: ta.sdpa(*[_nested()[0]] * 3, block_mask=ta.block_mask(
        variants.sliding_window(4), None, None, 8, 8, device="cpu")), InputError,
     "q is a nested tensor"),
    (lambda: variants.alibi_slopes(2.5, device="cpu"), ta.VariantError,
     "alibi_slopes: heads must be an int >= 1, got 2.5"),
    (lambda: variants.alibi_slopes(0, device="cpu"), ta.VariantError, "heads must be an int"),
    (lambda: variants.prefix_lm(5), ta.VariantError,
     "prefix_lm: prefix_lengths must be an int32 tensor [B] (one value per batch row), got 5"),
    (lambda: variants.prefix_lm(torch.tensor([2.0])), ta.VariantError,
     "got a torch.float32 tensor of shape (1,)"),
    (lambda: variants.prefix_lm(torch.tensor([2]), q_offset=3), ta.VariantError,
     "prefix_lm: q_offset must be an int32 tensor [B]"),
], ids=["negative-length", "float-length", "no-lengths", "no-tokens", "tpu", "device-number",
        "block-mask-dict", "nested", "jagged", "nested-k", "nested-with-block-mask",
        "fractional-heads", "zero-heads", "prefix-int", "prefix-float", "offset-int"])
def test_a_bad_variant_argument_is_one_typed_line_naming_it(call, error, words):
    # Each raised a torch or Python error (RuntimeError, AttributeError, TypeError) before:
    # CPU tensors suffice, the check runs before anything reaches a GPU.
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_variant_helpers_still_take_what_they_document():
    assert variants.segments_from_lengths([2, 0, 3], device="cpu").tolist() == [[0, 0, 2, 2, 2]]
    assert variants.segments_from_lengths(torch.tensor([1, 1]), device="cpu").tolist() == [[0, 1]]
    assert variants.alibi_slopes(4, device="cpu").tolist() == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6,
                                                                2.0 ** -8]
    assert callable(variants.prefix_lm(torch.tensor([3], dtype=torch.int32),
                                       q_offset=torch.tensor([0], dtype=torch.int32)))
    assert ta.block_mask(variants.sliding_window(4), None, None, 8, 8, device="cpu").device \
        == torch.device("cpu")
