"""The cuTile backward kernels: dQ over query tiles (with delta), dK/dV over key tiles.

With ``S`` the scores in softmax units (``body``: raw ``q.k`` or ``score_mod(scale * q.k)``,
plus the additive mask, masked), ``P = exp(S - lse)`` recomputed from the forward's saved
log-sum-exp (never stored) and the upstream gradient ``dO``::

    delta = rowsum(dO * O)            fp32: the dQ program of the rows (run first), or
                                      attention_bwd_delta (``BwdVariant.delta_in_dq``)
    dP    = dO V^T
    dS    = P * (dP - delta) [* score_mod'(scale * q.k)]
    dV    = P^T dO                    attention_bwd_dkdv, one program per key tile
    dK    = scale * dS^T Q            (of one K/V head: GQA sums its query heads inside)
    dQ    = scale * dS K              attention_bwd_dq, one program per query tile

V's head dim may differ from Q/K's (D_v != D_qk, MLA's (192, 128)): delta, dP and dV run
over V's head-dim chunks (``flags.value_chunks``), S, dQ and dK over Q/K's.

dQ comes either from its own kernel (deterministic: no atomics; it recomputes S and dP,
7 matmuls in all) or, with ``DQ_ATOMIC``, from the dK/dV programs adding their share into
an fp32 buffer by TMA bulk reduce-add (5 matmuls; the order of the additions, and so the
rounding, varies from run to run; the host converts it, times ``scale``). Which one runs
is the schedule's choice (``BwdSchedule.dq``);
benchmarks/NOTES.md records the measurement behind the default.

Both score kernels visit tiles as the forward does: dense with the causal skip, or the
partial-then-full lists of a block mask (dK/dV reads the transposed lists: query tiles per
key tile). All accumulators are fp32; P and dS are rounded to the input dtype for the
tensor-core MMAs, as FlashAttention does.

Masks get no gradient (an ``attn_mask`` that requires grad is refused by ``sdpa``). The
tensors a ``score_mod`` captures that require grad get theirs from the dK/dV program:
``mods.with_captured_grads`` generates the function that adds ``d out / d (modified score)
* d score_mod / d T[idx]`` into an fp32 ``G`` at ``idx`` with relaxed atomics. Rows
the forward found fully masked (log-sum-exp -inf, whatever masked them: a mask, a block
list, a score_mod returning -inf) have P = 0, so their dQ is zero and they add nothing to
dK/dV; no NaN arises. Out-of-range rows and keys load as explicit zeros; the key tail is
masked, and with a score_mod so are the padded query rows of the dK/dV program; dS is 0
wherever P is.
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from .body import (
    dot,
    dots_streamed,
    keep_tile,
    load_cols,
    load_lse,
    load_row_stats,
    load_rows,
    masked,
    masked_rows,
    mma_into,
    mma_streamed,
    modified,
    no_captured_grad,
    no_mask_mod,
    no_score_mod,
    row_stat,
    scale_chunks,
    scatter_rows,
    score_gradient,
    store_rows,
    with_mask,
    zeros_chunks,
)
from .entry import entry_point
from .flags import (
    BWD_SEQS,
    PLAIN,
    VARIANT,
    DkdvFlags,
    DqFlags,
    bwd_zero_safe,
    has_seqs,
    value_chunks,
)
from .visit import (
    block_at,
    block_range,
    key_range,
    mapped_program,
    query_range,
    seq_key_range,
    seq_query_range,
    sequence_slice,
    sequence_span,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

# The variant's functions, the score modification's derivative and the captured tensors'
# gradients (``binding.with_mods``).
SCORE_MOD = no_score_mod
SCORE_GRAD = no_score_mod
MASK_MOD = no_mask_mod
SCORE_CAPGRAD = no_captured_grad


@ct.kernel
def attention_bwd_delta(
    Out, dOut, Delta, Dlse, dQacc,
    TILE_M: ConstInt,
    WD: ConstInt,  # a power of two >= V's head dim (O, dO): the columns past it load as zeros
    WQ: ConstInt,  # the same for Q's head dim (dQacc's columns zeroed)
    HAS_DLSE: ConstBool,  # the log-sum-exp output has a gradient: delta -= dlse
    ZERO_DQ: ConstBool,  # also zero these rows of the fp32 dQacc (dQ by reduce-add)
):
    """delta[b, h, i] = sum_d dO * O in fp32, minus the gradient of the LSE output."""
    bid_m = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    o, _, _ = load_rows(Out, b, h, bid_m, TILE_M, WD, WD, WD, 1, None)
    do, _, _ = load_rows(dOut, b, h, bid_m, TILE_M, WD, WD, WD, 1, None)
    delta = ct.sum(o.astype(np.float32) * do.astype(np.float32), axis=-1, keepdims=False)
    if HAS_DLSE:
        # d lse / d S = P, so the LSE's gradient enters dS = P * (dP - delta) as -dlse.
        dlse = ct.load(Dlse, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                       padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M,))
        delta = delta - dlse
    ct.store(Delta, index=(b, h, bid_m), tile=delta.reshape((1, 1, TILE_M)))
    if ZERO_DQ:
        # The pass that reads every row anyway clears the reduce-add's target: no memset
        # launch. Columns past D fall outside the array and are not written.
        ct.store(dQacc, index=(b, h, bid_m, 0),
                 tile=ct.full((1, 1, TILE_M, WQ), 0.0, dtype=np.float32))


def grad_scores(qk, dp, arrays, fns, aux, where, i, j, on_diag, ALL_MASKS, f, ROW_TAIL,
                KEY_ROWS, stats=None):
    """P and dS of query tile ``i`` against key tile ``j`` from its products ``qk = Q K^T``
    and ``dp = dO V^T``, both rounded to the input dtype for the MMAs: the shared step of
    the dK/dV and dQ kernels. Grouped arguments as the forward's ``fwd_tile``: ``arrays``
    (Q, K, V, dO, Lse, Delta, Mask); ``fns`` (score_mod, its derivative, mask_mod);
    ``where`` (b, h, hk, seq_k, c, inv_scale, scale, ab, diag, at: the array batch of Q,
    dO, Lse, Delta, ``keep_tile``'s diagonal of a packed sequence, else b and None, and
    ``at`` the whole-array loads' origins, ``whole_origins``); ``aux``
    A0..A3 and G0..G3 (the
    captured tensors and their gradients' fp32 accumulators); ``f`` the kernel's flags
    (``DkdvFlags`` or ``DqFlags``: the fields read here are common to both); ``ROW_TAIL``
    mask the query rows past the sequence (``masked_rows``: with a score_mod; with whole
    loads also their row statistics, ``rows_past_end``). ``KEY_ROWS``: the products are the
    transposes, ``K Q^T`` and ``V dO^T`` [keys, queries], and so are P and dS: the same
    elementwise steps on index tiles and row statistics laid out the other way. ``stats``:
    the rows' (lse, delta) as ``load_row_stats`` gives them, kept by a program whose query
    tile is fixed (dQ); None loads them for tile ``i``."""
    TILE_M, TILE_N, CAUSAL, TAIL = f.TILE_M, f.TILE_N, f.CAUSAL, not f.EVEN_N
    HAS_SCORE_MOD = f.HAS_SCORE_MOD
    Q, K, V, dOut, Lse, Delta, Mask = arrays
    score_mod, score_grad, mask_mod, captured_grad = fns
    A0, A1, A2, A3, G0, G1, G2, G3 = aux
    b, h, hk, seq_k, c, inv_scale, scale, ab, diag, at = where
    # (Each orientation's index tiles in the order of the queries-as-rows original: the
    # default kernels compile to the same SASS as before the flag.)
    if KEY_ROWS:
        ROWS, COLS = TILE_N, TILE_M
        q_idx = (i * TILE_M + ct.arange(TILE_M, dtype=np.int32))[None, :]
        kv_idx = (j * TILE_N + ct.arange(TILE_N, dtype=np.int32))[:, None]
    else:
        ROWS, COLS = TILE_M, TILE_N
        q_idx = (i * TILE_M + ct.arange(TILE_M, dtype=np.int32))[:, None]
        kv_idx = (j * TILE_N + ct.arange(TILE_N, dtype=np.int32))[None, :]
    s = modified(qk, b, h, q_idx, kv_idx, score_mod, A0, A1, A2, A3, scale, HAS_SCORE_MOD)
    if f.HAS_MASK:
        s = with_mask(s, Mask, b, h, i, j, inv_scale, f, KEY_ROWS)
    if ALL_MASKS:
        s = masked(s, keep_tile(b, h, q_idx, kv_idx, seq_k, mask_mod, A0, A1, A2, A3, ROWS,
                                COLS, CAUSAL, TAIL, f.HAS_MASK_MOD, diag))
    elif (CAUSAL or TAIL) and on_diag:
        s = masked(s, keep_tile(b, h, q_idx, kv_idx, seq_k, mask_mod, A0, A1, A2, A3, ROWS,
                                COLS, CAUSAL, TAIL, False, diag))
    s = masked_rows(s, q_idx, rows_of(Q, at), ROW_TAIL and HAS_SCORE_MOD)
    if stats is None:
        lse, delta = load_row_stats(Lse, Delta, ab, h, i, TILE_M, bwd_zero_safe(f),
                                    q_origin(at))
        if ROW_TAIL and at is not None:
            lse, delta = rows_past_end(lse, delta, i, TILE_M, at[2])
    else:
        lse, delta = stats
    if KEY_ROWS:
        lse = lse.reshape((1, TILE_M))
        delta = delta.reshape((1, TILE_M))
    p = ct.exp2(s * c - lse, flush_to_zero=True)
    # d out / d (modified score), 0 wherever P is, for the captured tensors' gradients
    # (the dK/dV program's ``captured_grad`` adds it up; the others' does nothing).
    captured_grad(qk * scale, b, h, q_idx, kv_idx, A0, A1, A2, A3, G0, G1, G2, G3,
                  ct.where(p == 0.0, 0.0, p * (dp - delta)))
    ds = score_gradient(p, dp, delta, qk, b, h, q_idx, kv_idx, score_grad, A0, A1, A2, A3,
                        scale, HAS_SCORE_MOD)
    return p.astype(Q.dtype), ds.astype(Q.dtype)


def whole_origins(qs, ks, seq_q, f):
    """``at`` of a packed sequence whose rows start at ``qs`` (queries) and ``ks`` (keys)
    of the packed arrays (``DkdvFlags.WHOLE_LOADS``): (query origin, key origin or None,
    seq_q); None without whole loads. With ``SEQUSED`` K and V stay sliced to the keys
    used (key origin None): the rows past seqused_k may be unwritten memory, NaN, and 0 *
    NaN is NaN in the MMAs (dP = dO V^T, dS K), so they must load as TMA zeros, not be
    masked after the fact."""
    if f.WHOLE_LOADS:
        if f.SEQUSED:
            return (qs, None, seq_q)
        return (qs, ks, seq_q)
    return None


def q_origin(at):
    """The element origin of Q, dO, Lse and Delta rows (``body.row_chunk``), or None."""
    if at is None:
        return None
    return at[0]


def k_origin(at):
    """The element origin of K and V rows, or None (tile-indexed: dense, or sliced)."""
    if at is None:
        return None
    return at[1]


def rows_of(Q, at):
    """Query rows of the program's sequence: Q's extent (dense, or a slice), else at's."""
    if at is None:
        return Q.shape[2]
    return at[2]


def rows_past_end(lse, delta, i, TILE_M, seq_q):
    """Whole loads (dK/dV): query rows of tile ``i`` past the sequence's ``seq_q`` hold
    the next sequence's rows, or rows no sequence covers (the forward's ``torch.empty``
    out and lse there: anything, NaN included). lse +inf and delta 0 there make their P
    exp2(s - inf) = 0 and their dS 0 for every finite score (a score_mod's are masked
    to -inf first), so they add nothing to dK and dV: two selects per query tile, not
    one per score."""
    valid = (i * TILE_M + ct.arange(TILE_M, dtype=np.int32))[:, None] < seq_q
    return ct.where(valid, lse, np.inf), ct.where(valid, delta, 0.0)


def keys_as_rows(t, KEY_ROWS):
    """A [queries, keys] tile as the row operand of dV's and dK's products; a tile made
    with ``KEY_ROWS`` is that already."""
    if KEY_ROWS:
        return t
    return ct.transpose(t)


def dkdv_tile(kv, acc, arrays, fns, aux, where, i, bid_n, diag, ALL_MASKS, f, dQacc):
    """Query tile ``i`` of one key tile's dK/dV program (and its dQ share by atomics into
    the fp32 ``dQacc`` with ``f.DQ_ATOMIC``). ``kv``: the key tile's chunks kept on chip,
    (K^T, V^T, K) or, with ``f.KEY_ROWS``, (K, V, K); ``acc`` (dk0..2, dv0..2); ``f`` the
    ``DkdvFlags``.

    ``KEY_ROWS`` (FlashAttention-3's swapped orientation): the scores are computed as
    S^T = K Q^T and dP^T = V dO^T, keys as the MMA rows, so P^T and dS^T leave the MMA
    as the row operands of dV += P^T dO and dK += dS^T Q, and each consumer warp group
    keeps its own keys' rows of S^T, dK and dV. Without it (queries as the rows) P and dS
    are transposed into those products, which tileiras stages through shared memory on
    every step (sm_90 SASS: 8 STS.64, a CTA barrier and 4 LDS.128 per thread for each of
    P and dS; benchmarks/notes/backward.md §34a). Only dS K (the dQ share) then
    takes a transpose."""
    TILE_M, TILE_N, NCHUNK, W0, W1, W2 = f.TILE_M, f.TILE_N, f.NCHUNK, f.W0, f.W1, f.W2
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)  # dO, V, dV: V's head dim
    Q, K, V, dOut, Lse, Delta, Mask = arrays
    h, ab, qa = where[1], where[7], q_origin(where[9])
    (kt0, kt1, kt2), (vt0, vt1, vt2), (k0, k1, k2) = kv
    dk0, dk1, dk2, dv0, dv1, dv2 = acc
    q0, q1, q2 = load_rows(Q, ab, h, i, TILE_M, W0, W1, W2, NCHUNK, None, qa)
    do0, do1, do2 = load_rows(dOut, ab, h, i, TILE_M, VW0, VW1, VW2, VNCHUNK, None, qa)
    # A score_mod may give the padded query rows of the last query tile large scores:
    # they are masked; the plain kernels' padded rows add zeros anyway.
    if f.KEY_ROWS:
        st = dot(kt0, kt1, kt2, ct.transpose(q0), ct.transpose(q1), ct.transpose(q2), TILE_N,
                 TILE_M, NCHUNK)
        dpt = dot(vt0, vt1, vt2, ct.transpose(do0), ct.transpose(do1), ct.transpose(do2),
                  TILE_N, TILE_M, VNCHUNK)
        p, ds = grad_scores(st, dpt, arrays, fns, aux, where, i, bid_n, diag, ALL_MASKS, f,
                            f.HAS_SCORE_MOD or f.WHOLE_LOADS, True)  # P^T and dS^T
        if f.DQ_ATOMIC:
            dq_reduce(dQacc, ct.transpose(ds), k0, k1, k2, ab, h, i, TILE_M, W0, W1, W2,
                      NCHUNK)
    else:
        qk = dot(q0, q1, q2, kt0, kt1, kt2, TILE_M, TILE_N, NCHUNK)
        dp = dot(do0, do1, do2, vt0, vt1, vt2, TILE_M, TILE_N, VNCHUNK)
        p, ds = grad_scores(qk, dp, arrays, fns, aux, where, i, bid_n, diag, ALL_MASKS, f,
                            f.HAS_SCORE_MOD or f.WHOLE_LOADS, False)
        if f.DQ_ATOMIC:
            dq_reduce(dQacc, ds, k0, k1, k2, ab, h, i, TILE_M, W0, W1, W2, NCHUNK)
    # Each transpose right before its product, as before the flag (same default SASS).
    dv0, dv1, dv2 = mma_into(keys_as_rows(p, f.KEY_ROWS), do0, do1, do2, dv0, dv1, dv2,
                             VNCHUNK)
    dk0, dk1, dk2 = mma_into(keys_as_rows(ds, f.KEY_ROWS), q0, q1, q2, dk0, dk1, dk2, NCHUNK)
    return dk0, dk1, dk2, dv0, dv1, dv2


def dq_reduce(dQacc, ds, k0, k1, k2, b, h, i, TILE_M, W0, W1, W2, NCHUNK):
    """dQacc[b, h, tile i] += dS K (unscaled: the conversion applies ``scale``), one TMA
    bulk reduce-add per head-dim chunk (``tiled_view(...).atomic_store_add``: sm_90's
    ``UTMAREDG``, as FlashAttention-3 adds dQ) instead of per-element atomics. Rows and
    columns past the array's end are dropped by the TMA unit."""
    z0, z1, z2 = zeros_chunks(TILE_M, W0, W1, W2)
    dq0, dq1, dq2 = mma_into(ds, k0, k1, k2, z0, z1, z2, NCHUNK)
    reduce_add(dQacc, dq0, b, h, i, 0, TILE_M, W0)
    if NCHUNK > 1:
        reduce_add(dQacc, dq1, b, h, i, W0 // W1, TILE_M, W1)
    if NCHUNK > 2:
        reduce_add(dQacc, dq2, b, h, i, (W0 + W1) // W2, TILE_M, W2)


def reduce_add(T, tile, b, h, i, c, TILE_M, W):
    """T[b, h, rows i, columns chunk c of width W] += tile (fp32, one TMA reduce-add). A
    256-wide chunk goes as two 128-wide halves: with one 256-wide box the D = 256 dK/dV
    program compiled to per-element REDG and no HGMMA at all (1248-byte stack; tileiras
    13.4, sm_90), with halves to UTMAREDG and its warp-group MMAs (104-byte stack). Alone,
    a 256-wide reduce-add does compile to UTMAREDG: the compiler's choice in context."""
    if W > 128:
        half = W // 2
        T.tiled_view((1, 1, TILE_M, half)).atomic_store_add(
            (b, h, i, 2 * c), ct.extract(tile, (0, 0), (TILE_M, half)))
        T.tiled_view((1, 1, TILE_M, half)).atomic_store_add(
            (b, h, i, 2 * c + 1), ct.extract(tile, (0, 1), (TILE_M, half)))
    else:
        T.tiled_view((1, 1, TILE_M, W)).atomic_store_add((b, h, i, c), tile)


def dkdv_staggered(kv, acc, arrays, fns, aux, where, bid_n, m_lo, m_hi, mask_end, masked_all,
                   ALL_MASKS, f, dQacc):
    """The dense query loop of a dK/dV program that reduces dQ: query tiles [m_lo, m_hi)
    from a start that depends on the key tile, wrapping, so the programs of one head add
    into different dQ tiles at a time instead of all into tile 0, then 1, ..."""
    n = m_hi - m_lo
    start = bid_n % max(n, 1)
    for t in range(0, n):
        i = m_lo + start + t
        if i >= m_hi:
            i = i - n
        acc = dkdv_tile(kv, acc, arrays, fns, aux, where, i, bid_n,
                        masked_all or i < mask_end, ALL_MASKS, f, dQacc)
    return acc


def dq_tile(q, do, stats, acc, arrays, fns, aux, where, bid_m, j, diag, ALL_MASKS, f):
    """Key tile ``j`` of one query tile's dQ program; ``stats`` its rows' (lse, delta),
    or None to load them per tile; ``acc`` (dq0..2); ``f`` the ``DqFlags``."""
    TILE_M, TILE_N, NCHUNK, W0, W1, W2 = f.TILE_M, f.TILE_N, f.NCHUNK, f.W0, f.W1, f.W2
    K, V = arrays[1], arrays[2]
    hk, kb, ka = where[2], where[7], k_origin(where[9])
    q0, q1, q2 = q
    do0, do1, do2 = do
    dq0, dq1, dq2 = acc
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)
    qk, dp = dots_streamed(q0, q1, q2, do0, do1, do2, K, V, kb, hk, j, TILE_N, TILE_M, W0,
                           W1, W2, NCHUNK, VW0, VW1, VW2, VNCHUNK, ka)
    # Padded query rows of dQ are never stored and stay in their own rows: no row mask.
    _, ds = grad_scores(qk, dp, arrays, fns, aux, where, bid_m, j, diag, ALL_MASKS, f, False,
                        False, stats)
    return mma_streamed(ds, K, kb, hk, j, TILE_N, dq0, dq1, dq2, W0, W1, W2, NCHUNK, None,
                        at=ka)


def dkdv_program(Q, K, V, dOut, Lse, Delta, Mask, extra, dK, dV, dQacc, scalars, f, fns,
                 seqs=None):
    """One key tile's dK/dV (every entry point runs it). Grouped arguments as the forward's
    ``fwd_program``: ``extra`` (BlkCnt, BlkIdx, A0..A3, G0..G3), None in the plain kernel;
    ``scalars`` (qk_scale_log2, inv_scale, scale, GROUP); ``f`` the ``DkdvFlags``; ``fns``
    (score_mod, its derivative, mask_mod, the captured tensors' gradients: this program
    visits every (query, key) pair once, so it is the one that adds them up); ``seqs``
    (CuQ, CuK, SeqK, TileMap, WIN_L, WIN_R, HEAD_BLOCK) of a packed call
    (``attention_bwd_dkdv_seqs``: the map runs over the key tiles), else None."""
    # Grid (key tiles, K/V heads, batch).
    bid_n = ct.bid(0)
    hk = ct.bid(1)
    b = ct.bid(2)
    if has_seqs(f):
        CuQ, CuK, SeqK, TileMap, WIN_L, WIN_R, HEAD_BLOCK = seqs
        b, bid_n, valid, hk = mapped_program(TileMap, HEAD_BLOCK)
        if valid:
            arrays, ks, ke, seq_k, diag, at = sequence_arrays(
                (Q, K, V, dOut, Lse, Delta, Mask), seqs, b, f)
            if not f.SCATTER_OUT:
                dK = sequence_slice(dK, ks, ke)
                dV = sequence_slice(dV, ks, ke)
            dkdv_key_tile(arrays, extra, dK, dV, dQacc, scalars, f, fns, b, bid_n, hk, 0,
                          seq_k, diag, at, (ks, ke - ks))
    else:
        dkdv_key_tile((Q, K, V, dOut, Lse, Delta, Mask), extra, dK, dV, dQacc, scalars, f,
                      fns, b, bid_n, hk, b, K.shape[2], None)


def sequence_arrays(arrays, seqs, b, f):
    """(arrays, key start, key stop, keys used, diag, at) of packed sequence ``b``: the
    score kernels' arrays (Q, K, V, dO, Lse, Delta, Mask) sliced to its rows and keys (K
    and V to the keys used, capped by ``SeqK``), ``keep_tile``'s bottom-right diagonal
    (shift, WINDOW, WIN_L, WIN_R) and ``whole_origins``. With ``WHOLE_LOADS`` only K and
    V under ``SEQUSED`` are sliced: the rest are loaded from the whole packed arrays at
    the sequence's element origins (no tensor map built per program for them)."""
    Q, K, V, dOut, Lse, Delta, Mask = arrays
    CuQ, CuK, SeqK, TileMap, WIN_L, WIN_R, HEAD_BLOCK = seqs
    qs, qe = sequence_span(CuQ, b, Q.shape[2])
    ks, ke = sequence_span(CuK, b, K.shape[2])
    used = ke
    if f.SEQUSED:
        # K and V end at the used length: TMA reads the rows past it as zeros. They may be
        # unwritten memory, and 0 * NaN is NaN in dP = dO V^T, then in dS, dQ and dK; dK
        # and dV keep their whole slice (rows past the end are written as zeros).
        used = ct.minimum(ke, ks + ct.maximum(ct.gather(SeqK, b), 0))
    seq_k = used - ks
    # The dK/dV program loads its key tile before any query tile: with no key used, a
    # zero-row view there is an illegal TMA read (an H200 stopped on it), so K and V
    # keep one row, which no query tile visits (``m_hi`` past seqused_k).
    kv_stop = ct.maximum(used, ct.minimum(ks + 1, ke))
    diag = (seq_k - (qe - qs), f.WINDOW, WIN_L, WIN_R)
    at = whole_origins(qs, ks, qe - qs, f)
    if f.WHOLE_LOADS:
        if f.SEQUSED:
            K = sequence_slice(K, ks, kv_stop)
            V = sequence_slice(V, ks, kv_stop)
        return (Q, K, V, dOut, Lse, Delta, Mask), ks, ke, seq_k, diag, at
    sliced = (sequence_slice(Q, qs, qe), sequence_slice(K, ks, kv_stop),
              sequence_slice(V, ks, kv_stop),
              sequence_slice(dOut, qs, qe), sequence_slice(Lse, qs, qe),
              sequence_slice(Delta, qs, qe), Mask)
    return sliced, ks, ke, seq_k, diag, at


def dkdv_key_tile(arrays, extra, dK, dV, dQacc, scalars, f, fns, b, bid_n, hk, ab, seq_k,
                  diag, at=None, span=None):
    """Key tile ``bid_n`` of (batch or sequence) ``b`` and K/V head ``hk``: arrays at
    array batch ``ab``; ``diag`` ``keep_tile``'s bottom-right diagonal (shift, WINDOW,
    WIN_L, WIN_R) of a packed sequence, else None; ``at`` ``whole_origins``; ``span`` a
    packed sequence's (first key, keys) in the packed arrays (``SCATTER_OUT``'s rows),
    else None."""
    Q, K, V, dOut, Lse, Delta, Mask = arrays
    BlkCnt, BlkIdx, A0, A1, A2, A3, G0, G1, G2, G3 = extra
    qk_scale_log2, inv_scale, scale, GROUP = scalars
    TILE_M, TILE_N, NCHUNK, W0, W1, W2 = f.TILE_M, f.TILE_N, f.NCHUNK, f.W0, f.W1, f.W2
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)  # V and dV: V's head dim
    seq_q = rows_of(Q, at)
    ka = k_origin(at)
    TAIL = not f.EVEN_N

    # K and V of this key tile stay on chip: K^T and V^T for the score products
    # (Q K^T, dO V^T), as the forward loads K; K itself for dS K (atomic dQ only). With
    # KEY_ROWS the score products are K Q^T and V dO^T: K and V as they lie, K serving
    # dS K too.
    if f.KEY_ROWS:
        k_rows = load_rows(K, ab, hk, bid_n, TILE_N, W0, W1, W2, NCHUNK, None, ka)
        kv = (k_rows, load_rows(V, ab, hk, bid_n, TILE_N, VW0, VW1, VW2, VNCHUNK, None, ka),
              k_rows)
    else:
        kt = load_cols(K, ab, hk, bid_n, TILE_N, W0, W1, W2, NCHUNK, None, ka)
        vt = load_cols(V, ab, hk, bid_n, TILE_N, VW0, VW1, VW2, VNCHUNK, None, ka)
        k_rows = kt
        if f.DQ_ATOMIC:
            k_rows = load_rows(K, ab, hk, bid_n, TILE_N, W0, W1, W2, NCHUNK, None)
        kv = (kt, vt, k_rows)
    dk0, dk1, dk2 = zeros_chunks(TILE_N, W0, W1, W2)
    dv0, dv1, dv2 = zeros_chunks(TILE_N, VW0, VW1, VW2)
    acc = (dk0, dk1, dk2, dv0, dv1, dv2)
    aux = (A0, A1, A2, A3, G0, G1, G2, G3)
    if has_seqs(f):
        m_lo, m_hi, mask_end = seq_query_range(bid_n * TILE_N, seq_q, diag[0], TILE_M, TILE_N,
                                               f.CAUSAL, f.WINDOW, diag[2], diag[3])
        m_hi = ct.where(bid_n * TILE_N < seq_k, m_hi, m_lo)  # keys past seqused_k: zeros
    else:
        m_lo, m_hi, mask_end = query_range(bid_n * TILE_N, seq_q, TILE_M, TILE_N, f.CAUSAL)

    # A runtime trip count here spills the causal D = 192 / 256 programs; a constant one
    # does not (the group size as a constant unrolls and spills worse). Without the loop
    # tileiras waits on every MMA at D = 256, so MHA drops it only at variant.ONE_HEAD_DIMS
    # (benchmarks/notes/backward.md §36g, §37a).
    for g in range(1 if f.ONE_HEAD else GROUP):
        h = hk * GROUP + g
        where = (b, h, hk, seq_k, qk_scale_log2, inv_scale, scale, ab, diag, at)
        if f.BLOCK_SPARSE:
            n_part, n_full = block_range(BlkCnt, b, h, bid_n, f.BLK_BATCH, f.BLK_HEAD)
            for t in range(0, n_part):
                i = block_at(BlkIdx, b, h, bid_n, t, f.BLK_BATCH, f.BLK_HEAD)
                acc = dkdv_tile(kv, acc, arrays, fns, aux, where, i, bid_n, True, True, f,
                                dQacc)
            for t in range(n_part, n_part + n_full):
                i = block_at(BlkIdx, b, h, bid_n, t, f.BLK_BATCH, f.BLK_HEAD)
                acc = dkdv_tile(kv, acc, arrays, fns, aux, where, i, bid_n, False, False, f,
                                dQacc)
        elif f.DQ_ATOMIC:
            acc = dkdv_staggered(kv, acc, arrays, fns, aux, where, bid_n, m_lo, m_hi, mask_end,
                                 TAIL or f.MASK_ALL, f.HAS_MASK_MOD, f, dQacc)
        elif f.TAIL_TILE:
            # Only the key tile that holds the sequence's end has keys past it: the other
            # programs mask just their diagonal query tiles, as a dense EVEN_N one does.
            tail_here = (bid_n + 1) * TILE_N > seq_k
            for i in range(m_lo, m_hi):
                acc = dkdv_tile(kv, acc, arrays, fns, aux, where, i, bid_n,
                                tail_here or f.MASK_ALL or i < mask_end, f.HAS_MASK_MOD, f,
                                dQacc)
        else:
            for i in range(m_lo, m_hi):
                # The key tail is masked on every query tile (no padded key reaches dQ).
                # MASK_ALL: one loop body (the causal mask past the diagonal adds nothing)
                # instead of a masked and an unmasked version of it, which spill at D > 128.
                acc = dkdv_tile(kv, acc, arrays, fns, aux, where, i, bid_n,
                                TAIL or f.MASK_ALL or i < mask_end, f.HAS_MASK_MOD, f, dQacc)

    dk0, dk1, dk2, dv0, dv1, dv2 = acc
    dk0, dk1, dk2 = scale_chunks(dk0, dk1, dk2, scale, NCHUNK)
    if f.SCATTER_OUT:
        first, keys = span
        at_n = first + bid_n * TILE_N
        scatter_rows(dV, ab, hk, at_n, keys - bid_n * TILE_N, dv0, dv1, dv2, TILE_N, VW0,
                     VW1, VW2, VNCHUNK)
        scatter_rows(dK, ab, hk, at_n, keys - bid_n * TILE_N, dk0, dk1, dk2, TILE_N, W0, W1,
                     W2, NCHUNK)
    else:
        store_rows(dV, ab, hk, bid_n, dv0, dv1, dv2, TILE_N, VW0, VW1, VW2, VNCHUNK)
        store_rows(dK, ab, hk, bid_n, dk0, dk1, dk2, TILE_N, W0, W1, W2, NCHUNK)


def dq_row_stats(Out, Lse, Delta, Dlse, do, b, h, bid_m, f):
    """The dQ program's rows' (lse, delta), loaded and computed once for all its key
    tiles (``do``: the program's dO chunks). delta = rowsum(dO * O) in fp32 (minus the LSE
    output's gradient) is computed here and stored for the dK/dV kernel, which runs after:
    the delta launch folded into dQ's (one launch fewer per training call; dO is on chip
    already, O is one more load)."""
    TILE_M = f.TILE_M
    NCHUNK, W0, W1, W2 = value_chunks(f)  # O and dO: V's head dim
    o = load_rows(Out, b, h, bid_m, TILE_M, W0, W1, W2, NCHUNK, None)
    delta = row_delta(o, do, NCHUNK)
    if f.HAS_DLSE:
        # d lse / d S = P, so the LSE's gradient enters dS = P * (dP - delta) as -dlse.
        delta = delta - ct.load(Dlse, index=(b, h, bid_m), shape=(1, 1, TILE_M),
                                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
    ct.store(Delta, index=(b, h, bid_m), tile=delta.reshape((1, 1, TILE_M)))
    return load_lse(Lse, b, h, bid_m, TILE_M, bwd_zero_safe(f)), delta


def row_delta(o, do, NCHUNK):
    """rowsum(dO * O) in fp32 over the head-dim chunks ``o`` and ``do``, as [rows, 1]."""
    o0, o1, o2 = o
    do0, do1, do2 = do
    delta = ct.sum(o0.astype(np.float32) * do0.astype(np.float32), axis=-1, keepdims=True)
    if NCHUNK > 1:
        delta = delta + ct.sum(o1.astype(np.float32) * do1.astype(np.float32), axis=-1,
                               keepdims=True)
    if NCHUNK > 2:
        delta = delta + ct.sum(o2.astype(np.float32) * do2.astype(np.float32), axis=-1,
                               keepdims=True)
    return delta


def seq_row_stats(Out, Lse, Delta, Dlse, do, ab, h, bid_m, f, span, at):
    """``dq_row_stats`` of a packed sequence's query tile (``workload.PACKED_DQ_DELTA``;
    ``span`` (qs, seq_q): its rows are [qs, qs + seq_q) of the packed arrays). O and dlse
    are read from the whole arrays at element origin qs (their host-built tensor maps, as
    the whole loads read dO: ``body.row_chunk``), Lse as ``grad_scores`` reads it (``at``).
    The tile's rows past the sequence hold the next sequence's rows (or TMA zeros): their
    delta is never stored (a masked scatter writes the sequence's rows only, into the
    whole Delta at qs + row, or into its slice at row under sliced loads; a TMA store of
    the whole tile would race with the next sequence's own dQ program, which writes them)
    and never mixes with the sequence's rows (their dQ rows are not stored either). No
    tensor map is built for the store (a ``sequence_slice`` of Delta would build one in
    every program)."""
    TILE_M = f.TILE_M
    NCHUNK, W0, W1, W2 = value_chunks(f)  # O and dO: V's head dim
    qs, seq_q = span
    o = load_rows(Out, ab, h, bid_m, TILE_M, W0, W1, W2, NCHUNK, None, qs)
    delta = row_delta(o, do, NCHUNK)
    if f.HAS_DLSE:
        # d lse / d S = P, so the LSE's gradient enters dS = P * (dP - delta) as -dlse.
        delta = delta - row_stat(Dlse, ab, h, bid_m, TILE_M, qs)
    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=np.int32)
    # Delta is the whole packed array under whole loads (``at``), else the sequence's slice.
    first = rows if at is None else qs + rows
    ct.scatter(Delta, (ab, h, first), delta.reshape((TILE_M,)), mask=rows < seq_q)
    return load_lse(Lse, ab, h, bid_m, TILE_M, bwd_zero_safe(f), q_origin(at)), delta


def dq_program(Q, K, V, dOut, Lse, Delta, Mask, extra, Out, Dlse, dQ, scalars, f, fns,
               seqs=None):
    """One query tile's dQ, and its rows' delta for the dK/dV kernel (every entry point
    runs it); arguments as ``dkdv_program``'s, ``f`` the ``DqFlags``; a packed call's map
    runs over the query tiles."""
    # Grid (query tiles, query heads, batch), as the forward.
    bid_m = ct.bid(0)
    h = ct.bid(1)
    b = ct.bid(2)
    if has_seqs(f):
        CuQ, CuK, SeqK, TileMap, WIN_L, WIN_R, HEAD_BLOCK = seqs
        b, bid_m, valid, h = mapped_program(TileMap, HEAD_BLOCK)
        if valid:
            arrays, _, _, seq_k, diag, at = sequence_arrays(
                (Q, K, V, dOut, Lse, Delta, Mask), seqs, b, f)
            qs, qe = sequence_span(CuQ, b, Q.shape[2])
            if not f.SCATTER_OUT:
                dQ = sequence_slice(dQ, qs, qe)
            dq_query_tile(arrays, extra, Out, Dlse, dQ, scalars, f, fns, b, bid_m, h, 0,
                          seq_k, diag, at, (qs, qe - qs))
    else:
        dq_query_tile((Q, K, V, dOut, Lse, Delta, Mask), extra, Out, Dlse, dQ, scalars, f,
                      fns, b, bid_m, h, b, K.shape[2], None)


def dq_query_tile(arrays, extra, Out, Dlse, dQ, scalars, f, fns, b, bid_m, h, ab, seq_k,
                  diag, at=None, span=None):
    """Query tile ``bid_m`` of (batch or sequence) ``b`` and query head ``h``, arrays at
    array batch ``ab`` (``dkdv_key_tile``'s arguments; ``span`` a packed sequence's
    (first row, rows) in the packed arrays, else None). Rows past a sequence (whole
    loads: the next one's) are never stored and never mix with the sequence's rows: no
    mask for them."""
    Q, K, V, dOut, Lse, Delta, Mask = arrays
    BlkCnt, BlkIdx, A0, A1, A2, A3 = extra
    score_mod, score_grad, mask_mod = fns
    fns = (score_mod, score_grad, mask_mod, no_captured_grad)
    qk_scale_log2, inv_scale, scale, GROUP = scalars
    TILE_M, NCHUNK, W0, W1, W2 = f.TILE_M, f.NCHUNK, f.W0, f.W1, f.W2
    hk = h // GROUP

    q = load_rows(Q, ab, h, bid_m, TILE_M, W0, W1, W2, NCHUNK, None, q_origin(at))
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)  # dO: V's head dim
    do = load_rows(dOut, ab, h, bid_m, TILE_M, VW0, VW1, VW2, VNCHUNK, None, q_origin(at))
    stats = None  # (lse, delta) loaded on every key tile, as the dK/dV program does
    if f.DELTA:
        if span is None:
            stats = dq_row_stats(Out, Lse, Delta, Dlse, do, b, h, bid_m, f)
        else:
            stats = seq_row_stats(Out, Lse, Delta, Dlse, do, ab, h, bid_m, f, span, at)
    acc = zeros_chunks(TILE_M, W0, W1, W2)
    aux = (A0, A1, A2, A3, None, None, None, None)
    where = (b, h, hk, seq_k, qk_scale_log2, inv_scale, scale, ab, diag, at)

    if f.BLOCK_SPARSE:
        n_part, n_full = block_range(BlkCnt, b, h, bid_m, f.BLK_BATCH, f.BLK_HEAD)
        for t in range(0, n_part):
            j = block_at(BlkIdx, b, h, bid_m, t, f.BLK_BATCH, f.BLK_HEAD)
            acc = dq_tile(q, do, stats, acc, arrays, fns, aux, where, bid_m, j, True, True, f)
        for t in range(n_part, n_part + n_full):
            j = block_at(BlkIdx, b, h, bid_m, t, f.BLK_BATCH, f.BLK_HEAD)
            acc = dq_tile(q, do, stats, acc, arrays, fns, aux, where, bid_m, j, False, False, f)
    else:
        if has_seqs(f):
            j_lo, n_tiles, mask_start = seq_key_range(
                bid_m * TILE_M, seq_k, diag[0], TILE_M, f.TILE_N, f.CAUSAL, f.WINDOW, diag[2],
                diag[3], False, 0)
        else:
            j_lo = 0
            n_tiles, mask_start = key_range(bid_m * TILE_M, seq_k, 0, TILE_M, f.TILE_N,
                                            f.CAUSAL, not f.EVEN_N, False)
        for j in range(j_lo, n_tiles):
            acc = dq_tile(q, do, stats, acc, arrays, fns, aux, where, bid_m, j, j >= mask_start,
                          f.HAS_MASK_MOD, f)

    dq0, dq1, dq2 = acc
    dq0, dq1, dq2 = scale_chunks(dq0, dq1, dq2, scale, NCHUNK)
    if f.SCATTER_OUT:
        first, rows = span
        scatter_rows(dQ, ab, h, first + bid_m * TILE_M, rows - bid_m * TILE_M, dq0, dq1, dq2,
                     TILE_M, W0, W1, W2, NCHUNK)
    else:
        store_rows(dQ, ab, h, bid_m, dq0, dq1, dq2, TILE_M, W0, W1, W2, NCHUNK)


