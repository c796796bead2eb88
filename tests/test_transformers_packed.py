"""Padding-free (packed) training through the transformers integration, on the CPU: which
calls reach ``sdpa_varlen`` and with what, and that a tiny Llama trained one step on a packed
batch matches eager attention on the same batch (loss and every gradient). The kernel is
replaced by the float64 ``varlen_reference`` cast back to the input dtype; it runs in
tests/gpu/test_transformers_packed_gpu.py."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed: "
                    "pip install 'tiledattention[hf]'")

from transformers import (  # noqa: E402
    DataCollatorWithFlattening,
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)
from transformers.masking_utils import (  # noqa: E402
    and_masks,
    causal_mask_function,
    or_masks,
    packed_sequence_mask_function,
    sliding_window_causal_mask_function,
)

import tiledattention as ta  # noqa: E402
from tiledattention import api, varlen  # noqa: E402
from tiledattention.integrations import transformers as hf  # noqa: E402
from tiledattention.integrations import transformers_packed as packed  # noqa: E402
from tiledattention.workload_reference import varlen_reference  # noqa: E402

LENGTHS = (5, 9, 1, 13, 4)  # ragged, with a length-1 sequence


@pytest.fixture
def varlen_calls(monkeypatch):
    """sdpa_varlen replaced by the float64 reference (cast back); each call recorded."""
    seen = []

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, scale=None,
             window_size=(-1, -1), softcap=0.0, **kw):
        seen.append(dict(shape=tuple(q.shape), kv_shape=tuple(k.shape), cu_q=cu_q.tolist(),
                         cu_k=cu_k.tolist(), max_q=max_q, max_k=max_k, causal=causal,
                         window=window_size, softcap=softcap, dtype=cu_q.dtype))
        out, _ = varlen_reference(q, k, v, cu_q, cu_k, causal=causal, scale=scale,
                                  window_size=window_size, softcap=softcap)
        return out.to(q.dtype)

    monkeypatch.setattr(varlen, "sdpa_varlen", fake)
    return seen


@pytest.fixture
def dense_calls(monkeypatch):
    seen = []

    def fake_sdpa(q, k, v, *, causal=False, scale=None, attn_mask=None, enable_gqa=False,
                  **kw):
        seen.append(dict(sq=q.shape[2], causal=causal, mask=attn_mask))
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale, enable_gqa=enable_gqa)

    monkeypatch.setattr(api, "sdpa", fake_sdpa)
    return seen


def _batch(lengths=LENGTHS, *, fa_kwargs: bool, vocab: int = 128, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    features = [{"input_ids": torch.randint(0, vocab, (n,), generator=gen).tolist()}
                for n in lengths]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=fa_kwargs)(features)
    return batch


def _cu(lengths=LENGTHS):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _pair(model_cls, cfg):
    torch.manual_seed(0)
    ours = model_cls(cfg).train()
    ref = model_cls(copy.deepcopy(cfg)).train()  # models share a config object
    ref.load_state_dict(ours.state_dict())
    ours.set_attn_implementation(hf.register())
    ref.set_attn_implementation("eager")
    return ours, ref


def _llama():
    return LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)


def _step(model, batch):
    """One training step's loss and gradients (no update: both models stay equal).
    use_cache=False: with a cache transformers builds no packed mask, so eager would
    attend across the packed sequences (ours and flash_attention_2 do not)."""
    model.zero_grad(set_to_none=True)
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("fa_kwargs", [True, False], ids=["cu_seq_lens", "position_ids"])
def test_a_packed_batch_reaches_sdpa_varlen_with_its_offsets(varlen_calls, dense_calls,
                                                             fa_kwargs):
    ours, _ = _pair(LlamaForCausalLM, _llama())
    ours(**_batch(fa_kwargs=fa_kwargs))
    total = sum(LENGTHS)
    assert len(varlen_calls) == 2 and dense_calls == []  # one call per layer, none dense
    for call in varlen_calls:
        assert call["shape"] == (total, 8, 8) and call["kv_shape"] == (total, 2, 8)
        assert call["cu_q"] == call["cu_k"] == _cu()
        assert call["max_q"] == call["max_k"] == max(LENGTHS)
        assert call["causal"] is True and call["window"] == (-1, 0)
        assert call["dtype"] == torch.int32


@pytest.mark.parametrize("fa_kwargs", [True, False], ids=["cu_seq_lens", "position_ids"])
def test_one_training_step_on_a_packed_batch_matches_eager(varlen_calls, fa_kwargs):
    ours, ref = _pair(LlamaForCausalLM, _llama())
    batch = _batch(fa_kwargs=fa_kwargs)
    loss, grads = _step(ours, batch)
    ref_loss, ref_grads = _step(ref, batch)
    assert varlen_calls  # the packed path ran
    torch.testing.assert_close(loss, ref_loss)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")


def test_offsets_from_position_ids_are_read_once_per_forward(varlen_calls, monkeypatch):
    reads = []
    real = packed.offsets_of
    monkeypatch.setattr(packed, "offsets_of", lambda *a: reads.append(1) or real(*a))
    ours, _ = _pair(LlamaForCausalLM, _llama())
    ours(**_batch(fa_kwargs=False))
    ours(**_batch(fa_kwargs=False))  # new position_ids, equal values: read again
    assert len(varlen_calls) == 4 and len(reads) == 2  # 2 forwards x 2 layers, 2 syncs
    ours(**_batch(fa_kwargs=True))
    assert len(varlen_calls) == 6 and len(reads) == 2  # the collator's offsets: none


def test_a_packed_batch_is_not_one_long_sequence(varlen_calls):
    """The check above can fail: the same batch as one causal sequence differs."""
    ours, ref = _pair(LlamaForCausalLM, _llama())
    batch = _batch(fa_kwargs=False)
    one_row = dict(input_ids=batch["input_ids"], labels=batch["labels"])
    assert not torch.allclose(ours(**batch).loss, ref(**one_row, use_cache=False).loss)


def test_a_sliding_window_packed_batch_gets_the_window_and_matches_eager(varlen_calls):
    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                        sliding_window=4)
    ours, ref = _pair(MistralForCausalLM, cfg)
    batch = _batch(fa_kwargs=False)
    loss, grads = _step(ours, batch)
    ref_loss, ref_grads = _step(ref, batch)
    assert {c["window"] for c in varlen_calls} == {(3, 0)}  # W keys including the query
    torch.testing.assert_close(loss, ref_loss)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")


def test_gemma2_packed_gets_softcap_and_its_sliding_layers_and_matches_eager(varlen_calls):
    """Gemma 2 alternates sliding (W = 4) and full layers and caps its scores at 50."""
    cfg = Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, sliding_window=4, attn_logit_softcapping=50.0)
    ours, ref = _pair(Gemma2ForCausalLM, cfg)
    batch = _batch(fa_kwargs=True)
    loss, grads = _step(ours, batch)
    ref_loss, ref_grads = _step(ref, batch)
    assert {(c["window"], c["softcap"]) for c in varlen_calls} == {((3, 0), 50.0),
                                                                  ((-1, 0), 50.0)}
    torch.testing.assert_close(loss, ref_loss)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")


@torch.inference_mode()
def test_unpacked_batches_keep_the_dense_path(varlen_calls, dense_calls):
    ours, _ = _pair(LlamaForCausalLM, _llama())
    ours.eval()
    ids = torch.randint(0, 128, (1, 12))
    ours(ids)  # one sequence: position_ids 0..11 do not restart
    ours(ids, position_ids=torch.arange(12)[None])
    ours(torch.randint(0, 128, (2, 12)))  # a batch of two
    mask = torch.ones(1, 12, dtype=torch.long)
    mask[0, :3] = 0
    restart = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]])
    ours(ids, attention_mask=mask, position_ids=restart)  # a padding mask wins
    assert varlen_calls == []
    assert [c["causal"] for c in dense_calls[:6]] == [True] * 6
    assert dense_calls[-1]["mask"] is not None


def test_the_mask_function_skips_only_packed_causality():
    ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
    packed_fn = packed_sequence_mask_function(ids)
    size = dict(batch_size=1, q_length=6, kv_length=6, allow_is_causal_skip=False)
    assert packed.packed_aware_mask(**size, mask_function=and_masks(
        causal_mask_function, packed_fn)) is None
    mark = packed.packed_aware_mask(**size, mask_function=and_masks(
        sliding_window_causal_mask_function(3), packed_fn))
    assert packed.marked_window(mark) == 3 and mark.numel() == 0
    # anything else is built as sdpa builds it: an image-token or_mask, a batch of two
    image = or_masks(causal_mask_function, lambda b, h, q, k: q < 2)
    full = packed.packed_aware_mask(**size, mask_function=and_masks(image, packed_fn))
    assert full is not None and full.shape == (1, 1, 6, 6)
    assert packed.marked_window(full) is None
    two = packed.packed_aware_mask(**{**size, "batch_size": 2}, mask_function=and_masks(
        causal_mask_function, packed_sequence_mask_function(ids.expand(2, -1))))
    assert two is not None and two.shape == (2, 1, 6, 6)


def test_the_window_marker_is_read_inside_one_compiled_graph():
    """A marker made inside a compiled graph has no id() dynamo can trace: the window
    rides in its shape, so reading it breaks no graph."""
    @torch.compile(fullgraph=True, backend="eager")
    def read(x):
        return packed.marked_window(packed._mark_window(5, x.device)), packed.marked_window(
            x[None, None] > 0)

    torch._dynamo.reset()
    assert read(torch.ones(3, 3)) == (5, None)
    assert packed.marked_window(torch.ones(0, 1, 0, 5, dtype=torch.bool)) is None


def test_sinks_on_a_packed_batch_are_refused(varlen_calls):
    q = torch.randn(1, 4, 6, 16)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])

    class Module(torch.nn.Module):
        is_causal = True

    with pytest.raises(ta.InputError, match="s_aux"):
        hf.attention_forward(Module(), q, q, q, None, position_ids=pos,
                             s_aux=torch.zeros(4))
    assert varlen_calls == []
