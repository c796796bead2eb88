"""Continuous batching (``generate_batch``) through ``paged|tiledattention`` on the CPU:
which calls reach ``sdpa_paged`` / ``sdpa_varlen`` and with what, and greedy tokens equal to
eager generation, request by request. The kernels are replaced by the float64 references
cast back to the input dtype; they run in tests/gpu/test_transformers_packed_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed: "
                    "pip install 'tiledattention[hf]'")

from transformers import (  # noqa: E402
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention import varlen  # noqa: E402
from tiledattention.integrations import transformers as hf  # noqa: E402
from tiledattention.integrations.transformers_paged import (  # noqa: E402
    page_table_from_reads,
    paged_attention_forward,
)
from tiledattention.workload_reference import paged_reference, varlen_reference  # noqa: E402

PROMPTS = (5, 19, 40)  # 40 > max_batch_tokens: a chunked prefill
NEW = 6


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, scale=None,
                    window_size=(-1, -1), softcap=0.0, **kw):
        seen.append(dict(kind="varlen", cu_q=cu_q.tolist(), cu_k=cu_k.tolist(), causal=causal,
                         window=window_size))
        out, _ = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, scale=scale,
                                  window_size=window_size, softcap=softcap)
        return out.to(q.dtype)

    def fake_paged(q, k_cache, v_cache, page_table, cache_seqlens, *, cu_seqlens_q=None,
                   max_seqlen_q=None, causal=False, scale=None, window_size=(-1, -1),
                   softcap=0.0, **kw):
        seen.append(dict(kind="paged", cu_q=None if cu_seqlens_q is None else cu_seqlens_q.tolist(),
                         lens=cache_seqlens.tolist(),
                         max_q=max_seqlen_q, causal=causal, page=k_cache.shape[1],
                         shares=k_cache.untyped_storage().data_ptr(), view=k_cache._is_view(),
                         table=page_table.dtype))
        out, _ = paged_reference(q, k_cache, v_cache, page_table, cache_seqlens,
                                 cu_seqlens_q=cu_seqlens_q, causal=causal, scale=scale,
                                 window_size=window_size, softcap=softcap)
        return out.to(q.dtype)

    monkeypatch.setattr(varlen, "sdpa_varlen", fake_varlen)
    monkeypatch.setattr(varlen, "sdpa_paged", fake_paged)
    return seen


def _models(model_cls, cfg):
    torch.manual_seed(0)
    ours = model_cls(cfg).eval()
    ref = model_cls(copy.deepcopy(cfg)).eval()
    ref.load_state_dict(ours.state_dict())
    ours.set_attn_implementation("paged|" + hf.register())
    ref.set_attn_implementation("eager")
    return ours, ref


def _generate(ours, ref, block_size: int):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in PROMPTS]
    cfg = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=block_size, num_blocks=32, max_batch_tokens=32)
    out = ours.generate_batch(prompts, generation_config=cfg, continuous_batching_config=cb,
                              progress_bar=False)
    got = [out[f"req_{i}"].generated_tokens for i in range(len(prompts))]
    want = [ref.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False,
                         pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    return got, want


def _llama():
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)


def test_generate_batch_reads_the_paged_cache_and_matches_eager_greedy(calls):
    ours, ref = _models(LlamaForCausalLM, _llama())
    got, want = _generate(ours, ref, block_size=16)
    assert got == want
    paged = [c for c in calls if c["kind"] == "paged"]
    assert paged and all(c["causal"] and c["page"] == 16 for c in paged)
    assert all(c["table"] == torch.int32 for c in paged)
    # each layer's cache tensor, passed as a view: no copy of the cache
    assert len({c["shares"] for c in paged}) == 2 and all(c["view"] for c in paged)
    # the chunked prefill (new tokens against a cache holding more) and decode steps
    assert any(c["max_q"] > 1 and c["lens"][0] > c["cu_q"][1] for c in paged)
    assert any(c["max_q"] == 1 for c in paged)
    # a prefill with nothing cached attends its own keys (nothing to page through)
    assert calls[0]["kind"] == "varlen" and calls[0]["causal"]


def test_block_sizes_the_kernel_lacks_and_sliding_layers_take_the_gathered_keys(calls):
    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                        sliding_window=7)
    ours, ref = _models(MistralForCausalLM, cfg)
    got, want = _generate(ours, ref, block_size=16)
    assert got == want
    assert calls and {c["kind"] for c in calls} == {"varlen"}
    # W = 7 keys including the query; (-1, 0) where no request holds more than W keys
    # (a sliding layer reads at most W - 1 cached tokens)
    windows = {c["window"] for c in calls}
    assert (6, 0) in windows and windows <= {(6, 0), (-1, 0)}
    calls.clear()
    ours, ref = _models(LlamaForCausalLM, _llama())
    got, want = _generate(ours, ref, block_size=8)  # not a page size of sdpa_paged
    assert got == want
    assert calls and {c["kind"] for c in calls} == {"varlen"}


def test_the_page_table_is_read_off_the_cache_reads():
    # two requests: 20 tokens on pages 3, 1 (block 16); 5 tokens on page 7
    reads = torch.cat([torch.arange(48, 64), torch.arange(16, 20), torch.arange(112, 117)])
    cu_k = torch.tensor([0, 20, 25], dtype=torch.int32)
    table = page_table_from_reads(reads, cu_k, 20, 16)
    assert table.dtype == torch.int32 and table.shape == (2, 2)
    assert table[0].tolist() == [3, 1] and table[1, 0].item() == 7


def test_the_paged_implementation_refuses_a_call_without_its_cache():
    q = torch.randn(1, 4, 3, 16)
    with pytest.raises(ta.InputError, match="without a paged attention cache"):
        paged_attention_forward(torch.nn.Module(), q, q, q, None)


def test_a_block_table_decode_writes_through_the_table_and_reads_the_pages(calls):
    """transformers' decode fast path (a block table, no read/write index; 5.17 gives it
    to FlashAttention only): the new token lands at slot cache_seqlens - 1 of its pages, a
    padding request's in the write trash, and the output is attention over each request's
    whole context."""
    from types import SimpleNamespace

    from tiledattention.reference import naive_attention

    bs, hkv, hq, d = 16, 2, 4, 16
    torch.manual_seed(0)
    k_cache, v_cache = (torch.randn(6 * bs, hkv, d) for _ in range(2))  # 4 blocks + 2 trash
    cache = SimpleNamespace(block_size=bs, key_cache=[k_cache], value_cache=[v_cache],
                            layer_index_to_group_indices={0: (0, 0)}, sliding_windows={0: 1},
                            write_trash_index=5 * bs)
    table = torch.tensor([[[3, 1], [0, -1], [-1, -1]]], dtype=torch.int32)  # 3rd: padding
    cu_k = torch.tensor([0, 21, 27, 27], dtype=torch.int32)  # 20 + 1 and 5 + 1 tokens
    q, k, v = torch.randn(1, hq, 3, d), torch.randn(1, hkv, 3, d), torch.randn(1, hkv, 3, d)
    module = SimpleNamespace(layer_idx=0)
    out, _ = paged_attention_forward(module, q, k, v, None, scaling=0.25, cache=cache,
                                     cu_seq_lens_q=torch.arange(4, dtype=torch.int32),
                                     max_seqlen_q=1, cu_seq_lens_k=cu_k, max_seqlen_k=1,
                                     read_index=[], write_index=[], block_table=table)
    assert torch.equal(k_cache[1 * bs + 4], k[0, :, 0]) and torch.equal(k_cache[0 * bs + 5],
                                                                         k[0, :, 1])
    assert torch.equal(k_cache[5 * bs], k[0, :, 2])  # the padding request's, in the trash
    for b, slots in enumerate([list(range(48, 64)) + list(range(16, 21)), list(range(0, 6))]):
        keys, vals = k_cache[slots].transpose(0, 1)[None], v_cache[slots].transpose(0, 1)[None]
        want, _ = naive_attention(q[:, :, b:b + 1], keys, vals, scale=0.25)
        torch.testing.assert_close(out[0, b], want[0, :, 0].float())
    assert calls[-1]["kind"] == "paged" and calls[-1]["lens"] == [21, 6, 0]
