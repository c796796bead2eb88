"""Block sparsity: a ``mask_mod`` classified per (query tile, key tile), on the GPU.

``block_mask(mask_mod, B, H, Sq, Skv)`` returns a ``BlockMask``; ``sdpa(block_mask=...)``
then visits only the tiles that hold some attending pair: a tile is *empty* (never loaded),
*partial* (scores masked) or *full* (no mask work). B or H given as None (or 1) broadcast:
pass None for an axis the mask does not depend on.

The classification depends on the kernel's tile sizes, which the schedule picks per call
(the forward, dK/dV and dQ kernels may differ), so a ``BlockMask`` computes it lazily per
(tile_m, tile_n, causal, Sq, Skv) and keeps it: one cuTile launch that evaluates the mask on
every element once and writes one byte per tile, then per-row lists built with torch's
sort. Memory is proportional to the number of tiles, never Sq x Skv.

The lists of a row (per (batch, head, query tile); per key tile for the dK/dV kernel): the
partial tiles in ascending order, then the full ones; ``count[..., 0]`` and ``count[..., 1]``
say how many. Causality and the key tail are folded into the classification, so a full
tile needs no mask at all. Like FlexAttention's ``BlockMask``, it is a snapshot: rebuild it
when a tensor the ``mask_mod`` captures changes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import cuda.tile as ct
import numpy as np
import torch

from .body import keep_tile, no_mask_mod

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

EMPTY, PARTIAL, FULL = 0, 1, 2
MASK_MOD = no_mask_mod
_serial = itertools.count()


@ct.kernel
def classify_tiles(
    Cls, A0, A1, A2, A3,
    seq_q: int, seq_k: int,
    HEADS: int,  # heads of the classification (1 when broadcast)
    TILE_M: ConstInt, TILE_N: ConstInt, CAUSAL: ConstBool,
):
    """Cls[b, h, i, j] = EMPTY / PARTIAL / FULL for query tile i and key tile j."""
    i = ct.bid(0)
    j = ct.bid(1)
    bh = ct.bid(2)
    b = bh // HEADS
    h = bh % HEADS
    q_idx = (i * TILE_M + ct.arange(TILE_M, dtype=np.int32))[:, None]
    kv_idx = (j * TILE_N + ct.arange(TILE_N, dtype=np.int32))[None, :]
    keep = keep_tile(b, h, q_idx, kv_idx, seq_k, MASK_MOD, A0, A1, A2, A3, TILE_M, TILE_N,
                     CAUSAL, True, True)
    # Rows past Sq do not exist: they neither attend nor stop a tile from being full.
    row = q_idx < seq_q
    attend = ct.max(ct.where(keep & row, 1, 0), axis=None)
    masked_pair = ct.max(ct.where(row & (kv_idx < seq_k) & ~keep, 1, 0), axis=None)
    tail = ct.where(j * TILE_N + TILE_N > seq_k, 1, 0)  # padded keys need masking
    cls = ct.where(attend == 0, EMPTY, ct.where((masked_pair + tail) > 0, PARTIAL, FULL))
    ct.store(Cls, index=(b, h, i, j), tile=cls.reshape((1, 1, 1, 1)).astype(Cls.dtype))


@dataclass(eq=False)
class BlockMask:
    """A ``mask_mod`` over [B, H, Sq, Skv] (B/H None: broadcast), classified per tile on
    first use of each tiling (``lists``)."""

    mask_mod: object
    batch: int | None
    heads: int | None
    seq_q: int
    seq_kv: int
    device: torch.device
    _lists: dict = field(default_factory=dict, repr=False)
    # Identity by value: a mask_mod that captures no tensor classifies the same way for
    # the same shape, so equal masks share plans and registry entries; one that captures
    # tensors is a snapshot of their values: a serial that is never reused (an id is).
    key: tuple = field(default=(), repr=False)

    def __post_init__(self):
        from ..mods import mods_for

        mods = mods_for(None, self.mask_mod)
        self._made_with = mods.key  # the constants it was classified with (a snapshot)
        if not self.key:
            value = (mods.key, self.batch, self.heads, self.seq_q, self.seq_kv, str(self.device))
            self.key = value if not mods.tensors() else ("snapshot", next(_serial))

    def checked_mask_mod(self):
        """The mask_mod, refused when a constant it reads (a global, a closure cell)
        changed since this block mask was made: its tile lists would skip tiles the
        changed mask attends."""
        from ..errors import InputError
        from ..mods import mods_for

        if mods_for(None, self.mask_mod).key != self._made_with:
            raise InputError("a constant the block mask's mask_mod reads (a global or a "
                             "closure variable) changed since block_mask(...) made it; make "
                             "the block mask again")
        return self.mask_mod

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch or 1, self.heads or 1, self.seq_q, self.seq_kv)

    @property
    def axes(self) -> tuple[bool, bool]:
        """(batch, head) axes the lists have (False: broadcast)."""
        return (self.batch or 1) > 1, (self.heads or 1) > 1

    def classes(self, tile_m: int, tile_n: int, causal: bool) -> torch.Tensor:
        """uint8 [B', H', ceil(Sq/tile_m), ceil(Skv/tile_n)] of EMPTY / PARTIAL / FULL."""
        from .. import mods as _mods
        from .launch import launch_kernel, variant_arrays
        from .spec import CLASSIFY

        m = _mods.mods_for(None, self.checked_mask_mod())
        b, h, sq, sk = self.shape
        grid = (math.ceil(sq / tile_m), math.ceil(sk / tile_n), b * h)
        cls = torch.empty((b, h, grid[0], grid[1]), dtype=torch.int32, device=self.device)
        launch_kernel(self.device, grid, CLASSIFY.kernel(m), (
            cls, *variant_arrays((), m.tensors(), self.device)[2:], *CLASSIFY.ordered(dict(
                seq_q=sq, seq_k=sk, HEADS=h, TILE_M=tile_m, TILE_N=tile_n,
                CAUSAL=bool(causal)), skip_tensors=True)))
        return cls.to(torch.uint8)

    def lists(self, tile_m: int, tile_n: int, causal: bool, transposed: bool = False):
        """(count int32 [B', H', R, 2], index int32 [B', H', R, C]) per row R of query tiles
        (``transposed``: per key tile, listing query tiles), partial tiles first."""
        key = (tile_m, tile_n, bool(causal), transposed)
        found = self._lists.get(key)
        if found is None:
            cls = self.classes(tile_m, tile_n, causal)
            if transposed:
                cls = cls.transpose(-1, -2)
            found = self._lists[key] = lists_from_classes(cls)
        return found


def lists_from_classes(cls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: partial tiles ascending, then full ones ascending, then the empty ones."""
    order_key = torch.where(cls == PARTIAL, 0, torch.where(cls == FULL, 1, 2)).to(torch.int8)
    index = torch.sort(order_key, dim=-1, stable=True).indices.to(torch.int32).contiguous()
    count = torch.stack([(cls == PARTIAL).sum(-1), (cls == FULL).sum(-1)], dim=-1)
    return count.to(torch.int32).contiguous(), index


def block_mask(mask_mod, B: int | None, H: int | None, Sq: int, Skv: int,
               device: str | torch.device = "cuda") -> BlockMask:
    """A block mask of ``mask_mod(b, h, q_idx, kv_idx)`` over [B, H, Sq, Skv] (see the module
    docstring). Nothing runs until a call uses it."""
    from ..errors import InputError

    for name, value in (("B", B), ("H", H)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InputError(f"block_mask: {name} must be a positive int or None, got {value!r}")
    for name, value in (("Sq", Sq), ("Skv", Skv)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"block_mask: {name} must be a positive int, got {value!r}")
    from ..mods import mods_for

    mods_for(None, mask_mod)  # lift now: a bad mask_mod fails here, not at the first call
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cuda", "cpu", "meta"):  # the calls' devices
        raise InputError(f"block_mask: device must be a CUDA device ('cuda', 'cuda:0' or a "
                         f"torch.device), got {device!r}"[:200])
    device = parsed
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return BlockMask(mask_mod, B, H, Sq, Skv, device)
