"""Attention variants written only through the public API (``sdpa``'s ``score_mod`` /
``mask_mod`` / ``block_mask``): each is a small definition a user could have written.

A built-in is one torch function (FlexAttention's signature): the kernels get its tile code
from the lifter (``mods``), and the same function, evaluated over broadcast index tensors
(b [B,1,1,1], h [1,H,1,1], q_idx [1,1,Sq,1], kv_idx [1,1,1,Skv]), is its float64 reference
(``reference.naive_attention(score_ref=..., keep_ref=...)``) and what the ``variants``
stage's torch methods run (FlexAttention, eager, SDPA's mask: ``bench/variant_cases.py``):
``reference_of`` gives it. Only ``softcap`` is hand-written ct, for the speed of its
backward (its docstring says why), and carries a torch ``.reference``.

``sinks`` is the one variant that is not a modification of scores: it wraps ``sdpa``
(``return_lse=True``) and rescales the output, and its ``.reference`` is a whole float64
attention.

    import tiledattention as ta
    from tiledattention import variants

    window = variants.sliding_window(1024)
    out = ta.sdpa(q, k, v, block_mask=ta.block_mask(window, None, None, S, S))
"""

from __future__ import annotations

import math
import numbers

import cuda.tile as ct
import torch

from .mods import ScoreMod


def reference_of(mod):
    """A variant's torch form over broadcast index tensors (None for None): the
    ``.reference`` of hand-written ct code, else the function itself (a ``ScoreMod``'s
    ``fn``), which a torch function is."""
    fn = mod.fn if isinstance(mod, ScoreMod) else mod
    return getattr(fn, "reference", fn)


def _count(name: str, value, low: int) -> int:
    """An int argument >= ``low`` (a window size), or VariantError in one line."""
    from .mods import VariantError

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise VariantError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def _index_tensor(name: str, value) -> None:
    """An integer tensor [B] (per-row lengths or offsets, read by index in the kernel), or
    VariantError in one line: a number would be baked into the kernel, not read per row."""
    from .mods import VariantError

    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point() \
            or value.is_complex() or value.dtype == torch.bool:
        got = (f"a {value.dtype} tensor of shape {tuple(value.shape)}"
               if isinstance(value, torch.Tensor) else repr(value)[:80])
        raise VariantError(f"{name} must be an int32 tensor [B] (one value per batch row), "
                           f"got {got}")


def sliding_window(left: int, right: int = 0, *, q_offset: torch.Tensor | None = None):
    """Query i attends keys j with i - left < j <= i + right (``right=0``: causal window of
    ``left`` keys including itself, Mistral's and Gemma's ``sliding_window``; a ``right`` >
    0 looks ahead).

    ``q_offset`` (every positional variant here takes it): int32 [B] on the device, the
    position of each row's first query, i.e. a KV cache's length before these queries
    (transformers' bottom-right alignment: decode with Sq = 1 is query Skv - 1). A tensor,
    not a number, so a growing cache does not compile a kernel per step."""
    left, right = _count("sliding_window: left", left, 1), _count("sliding_window: right", right, 0)
    if q_offset is None:
        def window_mask(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx < left) & (kv_idx - q_idx <= right)
    else:
        def window_mask(b, h, q_idx, kv_idx):
            return (q_idx + q_offset[b] - kv_idx < left) & (kv_idx - q_idx - q_offset[b]
                                                            <= right)
    return window_mask


