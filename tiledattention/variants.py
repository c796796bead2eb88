"""Attention variants written only through the public API (``sdpa``'s ``score_mod`` /
``mask_mod`` / ``block_mask``): each is a small definition a user could have written.

Every function returned here is cuTile tile code (``kernel.mods`` says what that may use)
and carries ``.reference``: the same modification in plain PyTorch over broadcast index
tensors (b [B,1,1,1], h [1,H,1,1], q_idx [1,1,Sq,1], kv_idx [1,1,1,Skv]), which the tests
compare against (``reference.naive_attention(score_ref=..., keep_ref=...)``).

    import tiledattention as ta
    from tiledattention import variants

    window = variants.sliding_window(1024)
    out = ta.sdpa(q, k, v, block_mask=ta.block_mask(window, None, None, S, S))
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from .kernel.mods import ScoreMod


def _with_reference(fn, reference):
    fn.reference = reference
    return fn


def sliding_window(left: int, right: int = 0):
    """Query i attends keys j with i - left < j <= i + right (``right=0``: causal window of
    ``left`` keys, Mistral's and Gemma's; a ``right`` > 0 looks ahead)."""

    def window_mask(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx < left) & (kv_idx - q_idx <= right)

    return _with_reference(window_mask, lambda b, h, q, k: (q - k < left) & (k - q <= right))


def softcap(cap: float) -> ScoreMod:
    """Gemma 2's logit soft-capping: ``cap * tanh(score / cap)`` (its derivative is derived
    symbolically: ``1 - tanh^2``)."""
    cap = float(cap)

    def softcap_score(score, b, h, q_idx, kv_idx):
        return cap * ct.tanh(score / cap)

    return ScoreMod(_with_reference(softcap_score,
                                    lambda s, b, h, q, k: cap * torch.tanh(s / cap)))


def alibi(slopes: torch.Tensor):
    """ALiBi (BLOOM, MPT): ``score - slope[h] * (i - j)``, a per-head linear distance
    penalty; ``slopes`` fp32 [H] on the device (see ``alibi_slopes``)."""

    def alibi_score(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    return _with_reference(alibi_score, lambda s, b, h, q, k: s + slopes.double()[h] * (k - q))


def alibi_slopes(heads: int, device="cuda") -> torch.Tensor:
    """The standard geometric ALiBi slopes 2^(-8 i / H) for i = 1..H (H a power of two)."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)],
                        dtype=torch.float32, device=device)


def document(segment_ids: torch.Tensor):
    """Packed sequences: a token attends only tokens of its own document; ``segment_ids``
    int32 [B, S] (one id per token, e.g. from ``segments_from_lengths``). Combine with
    ``causal=True`` for packed causal training."""

    def document_mask(b, h, q_idx, kv_idx):
        return segment_ids[b, q_idx] == segment_ids[b, kv_idx]

    ids = segment_ids.long()
    return _with_reference(document_mask, lambda b, h, q, k: ids[b, q] == ids[b, k])


def segments_from_lengths(lengths: list[int], device="cuda") -> torch.Tensor:
    """int32 [1, sum(lengths)] document ids of a packed row built from sequence lengths
    (the ``cu_seqlens`` way of describing a varlen batch)."""
    ids = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32),
                                  torch.tensor(lengths))
    return ids[None].to(device)


def prefix_lm(prefix_lengths: torch.Tensor):
    """T5/UL2 prefix-LM: every token sees the whole prefix of its row (bidirectional), the
    rest is causal; ``prefix_lengths`` int32 [B]."""

    def prefix_mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < prefix_lengths[b])

    lens = prefix_lengths.long()
    return _with_reference(prefix_mask, lambda b, h, q, k: (k <= q) | (k < lens[b]))