# The entry points, written out from the families' fields (``entry``): ``FLAGS`` stands
# for one ``ct.Constant`` parameter per flag the entry point takes (``flags``: their meaning
# and scopes), then for the flags built from them by name. The plain ones take only the
# arrays a plain call reads.
attention_bwd_dkdv = entry_point(DkdvFlags, PLAIN, """
def attention_bwd_dkdv(
    Q, K, V, dOut, Lse, Delta, Mask, dK, dV, dQacc,
    qk_scale_log2: float,  # scale * log2(e), the forward's softmax-units factor
    inv_scale: float,  # 1 / scale: the forward's additive-mask factor
    scale: float,
    GROUP: int,  # query heads per K/V head; this program sums their contributions
    FLAGS,
):
    \"\"\"Plain dK/dV (no variant functions, no block mask): only the arrays it reads.\"\"\"
    dkdv_program(Q, K, V, dOut, Lse, Delta, Mask,
                 (None, None, None, None, None, None, None, None, None, None), dK, dV,
                 dQacc, (qk_scale_log2, inv_scale, scale, GROUP), FLAGS,
                 (no_score_mod, no_score_mod, no_mask_mod, no_captured_grad))
""", globals())


attention_bwd_dkdv_variant = entry_point(DkdvFlags, VARIANT, """
def attention_bwd_dkdv_variant(
    Q, K, V, dOut, Lse, Delta, Mask, BlkCnt, BlkIdx, A0, A1, A2, A3, G0, G1, G2, G3, dK, dV,
    dQacc,
    qk_scale_log2: float, inv_scale: float, scale: float, GROUP: int,
    FLAGS,
):
    \"\"\"dK/dV with the variant's functions, captured tensors (A0..A3), the fp32 gradients
    of those that require grad (G0..G3, written by ``SCORE_CAPGRAD``) and block lists.\"\"\"
    dkdv_program(Q, K, V, dOut, Lse, Delta, Mask,
                 (BlkCnt, BlkIdx, A0, A1, A2, A3, G0, G1, G2, G3), dK, dV,
                 dQacc, (qk_scale_log2, inv_scale, scale, GROUP), FLAGS,
                 (SCORE_MOD, SCORE_GRAD, MASK_MOD, SCORE_CAPGRAD))
""", globals())


