"""V^T for the FP8 forward, made on the GPU in one pass.

wgmma reads 8-bit operands K-major only, so P V needs V with its keys contiguous. A caller
that keeps V^T passes a transposed view (read in place). Otherwise the call transposes V
once. torch's transpose copy of a 1-byte tensor runs far below bandwidth: 0.20 ms for
34 MB at D 128, S 4k, B 4, H 16, which is 20-50 % of the FP8 call
(benchmarks/notes/head-shapes.md §41c). Here one program moves ``TILE_S`` keys of one
head: one tile load, a permute on chip, one tile store.
"""

from __future__ import annotations

import cuda.tile as ct

_ZERO = ct.PaddingMode.ZERO
ConstInt = ct.Constant[int]


@ct.kernel
def keys_last(
    V, Vt,  # [B, H, S, D] and [B, H, D, S] (a view of rows padded to 16 keys)
    TILE_S: ConstInt,  # keys per program
    D_PAD: ConstInt,  # the head dim rounded up to a power of two (tile shapes are)
):
    """Vt[b, h, :, keys] = V[b, h, keys, :]^T for program (key tile, h, b). Rows past D
    and keys past S are zeros on the load and clipped on the store. tileiras 13.4 moves
    these tiles with per-element loads and stores, not TMA (a lone load and store outside
    a pipelined loop). Without bounds checks it would emit half the instructions, but
    tileiras 13.4 fails that build at D 64 ("failed to compile Tile IR program")."""
    s = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    tile = ct.load(V, index=(b, h, s, 0), shape=(1, 1, TILE_S, D_PAD), padding_mode=_ZERO)
    ct.store(Vt, index=(b, h, 0, s), tile=ct.permute(tile, (0, 1, 3, 2)))
