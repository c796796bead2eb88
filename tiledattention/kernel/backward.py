"""The cuTile backward kernels: delta, dK/dV over key tiles, dQ over query tiles.

With ``S = scale * Q K^T + bias`` (raw scores plus the additive mask), ``P = exp(S - lse)``
(recomputed from the forward's saved natural-log log-sum-exp, never stored) and the
upstream gradient ``dO``::

    delta = rowsum(dO * O)            attention_bwd_delta (fp32, one pass over dO and O)
    dP    = dO V^T
    dS    = P * (dP - delta)          the gradient of the scores
    dV    = P^T dO                    attention_bwd_dkdv, one program per key tile
    dK    = scale * dS^T Q            (of one K/V head: GQA sums its query heads inside)
    dQ    = scale * dS K              attention_bwd_dq, one program per query tile

dQ comes either from its own kernel (deterministic: no atomics; it recomputes S and dP,
7 matmuls in all) or, with ``DQ_ATOMIC``, from the dK/dV programs adding their share into
an fp32 buffer with atomics (5 matmuls; the order of the additions, and so the rounding,
varies from run to run). Which one runs is the schedule's choice (``BwdSchedule.dq``);
benchmarks/NOTES.md records the measurement behind the default.

All accumulators are fp32; P and dS are rounded to the input dtype for the tensor-core
MMAs, as FlashAttention does. Head dims are split into the forward's power-of-two chunks
(``headdim.plan_head_dim``: 96 = 64 + 32 and 160 = 128 + 32 without padding); products
over the head dim sum their chunks, products into it write one chunk each.

Masks get no gradient (an ``attn_mask`` that requires grad is refused by ``sdpa``): a bool
mask has none, and an additive mask is treated as a constant. Rows the forward found fully
masked (log-sum-exp -inf) have P = 0, so their dQ is zero and they add nothing to dK/dV;
no NaN arises. Out-of-range query rows and key columns are loaded as explicit zeros; the
key tail is masked, so padded keys add nothing to dQ.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import numpy as np

LOG2E = 1.0 / math.log(2.0)
_ZERO = ct.PaddingMode.ZERO
_RELAXED = ct.MemoryOrder.RELAXED

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def attention_bwd_delta(
    Out, dOut, Delta, Dlse,
    TILE_M: ConstInt,
    WD: ConstInt,  # a power of two >= D: the columns past D load as zeros
    HAS_DLSE: ConstBool,  # the log-sum-exp output has a gradient: delta -= dlse
):
    """delta[b, h, i] = sum_d dO * O in fp32, minus the gradient of the LSE output."""
    bid_m = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    o = ct.load(Out, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, WD),
                padding_mode=_ZERO).reshape((TILE_M, WD)).astype(np.float32)
    do = ct.load(dOut, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, WD),
                 padding_mode=_ZERO).reshape((TILE_M, WD)).astype(np.float32)
    delta = ct.sum(o * do, axis=-1, keepdims=False)
    if HAS_DLSE:
        # d lse / d S = P, so the LSE's gradient enters dS = P * (dP - delta) as -dlse.
        dlse = ct.load(Dlse, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                       padding_mode=_ZERO).reshape((TILE_M,))
        delta = delta - dlse
    ct.store(Delta, index=(b, h, bid_m), tile=delta.reshape((1, 1, TILE_M)))


@ct.kernel
def attention_bwd_dkdv(
    Q, K, V, dOut, Lse, Delta, Mask, dK, dV, dQacc,
    qk_scale_log2: float,  # scale * log2(e)
    inv_scale: float,  # 1 / scale: additive masks are added to raw scores
    scale: float,
    GROUP: int,  # query heads per K/V head; this program sums their contributions
    TILE_M: ConstInt,  # query rows per inner step
    TILE_N: ConstInt,  # keys per program
    NCHUNK: ConstInt,
    W0: ConstInt,
    W1: ConstInt,
    W2: ConstInt,
    CAUSAL: ConstBool,
    EVEN_N: ConstBool,
    HAS_MASK: ConstBool,
    MASK_BATCH: ConstBool,
    MASK_HEAD: ConstBool,
    MASK_ROWS: ConstBool,
    DQ_ATOMIC: ConstBool,  # also add scale * dS K into the fp32 dQacc with atomics
):
    # Grid (key tiles, K/V heads, batch).
    bid_n = ct.bid(0)
    hk = ct.bid(1)
    b = ct.bid(2)
    seq_q = Q.shape[2]
    OFF1 = W0
    OFF2 = W0 + W1

    # K and V of this key tile stay on chip: K^T and V^T for the score products
    # (Q K^T, dO V^T), as the forward loads K.
    kt0 = ct.load(K, index=(b, hk, 0, bid_n), shape=(1, 1, W0, TILE_N), order=(0, 1, 3, 2),
                  padding_mode=_ZERO).reshape((W0, TILE_N))
    vt0 = ct.load(V, index=(b, hk, 0, bid_n), shape=(1, 1, W0, TILE_N), order=(0, 1, 3, 2),
                  padding_mode=_ZERO).reshape((W0, TILE_N))
    kt1 = kt0
    vt1 = vt0
    kt2 = kt0
    vt2 = vt0
    if NCHUNK > 1:
        kt1 = ct.load(K, index=(b, hk, OFF1 // W1, bid_n), shape=(1, 1, W1, TILE_N),
                      order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W1, TILE_N))
        vt1 = ct.load(V, index=(b, hk, OFF1 // W1, bid_n), shape=(1, 1, W1, TILE_N),
                      order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W1, TILE_N))
    if NCHUNK > 2:
        kt2 = ct.load(K, index=(b, hk, OFF2 // W2, bid_n), shape=(1, 1, W2, TILE_N),
                      order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W2, TILE_N))
        vt2 = ct.load(V, index=(b, hk, OFF2 // W2, bid_n), shape=(1, 1, W2, TILE_N),
                      order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W2, TILE_N))

    # K in [keys, D] layout for dS K (atomic dQ only).
    k0 = kt0
    k1 = kt1
    k2 = kt2
    if DQ_ATOMIC:
        k0 = ct.load(K, index=(b, hk, bid_n, 0), shape=(1, 1, TILE_N, W0),
                     padding_mode=_ZERO).reshape((TILE_N, W0))
        if NCHUNK > 1:
            k1 = ct.load(K, index=(b, hk, bid_n, OFF1 // W1), shape=(1, 1, TILE_N, W1),
                         padding_mode=_ZERO).reshape((TILE_N, W1))
        if NCHUNK > 2:
            k2 = ct.load(K, index=(b, hk, bid_n, OFF2 // W2), shape=(1, 1, TILE_N, W2),
                         padding_mode=_ZERO).reshape((TILE_N, W2))
    cols0 = ct.arange(W0, dtype=np.int32)[None, :]
    cols1 = OFF1 + ct.arange(W1, dtype=np.int32)[None, :]
    cols2 = OFF2 + ct.arange(W2, dtype=np.int32)[None, :]

    dk0 = ct.full((TILE_N, W0), 0.0, dtype=np.float32)
    dk1 = ct.full((TILE_N, W1), 0.0, dtype=np.float32)
    dk2 = ct.full((TILE_N, W2), 0.0, dtype=np.float32)
    dv0 = ct.full((TILE_N, W0), 0.0, dtype=np.float32)
    dv1 = ct.full((TILE_N, W1), 0.0, dtype=np.float32)
    dv2 = ct.full((TILE_N, W2), 0.0, dtype=np.float32)

    k_start = bid_n * TILE_N
    offs_n = (k_start + ct.arange(TILE_N, dtype=np.int32))[None, :]
    seq_k = K.shape[2]
    # The key tail: masked so that no padded key reaches dQ (and no inf arises there).
    tail = ct.where(offs_n < seq_k, 0.0, -np.inf)
    offs_m_tile = ct.arange(TILE_M, dtype=np.int32)[:, None]

    # Query tiles [m_lo, m_hi); causal: those wholly above this key tile's diagonal are
    # skipped, and only tiles starting before the key tile ends cross the diagonal.
    m_hi = ct.cdiv(seq_q, TILE_M)
    m_lo = 0
    mask_end = 0
    if CAUSAL:
        m_lo = k_start // TILE_M
        mask_end = ct.cdiv(k_start + TILE_N, TILE_M)

    mb = 0
    if MASK_BATCH:
        mb = b

    for g in range(GROUP):
        h = hk * GROUP + g
        mh = 0
        if MASK_HEAD:
            mh = h
        for i in range(m_lo, m_hi):
            q0 = ct.load(Q, index=(b, h, i, 0), shape=(1, 1, TILE_M, W0),
                         padding_mode=_ZERO).reshape((TILE_M, W0))
            do0 = ct.load(dOut, index=(b, h, i, 0), shape=(1, 1, TILE_M, W0),
                          padding_mode=_ZERO).reshape((TILE_M, W0))
            qk = ct.mma(q0, kt0, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
            dp = ct.mma(do0, vt0, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
            q1 = q0
            q2 = q0
            do1 = do0
            do2 = do0
            if NCHUNK > 1:
                q1 = ct.load(Q, index=(b, h, i, OFF1 // W1), shape=(1, 1, TILE_M, W1),
                             padding_mode=_ZERO).reshape((TILE_M, W1))
                do1 = ct.load(dOut, index=(b, h, i, OFF1 // W1), shape=(1, 1, TILE_M, W1),
                              padding_mode=_ZERO).reshape((TILE_M, W1))
                qk = ct.mma(q1, kt1, qk)
                dp = ct.mma(do1, vt1, dp)
            if NCHUNK > 2:
                q2 = ct.load(Q, index=(b, h, i, OFF2 // W2), shape=(1, 1, TILE_M, W2),
                             padding_mode=_ZERO).reshape((TILE_M, W2))
                do2 = ct.load(dOut, index=(b, h, i, OFF2 // W2), shape=(1, 1, TILE_M, W2),
                              padding_mode=_ZERO).reshape((TILE_M, W2))
                qk = ct.mma(q2, kt2, qk)
                dp = ct.mma(do2, vt2, dp)

            if HAS_MASK:
                mq = 0
                if MASK_ROWS:
                    mq = i
                    bias = ct.load(Mask, index=(mb, mh, mq, bid_n),
                                   shape=(1, 1, TILE_M, TILE_N),
                                   padding_mode=_ZERO).reshape((TILE_M, TILE_N))
                else:
                    bias = ct.load(Mask, index=(mb, mh, 0, bid_n), shape=(1, 1, 1, TILE_N),
                                   padding_mode=_ZERO).reshape((1, TILE_N))
                qk = qk + bias.astype(np.float32) * inv_scale
            if CAUSAL and i < mask_end:
                offs_m = i * TILE_M + offs_m_tile
                qk = qk + ct.where(offs_m >= offs_n, 0.0, -np.inf)
            if not EVEN_N:
                qk = qk + tail

            lse = ct.load(Lse, index=(b, h, i), shape=(1, 1, TILE_M),
                          padding_mode=_ZERO).reshape((TILE_M, 1)) * LOG2E
            if HAS_MASK:
                # Fully masked rows (lse = -inf): P = exp2(s - inf) = 0, not NaN.
                lse = ct.where(lse == -np.inf, np.inf, lse)
            delta = ct.load(Delta, index=(b, h, i), shape=(1, 1, TILE_M),
                            padding_mode=_ZERO).reshape((TILE_M, 1))
            p = ct.exp2(qk * qk_scale_log2 - lse, flush_to_zero=True)
            ds = (p * (dp - delta)).astype(Q.dtype)
            pt = ct.transpose(p.astype(Q.dtype))
            dst = ct.transpose(ds)
            if DQ_ATOMIC:
                rows = i * TILE_M + offs_m_tile
                dq0 = ct.mma(ds, k0, ct.full((TILE_M, W0), 0.0, dtype=np.float32)) * scale
                ct.atomic_add(dQacc, (b, h, rows, cols0), dq0, memory_order=_RELAXED)
                if NCHUNK > 1:
                    dq1 = ct.mma(ds, k1, ct.full((TILE_M, W1), 0.0, dtype=np.float32)) * scale
                    ct.atomic_add(dQacc, (b, h, rows, cols1), dq1, memory_order=_RELAXED)
                if NCHUNK > 2:
                    dq2 = ct.mma(ds, k2, ct.full((TILE_M, W2), 0.0, dtype=np.float32)) * scale
                    ct.atomic_add(dQacc, (b, h, rows, cols2), dq2, memory_order=_RELAXED)
            dv0 = ct.mma(pt, do0, dv0)
            dk0 = ct.mma(dst, q0, dk0)
            if NCHUNK > 1:
                dv1 = ct.mma(pt, do1, dv1)
                dk1 = ct.mma(dst, q1, dk1)
            if NCHUNK > 2:
                dv2 = ct.mma(pt, do2, dv2)
                dk2 = ct.mma(dst, q2, dk2)

    ct.store(dV, index=(b, hk, bid_n, 0), tile=dv0.reshape((1, 1, TILE_N, W0)).astype(dV.dtype))
    ct.store(dK, index=(b, hk, bid_n, 0),
             tile=(dk0 * scale).reshape((1, 1, TILE_N, W0)).astype(dK.dtype))
    if NCHUNK > 1:
        ct.store(dV, index=(b, hk, bid_n, OFF1 // W1),
                 tile=dv1.reshape((1, 1, TILE_N, W1)).astype(dV.dtype))
        ct.store(dK, index=(b, hk, bid_n, OFF1 // W1),
                 tile=(dk1 * scale).reshape((1, 1, TILE_N, W1)).astype(dK.dtype))
    if NCHUNK > 2:
        ct.store(dV, index=(b, hk, bid_n, OFF2 // W2),
                 tile=dv2.reshape((1, 1, TILE_N, W2)).astype(dV.dtype))
        ct.store(dK, index=(b, hk, bid_n, OFF2 // W2),
                 tile=(dk2 * scale).reshape((1, 1, TILE_N, W2)).astype(dK.dtype))


@ct.kernel
def attention_bwd_dq(
    Q, K, V, dOut, Lse, Delta, Mask, dQ,
    qk_scale_log2: float,
    inv_scale: float,
    scale: float,
    GROUP: int,
    TILE_M: ConstInt,  # query rows per program
    TILE_N: ConstInt,  # keys per inner step
    NCHUNK: ConstInt,
    W0: ConstInt,
    W1: ConstInt,
    W2: ConstInt,
    CAUSAL: ConstBool,
    EVEN_N: ConstBool,
    HAS_MASK: ConstBool,
    MASK_BATCH: ConstBool,
    MASK_HEAD: ConstBool,
    MASK_ROWS: ConstBool,
):
    # Grid (query tiles, query heads, batch), as the forward.
    bid_m = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    hk = h // GROUP
    seq_k = K.shape[2]
    OFF1 = W0
    OFF2 = W0 + W1

    q0 = ct.load(Q, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, W0),
                 padding_mode=_ZERO).reshape((TILE_M, W0))
    do0 = ct.load(dOut, index=(b, h, bid_m, 0), shape=(1, 1, TILE_M, W0),
                  padding_mode=_ZERO).reshape((TILE_M, W0))
    q1 = q0
    q2 = q0
    do1 = do0
    do2 = do0
    if NCHUNK > 1:
        q1 = ct.load(Q, index=(b, h, bid_m, OFF1 // W1), shape=(1, 1, TILE_M, W1),
                     padding_mode=_ZERO).reshape((TILE_M, W1))
        do1 = ct.load(dOut, index=(b, h, bid_m, OFF1 // W1), shape=(1, 1, TILE_M, W1),
                      padding_mode=_ZERO).reshape((TILE_M, W1))
    if NCHUNK > 2:
        q2 = ct.load(Q, index=(b, h, bid_m, OFF2 // W2), shape=(1, 1, TILE_M, W2),
                     padding_mode=_ZERO).reshape((TILE_M, W2))
        do2 = ct.load(dOut, index=(b, h, bid_m, OFF2 // W2), shape=(1, 1, TILE_M, W2),
                      padding_mode=_ZERO).reshape((TILE_M, W2))
    lse = ct.load(Lse, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                  padding_mode=_ZERO).reshape((TILE_M, 1)) * LOG2E
    if HAS_MASK:
        lse = ct.where(lse == -np.inf, np.inf, lse)
    delta = ct.load(Delta, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                    padding_mode=_ZERO).reshape((TILE_M, 1))

    dq0 = ct.full((TILE_M, W0), 0.0, dtype=np.float32)
    dq1 = ct.full((TILE_M, W1), 0.0, dtype=np.float32)
    dq2 = ct.full((TILE_M, W2), 0.0, dtype=np.float32)

    q_start = bid_m * TILE_M
    offs_m = (q_start + ct.arange(TILE_M, dtype=np.int32))[:, None]
    offs_n_tile = ct.arange(TILE_N, dtype=np.int32)[None, :]
    n_tiles = ct.cdiv(seq_k, TILE_N)
    mask_start = n_tiles
    if not EVEN_N:
        mask_start = seq_k // TILE_N
    if CAUSAL:
        n_tiles = ct.cdiv(min(q_start + TILE_M, seq_k), TILE_N)
        mask_start = min(mask_start, q_start // TILE_N)

    mb = 0
    mh = 0
    mq = 0
    if MASK_BATCH:
        mb = b
    if MASK_HEAD:
        mh = h
    if MASK_ROWS:
        mq = bid_m

    for j in range(0, n_tiles):
        kt0 = ct.load(K, index=(b, hk, 0, j), shape=(1, 1, W0, TILE_N), order=(0, 1, 3, 2),
                      padding_mode=_ZERO).reshape((W0, TILE_N))
        vt0 = ct.load(V, index=(b, hk, 0, j), shape=(1, 1, W0, TILE_N), order=(0, 1, 3, 2),
                      padding_mode=_ZERO).reshape((W0, TILE_N))
        qk = ct.mma(q0, kt0, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
        dp = ct.mma(do0, vt0, ct.full((TILE_M, TILE_N), 0.0, dtype=np.float32))
        if NCHUNK > 1:
            kt1 = ct.load(K, index=(b, hk, OFF1 // W1, j), shape=(1, 1, W1, TILE_N),
                          order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W1, TILE_N))
            vt1 = ct.load(V, index=(b, hk, OFF1 // W1, j), shape=(1, 1, W1, TILE_N),
                          order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W1, TILE_N))
            qk = ct.mma(q1, kt1, qk)
            dp = ct.mma(do1, vt1, dp)
        if NCHUNK > 2:
            kt2 = ct.load(K, index=(b, hk, OFF2 // W2, j), shape=(1, 1, W2, TILE_N),
                          order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W2, TILE_N))
            vt2 = ct.load(V, index=(b, hk, OFF2 // W2, j), shape=(1, 1, W2, TILE_N),
                          order=(0, 1, 3, 2), padding_mode=_ZERO).reshape((W2, TILE_N))
            qk = ct.mma(q2, kt2, qk)
            dp = ct.mma(do2, vt2, dp)

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

        p = ct.exp2(qk * qk_scale_log2 - lse, flush_to_zero=True)
        ds = (p * (dp - delta)).astype(Q.dtype)
        k0 = ct.load(K, index=(b, hk, j, 0), shape=(1, 1, TILE_N, W0),
                     padding_mode=_ZERO).reshape((TILE_N, W0))
        dq0 = ct.mma(ds, k0, dq0)
        if NCHUNK > 1:
            k1 = ct.load(K, index=(b, hk, j, OFF1 // W1), shape=(1, 1, TILE_N, W1),
                         padding_mode=_ZERO).reshape((TILE_N, W1))
            dq1 = ct.mma(ds, k1, dq1)
        if NCHUNK > 2:
            k2 = ct.load(K, index=(b, hk, j, OFF2 // W2), shape=(1, 1, TILE_N, W2),
                         padding_mode=_ZERO).reshape((TILE_N, W2))
            dq2 = ct.mma(ds, k2, dq2)

    ct.store(dQ, index=(b, h, bid_m, 0),
             tile=(dq0 * scale).reshape((1, 1, TILE_M, W0)).astype(dQ.dtype))
    if NCHUNK > 1:
        ct.store(dQ, index=(b, h, bid_m, OFF1 // W1),
                 tile=(dq1 * scale).reshape((1, 1, TILE_M, W1)).astype(dQ.dtype))
    if NCHUNK > 2:
        ct.store(dQ, index=(b, h, bid_m, OFF2 // W2),
                 tile=(dq2 * scale).reshape((1, 1, TILE_M, W2)).astype(dQ.dtype))
