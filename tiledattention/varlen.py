"""Packed variable-length batches and a paged KV cache: FlashAttention's workload APIs.

``sdpa_varlen`` takes sequences packed back to back (``[total, H, D]`` with int32
``cu_seqlens``, what ``flash_attn_varlen_func`` and transformers' padding-free training
take); ``sdpa_paged`` reads keys and values through a block table from a cache of
fixed-size pages (``[num_pages, page_size, Hkv, D]``, FA4's and vLLM's layout) for decode
and chunked prefill. The conventions are FlashAttention's: causality aligned bottom-right
when a sequence's Sq != Skv, ``window_size=(left, right)`` with -1 unbounded, ``softcap``,
GQA whenever Hq is a multiple of Hkv, the log-sum-exp as ``[Hq, total_q]``. Nothing reads
``cu_seqlens`` on the host: the kernels find each program's sequence themselves, so a call
never synchronises and can be captured in a CUDA graph; ``max_seqlen_*`` bound the grid,
as in FA (an understated one is refused where it can be seen without a sync, and is never
an overrun: a program past ``max_seqlen`` is not launched, so those rows would be left
unwritten — pass the true maximum).

The float64 definitions are ``workload_reference.varlen_reference`` / ``paged_reference``.
"""

from __future__ import annotations

from .kernel import workload as _workload


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                seqused_k=None, causal: bool = False, scale: float | None = None,
                window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                score_mod=None, mask_mod=None, return_lse: bool = False, schedule=None):
    """Attention over packed variable-length sequences, forward and backward.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D] (fp16/bf16, one dtype and device, D a
    multiple of 8 up to 256, Hq a multiple of Hkv). cu_seqlens_q / cu_seqlens_k: int32
    [B + 1], non-decreasing from 0 (sequence b is rows ``cu[b]:cu[b+1]``). max_seqlen_q /
    max_seqlen_k: Python ints >= every sequence's length. seqused_k: optional int32 [B],
    the keys of sequence b actually used (the first ``seqused_k[b]`` of its span).
    causal: bottom-right aligned. window_size: (left, right) keys around the diagonal,
    -1 unbounded. softcap: ``softcap * tanh(score / softcap)`` when > 0. score_mod /
    mask_mod: as ``sdpa``'s, with ``b`` the sequence index and ``q_idx`` / ``kv_idx``
    positions within the sequence.

    Returns out [total_q, Hq, D] (and lse [Hq, total_q] fp32 with ``return_lse``).
    Differentiable in q, k and v (and captured tensors, as ``sdpa``)."""
    return _workload.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            seqused_k=seqused_k, causal=causal, scale=scale,
                            window_size=window_size, softcap=softcap, score_mod=score_mod,
                            mask_mod=mask_mod, return_lse=return_lse, schedule=schedule)


def sdpa_paged(q, k_cache, v_cache, page_table, cache_seqlens, *, cu_seqlens_q=None,
               max_seqlen_q: int | None = None, causal: bool = False,
               scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
               softcap: float = 0.0, score_mod=None, mask_mod=None, return_lse: bool = False,
               schedule=None):
    """Attention of new tokens against a paged KV cache (decode, chunked prefill).

    q: [B, Sq, Hq, D] (Sq new tokens per sequence; Sq = 1 for decode) or packed [total_q,
    Hq, D] with ``cu_seqlens_q`` and ``max_seqlen_q`` (chunked prefill, ragged Sq).
    k_cache, v_cache: [num_pages, page_size, Hkv, D]; page_size a power of two from 16 to
    256. page_table: int32 [B, max_pages], the pages of sequence b in order.
    cache_seqlens: int32 [B], the tokens of sequence b in the cache **including** the new
    ones (append them first: writing the cache is the caller's, e.g.
    ``k_cache[page, slot] = k_new``); its keys are positions 0 .. cache_seqlens[b] - 1.
    causal: bottom-right aligned (the new tokens are the last Sq of the context).
    Inference only (no gradient).

    Returns out shaped like q (and lse fp32 [B, Hq, Sq], or [Hq, total_q] when packed)."""
    return _workload.paged(q, k_cache, v_cache, page_table, cache_seqlens,
                           cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
                           scale=scale, window_size=window_size, softcap=softcap,
                           score_mod=score_mod, mask_mod=mask_mod, return_lse=return_lse,
                           schedule=schedule)
