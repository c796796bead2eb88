"""A decode loop over a KV cache grown by ``torch.cat`` (transformers' DynamicCache) runs on
plans from the cache's family (``plan.family_key``) and matches the float64 reference at
every step, across key-tile boundaries and a schedule-table bucket boundary."""

from __future__ import annotations

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel import plan as planning
from tiledattention.reference import naive_attention
from tiledattention.tolerance import relative_error, rtol


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "key_padding"])
@pytest.mark.parametrize("hq,hkv,sq", [(32, 8, 1), (16, 16, 1), (32, 8, 4)])
def test_a_growing_cache_decodes_on_family_plans_and_matches_the_reference(
        monkeypatch, hq, hkv, sq, masked):
    built = []
    build = planning.build_plan
    monkeypatch.setattr(planning, "build_plan", lambda *a: built.append(1) or build(*a))
    planning.clear()
    torch.manual_seed(0)
    d, dtype = 128, torch.bfloat16
    q = torch.randn(1, hq, sq, d, device="cuda", dtype=dtype)
    k = torch.randn(1, hkv, 250, d, device="cuda", dtype=dtype)
    v = torch.randn(1, hkv, 250, d, device="cuda", dtype=dtype)
    keep = torch.rand(1, 1, 1, 600, device="cuda") > 0.2
    steps = 0
    while k.shape[2] < 530:  # key tiles of 64 and 128 end at 256, 384, 512; bucket at 257
        k = torch.cat([k, torch.randn(1, hkv, 1, d, device="cuda", dtype=dtype)], dim=2)
        v = torch.cat([v, torch.randn(1, hkv, 1, d, device="cuda", dtype=dtype)], dim=2)
        mask = keep[..., :k.shape[2]].contiguous() if masked else None
        out = ta.sdpa(q, k, v, attn_mask=mask, enable_gqa=hq != hkv)
        ref, _ = naive_attention(q, k, v, attn_mask=mask)
        err = relative_error(out, ref)
        assert err <= rtol(dtype), f"Skv {k.shape[2]}: relative error {err:.3e}"
        steps += 1
    assert len(built) < steps / 10, f"{len(built)} builds in {steps} steps"