def softcap(cap: float) -> ScoreMod:
    """Gemma 2's logit soft-capping: ``cap * tanh(score / cap)``, with its derivative
    ``1 - tanh^2(score / cap)`` given (the backward's tanh is the same expression as the
    score's, so the kernel computes it once per score). The hardware tanh
    (``tanh.approx.f32``, one MUFU instruction, relative error ~2^-11, as
    FlashAttention-3's softcap) instead of the full-precision one: below the fp16/bf16
    rounding of P. ``score * (1 / cap)``, not ``score / cap``: an fp32 division is
    IEEE-rounded in cuTile (a five-FFMA sequence, a range check and a slow-path call per
    element, each bracketed by a convergence barrier), which made the sm_90 backward's loop
    2.3x the instructions of the mask-only variants' and spilled the dK/dV program
    (benchmarks/notes/variants.md §39e); the product differs from the quotient by at most an ulp,
    far below the approximate tanh's error."""
    from .mods import VariantError

    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) or not (
            math.isfinite(cap) and cap > 0):
        raise VariantError(f"softcap: cap must be a finite number > 0, got {cap!r}")
    cap = float(cap)
    inv = 1.0 / cap

    def softcap_score(score, b, h, q_idx, kv_idx):
        return cap * ct.tanh(score * inv, rounding_mode=ct.RoundingMode.APPROX)

    def softcap_grad(score, b, h, q_idx, kv_idx):
        t = ct.tanh(score * inv, rounding_mode=ct.RoundingMode.APPROX)
        return 1.0 - t * t

    # Hand-written ct for speed: the torch spelling lifts to the full-precision tanh (EX2 +
    # RCP + FFMAs, no MUFU.TANH) and a derived gradient that recomputes it: sm_90 D = 128
    # causal, 1.6x the dK/dV loop's instructions (887 -> 1398), 1.9x dQ's, 2.3x the
    # forward's. Its torch definition is its reference.
    softcap_score.reference = lambda s, b, h, q, k: cap * torch.tanh(s / cap)
    return ScoreMod(softcap_score, grad=softcap_grad)


def alibi(slopes: torch.Tensor, *, q_offset: torch.Tensor | None = None):
    """ALiBi (BLOOM, MPT): ``score - slope[h] * (i - j)``, a per-head linear distance
    penalty; ``slopes`` fp32 [H] on the device (see ``alibi_slopes``); ``q_offset`` as
    for ``sliding_window``."""
    if q_offset is None:
        def alibi_score(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)
    else:
        def alibi_score(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx - q_offset[b])
    return alibi_score


def alibi_slopes(heads: int, device="cuda") -> torch.Tensor:
    """The standard geometric ALiBi slopes 2^(-8 i / H) for i = 1..H (H a power of two)."""
    heads = _count("alibi_slopes: heads", heads, 1)
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)],
                        dtype=torch.float32, device=device)


def document(segment_ids: torch.Tensor, *, q_offset: torch.Tensor | None = None):
    """Packed sequences: a token attends only tokens of its own document; ``segment_ids``
    int32 [B, Skv] (one id per token, e.g. from ``segments_from_lengths``). Combine with
    ``causal=True`` for packed causal training; ``q_offset`` as for ``sliding_window``."""
    if q_offset is None:
        def document_mask(b, h, q_idx, kv_idx):
            return segment_ids[b, q_idx] == segment_ids[b, kv_idx]
    else:
        def document_mask(b, h, q_idx, kv_idx):
            return segment_ids[b, q_idx + q_offset[b]] == segment_ids[b, kv_idx]
    return document_mask


def segments_from_lengths(lengths: list[int], device="cuda") -> torch.Tensor:
    """int32 [1, sum(lengths)] document ids of a packed row built from sequence lengths
    (the ``cu_seqlens`` way of describing a varlen batch)."""
    from .mods import VariantError

    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    if not isinstance(lengths, (list, tuple)) or not lengths:
        raise VariantError(f"segments_from_lengths: lengths must be a non-empty list of ints "
                           f">= 0, got {lengths!r}"[:200])
    lengths = [_count(f"segments_from_lengths: lengths[{i}]", n, 0)
               for i, n in enumerate(lengths)]
    if not sum(lengths):
        raise VariantError(f"segments_from_lengths: lengths must hold at least one token, got "
                           f"{lengths!r}"[:200])
    ids = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32),
                                  torch.tensor(lengths))
    return ids[None].to(device)


def prefix_lm(prefix_lengths: torch.Tensor, *, q_offset: torch.Tensor | None = None):
    """T5/UL2 prefix-LM: every token sees the whole prefix of its row (bidirectional), the
    rest is causal; ``prefix_lengths`` int32 [B]; ``q_offset`` as for ``sliding_window``."""
    _index_tensor("prefix_lm: prefix_lengths", prefix_lengths)
    if q_offset is not None:
        _index_tensor("prefix_lm: q_offset", q_offset)
    if q_offset is None:
        def prefix_mask(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) | (kv_idx < prefix_lengths[b])
    else:
        def prefix_mask(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx + q_offset[b]) | (kv_idx < prefix_lengths[b])
    return prefix_mask


