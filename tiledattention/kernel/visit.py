"""Which tiles a program visits: the tile functions every score kernel uses, and their
Python mirror for the host (the plan's split-K sizing, the tile-exact reference).

Dense (no block mask), a query tile starting at ``q_start`` visits key tiles ``[0,
n_tiles)``; under causality (top-left aligned, as torch's ``is_causal``) the tiles wholly
above the diagonal are never visited, and only tiles from ``mask_start`` on (the diagonal,
the key tail) can hold a masked pair. This is the closed form of a block mask for
causality, so it costs no lists. A dK/dV program (one key tile) visits the transposed
range of query tiles. With a block mask the lists (``blockmask``) say it: positions
``[0, n_part)`` of a tile's list are partial tiles (every mask applied), ``[n_part, n_part
+ n_full)`` full ones (no mask at all); empty tiles are never loaded.
"""

from __future__ import annotations

import math

import numpy as np

try:  # the host mirror below needs no cuTile (plans are made without it in tests)
    import cuda.tile as ct
except ImportError:  # pragma: no cover - kernel_module() names what is missing
    ct = None


# ----------------------------------------------------------------------------- tile functions
def key_range(q_start, seq_k, SEQ_Q, TILE_M, TILE_N, CAUSAL, TAIL, PACKED):
    """(n_tiles, mask_start): a query tile's dense key loop (forward, dQ). ``PACKED``
    (GQA decode): rows hold positions 0..SEQ_Q-1 of several heads, so every tile the last
    position sees is visited and masked."""
    n_tiles = ct.cdiv(seq_k, TILE_N)
    mask_start = n_tiles
    if TAIL:
        mask_start = seq_k // TILE_N
    if CAUSAL:
        if PACKED:
            n_tiles = ct.cdiv(min(SEQ_Q, seq_k), TILE_N)
            mask_start = 0
        else:
            n_tiles = ct.cdiv(min(q_start + TILE_M, seq_k), TILE_N)
            mask_start = min(mask_start, q_start // TILE_N)
    return n_tiles, mask_start


def split_range(lo, hi, split, SPLIT_TILES, SPLIT_K):
    """(lo, hi) of ``[lo, hi)`` that key split ``split`` visits (``SPLIT_K``: each split
    takes ``SPLIT_TILES`` of the positions from ``lo`` on). Never below the split's
    start: a split past a causal row's keys runs no iteration."""
    if SPLIT_K:
        lo = lo + split * SPLIT_TILES
        hi = max(min(hi, lo + SPLIT_TILES), lo)
    return lo, hi


def query_range(k_start, seq_q, TILE_M, TILE_N, CAUSAL):
    """(m_lo, m_hi, mask_end): a key tile's dense query loop (dK/dV). Causal: query tiles
    wholly above this key tile's diagonal are skipped, and only those starting before the
    key tile ends cross the diagonal."""
    m_hi = ct.cdiv(seq_q, TILE_M)
    m_lo = 0
    mask_end = 0
    if CAUSAL:
        m_lo = k_start // TILE_M
        mask_end = ct.cdiv(k_start + TILE_N, TILE_M)
    return m_lo, m_hi, mask_end


def block_row(b, h, BLK_BATCH, BLK_HEAD):
    """The (batch, head) index of a block mask's lists: 0 on a broadcast axis."""
    bb = 0
    hh = 0
    if BLK_BATCH:
        bb = b
    if BLK_HEAD:
        hh = h
    return bb, hh


def block_range(Cnt, b, h, tile, BLK_BATCH, BLK_HEAD):
    """(n_part, n_full): tile counts of one row of a block mask's lists (``blockmask``);
    the program visits positions [0, n_part) with every mask, then [n_part, n_part +
    n_full) with none."""
    bb, hh = block_row(b, h, BLK_BATCH, BLK_HEAD)
    return ct.gather(Cnt, (bb, hh, tile, 0)), ct.gather(Cnt, (bb, hh, tile, 1))


def block_at(Idx, b, h, tile, t, BLK_BATCH, BLK_HEAD):
    """The ``t``-th listed tile of one row of a block mask's lists."""
    bb, hh = block_row(b, h, BLK_BATCH, BLK_HEAD)
    return ct.gather(Idx, (bb, hh, tile, t))


# ----------------------------------------------------------------------------- packed sequences
def sequence_tiles(Cu, BPAD, TILE):
    """[BPAD] tiles of ``TILE`` rows per sequence of the packed offsets ``Cu`` ([B + 1]
    int32, B < BPAD; lanes past B count 0). A decreasing pair counts 0 tiles, never a
    negative number (``sequence_span`` clamps the same way)."""
    idx = ct.arange(BPAD, dtype=np.int32)
    batch = Cu.shape[0] - 1
    lo = ct.gather(Cu, idx, padding_value=0)
    hi = ct.gather(Cu, idx + 1, padding_value=0)
    n = ct.where(idx < batch, ct.maximum(hi - lo, 0), 0)
    return (n + (TILE - 1)) // TILE


def level_count(tiles, level):
    """Tiles at positions >= ``level`` within their sequence, over all sequences."""
    return ct.sum(ct.maximum(tiles - level, 0))


def sequence_tile(Cu, t, BPAD, TILE, STEPS):
    """(b, tile, valid): program ``t`` of a packed grid runs tile ``tile`` of sequence ``b``.

    The order is *level-major, deepest first*: programs 0.. run the last tiles of the
    longest sequences, the first tiles of every sequence run last. Under causality a
    query tile's work grows with its position, so this is the longest-first order that
    keeps the SMs busy to the end when long and short sequences share a batch (and for
    full attention the long sequences' tiles, the heavy ones, still start first). The
    level is found by bisection over ``level_count`` (``STEPS`` rounds cover every
    level the packed length allows, whatever ``max_seqlen`` says), then ``b`` is the
    rank-th sequence deep enough for it. ``valid``: ``t`` is below the number of tiles
    (the grid is sized from the packed length, an upper bound)."""
    tiles = sequence_tiles(Cu, BPAD, TILE)
    lo = 0
    hi = 1 << STEPS  # level_count(hi) == 0 > t never holds there
    for _ in range(STEPS):
        mid = (lo + hi) // 2
        deep = level_count(tiles, mid) > t
        lo = ct.where(deep, mid, lo)
        hi = ct.where(deep, hi, mid)
    valid = level_count(tiles, 0) > t
    rank = t - level_count(tiles, lo + 1)  # among the sequences with a tile at level lo
    has = ct.where(tiles > lo, 1, 0)
    b = ct.sum(ct.where(ct.cumsum(has, axis=0) <= rank, 1, 0))
    return b, lo, valid


def heaviest_sequence_tile(Cu, Wt, t, BPAD, TILE, W_OFFSETS):
    """(b, tile, valid) in *sequence-major* order, the heaviest sequence first: sequences
    ranked by weight (``Wt``: per-sequence key counts, as offsets [B + 1] when
    ``W_OFFSETS``, else values [B]; ties by index), each one's tiles deepest first. Where a
    tile's work follows its sequence's keys, not its depth (full attention, a paged
    cache's contexts), this is the longest-first order the level-major one is under
    causality. One [BPAD, BPAD] comparison ranks the sequences (``workload`` keeps BPAD
    small for it)."""
    idx = ct.arange(BPAD, dtype=np.int32)
    tiles = sequence_tiles(Cu, BPAD, TILE)
    w = ct.gather(Wt, idx, padding_value=0)
    if W_OFFSETS:
        w = ct.gather(Wt, idx + 1, padding_value=0) - w
    wb = w.reshape((BPAD, 1))
    wj = w.reshape((1, BPAD))
    ahead = (wj > wb) | ((wj == wb) & (idx.reshape((1, BPAD)) < idx.reshape((BPAD, 1))))
    before = ct.sum(ct.where(ahead, tiles.reshape((1, BPAD)), 0), axis=1)
    mine = (before <= t) & (before + tiles > t)
    b = ct.sum(ct.where(mine, idx, 0))
    m = ct.sum(ct.where(mine, tiles - 1 - (t - before), 0))
    return b, m, ct.sum(ct.where(mine, 1, 0)) > 0


def mapped_program(TileMap, HEAD_BLOCK):
    """(b, tile, valid, head) of this program of a packed grid: axis 0 runs the map's
    entries and axis 1 the heads, or (``HEAD_BLOCK`` > 0, a runtime value: the host picks
    it per call, ``workload.varlen_head_block``) axis 0 alone runs blocks of
    ``HEAD_BLOCK`` heads, each block's (entry, head) pairs heads fastest, so every head of
    a block runs the map's first (heaviest) entries first rather than one head's whole map
    after another's (a block of every head: all heads' heaviest entries first)."""
    x = ct.bid(0)
    h = ct.bid(1)
    if HEAD_BLOCK > 0:
        span = TileMap.shape[0] * HEAD_BLOCK  # programs per block of heads
        block = x // span
        x = x - block * span
        h = block * HEAD_BLOCK + x % HEAD_BLOCK
        x = x // HEAD_BLOCK
    b, m, valid = mapped_tile(TileMap, x)
    return b, m, valid, h


def mapped_tile(TileMap, t):
    """(b, tile, valid) of program ``t`` from ``seqmap.sequence_map``'s [programs, 2] map
    (b = -1: no tile). Gathered, not recomputed per program: tileiras 13.4 fails to
    compile the attention kernels with ``sequence_tile``'s reductions inlined."""
    b = ct.gather(TileMap, (t, 0))
    return b, ct.gather(TileMap, (t, 1)), b >= 0


def sequence_span(Cu, b, total):
    """(start, stop) of packed sequence ``b``, clamped into [0, total] and non-decreasing:
    a bad offset can shorten a sequence, never reach outside the tensor."""
    start = ct.minimum(ct.maximum(ct.gather(Cu, b), 0), total)
    stop = ct.minimum(ct.maximum(ct.gather(Cu, b + 1), start), total)
    return start, stop


def sequence_slice(T, start, stop):
    """``T`` sliced to rows [start, stop) of its axis 2, with ``start`` kept below T's extent
    (cuTile's ``Array.slice`` needs start < N): an empty sequence at the end of the packed
    tensor gets a one-row view it never reads (its length, stop - start, is 0)."""
    first = ct.minimum(start, T.shape[2] - 1)
    return T.slice(axis=2, start=first, stop=ct.maximum(stop, first))


def seq_key_range(q_start, seq_k, shift, TILE_M, TILE_N, CAUSAL, WINDOW, WIN_L, WIN_R,
                  PACKED, SEQ_Q):
    """(j_lo, n_tiles, mask_start) of a query tile of a packed or paged sequence: causality
    and the window are aligned bottom-right (query i stands at key position i +
    ``shift``, shift = Skv - Sq); tiles wholly outside them are not visited; the key tail
    (never a multiple of the tile for every sequence) and, with a window, every tile are
    masked. ``PACKED`` rows hold positions 0..SEQ_Q-1 of several heads."""
    first = q_start + shift  # the diagonal key of the tile's first row
    last = q_start + TILE_M - 1 + shift
    if PACKED:
        first = shift
        last = SEQ_Q - 1 + shift
    n_tiles = ct.cdiv(seq_k, TILE_N)
    mask_start = seq_k // TILE_N
    j_lo = 0
    if CAUSAL:
        n_tiles = ct.cdiv(ct.maximum(ct.minimum(last + 1, seq_k), 0), TILE_N)
        mask_start = ct.minimum(mask_start, ct.maximum(first, 0) // TILE_N)
    if WINDOW:
        n_tiles = ct.minimum(n_tiles, ct.cdiv(ct.maximum(ct.minimum(last + WIN_R + 1, seq_k),
                                                         0), TILE_N))
        j_lo = ct.maximum(first - WIN_L, 0) // TILE_N
        mask_start = j_lo
    return j_lo, n_tiles, mask_start


def seq_query_range(k_start, seq_q, shift, TILE_M, TILE_N, CAUSAL, WINDOW, WIN_L, WIN_R):
    """(m_lo, m_hi, mask_end) of a key tile of a packed sequence (dK/dV): the transposed
    ``seq_key_range``. Query row i sees keys up to i + shift (causal) and from i + shift
    - WIN_L (window); every visited tile is masked with a window, the diagonal ones
    otherwise."""
    m_hi = ct.cdiv(seq_q, TILE_M)
    m_lo = 0
    mask_end = 0
    if CAUSAL:
        m_lo = ct.maximum(k_start - shift, 0) // TILE_M
        mask_end = ct.cdiv(ct.maximum(k_start + TILE_N - shift, 0), TILE_M)
    if WINDOW:
        # rows whose window ends before this tile: i + shift + WIN_R < k_start
        m_lo = ct.maximum(k_start - shift - WIN_R, 0) // TILE_M
        m_hi = ct.minimum(m_hi, ct.cdiv(ct.maximum(k_start + TILE_N + WIN_L - shift, 0),
                                        TILE_M))
        mask_end = m_hi
    return m_lo, m_hi, mask_end


# ----------------------------------------------------------------------------- host mirror
def key_tiles(q_end: int, seq_k: int, tile_n: int, causal: bool) -> int:
    """Key tiles visited by rows before ``q_end`` (the host's ``key_range``'s n_tiles:
    ``q_end`` a query tile's end, or the last real row + 1 for the longest row)."""
    return math.ceil((min(q_end, seq_k) if causal else seq_k) / tile_n)


def host_key_range(q_start: int, seq_k: int, tile_m: int, tile_n: int, causal: bool,
                   even_n: bool) -> tuple[int, int]:
    """``key_range`` of an unpacked query tile, on the host."""
    n_tiles = key_tiles(q_start + tile_m, seq_k, tile_n, causal)
    mask_start = math.ceil(seq_k / tile_n) if even_n else seq_k // tile_n
    if causal:
        mask_start = min(mask_start, q_start // tile_n)
    return n_tiles, mask_start


def host_sequence_order(lengths: list[int], tile: int, first_heavy: bool = False,
                        weights: list[int] | None = None) -> list[tuple[int, int]]:
    """``seqmap.sequence_map``'s (sequence, tile) of each program, on the host: level-major,
    deepest level first, sequences in order within a level (``first_heavy``: a sequence's
    tiles numbered from its end); with ``weights`` (``heaviest_sequence_tile``)
    sequence-major, the heaviest sequence first (ties by index), its tiles deepest first."""
    tiles = [math.ceil(max(n, 0) / tile) for n in lengths]
    if weights is not None:
        ranked = sorted(range(len(tiles)), key=lambda b: (-weights[b], b))
        return [(b, m) for b in ranked for m in range(tiles[b] - 1, -1, -1)]
    depth = max(tiles, default=0)
    return [(b, t - 1 - m if first_heavy else m) for m in range(depth - 1, -1, -1)
            for b, t in enumerate(tiles) if t > m]
