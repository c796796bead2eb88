"""The checks of a packed (varlen) or paged call: every refusal before anything runs.

Only what the host knows without a device sync is checked (shapes, dtypes, devices,
strides, the Python ints); the offsets' values live on the GPU. Their structure is
checked where a sync costs nothing — on CPU tensors, and on the first call of a plan
(``checked_offsets``) — never inside a CUDA-graph capture or a compiled graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DeviceError, DTypeError, InputError, ShapeError, UnsupportedHeadDimError
from .validate import SUPPORTED_DTYPES

MAX_HEAD_DIM = 256
PAGE_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Workload:
    """A validated call: the sizes the plan keys on."""

    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    max_q: int
    max_k: int
    causal: bool
    scale: float
    window: tuple[int, int]
    softcap: float
    seqused: bool = False  # seqused_k given: it caps each sequence's keys
    page_size: int = 0  # 0: keys packed by cu_seqlens_k, else the cache's page size
    packed_q: bool = True  # q is [total_q, H, D] (else [B, Sq, H, D], a uniform Sq)


def _tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested or t.layout != torch.strided:
        raise InputError(f"{name} must be a dense (strided) tensor, got layout {t.layout}"
                         f"{' (nested)' if t.is_nested else ''}")


def _offsets(name, t, device, length: int | None):
    _tensor(name, t)
    if t.dtype != torch.int32:
        raise DTypeError(f"{name}.dtype is {t.dtype}; it must be torch.int32 (as "
                         "FlashAttention's)")
    if t.dim() != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ShapeError(f"{name} must have {length} entries, got {t.shape[0]}")
    if t.device != device:
        raise DeviceError(f"{name} is on {t.device}, q on {device}")


def _qkv(q, k, v, rank: int, layout: str):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _tensor(name, t)
    if not (q.device == k.device == v.device):
        raise DeviceError(f"q, k, v must be on one device, got {q.device}, {k.device}, "
                          f"{v.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise DTypeError(f"{name}.dtype is {t.dtype}; supported: torch.float16, "
                             "torch.bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise DTypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != rank:
            raise ShapeError(f"{name} must have rank {rank} {layout}, got shape "
                             f"{tuple(t.shape)}")
    if k.shape != v.shape:
        raise ShapeError(f"k and v must have one shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ShapeError(f"head dims differ: q {d}, k/v {k.shape[-1]}")
    if d % 8 or not 8 <= d <= MAX_HEAD_DIM:
        raise UnsupportedHeadDimError(f"head dim {d}: the kernels take multiples of 8 up to "
                                      f"{MAX_HEAD_DIM}")
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk:
        raise ShapeError(f"q has {hq} heads, k/v {hk}: Hq must be a multiple of Hkv (GQA)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ShapeError(f"{name}'s head-dim axis must be contiguous (stride 1), got "
                             f"strides {t.stride()}")


def _common(d, causal, scale, window_size, softcap, max_q, max_k):
    for name, n in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"{name} must be a Python int >= 0 (FA's convention: the longest "
                             f"sequence), got {n!r}")
    scale = d ** -0.5 if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
            0 < float(scale) < float("inf")):
        raise InputError(f"scale must be a finite number > 0, got {scale!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, int) or w < -1
                   for w in window_size)):
        raise InputError(f"window_size must be (left, right) ints >= -1 (-1: unbounded), got "
                         f"{window_size!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not (
            0 <= float(softcap) < float("inf")):
        raise InputError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    if not isinstance(causal, bool):
        raise InputError(f"causal must be a bool, got {causal!r}")
    return float(scale), (int(window_size[0]), int(window_size[1])), float(softcap)


def check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale, window_size,
                 softcap) -> Workload:
    _tensor("q", q)
    if q.dim() != 3:
        raise ShapeError(f"q must have rank 3 [total_q, H, D], got shape {tuple(q.shape)}")
    _qkv(q, k, v, 3, "[total_k, H, D]")
    _offsets("cu_seqlens_q", cu_q, q.device, None)
    if cu_q.shape[0] < 1:
        raise ShapeError("cu_seqlens_q must have B + 1 >= 1 entries")
    batch = cu_q.shape[0] - 1
    _offsets("cu_seqlens_k", cu_k, q.device, batch + 1)
    if seqused_k is not None:
        _offsets("seqused_k", seqused_k, q.device, batch)
    scale, window, softcap = _common(q.shape[-1], causal, scale, window_size, softcap,
                                     max_q, max_k)
    if max_q > q.shape[0] or max_k > k.shape[0]:
        raise InputError(f"max_seqlen_q={max_q} / max_seqlen_k={max_k} exceed the packed "
                         f"tokens ({q.shape[0]} / {k.shape[0]})")
    if cu_q.device.type == "cpu":
        checked_offsets(cu_q, cu_k, seqused_k, max_q, max_k, q.shape[0], k.shape[0])
    return Workload(batch, q.shape[1], k.shape[1], q.shape[2], q.dtype, max_q, max_k,
                    causal, scale, window, softcap, seqused=seqused_k is not None)


def checked_offsets(cu_q, cu_k, seqused_k, max_q, max_k, total_q, total_k) -> None:
    """The offsets' values: from 0, non-decreasing, within the tensors, no sequence
    longer than its ``max_seqlen``. Reads them (a sync on a GPU tensor)."""
    for name, cu, total, mx in (("cu_seqlens_q", cu_q, total_q, max_q),
                                ("cu_seqlens_k", cu_k, total_k, max_k)):
        vals = cu.tolist()
        if vals[0] != 0:
            raise InputError(f"{name}[0] is {vals[0]}; it must be 0")
        lens = [b - a for a, b in zip(vals, vals[1:])]
        if any(n < 0 for n in lens):
            i = next(i for i, n in enumerate(lens) if n < 0)
            raise InputError(f"{name} must be non-decreasing; entry {i + 1} ({vals[i + 1]}) < "
                             f"entry {i} ({vals[i]})")
        if vals[-1] > total:
            raise InputError(f"{name}[-1] is {vals[-1]}, past the {total} packed tokens")
        if lens and max(lens) > mx:
            raise InputError(f"{name} holds a sequence of {max(lens)} tokens, longer than "
                             f"max_seqlen_{name[-1]}={mx} (it must be the longest)")
    if seqused_k is not None:
        used, spans = seqused_k.tolist(), [b - a for a, b in zip(cu_k.tolist(),
                                                                 cu_k.tolist()[1:])]
        bad = [i for i, (u, n) in enumerate(zip(used, spans)) if not 0 <= u <= n]
        if bad:
            raise InputError(f"seqused_k[{bad[0]}] is {used[bad[0]]}; it must be within "
                             f"0..{spans[bad[0]]} (its sequence's keys)")


def check_paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, max_q, causal, scale,
                window_size, softcap) -> Workload:
    _tensor("q", q)
    _qkv(q, k_cache, v_cache, 4, "[num_pages, page_size, Hkv, D]")
    _offsets("cache_seqlens", cache_seqlens, q.device, None)
    batch = cache_seqlens.shape[0]
    _tensor("page_table", page_table)
    if page_table.dtype != torch.int32:
        raise DTypeError(f"page_table.dtype is {page_table.dtype}; it must be torch.int32")
    if page_table.dim() != 2 or page_table.shape[0] != batch:
        raise ShapeError(f"page_table must be [B, max_pages] with B = {batch} (cache_seqlens' "
                         f"length), got shape {tuple(page_table.shape)}")
    if page_table.device != q.device:
        raise DeviceError(f"page_table is on {page_table.device}, q on {q.device}")
    page = k_cache.shape[1]
    if page not in PAGE_SIZES:
        raise ShapeError(f"page_size (k_cache.shape[1]) is {page}; supported: {PAGE_SIZES}")
    capacity = page_table.shape[1] * page
    if cu_q is None:
        if q.dim() != 4 or q.shape[0] != batch:
            raise ShapeError(f"q must be [B, Sq, Hq, D] with B = {batch}, or packed [total_q, "
                             f"Hq, D] with cu_seqlens_q; got shape {tuple(q.shape)}")
        max_q = q.shape[1]
    else:
        if q.dim() != 3:
            raise ShapeError(f"with cu_seqlens_q, q must be [total_q, Hq, D], got shape "
                             f"{tuple(q.shape)}")
        _offsets("cu_seqlens_q", cu_q, q.device, batch + 1)
        if max_q is None:
            raise InputError("with cu_seqlens_q, pass max_seqlen_q (the longest new chunk)")
    scale, window, softcap = _common(q.shape[-1], causal, scale, window_size, softcap,
                                     max_q, capacity)
    if cache_seqlens.device.type == "cpu":
        checked_cache(page_table, cache_seqlens, k_cache.shape[0], page, cu_q, max_q,
                      q.shape[0] if cu_q is not None else None)
    return Workload(batch, q.shape[-2], k_cache.shape[2], q.shape[-1], q.dtype, max_q,
                    capacity, causal, scale, window, softcap, page_size=page,
                    packed_q=cu_q is not None)


def checked_cache(page_table, cache_seqlens, num_pages, page, cu_q, max_q, total_q) -> None:
    """Context lengths within the table, page ids within the cache (for the pages a
    sequence reads), new tokens within the context. Reads them (a sync on the GPU)."""
    lens, table = cache_seqlens.tolist(), page_table.tolist()
    capacity = page_table.shape[1] * page
    for b, n in enumerate(lens):
        if not 0 <= n <= capacity:
            raise InputError(f"cache_seqlens[{b}] is {n}; the page table holds 0..{capacity} "
                             f"tokens per sequence ({page_table.shape[1]} pages of {page})")
        used = table[b][:(n + page - 1) // page]
        bad = [p for p in used if not 0 <= p < num_pages]
        if bad:
            raise InputError(f"page_table[{b}] names page {bad[0]}, outside the cache's "
                             f"{num_pages} pages")
    if cu_q is not None:
        checked_offsets(cu_q, cu_q, None, max_q, max_q, total_q, total_q)
        news = [b - a for a, b in zip(cu_q.tolist(), cu_q.tolist()[1:])]
        over = [b for b, (s, n) in enumerate(zip(news, lens)) if s > n]
        if over:
            raise InputError(f"sequence {over[0]} has {news[over[0]]} new tokens but "
                             f"cache_seqlens[{over[0]}] = {lens[over[0]]}: the new tokens must "
                             "be appended to the cache first (they are its last Sq)")
