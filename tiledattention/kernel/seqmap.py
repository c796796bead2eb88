"""The tile order of a packed (varlen) launch, computed on the GPU: no host sync.

``sequence_map`` writes, for each program of a packed grid, which sequence and which of
its tiles it runs, heaviest first (``visit.sequence_tile``: deepest tiles first, the
longest-first order under causality; ``visit.heaviest_sequence_tile``: the sequences with
the most keys first, where a tile's work follows its sequence's keys); the attention kernels
read it (``visit.mapped_tile``). One small launch per call and tile size, from the
``cu_seqlens`` on the device, so the call can be captured in a CUDA graph.

The backward's two maps also zero the gradient rows that no sequence covers (past
``cu_seqlens[-1]``): the gradients are then allocated empty, not zero-filled, which saved
three full writes of dQ, dK and dV per call (benchmarks/notes/varlen-paged.md §44a).
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from .visit import heaviest_sequence_tile, sequence_tile, sequence_tiles

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


# columns per zeroing store: a (TILE, ZERO_COLS) tile of zeros per step along a row
ZERO_COLS = 64


@ct.kernel
def sequence_map(
    Cu, Wt, TileMap, Zero0, Zero1,
    STEPS: int,  # bisection rounds: the bit length of the most tiles a sequence can have
    TILE: ConstInt,  # rows per tile of the kernel that reads the map
    BPAD: ConstInt,  # a power of two > B
    FIRST_HEAVY: ConstBool,  # number a sequence's tiles from its end (causal dK/dV)
    BY_WEIGHT: ConstBool,  # sequence-major by Wt, heaviest first (else level-major)
    W_OFFSETS: ConstBool,  # Wt holds offsets [B + 1] (else per-sequence values [B])
    ZEROS: ConstInt,  # how many of Zero0, Zero1 ([total, columns]) get their tail zeroed
):
    """TileMap[t] = (b, tile) of program t, or (-1, 0) past the last tile.

    ``FIRST_HEAVY``: under causality a key tile's dK/dV work shrinks with its position
    (fewer queries see it), the opposite of a query tile's: the deepest level then runs a
    sequence's *first* tiles, so the heaviest programs still start first."""
    t = ct.bid(0)
    if BY_WEIGHT:
        b, m, valid = heaviest_sequence_tile(Cu, Wt, t, BPAD, TILE, W_OFFSETS)
    else:
        b, m, valid = sequence_tile(Cu, t, BPAD, TILE, STEPS)
    if FIRST_HEAVY and not BY_WEIGHT:
        tiles = sequence_tiles(Cu, BPAD, TILE)
        own = ct.sum(ct.where(ct.arange(BPAD, dtype=np.int32) == b, tiles, 0))
        m = own - 1 - m
    ct.scatter(TileMap, (t, 0), ct.where(valid, b, -1))
    ct.scatter(TileMap, (t, 1), ct.where(valid, m, 0))
    if ZEROS > 0:
        zero_tail(Cu, Zero0, t, TILE)
    if ZEROS > 1:
        zero_tail(Cu, Zero1, t, TILE)


def zero_tail(Cu, Z, t, TILE):
    """Rows [Cu[-1] + t * TILE, + TILE) of ``Z`` ([total, columns]) set to zero: the grid
    (an upper bound on the tiles, ``workload.programs``) covers every row past the last
    sequence. Programs whose rows start past the tensor store nothing."""
    total = Z.shape[0]
    end = ct.minimum(ct.maximum(ct.gather(Cu, Cu.shape[0] - 1), 0), total)
    if end + t * TILE < total:
        tail = Z.slice(axis=0, start=end, stop=total)
        zero = ct.full((TILE, ZERO_COLS), 0.0, dtype=np.float32).astype(Z.dtype)
        for c in range((Z.shape[1] + ZERO_COLS - 1) // ZERO_COLS):
            ct.store(tail, index=(t, c), tile=zero)
