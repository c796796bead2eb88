"""The tile order of a packed (varlen) launch, computed on the GPU: no host sync.

``sequence_map`` writes, for each program of a packed grid, which sequence and which of
its tiles it runs (``visit.sequence_tile``: deepest tiles first); the attention kernels
read it (``visit.mapped_tile``). One small launch per call and tile size, from the
``cu_seqlens`` on the device, so the call can be captured in a CUDA graph.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from .visit import sequence_tile, sequence_tiles

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def sequence_map(
    Cu, TileMap,
    STEPS: int,  # bisection rounds: the bit length of the most tiles a sequence can have
    TILE: ConstInt,  # rows per tile of the kernel that reads the map
    BPAD: ConstInt,  # a power of two > B
    FIRST_HEAVY: ConstBool,  # number a sequence's tiles from its end (causal dK/dV)
):
    """TileMap[t] = (b, tile) of program t, or (-1, 0) past the last tile.

    ``FIRST_HEAVY``: under causality a key tile's dK/dV work shrinks with its position
    (fewer queries see it), the opposite of a query tile's: the deepest level then runs a
    sequence's *first* tiles, so the heaviest programs still start first."""
    t = ct.bid(0)
    b, m, valid = sequence_tile(Cu, t, BPAD, TILE, STEPS)
    if FIRST_HEAVY:
        tiles = sequence_tiles(Cu, BPAD, TILE)
        own = ct.sum(ct.where(ct.arange(BPAD, dtype=np.int32) == b, tiles, 0))
        m = own - 1 - m
    ct.scatter(TileMap, (t, 0), ct.where(valid, b, -1))
    ct.scatter(TileMap, (t, 1), ct.where(valid, m, 0))
