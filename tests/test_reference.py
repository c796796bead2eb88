"""The float64 references: the tiled online-softmax algorithm the kernel implements
equals naive softmax attention, and naive attention equals PyTorch's definition."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tiledattention.reference import naive_attention, tiled_attention

SHAPES = [  # (Sq, Skv, D, Hq, Hkv)
    (1, 1, 64, 2, 2), (1, 17, 96, 4, 1), (17, 17, 160, 2, 2), (17, 1000, 40, 4, 2),
    (1000, 17, 128, 2, 1), (1000, 1000, 96, 1, 1), (130, 67, 256, 2, 2), (64, 128, 8, 2, 2),
]


def rand(*shape, gen):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def masks(b, hq, sq, sk, gen):
    key_pad = torch.ones(b, 1, 1, sk, dtype=torch.bool)
    key_pad[-1, ..., sk // 2 + 1:] = False
    full = torch.rand(b, hq, sq, sk, generator=gen) > 0.4
    additive = torch.where(torch.rand(1, hq, 1, sk, generator=gen) > 0.3,
                           torch.randn(1, hq, 1, sk, generator=gen, dtype=torch.float64),
                           torch.tensor(float("-inf"), dtype=torch.float64))
    return {"none": None, "key_padding": key_pad, "full_bool": full, "additive": additive,
            "rank2": torch.rand(sq, sk, generator=gen) > 0.5}


@pytest.mark.parametrize("sq,sk,d,hq,hkv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tiles", [(64, 64), (64, 128), (128, 32)])
def test_tiled_online_softmax_equals_naive_attention(sq, sk, d, hq, hkv, causal, tiles):
    gen = torch.Generator().manual_seed(sq * 7919 + sk * 31 + d)
    q = rand(2, hq, sq, d, gen=gen)
    k, v = rand(2, hkv, sk, d, gen=gen), rand(2, hkv, sk, d, gen=gen)
    for name, mask in masks(2, hq, sq, sk, gen).items():
        ref, ref_lse = naive_attention(q, k, v, causal=causal, attn_mask=mask, scale=0.3)
        out, lse = tiled_attention(q, k, v, causal=causal, attn_mask=mask, scale=0.3,
                                   tile_m=tiles[0], tile_n=tiles[1])
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12, msg=name)
        torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=1e-12, msg=name)


@pytest.mark.parametrize("sq,sk", [(1, 17), (17, 1000), (1000, 17), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention_matches_torch_sdpa_semantics(sq, sk, causal):
    # PyTorch's is_causal is top-left aligned also for Sq != Skv; GQA repeats K/V heads.
    gen = torch.Generator().manual_seed(1)
    q, k, v = rand(1, 4, sq, 32, gen=gen), rand(1, 2, sk, 32, gen=gen), rand(1, 2, sk, 32, gen=gen)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    out, lse = naive_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(32)
    if causal:
        scores = scores.masked_fill(torch.ones(sq, sk).tril().logical_not(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=1e-12, rtol=1e-12)


def test_bool_and_additive_masks_match_torch_where_rows_are_not_fully_masked():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (rand(2, 3, 50, 64, gen=gen) for _ in range(3))
    mask = torch.rand(2, 1, 50, 50, generator=gen) > 0.5
    mask[..., 0] = True  # no fully masked rows: torch's math path is then defined
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(naive_attention(q, k, v, attn_mask=mask)[0], ref)
    additive = torch.randn(2, 3, 50, 50, generator=gen, dtype=torch.float64)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    torch.testing.assert_close(tiled_attention(q, k, v, attn_mask=additive)[0], ref)


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (rand(1, 2, 70, 64, gen=gen) for _ in range(3))
    mask = torch.ones(1, 2, 70, 70, dtype=torch.bool)
    mask[0, 1, 5] = False
    for fn in (naive_attention, tiled_attention):
        out, lse = fn(q, k, v, attn_mask=mask)
        assert (out[0, 1, 5] == 0).all() and torch.isneginf(lse[0, 1, 5])
        assert torch.isfinite(out).all()