attention_bwd_dq = entry_point(DqFlags, PLAIN, """
def attention_bwd_dq(
    Q, K, V, dOut, Lse, Delta, Mask, Out, Dlse, dQ,
    qk_scale_log2: float, inv_scale: float, scale: float, GROUP: int,
    FLAGS,
):
    \"\"\"Plain dQ (and delta): only the arrays it reads.\"\"\"
    dq_program(Q, K, V, dOut, Lse, Delta, Mask, (None, None, None, None, None, None), Out,
               Dlse, dQ, (qk_scale_log2, inv_scale, scale, GROUP), FLAGS,
               (no_score_mod, no_score_mod, no_mask_mod))
""", globals())


attention_bwd_dq_variant = entry_point(DqFlags, VARIANT, """
def attention_bwd_dq_variant(
    Q, K, V, dOut, Lse, Delta, Mask, BlkCnt, BlkIdx, A0, A1, A2, A3, Out, Dlse, dQ,
    qk_scale_log2: float, inv_scale: float, scale: float, GROUP: int,
    FLAGS,
):
    \"\"\"dQ (and delta) with the variant's functions, captured tensors and block lists.\"\"\"
    dq_program(Q, K, V, dOut, Lse, Delta, Mask, (BlkCnt, BlkIdx, A0, A1, A2, A3), Out, Dlse,
               dQ, (qk_scale_log2, inv_scale, scale, GROUP), FLAGS,
               (SCORE_MOD, SCORE_GRAD, MASK_MOD))
""", globals())


