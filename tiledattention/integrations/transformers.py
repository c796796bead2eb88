"""Hugging Face transformers: the kernel as an attention implementation.

``register()`` adds ``attention_forward`` to ``transformers.AttentionInterface`` and the
matching mask function (transformers' own ``sdpa_mask``: a bool mask, True = attend, or
None where causality alone decides; none for a packed row, see below) to
``AttentionMaskInterface``; then

    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="tiledattention")
    # or: model.set_attn_implementation("tiledattention")

How calls map onto ``tiledattention.sdpa`` (the same decisions as transformers' sdpa path):
- causal prefill without a mask: ``causal=True`` (top-left, as torch's ``is_causal``);
- padding (e.g. left-padded batches): transformers builds the bool mask, passed as is;
- KV-cache decode (Sq = 1, or any Sq with a mask): ``causal=False`` with the mask, so the
  new query sees the whole cache;
- GQA: K/V are passed with their own heads and ``enable_gqa=True`` (no repeat_kv copy).

The model's attention arguments map onto ``tiledattention.variants``:
- ``softcap`` (Gemma 2's ``attn_logit_softcapping``): ``variants.softcap`` as score_mod;
- ``s_aux`` (gpt-oss's per-head sinks, a parameter that trains): ``variants.sinks``;
- ``sliding_window`` (Mistral, Gemma 2/3, gpt-oss: W keys including the query itself):
  transformers' mask holds the window wherever one is needed (its mask function has it;
  with a KV cache its offsets too), so the mask stays; in a prefill (Sq = Skv: positions
  are the indices, as in transformers' mask) with Skv > W the window's left edge,
  ``variants.sliding_window(W, _AHEAD)``, is added as a block mask, so key tiles older
  than the window are never loaded. Only the left edge: a mask that lets a query see
  later keys (Gemma 3's bidirectional image tokens) keeps them. A decode step (Sq < Skv:
  only transformers knows the cache's positions) uses the mask alone. The mask itself is
  not skipped: some models (PhiMoE, Doge, BLT) build the window mask without passing
  ``sliding_window`` to the attention.
A call without them takes the plain path, unchanged.

Padding-free training (``DataCollatorWithFlattening``: one row of sequences back to back,
with ``cu_seq_lens_*`` / ``max_length_*`` or restarting ``position_ids``) calls
``tiledattention.sdpa_varlen`` per sequence, causal, with the model's window and softcap,
as ``flash_attention_2`` does (``integrations/transformers_packed.py``). Continuous
batching (``model.generate_batch``, with ``attn_implementation="paged|tiledattention"``,
also registered) reads the paged cache through ``tiledattention.sdpa_paged``
(``integrations/transformers_paged.py``).

Needs the ``hf`` extra (``pip install 'tiledattention[hf]'``); dropout must be 0. It
trains (``sdpa`` is differentiable) and compiles (``torch.compile``; a variant call costs
one graph break); ``stages/model.py`` times prefill, decode and a training step, eager and
compiled. For a model left on ``attn_implementation="sdpa"``,
``tiledattention.sdpa_mode()`` routes PyTorch's SDPA calls instead
(``integrations/dropin.py``).
"""

from __future__ import annotations

import functools

import torch

from . import transformers_packed as _packed
from .transformers_paged import PAGED_PREFIX, paged_attention_forward