def _combine(name: str, mask_mods: tuple, op):
    from .mods import VariantError

    if not mask_mods:
        raise VariantError(f"{name} needs at least one mask_mod")
    for m in mask_mods:
        if not callable(m):
            raise VariantError(f"{name}: every argument must be a mask_mod, got "
                               f"{type(m).__name__}")
    if len(mask_mods) == 1:
        return mask_mods[0]
    first, rest = mask_mods[0], _combine(name, mask_mods[1:], op)
    if op == "and":
        def combined(b, h, q_idx, kv_idx):
            return first(b, h, q_idx, kv_idx) & rest(b, h, q_idx, kv_idx)
    else:
        def combined(b, h, q_idx, kv_idx):
            return first(b, h, q_idx, kv_idx) | rest(b, h, q_idx, kv_idx)
    refs = [reference_of(m) for m in (first, rest)]
    if refs != [first, rest]:  # a part is hand-written ct: combine the torch forms
        combined.reference = ((lambda *a: refs[0](*a) & refs[1](*a)) if op == "and"
                              else (lambda *a: refs[0](*a) | refs[1](*a)))
    return combined


def and_masks(*mask_mods):
    """FlexAttention's ``and_masks``: attend where every mask_mod attends (the helpers
    are inlined into one mask_mod when lifted)."""
    return _combine("and_masks", mask_mods, "and")


def or_masks(*mask_mods):
    """FlexAttention's ``or_masks``: attend where any mask_mod attends."""
    return _combine("or_masks", mask_mods, "or")


def sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor,
          **sdpa_kwargs):
    """Attention sinks as gpt-oss trains them: a learnable per-head logit ``sink`` [Hq]
    that joins each softmax denominator and nothing else (it has no value row).

    ``softmax([s, sink])`` over the keys is ``softmax(s) * exp(lse) / (exp(lse) +
    exp(sink))`` = ``out * sigmoid(lse - sink)``, so the call is ``sdpa(...,
    return_lse=True)`` and one rescale: q, k, v get their gradient through ``out`` and the
    LSE (the kernels take dLSE), ``sink`` (which may require grad) through torch. Any other
    ``sdpa`` argument (causal, masks, GQA, a score_mod / block_mask, a KV cache) composes.
    With ``return_lse=True`` the LSE returned includes the sink. Reference:
    ``sinks.reference(q, k, v, sink, **naive_attention_kwargs)``.
    """
    from .api import sdpa
    from .errors import InputError

    want_lse = sdpa_kwargs.pop("return_lse", False)
    heads = q.shape[1]
    if not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (heads,):
        raise InputError(f"sinks: sink must be a tensor of shape [Hq] = [{heads}] (one logit "
                         f"per query head), got {getattr(sink, 'shape', type(sink).__name__)}")
    out, lse = sdpa(q, k, v, return_lse=True, **sdpa_kwargs)
    # fp32 factor (LSE is fp32), cast once to the output's dtype.
    logit = sink.to(device=lse.device, dtype=torch.float32)[None, :, None]
    out = out * torch.sigmoid(lse - logit).to(out.dtype).unsqueeze(-1)
    return (out, torch.logaddexp(lse, logit)) if want_lse else out


def _sinks_reference(q, k, v, sink, *, causal=False, scale=None, attn_mask=None,
                     score_ref=None, keep_ref=None):
    """float64 (out, lse): the sink appended to the score matrix as one more column,
    softmax, the column dropped (``naive_attention``'s scores and arguments)."""
    from .reference import _expand_kv, _scores

    q, k, v = q.double(), k.double(), v.double()
    k, v = _expand_kv(k, v, q.shape[1])
    s, _ = _scores(q, k, causal, scale, attn_mask, score_ref, keep_ref)
    col = sink.double().to(s.device)[None, :, None, None].expand(*s.shape[:-1], 1)
    full = torch.cat([s, col], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    return torch.exp(full - lse[..., None])[..., :-1] @ v, lse


sinks.reference = _sinks_reference