# Packed sequences: the keys and queries always packed (``VARLEN_Q`` / ``VARLEN_K``).
attention_bwd_dkdv_seqs = entry_point(DkdvFlags, BWD_SEQS, """
def attention_bwd_dkdv_seqs(
    Q, K, V, dOut, Lse, Delta, Mask, BlkCnt, BlkIdx, A0, A1, A2, A3, G0, G1, G2, G3, dK, dV,
    dQacc, CuQ, CuK, SeqK, TileMap,
    qk_scale_log2: float, inv_scale: float, scale: float, GROUP: int, WIN_L: int, WIN_R: int,
    HEAD_BLOCK: int,  # heads per block of grid axis 0 (``visit.mapped_program``)
    FLAGS,
):
    \"\"\"dK/dV of packed sequences (``sdpa_varlen``): Q, dO [1, Hq, total_q, D], Lse and
    Delta [1, Hq, total_q], K, V, dK, dV [1, Hkv, total_k, D]; ``TileMap`` runs over the
    key tiles (``seqmap``).\"\"\"
    dkdv_program(Q, K, V, dOut, Lse, Delta, Mask,
                 (BlkCnt, BlkIdx, A0, A1, A2, A3, G0, G1, G2, G3), dK, dV,
                 dQacc, (qk_scale_log2, inv_scale, scale, GROUP), FLAGS,
                 (SCORE_MOD, SCORE_GRAD, MASK_MOD, SCORE_CAPGRAD),
                 (CuQ, CuK, SeqK, TileMap, WIN_L, WIN_R, HEAD_BLOCK))
""", globals(), fixed=dict(VARLEN_Q=True, VARLEN_K=True))


