"""The cuTile forward kernel: one tile program, specialised by compile-time flags.

One program instance computes a ``TILE_M`` block of query rows of one (batch, head): it
streams K/V tiles of ``TILE_N`` keys through the shared body (``body``): chunked loads,
``Q K^T``, score modification and masking, the online softmax in fp32 log2 units, ``P V``.

Which key tiles a program visits is ``visit``'s: dense (with the causal skip) or, with
``BLOCK_SPARSE``, a block mask's partial-then-full lists. The compile-time flags are one
``flags.FwdFlags``, read by name.

Two flags reshape the grid for small ones (decode):

- ``SPLIT_K`` (flash-decoding): grid axis 1 runs over heads x ``NUM_SPLITS`` key splits;
  each program visits ``SPLIT_TILES`` of the tiles it would visit and writes its normalised
  partial output (fp32, into ``Out`` of shape [B, H * NUM_SPLITS, Sq, D]) and its
  log-sum-exp (into ``Lse``); ``combine.attention_combine`` merges them. A split past a
  row's last key leaves that row's partial at zero with log-sum-exp -inf.
- ``PACKED`` (GQA decode): the launch views q as [B, Hkv, GROUP * Sq, D], so the query
  heads of one K/V head share the rows of a tile and K/V are read once per group; row r
  is query position ``r % SEQ_Q`` of head ``r // SEQ_Q``.

``FP8`` (``attention_fwd_fp8``): e4m3 Q, K and V^T (V transposed once per call: wgmma
takes fp8 operands K-major only), both products on fp8 with P rounded to e4m3 (as FA3),
the softmax factor and V's descale per (batch, K/V head), the output in bf16 or fp16
(benchmarks/notes/head-shapes.md §40h).

``SCORE_MOD`` / ``MASK_MOD`` are the variant's functions (``mods``): module globals here,
replaced per variant in a copy of this kernel, and inlined by cuTile. ``A0..A3`` are the
tensors they capture. ``PDL`` (``Schedule.pdl``): launched as a programmatic dependent, the
kernel waits for the previous kernel's grid before its first load (benchmarks/notes/forward.md §20).
"""

from __future__ import annotations

import cuda.tile as ct
import numpy as np

from .body import (
    _T,
    _ZERO,
    divide_chunks,
    dot,
    dot_streamed,
    fp8_factors,
    keep_tile,
    load_rows,
    masked,
    mma_into,
    mma_streamed,
    modified,
    no_mask_mod,
    no_score_mod,
    online_softmax,
    row_lse,
    safe_divisor,
    scale_chunks,
    scatter_rows,
    softmax_init,
    store_rows,
    with_mask,
    zeros_chunks,
)
from .entry import entry_point
from .flags import (
    FWD_FP8,
    FWD_SEQS,
    PLAIN,
    VARIANT,
    FwdFlags,
    fwd_zero_safe,
    has_seqs,
    value_chunks,
)
from .visit import (
    block_at,
    block_range,
    key_range,
    mapped_program,
    seq_key_range,
    sequence_slice,
    sequence_span,
    split_range,
)

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

# The variant's functions; ``binding.with_mods`` compiles a copy of the kernel against others.
SCORE_MOD = no_score_mod
MASK_MOD = no_mask_mod


