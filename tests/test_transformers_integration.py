"""The transformers integration on the CPU: registration, and how transformers' attention
calls map onto ``tiledattention.sdpa`` (with the kernel replaced by torch's SDPA taking
exactly the mapped arguments, so a tiny Llama must reproduce the built-in ``sdpa`` path).
The kernel itself runs in tests/gpu/test_transformers_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers not installed: "
                    "pip install 'tiledattention[hf]'")

from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention import api  # noqa: E402
from tiledattention.integrations import transformers as hf  # noqa: E402


@pytest.fixture
def calls(monkeypatch):
    """ta.sdpa replaced by torch's SDPA with the mapped arguments; each call recorded."""
    seen = []

    def fake_sdpa(q, k, v, *, causal=False, scale=None, attn_mask=None, enable_gqa=False,
                  **kw):
        seen.append(dict(sq=q.shape[2], skv=k.shape[2], causal=causal, mask=attn_mask,
                         gqa=enable_gqa))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                              scale=scale, enable_gqa=enable_gqa)

    monkeypatch.setattr(api, "sdpa", fake_sdpa)
    return seen


def test_register_adds_the_attention_and_its_mask_function():
    from transformers.masking_utils import AttentionMaskInterface

    from tiledattention.integrations.transformers_packed import packed_aware_mask

    name = hf.register("tiledattention-test")
    assert AttentionInterface._global_mapping[name] is hf.attention_forward
    # sdpa_mask, except for a packed row (tests/test_transformers_packed.py)
    assert AttentionMaskInterface._global_mapping[name] is packed_aware_mask


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("sq,mask,is_causal,want_causal", [
    (7, None, None, True),  # prefill: torch's top-left causal
    (1, None, None, False),  # decode: the new token sees the whole cache
    (7, "bool", None, False),  # padding: the mask says it all
    (7, None, False, False),  # a non-causal (encoder) layer
])
def test_calls_map_causality_masks_and_gqa(calls, sq, mask, is_causal, want_causal):
    q = torch.randn(2, 8, sq, 16)
    k, v = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    m = torch.rand(2, 1, sq, 9) > 0.2 if mask else None
    out, weights = hf.attention_forward(_Module(), q, k, v, m, scaling=0.3,
                                        is_causal=is_causal)
    assert weights is None and out.shape == (2, sq, 8, 16) and out.is_contiguous()
    (call,) = calls
    assert call["causal"] is want_causal and call["gqa"] is True and call["mask"] is m


def test_dropout_and_position_bias_are_refused(calls):
    q = torch.randn(1, 2, 3, 16)
    with pytest.raises(ta.InputError, match="dropout"):
        hf.attention_forward(_Module(), q, q, q, None, dropout=0.1)
    with pytest.raises(ta.InputError, match="position_bias"):
        hf.attention_forward(_Module(), q, q, q, None, position_bias=torch.zeros(1))
    assert calls == []


@torch.inference_mode()
def test_a_tiny_llama_through_the_mapping_matches_builtin_sdpa(calls):
    name = hf.register()
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)
    torch.manual_seed(0)
    ours = LlamaForCausalLM(cfg).eval()
    ref = LlamaForCausalLM(copy.deepcopy(cfg)).eval()  # models share a config object
    ref.load_state_dict(ours.state_dict())
    ours.set_attn_implementation(name)
    ref.set_attn_implementation("sdpa")
    ids = torch.randint(0, 128, (2, 11))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    torch.testing.assert_close(ours(ids).logits, ref(ids).logits)
    keep = mask.bool()
    torch.testing.assert_close(ours(ids, attention_mask=mask).logits[keep],
                               ref(ids, attention_mask=mask).logits[keep])
    gen = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **gen), ref.generate(ids, **gen))
    assert any(c["sq"] == 1 and not c["causal"] for c in calls)  # decode steps ran
    assert any(c["causal"] for c in calls)  # the unpadded prefill ran causal


@torch.inference_mode()
def test_a_compiled_llama_is_one_graph_and_matches_builtin_sdpa(calls):
    """torch.compile(fullgraph=True) fails on any graph break in the attention path (one
    per layer once sent every layer to eager, recompiling each call). While tracing,
    transformers builds the causal mask dense, with a cache or without."""
    name = hf.register()
    torch.manual_seed(0)
    ours = LlamaForCausalLM(LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2)).eval()
    ids = torch.randint(0, 128, (1, 12))
    ours.set_attn_implementation("sdpa")
    want = ours(ids, use_cache=False).logits
    ours.set_attn_implementation(name)
    for use_cache in (False, True):
        torch._dynamo.reset()
        calls.clear()
        compiled = torch.compile(ours, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(ids, use_cache=use_cache).logits, want)
        seen = [(c["causal"], None if c["mask"] is None else tuple(c["mask"].shape))
                for c in calls]
        assert seen == [(False, (1, 1, 12, 12))] * 2
    torch._dynamo.reset()


def test_register_refuses_an_empty_name():
    from tiledattention.errors import InputError
    from tiledattention.integrations.transformers import register

    for name in ("", "  ", " tiled"):
        with pytest.raises(InputError, match="must be a non-empty string"):
            register(name)