NAME = "tiledattention"
_AHEAD = 2**30  # a window's right extent that rules nothing out (one compile per W)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D] in,
    ([B, Sq, Hq, D], None) out."""
    from ..api import sdpa
    from ..errors import InputError

    if dropout:
        raise InputError(f"tiledattention has no attention dropout (got dropout={dropout}); "
                         "use it for inference (model.eval())")
    if kwargs.get("position_bias") is not None:
        raise InputError("tiledattention does not take position_bias; use "
                         "attn_implementation='sdpa' for this model")
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    softcap, window, sink = kwargs.get("softcap"), kwargs.get("sliding_window"), kwargs.get(
        "s_aux")
    marked = _packed.marked_window(attention_mask)
    packed = _packed.packed_call(query, key, attention_mask, marked, kwargs)
    if packed is not None:
        return _packed.packed_forward(module, query, key, value, packed, scaling=scaling,
                                      is_causal=is_causal, softcap=softcap, sink=sink,
                                      window=marked if marked is not None else window), None
    if marked is not None:
        raise InputError("tiledattention: the mask says this row is packed (padding-free) "
                         "but neither position_ids nor cu_seq_lens_q/k reached the attention")
    causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    if softcap is None and window is None and sink is None:
        out = sdpa(query, key, value, causal=causal, scale=scaling, attn_mask=attention_mask,
                   enable_gqa=query.shape[1] != key.shape[1])
    else:
        out = _with_variants(query, key, value, attention_mask, causal, scaling, softcap,
                             window, sink)
    return out.transpose(1, 2).contiguous(), None


def _with_variants(query, key, value, attention_mask, causal, scaling, softcap, window, sink):
    """A call carrying softcap, a sliding window and/or sinks (see the module docstring)."""
    from .. import variants
    from ..api import sdpa

    kw = dict(causal=causal, scale=scaling, attn_mask=attention_mask,
              enable_gqa=query.shape[1] != key.shape[1])
    if softcap:
        kw["score_mod"] = _softcap(float(softcap))
    sq, skv = query.shape[2], key.shape[2]
    # The mask (or causality) already decides; in a prefill the positions are the indices,
    # so the window's left edge as a block mask only skips the tiles it rules out.
    if window is not None and sq == skv > window:
        kw["block_mask"] = _window_blocks(int(window), sq, skv, query.device)
    if sink is None:
        return sdpa(query, key, value, **kw)
    return variants.sinks(query, key, value, sink, **kw)


@functools.lru_cache(maxsize=16)
def _softcap(cap: float):
    from .. import variants

    return variants.softcap(cap)


@functools.lru_cache(maxsize=32)
def _window_blocks(window: int, sq: int, skv: int, device: torch.device):
    """The window's left edge as a block mask, shared by every sliding layer of a forward
    (and later calls of the same length): classified once, not once per layer."""
    from .. import variants
    from ..kernel.blockmask import block_mask

    return block_mask(variants.sliding_window(window, _AHEAD), None, None, sq, skv,
                      device=device)


def register(name: str = NAME) -> str:
    """Register the kernel (and transformers' sdpa mask function) under ``name``."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        from ..errors import InputError

        raise InputError(f"register: name {name!r} must be a non-empty string without "
                         "surrounding spaces (it is what attn_implementation= names)")
    try:
        from transformers import AttentionInterface
    except ImportError as exc:
        from ..errors import InputError

        raise InputError("transformers is not installed: pip install 'tiledattention[hf]'"
                         ) from exc
    AttentionInterface.register(name, attention_forward)
    # continuous batching (generate_batch) asks for "paged|<name>"; no mask function for
    # it: the paged path needs none, and transformers then builds none
    AttentionInterface.register(PAGED_PREFIX + name, paged_attention_forward)
    try:  # transformers >= 4.53 picks the mask builder per implementation
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return name
    AttentionMaskInterface.register(name, _packed.packed_aware_mask)
    return name


def tiny_llama(attn_implementation: str, *, dtype=torch.bfloat16, device="cuda", seed: int = 0,
               layers: int = 4):
    """The Llama-shaped model the GPU test and the model benchmark (``stages/model.py``) run: random
    weights (no download), hidden 2048, 16 heads / 4 KV heads (D = 128), a 1024-token
    vocabulary, ``layers`` layers. Same ``seed``, same weights, whatever the attention."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=8192)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(device, dtype).eval()
    model.set_attn_implementation(attn_implementation)
    return model
