"""The transformers integration on a GPU: a tiny randomly initialised Llama (no downloads)
with our attention against transformers' built-in ``sdpa``: logits of a causal prefill,
of a left-padded batch, and greedy generation with a KV cache."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: "
                                   "pip install 'tiledattention[hf]'")

from tiledattention.integrations.transformers import register, tiny_llama  # noqa: E402
from tiledattention.tolerance import relative_error, rtol  # noqa: E402

DTYPE = torch.bfloat16


@pytest.fixture(scope="module")
def models():
    name = register()
    return tiny_llama(name, dtype=DTYPE), tiny_llama("sdpa", dtype=DTYPE)


def _logit_error(a, b):
    return relative_error(a.float(), b.double())


@torch.inference_mode()
def test_causal_prefill_logits_match_sdpa(models):
    ours, ref = models
    ids = torch.randint(0, 1024, (2, 300), device="cuda")
    err = _logit_error(ours(ids).logits, ref(ids).logits)
    assert err <= 2 * rtol(DTYPE), f"logits differ by {err:.3e}"


@torch.inference_mode()
def test_left_padded_batch_logits_match_sdpa(models):
    ours, ref = models
    ids = torch.randint(0, 1024, (3, 257), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :100] = 0
    mask[2, :3] = 0
    a = ours(ids, attention_mask=mask).logits
    b = ref(ids, attention_mask=mask).logits
    keep = mask.bool()  # padded positions attend nothing: compare the real tokens
    err = _logit_error(a[keep], b[keep])
    assert err <= 2 * rtol(DTYPE), f"logits differ by {err:.3e}"


@torch.inference_mode()
def test_greedy_generation_with_kv_cache_matches_sdpa(models):
    ours, ref = models
    ids = torch.randint(0, 1024, (2, 500), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :37] = 0  # left padding: the decode steps carry a mask
    kw = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, use_cache=True,
              pad_token_id=0)
    a = ours.generate(ids, **kw)
    b = ref.generate(ids, **kw)
    # Random weights give near-tied logits; count tokens equal to the reference's up to
    # the first divergence and ask for most of them.
    same = (a[:, 500:] == b[:, 500:]).all(0).int().cumprod(0).sum().item()
    assert same >= 20, f"only the first {same} of 24 greedy tokens agree"
