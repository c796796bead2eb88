"""transformers' ``softcap``, ``sliding_window`` and ``s_aux`` (sinks) arguments on the CPU:
how the integration maps them onto ``tiledattention.variants``, with the kernel replaced by
a float64 torch stand-in of ``sdpa`` that applies exactly the mapped arguments (variants
through their torch form, ``variants.reference_of``), so tiny Gemma-2-, Mistral- and
gpt-oss-style models must reproduce transformers' eager path: prefill, a left-padded
batch, greedy generation with a cache. The kernel itself runs in
tests/gpu/test_transformers_variants_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed: "
                    "pip install 'tiledattention[hf]'")
pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import transformers  # noqa: E402

from tiledattention import api, variants  # noqa: E402
from tiledattention.integrations import transformers as hf  # noqa: E402
from tiledattention.reference import naive_attention  # noqa: E402


def _ref(mod):
    return variants.reference_of(mod)


@pytest.fixture
def calls(monkeypatch):
    """``api.sdpa`` replaced by float64 torch math over the mapped arguments (out in q's
    dtype, fp32 LSE); each call's arguments recorded."""
    seen = []

    def torch_stand_in_for_sdpa(q, k, v, *, causal=False, scale=None, attn_mask=None,
                                enable_gqa=False, return_lse=False, score_mod=None,
                                block_mask=None, **kw):
        assert not kw, f"unexpected sdpa arguments {sorted(kw)}"
        seen.append(dict(sq=q.shape[2], skv=k.shape[2], causal=causal, mask=attn_mask,
                         score_mod=score_mod, block_mask=block_mask, lse=return_lse))
        keep = None if block_mask is None else _ref(block_mask.mask_mod)
        out, lse = naive_attention(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask,
                                   score_ref=_ref(score_mod), keep_ref=keep)
        out = out.to(q.dtype)
        return (out, lse.float()) if return_lse else out

    monkeypatch.setattr(api, "sdpa", torch_stand_in_for_sdpa)
    return seen


class _Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2
    training = False


def _qkv(sq, skv, d=16, hq=4, hk=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, hq, sq, d, generator=g), torch.randn(2, hk, skv, d, generator=g),
            torch.randn(2, hk, skv, d, generator=g))


def test_a_call_without_variants_takes_the_plain_path(calls):
    q, k, v = _qkv(7, 7)
    hf.attention_forward(_Module(), q, k, v, None, scaling=0.25, sliding_window=None,
                         softcap=None, s_aux=None)
    (call,) = calls
    assert call["score_mod"] is None and call["block_mask"] is None and not call["lse"]


def test_softcap_is_gemma2s_eager_softcapping(calls):
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    q, k, v = _qkv(9, 9)
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    mask[0, ..., :3] = False
    mask[0, :, :3, 0] = True  # padded rows keep one key (eager has no empty row)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    got, _ = hf.attention_forward(_Module(), q, k, v, mask, scaling=0.3, softcap=2.0)
    want, _ = eager_attention_forward(_Module(), q, k, v, additive, scaling=0.3, softcap=2.0)
    assert calls[0]["score_mod"] is not None
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_s_aux_is_gpt_oss_sinks_with_a_gradient_to_the_sinks(calls):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = _Module()
    module.sinks = torch.nn.Parameter(torch.randn(4))
    q, k, v = _qkv(6, 6)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    got, _ = hf.attention_forward(module, q, k, v, mask, scaling=0.25, s_aux=module.sinks)
    (g_got,) = torch.autograd.grad(got.square().sum(), module.sinks)
    want, _ = eager_attention_forward(module, q, k, v, additive, scaling=0.25)
    (g_want,) = torch.autograd.grad(want.square().sum(), module.sinks)
    assert calls[0]["lse"] is True
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sq,skv,mask,block", [
    (12, 12, False, True),  # unpadded prefill past the window: causal + the window's tiles
    (12, 12, True, True),  # padded prefill: transformers' mask + the window's tiles
    (4, 4, False, False),  # shorter than the window: it cuts nothing
    (1, 12, True, False),  # decode: the mask alone (only it knows the cache's positions)
])
def test_a_sliding_window_adds_its_left_edge_as_a_block_mask_in_prefill(calls, sq, skv, mask,
                                                                        block):
    q, k, v = _qkv(sq, skv)
    m = torch.ones(2, 1, sq, skv, dtype=torch.bool) if mask else None
    hf.attention_forward(_Module(), q, k, v, m, sliding_window=5)
    (call,) = calls
    assert (call["block_mask"] is not None) is block
    assert call["causal"] is (sq > 1 and not mask)


def test_the_windows_block_mask_is_made_once_per_length(calls):
    q, k, v = _qkv(12, 12)
    for _ in range(3):
        hf.attention_forward(_Module(), q, k, v, None, sliding_window=5)
    assert calls[0]["block_mask"] is calls[2]["block_mask"]


def _tiny(kind):
    small = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
                 initializer_range=0.2)  # scores large enough for softcap and sinks to bite
    if kind == "gemma2":  # alternating sliding/full layers, softcap
        return transformers.Gemma2Config(**small, query_pre_attn_scalar=16,
                                         attn_logit_softcapping=2.0), "Gemma2ForCausalLM"
    if kind == "mistral":
        return transformers.MistralConfig(**small), "MistralForCausalLM"
    return transformers.GptOssConfig(**small, num_local_experts=4, num_experts_per_tok=2
                                     ), "GptOssForCausalLM"


def _pair(kind):
    if kind == "gpt_oss" and not hasattr(transformers, "GptOssConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no GptOss")
    cfg, cls = _tiny(kind)
    torch.manual_seed(0)
    ours = getattr(transformers, cls)(cfg).eval()
    ref = getattr(transformers, cls)(copy.deepcopy(cfg)).eval()
    ref.load_state_dict(ours.state_dict())
    ours.set_attn_implementation(hf.register())
    ref.set_attn_implementation("eager")
    return ours, ref


KINDS = ["gemma2", "mistral", "gpt_oss"]


@pytest.mark.parametrize("kind", KINDS)
@torch.inference_mode()
def test_a_tiny_model_through_the_mapping_matches_eager(calls, kind):
    ours, ref = _pair(kind)
    ids = torch.randint(0, 128, (2, 15), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert any(c["block_mask"] is not None for c in calls)  # a window shorter than S ran
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    keep = mask.bool()
    torch.testing.assert_close(ours(ids, attention_mask=mask).logits[keep],
                               ref(ids, attention_mask=mask).logits[keep], rtol=1e-4,
                               atol=1e-4)
    gen = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **gen), ref.generate(ids, **gen))
    assert any(c["sq"] == 1 for c in calls)  # decode steps ran through the mapping
