"""transformers' continuous batching (``generate_batch``, ``ContinuousBatchingManager``)
through the kernel: the ``paged|tiledattention`` attention implementation.

What transformers 5.x calls. Continuous batching packs every scheduled request's new
tokens into one row (q ``[1, Hq, total_q, D]``) and passes, per forward: the
``PagedAttentionCache`` (``cache``), ``cu_seq_lens_q`` / ``max_seqlen_q``,
``cu_seq_lens_k`` / ``max_seqlen_k`` (past + new tokens per request; a dict per layer
type for hybrid models), ``write_index`` / ``read_index`` (per layer group: the flat cache
slots of the new tokens, and of every token a request reads, in order) and
``block_table``. The cache of a layer group is ``[(num_blocks + 2) * block_size, Hkv, D]``
— a view of ``[num_pages, page_size, Hkv, D]``, the layout ``sdpa_paged`` takes, with no
copy (the two extra blocks are transformers' read/write trash).

What we do with it:
- a full-attention layer reading a cache whose block size ``sdpa_paged`` takes (16–256):
  the new keys/values are written to their slots (``write_index``), a page table
  ``[B, ceil(max_seqlen_k / block_size)]`` is read off ``read_index`` (a request's reads
  run through its pages in order, page-aligned: entry ``j * block_size`` of its reads is
  on its ``j``-th page), and ``sdpa_paged`` attends the packed new tokens (chunked prefill
  and decode alike) against the pages, causal bottom-right: no gather of the cache;
- otherwise (a prefill with nothing cached, a sliding-window layer — transformers keeps
  those in a rolling buffer whose reads are not in page order —, another block size):
  ``cache.update`` writes and gathers the keys/values, and ``sdpa_varlen`` attends them
  with ``cu_seq_lens_k``, causal bottom-right (and the window), as transformers' own
  ``paged|flash_attention_*`` does.

``block_table`` (transformers' decode fast path: one new token per request, no read or
write index) is only filled for FlashAttention 2/3 in 5.17
(``continuous_batching.initialization.ensure_decode_fast_path_is_available``), so it never
reaches us there; should a later version pass it, the new tokens are written through it and
``sdpa_paged`` reads the cache through it.
"""

from __future__ import annotations

import torch

from .transformers_packed import Packed

PAGED_PREFIX = "paged|"


def paged_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, **kwargs):
    """transformers' paged attention signature: q [1, Hq, total_q, D], k/v [1, Hkv,
    total_q, D] (the new tokens) in, ([1, total_q, Hq, D], None) out."""
    from ..errors import InputError

    cache = kwargs.get("cache")
    if cache is None:
        raise InputError("paged|tiledattention was called without a paged attention cache: it "
                         "serves transformers' continuous batching (generate_batch); use "
                         "'tiledattention' for a standard forward")
    if dropout:
        raise InputError(f"tiledattention has no attention dropout (got dropout={dropout})")
    if kwargs.get("s_aux") is not None:
        raise InputError("paged|tiledattention: attention sinks (s_aux) are not supported by "
                         "sdpa_paged / sdpa_varlen; use paged|sdpa for this model")
    # the cache's own record of the layer (1: full attention), not module.sliding_window:
    # Mistral passes its window as an argument and has no such attribute
    window = cache.sliding_windows.get(module.layer_idx, 1)
    window = None if window == 1 else int(window)
    layer_type = "full_attention" if window is None else "sliding_attention"
    cu_k, max_k = kwargs["cu_seq_lens_k"], kwargs["max_seqlen_k"]
    if isinstance(cu_k, dict):
        cu_k, max_k = cu_k[layer_type], max_k[layer_type]
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    # CUDA-graph padding can state maxima above the tokens there are: the true ones are not
    max_q = min(max(int(kwargs["max_seqlen_q"]), 1), query.shape[2])
    softcap = float(kwargs.get("softcap") or 0.0)
    group, in_group = cache.layer_index_to_group_indices[module.layer_idx]
    if kwargs.get("block_table") is not None:  # the decode fast path: no read/write index
        out = _decode_with_table(query, key, value, cache, in_group,
                                 kwargs["block_table"][group], cu_k.to(torch.int32),
                                 scaling, softcap, window)
        return out.unsqueeze(0), None
    read = kwargs["read_index"][group]
    if window is None and read.numel() and cache.block_size in _page_sizes():
        out = _through_pages(module, query, key, value, cache, group, in_group, read,
                             kwargs["write_index"][group], cu_q, max_q, cu_k.to(torch.int32),
                             int(max_k), scaling, softcap)
    else:
        out = _through_gather(module, query, key, value, cache, kwargs, cu_q, max_q,
                              cu_k.to(torch.int32), int(max_k), scaling, softcap, window)
    return out.unsqueeze(0), None