attention_bwd_dq_seqs = entry_point(DqFlags, BWD_SEQS, """
def attention_bwd_dq_seqs(
    Q, K, V, dOut, Lse, Delta, Mask, BlkCnt, BlkIdx, A0, A1, A2, A3, Out, Dlse, dQ,
    CuQ, CuK, SeqK, TileMap,
    qk_scale_log2: float, inv_scale: float, scale: float, GROUP: int, WIN_L: int, WIN_R: int,
    HEAD_BLOCK: int,  # heads per block of grid axis 0 (``visit.mapped_program``)
    FLAGS,
):
    \"\"\"dQ of packed sequences; ``TileMap`` runs over the query tiles. Delta: with
    ``DELTA`` computed here and stored for the sequence's rows (``seq_row_stats``), else
    from ``attention_bwd_delta`` over the packed rows, run first.\"\"\"
    dq_program(Q, K, V, dOut, Lse, Delta, Mask, (BlkCnt, BlkIdx, A0, A1, A2, A3), Out, Dlse,
               dQ, (qk_scale_log2, inv_scale, scale, GROUP), FLAGS,
               (SCORE_MOD, SCORE_GRAD, MASK_MOD),
               (CuQ, CuK, SeqK, TileMap, WIN_L, WIN_R, HEAD_BLOCK))
""", globals(), fixed=dict(VARLEN_Q=True, VARLEN_K=True))
