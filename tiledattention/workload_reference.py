"""Float64 references of the packed (varlen) and paged-cache workloads, in plain PyTorch.

Both follow FlashAttention's conventions (``flash_attn_varlen_func``, FA4's
``page_table``): tensors are ``[total, H, D]`` (tokens of every sequence back to back,
``cu_seqlens`` int32 offsets) or a paged cache ``[num_pages, page_size, Hkv, D]``
addressed by a block table ``[B, max_pages]``. Causality is aligned bottom-right when a
sequence's Sq != Skv: query i attends key j <= i + Skv - Sq (the new tokens are the last
Sq of the context); a query with no key to attend (Sq > Skv) gets a zero row and
log-sum-exp -inf, as in the dense kernels. A ``score_ref`` / ``keep_ref`` sees the
sequence's index as ``b`` and positions within the sequence as ``q_idx`` / ``kv_idx``.
"""

from __future__ import annotations

import torch

from .reference import naive_attention


def bottom_right_keep(seq_q: int, seq_k: int, window: tuple[int, int] = (-1, -1),
                      causal: bool = False, device=None):
    """[Sq, Skv] bool: causality and FA's ``window_size=(left, right)`` (-1: unbounded),
    both aligned bottom-right."""
    i = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q)
    j = torch.arange(seq_k, device=device)[None, :]
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        keep &= j <= i + right
    if left >= 0:
        keep &= j >= i - left
    return keep


def _one(q, k, v, b, causal, scale, window, softcap, score_ref, keep_ref):
    """One sequence: q [Sq, Hq, D], k/v [Skv, Hkv, D] -> (out [Sq, Hq, D], lse [Hq, Sq])."""
    sq, sk = q.shape[0], k.shape[0]
    if sq == 0:
        return q.new_zeros(q.shape, dtype=torch.float64), q.new_zeros(
            (q.shape[1], 0), dtype=torch.float64)
    keep = bottom_right_keep(sq, sk, window, causal, q.device)

    def score(s, bb, h, qi, ki):
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        return score_ref(s, bb + b, h, qi, ki) if score_ref is not None else s

    def mask(bb, h, qi, ki):
        m = keep[qi, ki]
        return m & keep_ref(bb + b, h, qi, ki) if keep_ref is not None else m

    out, lse = naive_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                               v.transpose(0, 1)[None], scale=scale, score_ref=score,
                               keep_ref=mask)
    return out[0].transpose(0, 1), lse[0]


def varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, *, seqused_k=None, causal=False,
                     scale=None, window_size=(-1, -1), softcap=0.0, score_ref=None,
                     keep_ref=None):
    """(out [total_q, Hq, D] float64, lse [Hq, total_q] float64) of packed sequences.

    Sequence b has queries ``q[cu_q[b]:cu_q[b+1]]`` and keys ``k[cu_k[b]:cu_k[b] +
    n_k]`` with ``n_k = cu_k[b+1] - cu_k[b]``, or ``seqused_k[b]`` when given (FA's
    ``seqused_k``: the first that many keys of the sequence's span)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64,
                     device=q.device)
    for b in range(len(cq) - 1):
        nk = ck[b + 1] - ck[b] if used is None else used[b]
        o, s = _one(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b] + nk], v[ck[b]:ck[b] + nk], b, causal,
                    scale, window_size, softcap, score_ref, keep_ref)
        out[cq[b]:cq[b + 1]] = o
        lse[:, cq[b]:cq[b + 1]] = s
    return out, lse


def gather_pages(cache, page_table, b: int, n: int):
    """The first ``n`` tokens of sequence ``b`` of a paged cache [pages, P, H, D], in order."""
    page = cache.shape[1]
    pages = page_table[b, :(n + page - 1) // page].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def paged_reference(q, k_cache, v_cache, page_table, cache_seqlens, *, cu_seqlens_q=None,
                    causal=False, scale=None, window_size=(-1, -1), softcap=0.0,
                    score_ref=None, keep_ref=None):
    """(out, lse) of queries against a paged KV cache, float64.

    ``q``: [B, Sq, Hq, D] (every sequence Sq new tokens; out [B, Sq, Hq, D], lse [B, Hq,
    Sq]) or packed [total_q, Hq, D] with ``cu_seqlens_q`` (chunked prefill; out [total_q,
    Hq, D], lse [Hq, total_q]). Sequence b's keys are the first ``cache_seqlens[b]`` tokens
    of its pages ``page_table[b]`` (new tokens already appended: they are the last Sq)."""
    lens = cache_seqlens.tolist()
    if cu_seqlens_q is None:
        outs, lses = [], []
        for b, n in enumerate(lens):
            o, s = _one(q[b], gather_pages(k_cache, page_table, b, n),
                        gather_pages(v_cache, page_table, b, n), b, causal, scale,
                        window_size, softcap, score_ref, keep_ref)
            outs.append(o)
            lses.append(s)
        return torch.stack(outs), torch.stack(lses)
    cq = cu_seqlens_q.tolist()
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64,
                     device=q.device)
    for b, n in enumerate(lens):
        o, s = _one(q[cq[b]:cq[b + 1]], gather_pages(k_cache, page_table, b, n),
                    gather_pages(v_cache, page_table, b, n), b, causal, scale, window_size,
                    softcap, score_ref, keep_ref)
        out[cq[b]:cq[b + 1]] = o
        lse[:, cq[b]:cq[b + 1]] = s
    return out, lse
