"""The tile order of a packed (varlen) launch, computed on the GPU: no host sync.

``sequence_map`` writes, for each program of a packed grid, which sequence and which of
its tiles it runs (``visit.sequence_tile``: deepest tiles first); the attention kernels
read it (``visit.mapped_tile``). One small launch per call and tile size, from the
``cu_seqlens`` on the device, so the call can be captured in a CUDA graph.
"""

from __future__ import annotations

import cuda.tile as ct

from .visit import sequence_tile

ConstInt = ct.Constant[int]


@ct.kernel
def sequence_map(
    Cu, TileMap,
    STEPS: int,  # bisection rounds: the bit length of the most tiles a sequence can have
    TILE: ConstInt,  # rows per tile of the kernel that reads the map
    BPAD: ConstInt,  # a power of two > B
):
    """TileMap[t] = (b, tile) of program t, or (-1, 0) past the last tile."""
    t = ct.bid(0)
    b, m, valid = sequence_tile(Cu, t, BPAD, TILE, STEPS)
    ct.scatter(TileMap, (t, 0), ct.where(valid, b, -1))
    ct.scatter(TileMap, (t, 1), ct.where(valid, m, 0))