def fwd_tile(q, arrays, fns, aux, where, state, j, diag, ALL_MASKS, f, CACHE_END=False):
    """One key tile ``j`` of the forward: scores, masks, online softmax, P V.

    Grouped arguments (tuples of compile-time constants stay constants): ``q`` the query
    chunks; ``arrays`` (K, V, Mask); ``fns`` (score_mod, mask_mod); ``aux`` A0..A3;
    ``where`` (b, h, hk, bid_m, offs_m, seq_k, c, inv_scale, scale); ``state`` (m, l,
    acc0..2); ``diag`` whether causality or the key tail may mask this tile; ``ALL_MASKS``
    apply every mask (a partial block, or a mask_mod without block mask); ``f`` the
    kernel's ``FwdFlags``; ``CACHE_END`` the tile holds the end of a paged cache's context
    (``SEQUSED``): V's rows past it read as zeros (``end_rows``), since a page's free slots
    may be unwritten memory whose NaN would survive P = 0 in P V; or the end of a packed
    sequence whose keys load from the whole arrays (``key_origin``): V's rows past it,
    the next sequence's or rows no sequence covers, read as zeros likewise."""
    TILE_M, TILE_N, NCHUNK, W0, W1, W2 = f.TILE_M, f.TILE_N, f.NCHUNK, f.W0, f.W1, f.W2
    CAUSAL, TAIL, HAS_MASK_MOD = f.CAUSAL, not f.EVEN_N, f.HAS_MASK_MOD
    q0, q1, q2 = q
    K, V, Mask = arrays
    score_mod, mask_mod = fns
    A0, A1, A2, A3 = aux
    b, h, hk, bid_m, offs_m, seq_k, c, inv_scale, scale, seq = where
    m_i, l_i, acc0, acc1, acc2 = state
    kb, kj = key_tile_at(seq, b, j, f)
    if f.PAGE_GATHER or f.PAGE_GATHER_K:
        qk = gathered_scores(q, K, seq, b, j, hk, f)
    elif f.PAGE_SPAN > 1 and f.PAGE_JOIN:
        qk = joined_scores(q, K, seq, b, j, hk, f)
    elif f.PAGE_SPAN > 1:
        qk = span_scores(q, K, seq, b, j, hk, f)
    else:
        qk = dot_streamed(q0, q1, q2, K, kb, hk, kj, TILE_N, TILE_M, W0, W1, W2, NCHUNK,
                          f.LAT_K, fast=f.FP8, at=key_origin(seq))
    kv_idx = j * TILE_N + ct.arange(TILE_N, dtype=np.int32)[None, :]
    s = modified(qk, b, h, offs_m, kv_idx, score_mod, A0, A1, A2, A3, scale, f.HAS_SCORE_MOD)
    if f.HAS_MASK:
        s = with_mask(s, Mask, b, h, bid_m, j, inv_scale, f)
    if ALL_MASKS:
        s = masked(s, keep_tile(b, h, offs_m, kv_idx, seq_k, mask_mod, A0, A1, A2, A3,
                                TILE_M, TILE_N, CAUSAL, TAIL, HAS_MASK_MOD, seq_diag(seq, f)))
    elif (CAUSAL or TAIL) and diag:
        s = masked(s, keep_tile(b, h, offs_m, kv_idx, seq_k, mask_mod, A0, A1, A2, A3,
                                TILE_M, TILE_N, CAUSAL, TAIL, False, seq_diag(seq, f)))
    p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, c, fwd_zero_safe(f))
    acc0, acc1, acc2 = scale_chunks(acc0, acc1, acc2, alpha, value_chunks(f)[0])
    acc0, acc1, acc2 = values_step(p.astype(K.dtype), V, seq, b, j, hk, kb, kj,
                                   (acc0, acc1, acc2), seq_k if CACHE_END else None, f)
    return m_i, l_i, acc0, acc1, acc2


def values_step(p, V, seq, b, j, hk, kb, kj, acc, seq_k, f):
    """acc += P V over key tile ``j``; ``seq_k`` (or None): the tile holds the end of a
    cache's context (``end_rows``) or of a whole-loaded packed sequence (its slice), and
    V's rows from it on read as zeros."""
    acc0, acc1, acc2 = acc
    if f.PAGE_GATHER:
        return gathered_values(p, V, seq, b, j, hk, acc, seq_k, f)
    if f.PAGE_SPAN > 1:
        return span_values(p, V, seq, b, j, hk, acc0, acc1, acc2, seq_k, f)
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)
    at = key_origin(seq)
    if seq_k is not None and at is not None:
        # A whole-loaded sequence's last tile: its slice (a tensor map built here, only in
        # the programs that reach it) reads the rows past its end as zeros.
        return mma_streamed(p, sequence_slice(V, at, at + seq_k), kb, hk, kj, f.TILE_N,
                            acc0, acc1, acc2, VW0, VW1, VW2, VNCHUNK, f.LAT_V)
    T = V
    if seq_k is not None:
        T = end_rows(V, seq_k, f.TILE_N * f.PAGE_TILES)  # tile j lies in the end's page
    if f.FP8:  # V is V^T: [.., D, Skv] in memory
        return mma_streamed(p, T, kb, hk, kj, f.TILE_N, acc0, acc1, acc2, VW0, VW1, VW2,
                            VNCHUNK, f.LAT_V, order=_T, fast=True)
    return mma_streamed(p, T, kb, hk, kj, f.TILE_N, acc0, acc1, acc2, VW0, VW1, VW2,
                        VNCHUNK, f.LAT_V, at=at)


def end_rows(V, seq_k, page):
    """V's pages cut to the rows that the page holding a context's end (``seq_k``) uses: a
    tile load from this view reads that page's rows past the end as zeros, and TMA reads
    nothing there. (A select on the loaded rows instead held the tile in registers, and
    the whole kernel took that tile's register count: 177 at page 16, from 128.)"""
    return V.slice(axis=2, start=0, stop=ct.maximum(seq_k - 1, 0) % page + 1)


