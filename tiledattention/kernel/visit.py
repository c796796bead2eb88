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
    takes ``SPLIT_TILES`` of the positions). Never below the split's start: a split past
    a causal row's keys runs no iteration."""
    if SPLIT_K:
        lo = split * SPLIT_TILES
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