def _page_sizes():
    from ..kernel.workload_check import PAGE_SIZES

    return PAGE_SIZES


def page_table_from_reads(read: torch.Tensor, cu_k: torch.Tensor, max_k: int,
                          block_size: int) -> torch.Tensor:
    """int32 [B, ceil(max_k / block_size)]: request b's j-th page is the page of its read
    ``j * block_size``. Entries past a request's last page name some valid page (they are
    never read: ``cache_seqlens`` stops the kernel before them)."""
    pages = max(-(-max_k // block_size), 1)
    at = cu_k[:-1, None].long() + torch.arange(pages, device=read.device)[None] * block_size
    return (read[at.clamp_(max=read.numel() - 1)] // block_size).to(torch.int32)


def _through_pages(module, query, key, value, cache, group, in_group, read, write, cu_q,
                   max_q, cu_k, max_k, scaling, softcap):
    from .. import varlen as _varlen

    k_cache, v_cache = cache.key_cache[in_group], cache.value_cache[in_group]
    # the new tokens into their slots, as cache.update does (it would also gather)
    k_cache.index_copy_(0, write, key[0].transpose(0, 1))
    v_cache.index_copy_(0, write, value[0].transpose(0, 1))
    shape = (-1, cache.block_size, k_cache.shape[-2], k_cache.shape[-1])
    table = page_table_from_reads(read, cu_k, max_k, cache.block_size)
    return _varlen.sdpa_paged(query[0].transpose(0, 1), k_cache.view(shape),
                              v_cache.view(shape), table, cu_k.diff().to(torch.int32),
                              cu_seqlens_q=cu_q, max_seqlen_q=max_q, causal=True,
                              scale=scaling, softcap=softcap)


def _decode_with_table(query, key, value, cache, in_group, table, cu_k, scaling, softcap,
                       window):
    """One new token per request (transformers fills ``block_table`` only for decode-only
    batches, and then no read/write index): each token goes to slot ``cache_seqlens - 1``
    of its pages (a padding request, with no tokens, to the write trash), then
    ``sdpa_paged``. Not reached from transformers 5.17, which gives a block table to
    FlashAttention only."""
    from .. import varlen as _varlen
    from ..errors import InputError

    if window is not None or cache.block_size not in _page_sizes():
        raise InputError(f"paged|tiledattention: a block table for a sliding-window layer or "
                         f"block size {cache.block_size} (sdpa_paged takes "
                         f"{_page_sizes()} without a window); use paged|sdpa")
    n = key.shape[2]
    lens = cu_k.diff()[:n]
    pos = (lens - 1).clamp_(min=0).long()
    page = table[:n].long().gather(1, (pos // cache.block_size)[:, None])[:, 0]
    slot = torch.where(lens > 0, page * cache.block_size + pos % cache.block_size,
                       cache.write_trash_index)
    k_cache, v_cache = cache.key_cache[in_group], cache.value_cache[in_group]
    k_cache.index_copy_(0, slot, key[0].transpose(0, 1))
    v_cache.index_copy_(0, slot, value[0].transpose(0, 1))
    shape = (-1, cache.block_size, k_cache.shape[-2], k_cache.shape[-1])
    # q [1, Hq, B, D] -> [B, 1, Hq, D]: one new token per request, a view
    return _varlen.sdpa_paged(query[0].transpose(0, 1)[:, None], k_cache.view(shape),
                              v_cache.view(shape), table[:n].to(torch.int32),
                              lens.to(torch.int32), causal=True, scale=scaling,
                              softcap=softcap)[:, 0]


def _through_gather(module, query, key, value, cache, kwargs, cu_q, max_q, cu_k, max_k,
                    scaling, softcap, window):
    from .transformers_packed import packed_forward

    k, v = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                        read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    k, v = (t.transpose(0, 1).unsqueeze(0) for t in (k, v))  # [1, Hkv, total_k, D] views
    max_k = min(max(max_k, 1), k.shape[2])
    return packed_forward(module, query, k, v, Packed(cu_q, cu_k, max_q, max_k),
                          scaling=scaling, is_causal=True, window=window, softcap=softcap,
                          sink=None)[0]
