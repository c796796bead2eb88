"""The cuTile forward kernel: one tile program, specialised by compile-time flags.

One program instance computes a ``TILE_M`` block of query rows of one (batch, head):
it streams K/V tiles of ``TILE_N`` keys, keeps the running max ``m`` and running sum
``l`` of the online softmax in fp32 (in log2 units: ``log2(e)`` is folded into the
scale, so ``exp2`` replaces ``exp``) and accumulates ``P @ V`` in fp32.

Head dims that are not a power of two are split into at most three power-of-two
chunks (``headdim.plan_head_dim``): 96 = 64 + 32 and 160 = 128 + 32 are exact, so no
multiply-accumulate work is spent on padding. Out-of-range rows, keys and head-dim
columns are loaded as explicit zeros and masked, never read as undefined padding.

Two flags reshape the grid for small ones (decode):

- ``SPLIT_K`` (flash-decoding): grid axis 1 runs over heads x ``NUM_SPLITS`` key splits;
  each program visits ``SPLIT_TILES`` key tiles and writes its normalised partial output
  (fp32, into ``Out`` of shape [B, H * NUM_SPLITS, Sq, D]) and its log-sum-exp (into
  ``Lse``); ``combine.attention_combine`` merges them. A split past a row's last key
  (causal) leaves that row's partial at zero with log-sum-exp -inf.
- ``PACKED`` (GQA decode): the launch views q as [B, Hkv, GROUP * Sq, D], so the query
  heads of one K/V head share the rows of a tile and K/V are read once per group; row r
  is query position ``r % SEQ_Q`` of head ``r // SEQ_Q``.

``PDL`` (``Schedule.pdl``): the kernel is launched as a programmatic dependent and waits for
the previous kernel's grid before its first load (benchmarks/NOTES.md §20).
"""

from __future__ import annotations

import math

