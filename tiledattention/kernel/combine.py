"""The split-K combine: merges the per-split partial outputs of ``attention_fwd``.

Each split s of a row left a normalised partial output ``o_s`` (fp32) and its natural-log
log-sum-exp ``lse_s`` (-inf for a split that saw no key of the row; such a split may
leave ``o_s`` unwritten, ``FwdFlags.SPLIT_SKIP``, so it is read as zeros). The row's output is
``sum_s w_s o_s / sum_s w_s`` with ``w_s = exp(lse_s - max_s lse_s)``, and its log-sum-exp
``max + log(sum_s w_s)``. Rows every split left empty (fully masked) are zeros with -inf.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from .body import LOG2E, divide_chunks, load_rows, row_lse, store_rows, zeros_chunks

_ZERO = ct.PaddingMode.ZERO
ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def split_lse(PartLse, b, hs, rt, TILE_R):
    """One split's log-sum-exps of ``TILE_R`` rows, in log2 units, as [TILE_R, 1]."""
    return ct.load(PartLse, index=(b, hs, rt), shape=(1, 1, TILE_R),
                   padding_mode=_ZERO).reshape((TILE_R, 1)) * LOG2E


@ct.kernel
def attention_combine(
    Part, PartLse, Out, Lse,  # [B, H*NUM_SPLITS, R, D] fp32, [B, H*NUM_SPLITS, R]; Out, Lse
    NUM_SPLITS: int,
    TILE_R: ConstInt,  # rows per program
    NCHUNK: ConstInt, W0: ConstInt, W1: ConstInt, W2: ConstInt,  # as in attention_fwd
    RETURN_LSE: ConstBool,
):
    rt = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)

    # Pass 1: the row max of the splits' log-sum-exps (log2 units).
    m = ct.full((TILE_R, 1), -np.inf, dtype=np.float32)
    for s in range(NUM_SPLITS):
        m = max(m, split_lse(PartLse, b, h * NUM_SPLITS + s, rt, TILE_R))
    m_sub = ct.where(m == -np.inf, 0.0, m)

    # Pass 2: the weighted sum .
    l_sum = ct.full((TILE_R, 1), 0.0, dtype=np.float32)
    acc0, acc1, acc2 = zeros_chunks(TILE_R, W0, W1, W2)
    for s in range(NUM_SPLITS):
        hs = h * NUM_SPLITS + s
        w = ct.exp2(split_lse(PartLse, b, hs, rt, TILE_R) - m_sub, flush_to_zero=True)
        l_sum = l_sum + w
        p0, p1, p2 = load_rows(Part, b, hs, rt, TILE_R, W0, W1, W2, NCHUNK, None)
        seen = w > 0.0  # an unwritten partial may hold anything, NaN included
        acc0 = acc0 + ct.where(seen, w * p0, 0.0)
        if NCHUNK > 1:
            acc1 = acc1 + ct.where(seen, w * p1, 0.0)
        if NCHUNK > 2:
            acc2 = acc2 + ct.where(seen, w * p2, 0.0)

    l_div = ct.where(l_sum == 0.0, 1.0, l_sum)
    o0, o1, o2 = divide_chunks(acc0, acc1, acc2, l_div, NCHUNK)
    store_rows(Out, b, h, rt, o0, o1, o2, TILE_R, W0, W1, W2, NCHUNK)
    if RETURN_LSE:
        ct.store(Lse, index=(b, h, rt), tile=row_lse(m, l_sum).reshape((1, 1, TILE_R)))
