"""The split-K combine: merges the per-split partial outputs of ``attention_fwd``.

Each split s of a row left a normalised partial output ``o_s`` (fp32) and its natural-log
log-sum-exp ``lse_s`` (-inf for a split that saw no key of the row). The row's output is
``sum_s w_s o_s / sum_s w_s`` with ``w_s = exp(lse_s - max_s lse_s)``, and its log-sum-exp
``max + log(sum_s w_s)``. Rows every split left empty (fully masked) are zeros with -inf.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np
from cuda.tile import RoundingMode

from .attention import LN2, LOG2E, ConstBool, ConstInt

_ZERO = ct.PaddingMode.ZERO


@ct.kernel
def attention_combine(
    Part, PartLse, Out, Lse,  # [B, H*NUM_SPLITS, R, D] fp32, [B, H*NUM_SPLITS, R]; Out, Lse
    NUM_SPLITS: int,
    TILE_R: ConstInt,  # rows per program
    NCHUNK: ConstInt,  # head-dim chunks, as in attention_fwd
    W0: ConstInt,
    W1: ConstInt,
    W2: ConstInt,
    RETURN_LSE: ConstBool,
):
    rt = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    OFF1 = W0
    OFF2 = W0 + W1

    # Pass 1: the row max of the splits' log-sum-exps (log2 units).
    m = ct.full((TILE_R, 1), -np.inf, dtype=np.float32)
    for s in range(NUM_SPLITS):
        lse_s = ct.load(PartLse, index=(b, h * NUM_SPLITS + s, rt), shape=(1, 1, TILE_R),
                        padding_mode=_ZERO).reshape((TILE_R, 1))
        m = max(m, lse_s * LOG2E)
    m_sub = ct.where(m == -np.inf, 0.0, m)

    # Pass 2: the weighted sum.
    l_sum = ct.full((TILE_R, 1), 0.0, dtype=np.float32)
    acc0 = ct.full((TILE_R, W0), 0.0, dtype=np.float32)
    acc1 = ct.full((TILE_R, W1), 0.0, dtype=np.float32)
    acc2 = ct.full((TILE_R, W2), 0.0, dtype=np.float32)
    for s in range(NUM_SPLITS):
        hs = h * NUM_SPLITS + s
        lse_s = ct.load(PartLse, index=(b, hs, rt), shape=(1, 1, TILE_R),
                        padding_mode=_ZERO).reshape((TILE_R, 1))
        w = ct.exp2(lse_s * LOG2E - m_sub, flush_to_zero=True)
        l_sum = l_sum + w
        acc0 = acc0 + w * ct.load(Part, index=(b, hs, rt, 0), shape=(1, 1, TILE_R, W0),
                                  padding_mode=_ZERO).reshape((TILE_R, W0))
        if NCHUNK > 1:
            acc1 = acc1 + w * ct.load(Part, index=(b, hs, rt, OFF1 // W1),
                                      shape=(1, 1, TILE_R, W1),
                                      padding_mode=_ZERO).reshape((TILE_R, W1))
        if NCHUNK > 2:
            acc2 = acc2 + w * ct.load(Part, index=(b, hs, rt, OFF2 // W2),
                                      shape=(1, 1, TILE_R, W2),
                                      padding_mode=_ZERO).reshape((TILE_R, W2))

    l_div = ct.where(l_sum == 0.0, 1.0, l_sum)
    out0 = ct.truediv(acc0, l_div, rounding_mode=RoundingMode.APPROX)
    ct.store(Out, index=(b, h, rt, 0), tile=out0.reshape((1, 1, TILE_R, W0)).astype(Out.dtype))
    if NCHUNK > 1:
        out1 = ct.truediv(acc1, l_div, rounding_mode=RoundingMode.APPROX)
        ct.store(Out, index=(b, h, rt, OFF1 // W1),
                 tile=out1.reshape((1, 1, TILE_R, W1)).astype(Out.dtype))
    if NCHUNK > 2:
        out2 = ct.truediv(acc2, l_div, rounding_mode=RoundingMode.APPROX)
        ct.store(Out, index=(b, h, rt, OFF2 // W2),
                 tile=out2.reshape((1, 1, TILE_R, W2)).astype(Out.dtype))
    if RETURN_LSE:
        lse = (m + ct.log2(l_sum)) * LN2
        ct.store(Lse, index=(b, h, rt), tile=lse.reshape((1, 1, TILE_R)))