import cuda.tile as ct
import numpy as np
from cuda.tile import RoundingMode

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)
_ZERO = ct.PaddingMode.ZERO

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def attention_fwd(
    Q, K, V, Out, Lse, Mask,
    qk_scale_log2: float,  # scale * log2(e)
    inv_scale: float,  # 1 / scale: additive masks are added to raw scores
    GROUP: int,  # query heads per K/V head (GQA); 1 for MHA (and when PACKED)
    SEQ_Q: int,  # query positions per head (PACKED: rows per head in the packed tile)
    NUM_SPLITS: int,  # SPLIT_K: key splits per (batch, head)
    SPLIT_TILES: int,  # SPLIT_K: key tiles per split
    TILE_M: ConstInt,
    TILE_N: ConstInt,
    NCHUNK: ConstInt,  # head-dim chunks used (1..3)
    W0: ConstInt,  # chunk widths, powers of two; unused ones are ignored
    W1: ConstInt,
    W2: ConstInt,
    CAUSAL: ConstBool,
    HEAVY_FIRST: ConstBool,  # causal: launch the longest query tiles (last rows) first
    EVEN_N: ConstBool,  # Skv % TILE_N == 0: no key-tail masking needed
    HAS_MASK: ConstBool,
    MASK_BATCH: ConstBool,  # mask has a batch axis (else broadcast)
    MASK_HEAD: ConstBool,  # mask has a head axis
    MASK_ROWS: ConstBool,  # mask has a query axis (False: key-padding mask, one row)
    RETURN_LSE: ConstBool,
    LAT_K: ConstInt,
    LAT_V: ConstInt,
    SPLIT_K: ConstBool,  # write per-split partials (fp32 Out, Lse) for the combine kernel
    PACKED: ConstBool,  # rows are (query head in group, query position) pairs
    PDL: ConstBool,  # launched as a programmatic dependent: wait before the first load
):
    # Grid (query tiles, heads, batch): query tiles of one head are adjacent, so
    # they share its K/V in L2.
    bid_m = ct.bid(0)
    if CAUSAL and HEAVY_FIRST:
        # Under causality the last query tiles visit the most keys; starting them first
        # leaves the short ones to fill the final wave.
        bid_m = ct.num_blocks(0) - 1 - bid_m
    hb = ct.bid(1)  # the head (and split) index of Out and Lse
    h = hb
    if SPLIT_K:
        h = hb // NUM_SPLITS
    b = ct.bid(2)
    hk = h // GROUP
    seq_k = K.shape[2]

    # Head-dim chunk c starts at column OFF_c; its tile index is OFF_c // W_c, exact
    # because the widths are non-increasing powers of two.
    OFF1 = W0
    OFF2 = W0 + W1

    if PDL:
        # Programmatic dependent launch: the CTA's setup and the index math (no memory
        # effects, so the compiler may place all of it before the wait) run while the
        # previous kernel finishes; every load and store is ordered after the wait (that
        # kernel may write our inputs or still read memory we write). The next kernel may
        # be scheduled now: it waits for this whole grid itself.
        ct.grid_dependency_control_launch_dependents()
        ct.grid_dependency_control_wait()

    q0 = ct.load(Q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, W0),
                 padding_mode=_ZERO).reshape((TILE_M, W0))
    q1 = q0
    q2 = q0
    if NCHUNK > 1:
        q1 = ct.load(Q, index=(b, h, bid_m, OFF1 // W1), shape=(1, 1, TILE_M, W1),
                     padding_mode=_ZERO).reshape((TILE_M, W1))
    if NCHUNK > 2:
        q2 = ct.load(Q, index=(b, h, bid_m, OFF2 // W2), shape=(1, 1, TILE_M, W2),
                     padding_mode=_ZERO).reshape((TILE_M, W2))

    m_i = ct.full((TILE_M, 1), -np.inf, dtype=np.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=np.float32)
    acc0 = ct.full((TILE_M, W0), 0.0, dtype=np.float32)
    acc1 = ct.full((TILE_M, W1), 0.0, dtype=np.float32)
    acc2 = ct.full((TILE_M, W2), 0.0, dtype=np.float32)

    q_start = bid_m * TILE_M
    offs_m = (q_start + ct.arange(TILE_M, dtype=np.int32))[:, None]
    if PACKED:
        offs_m = offs_m % SEQ_Q  # query position of each packed row
    offs_n_tile = ct.arange(TILE_N, dtype=np.int32)[None, :]

    # Key tiles [0, n_tiles) are visited; from mask_start on, some element of the
    # tile may be masked by causality or the key tail. Causal tiles wholly above
    # the diagonal (top-left aligned, as torch's is_causal) are never visited.
    n_tiles = ct.cdiv(seq_k, TILE_N)
    mask_start = n_tiles
    if not EVEN_N:
        mask_start = seq_k // TILE_N
    if CAUSAL:
        if PACKED:
            # Packed rows hold positions 0..SEQ_Q-1 of several heads: every tile the
            # last position sees is visited and masked.
            n_tiles = ct.cdiv(min(SEQ_Q, seq_k), TILE_N)
            mask_start = 0
        else:
            n_tiles = ct.cdiv(min(q_start + TILE_M, seq_k), TILE_N)
            mask_start = min(mask_start, q_start // TILE_N)
    j_start = 0
    if SPLIT_K:
        j_start = (hb % NUM_SPLITS) * SPLIT_TILES
        # Never below j_start: a split past a causal row's keys runs no iteration.
        n_tiles = max(min(n_tiles, j_start + SPLIT_TILES), j_start)

    mb = 0
    mh = 0
    mq = 0
    if MASK_BATCH:
        mb = b
    if MASK_HEAD:
        mh = h
    if MASK_ROWS:
        mq = bid_m

    for j in range(j_start, n_tiles):
        k0 = ct.load(K, index=(b, hk, 0, j), shape=(1, 1, W0, TILE_N), order=(0, 1, 3, 2),
                     padding_mode=_ZERO, latency=LAT_K).reshape((W0, TILE_N))
        qk = ct.mma(q0, k0, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
        if NCHUNK > 1:
            k1 = ct.load(K, index=(b, hk, OFF1 // W1, j), shape=(1, 1, W1, TILE_N),
                         order=(0, 1, 3, 2), padding_mode=_ZERO,
                         latency=LAT_K).reshape((W1, TILE_N))
            qk = ct.mma(q1, k1, qk)
        if NCHUNK > 2:
            k2 = ct.load(K, index=(b, hk, OFF2 // W2, j), shape=(1, 1, W2, TILE_N),
                         order=(0, 1, 3, 2), padding_mode=_ZERO,
                         latency=LAT_K).reshape((W2, TILE_N))
            qk = ct.mma(q2, k2, qk)

        if HAS_MASK:
            if MASK_ROWS:
                bias = ct.load(Mask, index=(mb, mh, mq, j), shape=(1, 1, TILE_M, TILE_N),
                               padding_mode=_ZERO).reshape((TILE_M, TILE_N))
            else:
                bias = ct.load(Mask, index=(mb, mh, 0, j), shape=(1, 1, 1, TILE_N),
                               padding_mode=_ZERO).reshape((1, TILE_N))
            qk = qk + bias.astype(np.float32) * inv_scale

        if (CAUSAL or not EVEN_N) and j >= mask_start:
            offs_n = j * TILE_N + offs_n_tile
            keep = ct.full((TILE_M, TILE_N), True, dtype=np.bool_)
            if not EVEN_N:
                keep = keep & (offs_n < seq_k)
            if CAUSAL:
                keep = keep & (offs_m >= offs_n)
            qk = qk + ct.where(keep, 0.0, -np.inf)

        # Online softmax in log2 units; the scale is applied after the row max so it
        # fuses into the subtraction.
        m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
        m_sub = m_ij
        if HAS_MASK or SPLIT_K:
            # A row masked so far has m = -inf (a user mask, or causal keys past the row
            # in a later split); subtracting 0 keeps p = 0, not NaN.
            m_sub = ct.where(m_ij == -np.inf, 0.0, m_ij)
        p = ct.exp2(qk * qk_scale_log2 - m_sub, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_sub, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        p = p.astype(Q.dtype)

        v0 = ct.load(V, index=(b, hk, j, 0), shape=(1, 1, TILE_N, W0), padding_mode=_ZERO,
                     latency=LAT_V).reshape((TILE_N, W0))
        acc0 = ct.mma(p, v0, acc0 * alpha)
        if NCHUNK > 1:
            v1 = ct.load(V, index=(b, hk, j, OFF1 // W1), shape=(1, 1, TILE_N, W1),
                         padding_mode=_ZERO, latency=LAT_V).reshape((TILE_N, W1))
            acc1 = ct.mma(p, v1, acc1 * alpha)
        if NCHUNK > 2:
            v2 = ct.load(V, index=(b, hk, j, OFF2 // W2), shape=(1, 1, TILE_N, W2),
                         padding_mode=_ZERO, latency=LAT_V).reshape((TILE_N, W2))
            acc2 = ct.mma(p, v2, acc2 * alpha)
        m_i = m_ij

    # Fully masked rows (a user mask, or a split past the row's last key) have l = 0:
    # they are written as zeros, and their log-sum-exp as -inf.
    l_div = l_i
    if HAS_MASK or SPLIT_K:
        l_div = ct.where(l_i == 0.0, 1.0, l_i)
    out0 = ct.truediv(acc0, l_div, flush_to_zero=True, rounding_mode=RoundingMode.APPROX)
    ct.store(Out, index=(b, hb, bid_m, 0),
             tile=out0.reshape((1, 1, TILE_M, W0)).astype(Out.dtype))
    if NCHUNK > 1:
        out1 = ct.truediv(acc1, l_div, flush_to_zero=True, rounding_mode=RoundingMode.APPROX)
        ct.store(Out, index=(b, hb, bid_m, OFF1 // W1),
                 tile=out1.reshape((1, 1, TILE_M, W1)).astype(Out.dtype))
    if NCHUNK > 2:
        out2 = ct.truediv(acc2, l_div, flush_to_zero=True, rounding_mode=RoundingMode.APPROX)
        ct.store(Out, index=(b, hb, bid_m, OFF2 // W2),
                 tile=out2.reshape((1, 1, TILE_M, W2)).astype(Out.dtype))
    if RETURN_LSE or SPLIT_K:
        lse = (m_i + ct.log2(l_i)) * LN2
        ct.store(Lse, index=(b, hb, bid_m), tile=lse.reshape((1, 1, TILE_M)))