def key_tile_at(seq, b, j, f):
    """(array batch, tile) of key tile ``j`` of sequence ``b``: (b, j) dense; (0, j) in a
    sequence's slice of packed keys; (page, j mod tiles per page) in a page cache, the
    page read from the block table and clamped into the cache (a bad page id reads the
    wrong page of this cache, never memory outside it)."""
    kb = b
    kj = j
    if f.VARLEN_K:
        kb = 0
    if f.PAGED:
        kb = page_at(seq, b, j // f.PAGE_TILES)
        kj = j % f.PAGE_TILES
    return kb, kj


def page_at(seq, b, i):
    """Physical page of page ``i`` of sequence ``b``, clamped into the cache (a bad id, or
    one past the block table's row, reads a page of this cache, never memory outside it)."""
    Pages, num_pages = seq[0], seq[1]
    page = ct.gather(Pages, (b, i))
    return ct.minimum(ct.maximum(page, 0), num_pages - 1)


def page_scores(q, K, seq, b, i, hk, f):
    """Q K^T over page ``i`` of sequence ``b``: [TILE_M, page]."""
    q0, q1, q2 = q
    return dot_streamed(q0, q1, q2, K, page_at(seq, b, i), hk, 0, f.TILE_N // f.PAGE_SPAN,
                        f.TILE_M, f.W0, f.W1, f.W2, f.NCHUNK, f.LAT_K)


def span_scores(q, K, seq, b, j, hk, f):
    """Q K^T of key tile ``j`` when it spans ``PAGE_SPAN`` (2 or 4) pages (pages smaller than the
    tile): one MMA per page (each page its own TMA load), the scores joined along the keys,
    so the softmax and the rescale of the accumulators run once per tile, not per page."""
    first = j * f.PAGE_SPAN
    s = ct.cat((page_scores(q, K, seq, b, first, hk, f),
                page_scores(q, K, seq, b, first + 1, hk, f)), 1)
    if f.PAGE_SPAN > 2:
        s = ct.cat((s, ct.cat((page_scores(q, K, seq, b, first + 2, hk, f),
                               page_scores(q, K, seq, b, first + 3, hk, f)), 1)), 1)
    if f.PAGE_SPAN > 4:
        s = ct.cat((s, ct.cat((
            ct.cat((page_scores(q, K, seq, b, first + 4, hk, f),
                    page_scores(q, K, seq, b, first + 5, hk, f)), 1),
            ct.cat((page_scores(q, K, seq, b, first + 6, hk, f),
                    page_scores(q, K, seq, b, first + 7, hk, f)), 1)), 1)), 1)
    return s


def joined_keys(K, seq, b, j, hk, c, W, f):
    """Head-dim chunk ``c`` (width ``W``) of key tile ``j``'s K^T, [W, TILE_N]: its
    ``PAGE_SPAN`` pages (2, 4 or 8), each its own TMA load, joined along the keys
    (``PAGE_JOIN``) so that one MMA takes the whole tile. Per-page MMAs of 16 keys are too
    narrow for wgmma to keep its operands fed (benchmarks/notes/varlen-paged.md §49a)."""
    first = j * f.PAGE_SPAN
    t = ct.cat((page_keys(K, seq, b, first, hk, c, W, f),
                page_keys(K, seq, b, first + 1, hk, c, W, f)), 1)
    if f.PAGE_SPAN > 2:
        t = ct.cat((t, ct.cat((page_keys(K, seq, b, first + 2, hk, c, W, f),
                               page_keys(K, seq, b, first + 3, hk, c, W, f)), 1)), 1)
    if f.PAGE_SPAN > 4:
        t = ct.cat((t, ct.cat((
            ct.cat((page_keys(K, seq, b, first + 4, hk, c, W, f),
                    page_keys(K, seq, b, first + 5, hk, c, W, f)), 1),
            ct.cat((page_keys(K, seq, b, first + 6, hk, c, W, f),
                    page_keys(K, seq, b, first + 7, hk, c, W, f)), 1)), 1)), 1)
    return t


def page_keys(K, seq, b, i, hk, c, W, f):
    """Head-dim chunk ``c`` of page ``i`` of sequence ``b``'s K^T: [W, page]."""
    page = f.TILE_N // f.PAGE_SPAN
    return ct.load(K, index=(page_at(seq, b, i), hk, c, 0), shape=(1, 1, W, page), order=_T,
                   padding_mode=_ZERO, latency=f.LAT_K).reshape((W, page))


def joined_scores(q, K, seq, b, j, hk, f):
    """Q K^T of key tile ``j`` over its pages joined (``joined_keys``): one MMA per
    head-dim chunk, as a dense tile takes."""
    q0, q1, q2 = q
    acc = ct.mma(q0, joined_keys(K, seq, b, j, hk, 0, f.W0, f),
                 ct.full((f.TILE_M, f.TILE_N), 0.0, dtype=np.float32))
    if f.NCHUNK > 1:
        acc = ct.mma(q1, joined_keys(K, seq, b, j, hk, f.W0 // f.W1, f.W1, f), acc)
    if f.NCHUNK > 2:
        acc = ct.mma(q2, joined_keys(K, seq, b, j, hk, (f.W0 + f.W1) // f.W2, f.W2, f), acc)
    return acc


def page_values(p, V, Vend, seq, b, j, i, hk, acc, seq_k, f):
    """acc += P's columns of page ``i`` of key tile ``j`` @ that page's values. ``seq_k``
    (or None): the tile holds a context's end; a page wholly before it is read whole, the
    page holding it through ``end_rows``, and a page wholly past it not at all (its
    columns of P are zero)."""
    page = f.TILE_N // f.PAGE_SPAN
    first = j * f.PAGE_SPAN + i
    pv = ct.extract(p, index=(0, i), shape=(f.TILE_M, page))
    if seq_k is None:
        return page_mma(pv, V, seq, b, first, hk, acc, f)
    n = seq_k - first * page  # this page's rows before the end
    if n >= page:
        acc = page_mma(pv, V, seq, b, first, hk, acc, f)
    elif n > 0:
        acc = page_mma(pv, Vend, seq, b, first, hk, acc, f)
    return acc


def page_mma(pv, V, seq, b, first, hk, acc, f):
    """acc += pv @ V's page ``first`` of sequence ``b``."""
    acc0, acc1, acc2 = acc
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)
    return mma_streamed(pv, V, page_at(seq, b, first), hk, 0, f.TILE_N // f.PAGE_SPAN, acc0,
                        acc1, acc2, VW0, VW1, VW2, VNCHUNK, f.LAT_V)


def span_values(p, V, seq, b, j, hk, acc0, acc1, acc2, seq_k, f):
    """acc += P V over the ``PAGE_SPAN`` pages (2, 4 or 8) of key tile ``j``: one MMA per
    page, joined or not (``PAGE_JOIN`` joins K only: P V per page is D wide)."""
    Vend = V
    if seq_k is not None:
        Vend = end_rows(V, seq_k, f.TILE_N // f.PAGE_SPAN)  # one view for the end's page
    acc = page_values(p, V, Vend, seq, b, j, 0, hk, (acc0, acc1, acc2), seq_k, f)
    acc = page_values(p, V, Vend, seq, b, j, 1, hk, acc, seq_k, f)
    if f.PAGE_SPAN > 2:
        acc = page_values(p, V, Vend, seq, b, j, 2, hk, acc, seq_k, f)
        acc = page_values(p, V, Vend, seq, b, j, 3, hk, acc, seq_k, f)
    if f.PAGE_SPAN > 4:
        acc = page_values(p, V, Vend, seq, b, j, 4, hk, acc, seq_k, f)
        acc = page_values(p, V, Vend, seq, b, j, 5, hk, acc, seq_k, f)
        acc = page_values(p, V, Vend, seq, b, j, 6, hk, acc, seq_k, f)
        acc = page_values(p, V, Vend, seq, b, j, 7, hk, acc, seq_k, f)
    return acc


def tile_rows(seq, b, j, f):
    """(page, row) of each key of tile ``j`` ([TILE_N, 1] each) when K/V rows are gathered
    (``PAGE_GATHER``): the tile's ``PAGE_SPAN`` page ids (up to ``MAX_PAGE_SPAN``, 8) read
    as scalars, each key selecting its own. (Row ids built from a loaded tile of page ids
    made tileiras stage every element's pointer through shared memory: repro 7,
    ``paged_gather.py``.)"""
    page = f.TILE_N // f.PAGE_SPAN
    key = ct.arange(f.TILE_N, dtype=np.int32)
    first = j * f.PAGE_SPAN
    pg = ct.full((f.TILE_N,), 0, dtype=np.int32) + page_at(seq, b, first)
    if f.PAGE_SPAN > 1:
        pg = ct.where(key >= page, page_at(seq, b, first + 1), pg)
    if f.PAGE_SPAN > 2:
        pg = ct.where(key >= 2 * page, page_at(seq, b, first + 2), pg)
        pg = ct.where(key >= 3 * page, page_at(seq, b, first + 3), pg)
    if f.PAGE_SPAN > 4:
        pg = ct.where(key >= 4 * page, page_at(seq, b, first + 4), pg)
        pg = ct.where(key >= 5 * page, page_at(seq, b, first + 5), pg)
        pg = ct.where(key >= 6 * page, page_at(seq, b, first + 6), pg)
        pg = ct.where(key >= 7 * page, page_at(seq, b, first + 7), pg)
    return pg[:, None], (key % page)[:, None]


def gathered_chunks(T, rows, hk, keep, W0, W1, W2, NCHUNK):
    """Key rows ``rows`` (``tile_rows``) of page cache ``T`` [pages, Hkv, P, D] at K/V head
    ``hk`` as [TILE_N, W] head-dim chunks, by cp.async (``check_bounds=False``: the pages
    are clamped into the cache, rows lie in a page). ``keep`` (or None): [TILE_N, 1], rows
    where it is False read as zeros and are not read at all (a free slot may hold NaN)."""
    pg, row = rows
    c0 = ct.gather(T, (pg, hk, row, ct.arange(W0, dtype=np.int32)[None, :]), mask=keep,
                   check_bounds=False)
    c1 = c0
    c2 = c0
    if NCHUNK > 1:
        c1 = ct.gather(T, (pg, hk, row, W0 + ct.arange(W1, dtype=np.int32)[None, :]),
                       mask=keep, check_bounds=False)
    if NCHUNK > 2:
        c2 = ct.gather(T, (pg, hk, row, W0 + W1 + ct.arange(W2, dtype=np.int32)[None, :]),
                       mask=keep, check_bounds=False)
    return c0, c1, c2


def gathered_scores(q, K, seq, b, j, hk, f):
    """Q K^T of key tile ``j`` with its K rows gathered across its pages: one MMA per
    head-dim chunk over the whole tile (benchmarks/notes/varlen-paged.md §40f)."""
    q0, q1, q2 = q
    k0, k1, k2 = gathered_chunks(K, tile_rows(seq, b, j, f), hk, None, f.W0, f.W1, f.W2,
                                 f.NCHUNK)
    return dot(q0, q1, q2, ct.transpose(k0), ct.transpose(k1), ct.transpose(k2), f.TILE_M,
               f.TILE_N, f.NCHUNK)


def gathered_values(p, V, seq, b, j, hk, acc, seq_k, f):
    """acc += P V over key tile ``j``, V's rows gathered; ``seq_k`` (or None): the tile
    holds a context's end, and V's rows from it on read as zeros (its free slots may hold
    NaN, which P = 0 would not cancel)."""
    keep = None
    if seq_k is not None:
        keep = (j * f.TILE_N + ct.arange(f.TILE_N, dtype=np.int32))[:, None] < seq_k
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)
    v0, v1, v2 = gathered_chunks(V, tile_rows(seq, b, j, f), hk, keep, VW0, VW1, VW2, VNCHUNK)
    acc0, acc1, acc2 = acc
    return mma_into(p, v0, v1, v2, acc0, acc1, acc2, VNCHUNK)


def seq_diag(seq, f):
    """``keep_tile``'s bottom-right diagonal of a packed or paged sequence, else None."""
    if has_seqs(f):
        return (seq[2], f.WINDOW, seq[3], seq[4])
    return None


def fwd_program(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, seqs=None, descale=None):
    """The forward program every entry point runs (grouped arguments: tuples of
    compile-time constants stay constants). ``extra`` (BlkCnt, BlkIdx, A0..A3): a block
    mask's lists and the captured tensors, None in the plain kernel; ``scalars``
    (qk_scale_log2, inv_scale, scale, GROUP, SEQ_Q, NUM_SPLITS, SPLIT_TILES); ``f`` the
    ``FwdFlags``; ``fns`` (score_mod, mask_mod); ``seqs`` (CuQ, CuK, SeqK, Pages, TileMap,
    WIN_L, WIN_R, HEAD_BLOCK) of a packed or paged call (``attention_fwd_seqs``), else None;
    ``descale`` the FP8 forward's descale arrays (``fp8_factors``), else None."""
    # Grid (query tiles, heads, batch): query tiles of one head are adjacent, so
    # they share its K/V in L2.
    bid_m = ct.bid(0)
    if f.CAUSAL and f.HEAVY_FIRST:
        # Under causality the last query tiles visit the most keys; starting them first
        # leaves the short ones to fill the final wave.
        bid_m = ct.num_blocks(0) - 1 - bid_m
    b = ct.bid(2)
    hb = ct.bid(1)  # the head (and split) index of Out and Lse
    if has_seqs(f):
        CuQ, CuK, SeqK, Pages, TileMap, WIN_L, WIN_R, HEAD_BLOCK = seqs
        valid = True
        if f.VARLEN_Q:
            # Packed queries: one grid axis over every sequence's tiles, in the order of
            # ``seqmap.sequence_map`` (heaviest first); its last entries may be unused.
            b, bid_m, valid, hb = mapped_program(TileMap, HEAD_BLOCK)
        if valid:
            seq_program(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, seqs, b, bid_m, hb)
    else:
        rows_program(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, b, bid_m, hb, b,
                     K.shape[2], (None, None, 0, 0, 0, None, None), descale)


def seq_program(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, seqs, b, bid_m, hb):
    """A query tile of sequence ``b`` of a packed or paged call: its rows' slice of the
    packed q / out / lse (the array batch is then 0), its keys' slice or its pages, and
    ``shift`` = Skv - Sq, where causality and the window align (bottom-right)."""
    CuQ, CuK, SeqK, Pages, TileMap, WIN_L, WIN_R, HEAD_BLOCK = seqs
    SEQ_Q = scalars[4]
    ab = b
    seq_q = SEQ_Q
    start = 0
    kstart = 0
    if f.VARLEN_Q:
        start, stop = sequence_span(CuQ, b, Q.shape[2])
        if not whole_q(f):
            Q = sequence_slice(Q, start, stop)
        if not (whole_q(f) and f.SCATTER_OUT):
            Out = sequence_slice(Out, start, stop)
        if f.RETURN_LSE:
            Lse = sequence_slice(Lse, start, stop)
        seq_q = stop - start
        ab = 0
    seq_k = K.shape[2]
    if f.VARLEN_K:
        kstart, kstop = sequence_span(CuK, b, K.shape[2])
        if f.SEQUSED:
            # The slice ends at the used length: TMA reads the rows past it as zeros (they
            # may be unwritten memory, and 0 * NaN is NaN in P V), so no tile is apart.
            kstop = ct.minimum(kstop, kstart + ct.maximum(ct.gather(SeqK, b), 0))
        if not whole_kv(f):
            K = sequence_slice(K, kstart, kstop)
            V = sequence_slice(V, kstart, kstop)
        seq_k = kstop - kstart
    if f.PAGED:
        seq_k = Pages.shape[1] * (f.PAGE_TILES * f.TILE_N // f.PAGE_SPAN)
    if f.SEQUSED and not f.VARLEN_K:
        seq_k = ct.minimum(ct.maximum(ct.gather(SeqK, b), 0), seq_k)
    rows_program(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, b, bid_m, hb, ab, seq_k,
                 (Pages, K.shape[0], seq_k - seq_q, WIN_L, WIN_R, *whole_origins(start, kstart, f)))


def whole_q(f):
    """Q (packed) loads from the whole packed array (``FwdFlags.WHOLE_LOADS``)."""
    return f.WHOLE_LOADS and f.VARLEN_Q


def whole_kv(f):
    """K and V (packed) load from the whole packed arrays. Under ``SEQUSED`` they stay
    sliced to the keys used: past them may be unwritten memory, and 0 * NaN is NaN in
    P V."""
    return f.WHOLE_LOADS and f.VARLEN_K and not f.SEQUSED


def whole_origins(start, kstart, f):
    """(query origin, key origin) of a packed sequence's rows in the whole packed arrays
    (``body.row_chunk``), each None where that array is sliced (tile-indexed). Rows past
    the sequence are the next one's, or TMA zeros past the array: its query rows are never
    stored, and its keys are masked (the key tail), their values weighed by P = 0."""
    return (start if whole_q(f) else None, kstart if whole_kv(f) else None)


def query_origin(seq):
    """Q's element row origin (``whole_origins``), or None: tile-indexed."""
    return seq[5]


def key_origin(seq):
    """K's and V's element row origin (``whole_origins``), or None: tile-indexed."""
    return seq[6]


def rows_program(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, b, bid_m, hb, ab, seq_k,
                 seq, descale=None):
    """``rows_body``, or with ``SPLIT_SKIP`` for a key split that holds none of its
    sequence's keys only its rows' -inf log-sum-exps: such a program loads nothing and
    writes no partial (the combine weighs it 0). A ragged batch's splits are sized by its
    longest context, so most of a short context's splits are empty."""
    if f.SPLIT_SKIP:
        NUM_SPLITS, SPLIT_TILES = scalars[5], scalars[6]
        j_lo, n_tiles, _ = seq_key_range(bid_m * f.TILE_M, seq_k, seq[2], f.TILE_M, f.TILE_N,
                                         f.CAUSAL, f.WINDOW, seq[3], seq[4], f.PACKED,
                                         scalars[4])
        j_start, n_tiles = split_range(j_lo, n_tiles, hb % NUM_SPLITS, SPLIT_TILES, True)
        if j_start < n_tiles:
            rows_body(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, b, bid_m, hb, ab,
                      seq_k, seq, descale)
        else:
            ct.store(Lse, index=(ab, hb, bid_m),
                     tile=ct.full((1, 1, f.TILE_M), -np.inf, dtype=np.float32))
    else:
        rows_body(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, b, bid_m, hb, ab, seq_k,
                  seq, descale)


def rows_body(Q, K, V, Out, Lse, Mask, extra, scalars, f, fns, b, bid_m, hb, ab, seq_k,
              seq, descale=None):
    """One query tile ``bid_m`` of (batch or sequence) ``b`` and head (and split) ``hb``:
    Q, Out and Lse indexed at array batch ``ab``; ``seq`` (Pages, pages in the cache,
    shift, WIN_L, WIN_R) is what ``key_tile_at`` and ``seq_diag`` read for a packed or
    paged sequence; ``descale`` (FP8): the descale arrays."""
    BlkCnt, BlkIdx, A0, A1, A2, A3 = extra
    qk_scale_log2, inv_scale, scale, GROUP, SEQ_Q, NUM_SPLITS, SPLIT_TILES = scalars
    TILE_M, W0, W1, W2, NCHUNK = f.TILE_M, f.W0, f.W1, f.W2, f.NCHUNK
    h = hb
    if f.SPLIT_K:
        h = hb // NUM_SPLITS
    hk = h // GROUP

    if f.PDL:
        # Programmatic dependent launch: the CTA's setup and the index math (no memory
        # effects, so the compiler may place all of it before the wait) run while the
        # previous kernel finishes; every load and store is ordered after the wait (that
        # kernel may write our inputs or still read memory we write). The next kernel may
        # be scheduled now: it waits for this whole grid itself.
        ct.grid_dependency_control_launch_dependents()
        ct.grid_dependency_control_wait()

    q = load_rows(Q, ab, h, bid_m, TILE_M, W0, W1, W2, NCHUNK, None, query_origin(seq))
    m_i, l_i = softmax_init(TILE_M)
    VNCHUNK, VW0, VW1, VW2 = value_chunks(f)  # the accumulators and Out: V's head dim
    acc0, acc1, acc2 = zeros_chunks(TILE_M, VW0, VW1, VW2)
    state = (m_i, l_i, acc0, acc1, acc2)

    q_start = bid_m * TILE_M
    offs_m = (q_start + ct.arange(TILE_M, dtype=np.int32))[:, None]
    if f.PACKED:
        offs_m = offs_m % SEQ_Q  # query position of each packed row
    arrays = (K, V, Mask)
    aux = (A0, A1, A2, A3)
    c = qk_scale_log2
    v_descale = 1.0
    if f.FP8:
        c, v_descale = fp8_factors(descale, b, hk, qk_scale_log2)
    where = (b, h, hk, bid_m, offs_m, seq_k, c, inv_scale, scale, seq)

    if f.BLOCK_SPARSE:
        # Positions [0, n_part) of this tile's list are partial tiles, then n_full full
        # ones; a split takes its share of the positions.
        n_part, n_full = block_range(BlkCnt, b, h, bid_m, f.BLK_BATCH, f.BLK_HEAD)
        lo, hi = split_range(0, n_part + n_full, hb % NUM_SPLITS, SPLIT_TILES, f.SPLIT_K)
        for t in range(lo, min(hi, n_part)):
            j = block_at(BlkIdx, b, h, bid_m, t, f.BLK_BATCH, f.BLK_HEAD)
            state = fwd_tile(q, arrays, fns, aux, where, state, j, True, True, f)
        for t in range(max(lo, n_part), hi):
            j = block_at(BlkIdx, b, h, bid_m, t, f.BLK_BATCH, f.BLK_HEAD)
            state = fwd_tile(q, arrays, fns, aux, where, state, j, False, False, f)
    else:
        # Key tiles [j_lo, n_tiles) are visited; from mask_start on, some element of
        # the tile may be masked by causality, the window or the key tail.
        if has_seqs(f):
            j_lo, n_tiles, mask_start = seq_key_range(
                q_start, seq_k, seq[2], TILE_M, f.TILE_N, f.CAUSAL, f.WINDOW, seq[3], seq[4],
                f.PACKED, SEQ_Q)
        else:
            j_lo = 0
            n_tiles, mask_start = key_range(q_start, seq_k, SEQ_Q, TILE_M, f.TILE_N,
                                            f.CAUSAL, not f.EVEN_N, f.PACKED)
        j_start, n_tiles = split_range(j_lo, n_tiles, hb % NUM_SPLITS, SPLIT_TILES,
                                       f.SPLIT_K)
        n_whole = n_tiles
        ends_apart = (f.PAGED and f.SEQUSED) or key_origin(seq) is not None
        if ends_apart:
            # The tile holding the context's (or whole-loaded sequence's) end runs apart,
            # after the loop: only it reads V through a view cut at the end
            # (``values_step``), and the loop stays as it was.
            n_whole = max(min(n_tiles, seq_k // f.TILE_N), j_start)
        for j in range(j_start, n_whole):
            state = fwd_tile(q, arrays, fns, aux, where, state, j, j >= mask_start,
                             f.HAS_MASK_MOD, f)
        if ends_apart:
            for j in range(n_whole, n_tiles):
                state = fwd_tile(q, arrays, fns, aux, where, state, j, True,
                                 f.HAS_MASK_MOD, f, CACHE_END=True)

    # Fully masked rows (l = 0) are written as zeros, and their log-sum-exp as -inf.
    m_i, l_i, acc0, acc1, acc2 = state
    l_div = safe_divisor(l_i, fwd_zero_safe(f))
    if f.FP8:
        l_div = l_div / v_descale  # V's descale folds into the row sums: one op a row
    o0, o1, o2 = divide_chunks(acc0, acc1, acc2, l_div, VNCHUNK)
    if f.SCATTER_OUT and query_origin(seq) is not None:
        # the sequence's rows of this tile: its queries (seq_k - shift) past the tile's first
        scatter_rows(Out, ab, hb, query_origin(seq) + q_start, seq_k - seq[2] - q_start,
                     o0, o1, o2, TILE_M, VW0, VW1, VW2, VNCHUNK)
    else:
        store_rows(Out, ab, hb, bid_m, o0, o1, o2, TILE_M, VW0, VW1, VW2, VNCHUNK)
    if f.RETURN_LSE or f.SPLIT_K:
        ct.store(Lse, index=(ab, hb, bid_m), tile=row_lse(m_i, l_i).reshape((1, 1, TILE_M)))


# The entry points, written out from ``FwdFlags``' fields (``entry``): ``FLAGS`` stands for
# one ``ct.Constant`` parameter per flag the entry point takes (``flags``: their meaning and
# scopes), then for the ``FwdFlags`` built from them by name.
attention_fwd = entry_point(FwdFlags, PLAIN, """
def attention_fwd(
    Q, K, V, Out, Lse, Mask,
    qk_scale_log2: float,  # scale * log2(e): the softmax units' factor
    inv_scale: float,  # 1 / scale: additive masks are added to raw scores
    GROUP: int,  # query heads per K/V head (GQA); 1 for MHA (and when PACKED)
    SEQ_Q: int,  # query positions per head (PACKED: rows per head in the packed tile)
    NUM_SPLITS: int, SPLIT_TILES: int,  # SPLIT_K: key splits per (batch, head), tiles each
    FLAGS,
):
    \"\"\"Plain attention (no variant functions, no block mask): only the arrays it reads.\"\"\"
    fwd_program(
        Q, K, V, Out, Lse, Mask, (None, None, None, None, None, None),
        (qk_scale_log2, inv_scale, 1.0, GROUP, SEQ_Q, NUM_SPLITS, SPLIT_TILES), FLAGS,
        (no_score_mod, no_mask_mod))
""", globals())


attention_fwd_variant = entry_point(FwdFlags, VARIANT, """
def attention_fwd_variant(
    Q, K, V, Out, Lse, Mask, BlkCnt, BlkIdx, A0, A1, A2, A3,
    qk_scale_log2: float,  # log2(e) with a score_mod (it sees scaled scores), else as above
    inv_scale: float,  # 1 with a score_mod: an additive mask is added as is
    scale: float,
    GROUP: int, SEQ_Q: int, NUM_SPLITS: int, SPLIT_TILES: int,
    FLAGS,
):
    \"\"\"Attention with the variant's functions (``SCORE_MOD``, ``MASK_MOD``), the tensors
    they capture (``A0..A3``) and a block mask's lists.\"\"\"
    fwd_program(
        Q, K, V, Out, Lse, Mask, (BlkCnt, BlkIdx, A0, A1, A2, A3),
        (qk_scale_log2, inv_scale, scale, GROUP, SEQ_Q, NUM_SPLITS, SPLIT_TILES), FLAGS,
        (SCORE_MOD, MASK_MOD))
""", globals())


attention_fwd_seqs = entry_point(FwdFlags, FWD_SEQS, """
def attention_fwd_seqs(
    Q, K, V, Out, Lse, Mask, BlkCnt, BlkIdx, A0, A1, A2, A3, CuQ, CuK, SeqK, Pages, TileMap,
    qk_scale_log2: float, inv_scale: float, scale: float,
    GROUP: int, SEQ_Q: int, NUM_SPLITS: int, SPLIT_TILES: int,
    WIN_L: int, WIN_R: int,  # the window's keys left / right of the diagonal (2**30: none)
    HEAD_BLOCK: int,  # packed q: heads per block of grid axis 0 (``visit.mapped_program``)
    FLAGS,
):
    \"\"\"Packed (``sdpa_varlen``) and paged (``sdpa_paged``) sequences: the same program,
    each tile's sequence read from ``TileMap`` (packed q: ``seqmap.sequence_map``) or the
    grid's batch axis, its keys sliced by ``CuK`` or read through the block table ``Pages``
    ([B, max_pages]; K and V viewed [pages, Hkv, page, D]), capped by ``SeqK``. Q, Out are
    [1, H, total_q, D] and Lse [1, H, total_q] when packed, else [B, H, Sq, D] / [B, H,
    Sq].\"\"\"
    fwd_program(
        Q, K, V, Out, Lse, Mask, (BlkCnt, BlkIdx, A0, A1, A2, A3),
        (qk_scale_log2, inv_scale, scale, GROUP, SEQ_Q, NUM_SPLITS, SPLIT_TILES), FLAGS,
        (SCORE_MOD, MASK_MOD), (CuQ, CuK, SeqK, Pages, TileMap, WIN_L, WIN_R, HEAD_BLOCK))
""", globals())


attention_fwd_fp8 = entry_point(FwdFlags, FWD_FP8, """
def attention_fwd_fp8(
    Q, K, Vt, Out, Lse, QDescale, KDescale, VDescale,
    qk_scale_log2: float,  # scale * log2(e); times q's and k's descales per (b, K/V head)
    GROUP: int, SEQ_Q: int,
    QD_HEADS: int, KD_HEADS: int, VD_HEADS: int,  # 1: that descale is [B, Hkv]; 0: [1, 1]
    FLAGS,
):
    \"\"\"The FP8 forward (``FP8``): e4m3 Q, K and Vt = V^T [B, Hkv, D, Skv]; the descales
    fp32; Out bf16 or fp16; no mask, variant or split.\"\"\"
    fwd_program(
        Q, K, Vt, Out, Lse, None, (None, None, None, None, None, None),
        (qk_scale_log2, 1.0, 1.0, GROUP, SEQ_Q, 1, 1), FLAGS,
        (no_score_mod, no_mask_mod), None,
        (QDescale, KDescale, VDescale, QD_HEADS, KD_HEADS, VD_HEADS))
""", globals())
