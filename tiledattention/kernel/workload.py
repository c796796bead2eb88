"""The host path of packed (varlen) and paged calls: validate, plan, launch."""

from __future__ import annotations

from .validate import check_device
from .workload_check import check_paged, check_varlen


def varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, seqused_k, causal, scale, window_size,
           softcap, score_mod, mask_mod, return_lse, schedule):
    w = check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale,
                     window_size, softcap)
    check_device(q)
    raise NotImplementedError(w)


def paged(q, k_cache, v_cache, page_table, cache_seqlens, *, cu_seqlens_q, max_seqlen_q,
          causal, scale, window_size, softcap, score_mod, mask_mod, return_lse, schedule):
    w = check_paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q,
                    max_seqlen_q, causal, scale, window_size, softcap)
    check_device(q)
    raise NotImplementedError(w)
