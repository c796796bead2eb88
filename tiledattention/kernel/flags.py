"""Compile-time flags by name: one frozen dataclass per score-kernel family.

Each ``@ct.kernel`` entry point receives its flags as ``ct.Constant`` scalar parameters
(cuTile 1.7 launches through the ``cutile_python_v1`` calling convention, which takes
neither tuple nor dataclass parameters) and builds its family's flags from them once, by
keyword; every tile function below it reads ``flags.CAUSAL``, never a position. cuTile
builds frozen dataclass instances in device code, and a field built from a constant stays
a constant: branches on it fold away as on the parameter itself (the same SASS,
benchmarks/kernel_identity.py). The entry points are generated from these fields
(``entry``): a new flag is one field here (its ``scope``: which entry points take it), its
value in ``variant`` and the tile code that reads it.

Scopes: none, every entry point of the family; ``dense``, the plain and variant ones (the
packed/paged one leaves it off); ``variant``, the variant and packed/paged ones;
``sparse``, the variant one; ``seqs``, the packed/paged ones; ``paged``, the packed/paged
forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The scopes each entry point takes (``entry.entry_point``).
PLAIN = (None, "dense")
VARIANT = (None, "dense", "variant", "sparse")
FWD_SEQS = (None, "variant", "seqs", "paged")
BWD_SEQS = (None, "variant", "seqs")
FWD_FP8 = (None, "dense", "fp8")


_REQUIRED = object()


def flag(scope: str, default=_REQUIRED):
    """A field the entry points of ``scope`` take (``entry``); ``default``: its value in
    the others (none: off)."""
    if default is _REQUIRED:
        return field(metadata={"scope": scope})
    return field(default=default, metadata={"scope": scope})


@dataclass(frozen=True, kw_only=True)
class SeqFlags:
    """How a packed or paged call finds its sequences (``visit.mapped_tile``): the
    score kernels of ``sdpa_varlen`` / ``sdpa_paged`` set these; the dense kernels leave
    them off (every family's flags end with them)."""

    # q (out, lse) packed by CuQ: grid axis 0 runs over its tiles
    VARLEN_Q: bool = flag("seqs", False)
    VARLEN_K: bool = flag("seqs", False)  # k, v packed by CuK (else paged, or dense by batch)
    # SeqK caps each sequence's keys (seqused_k; paged: the context)
    SEQUSED: bool = flag("seqs", False)
    # k, v are a page cache [pages, Hkv, P, D] addressed by Pages
    PAGED: bool = flag("paged", False)
    PAGE_TILES: int = flag("paged", 1)  # key tiles per page (P // TILE_N)
    # pages per key tile (TILE_N // P): pages smaller than the tile
    PAGE_SPAN: int = flag("paged", 1)
    WINDOW: bool = flag("seqs", False)  # a (left, right) window around the bottom-right diagonal
    # K/V rows gathered through the block table (cp.async) into key tiles of PAGE_SPAN
    # whole pages, not one TMA load per page (pages < workload.PAGE_GATHER_BELOW)
    PAGE_GATHER: bool = flag("paged", False)
    # a key tile's pages (PAGE_SPAN, one TMA load each) joined along the keys into one
    # MMA operand, not one MMA per page (chunked prefill at small pages)
    PAGE_JOIN: bool = flag("paged", False)
    # a key tile's K rows gathered through the block table (cp.async) into one Q K^T
    # operand, V still one TMA load per page (chunked prefill at small pages, instead of
    # ``PAGE_JOIN``'s copy: ``workload.PAGE_KEYS_GATHERED``)
    PAGE_GATHER_K: bool = flag("paged", False)
    # split-K: a split that holds no key of its sequence stores only its rows' -inf
    # log-sum-exps and loads nothing (no q, no partial written); the combine weighs it 0
    # (``workload.PAGED_SKIP_EMPTY``: a ragged batch's splits past its short contexts)
    SPLIT_SKIP: bool = flag("paged", False)


@dataclass(frozen=True, kw_only=True)
class ModFlags(SeqFlags):
    """The variant's functions, the block mask and V's chunks: every family's flags have
    them, after its own (``entry.declared_fields``: a base class's fields come first in
    the dataclass, so the entry points place these by that order, not the MRO's)."""

    HAS_SCORE_MOD: bool = flag("variant", False)
    HAS_MASK_MOD: bool = flag("variant", False)
    # visit the tiles a block mask lists (BlkCnt, BlkIdx; dK/dV: the transposed lists,
    # query tiles per key tile)
    BLOCK_SPARSE: bool = flag("sparse", False)
    BLK_BATCH: bool = flag("sparse", False)  # the block mask's real axes
    BLK_HEAD: bool = flag("sparse", False)
    # V's head-dim chunks (and what has its head dim: the forward's accumulators and
    # output, the backward's O, dO and dV) when V's head dim differs from Q/K's (D_v !=
    # D_qk, as torch's SDPA allows: MLA); 0: the Q/K chunks (the packed and paged entry
    # points leave them there). Read through ``value_chunks``.
    VNCHUNK: int = flag("dense", 0)
    VW0: int = flag("dense", 0)
    VW1: int = flag("dense", 0)
    VW2: int = flag("dense", 0)


@dataclass(frozen=True, kw_only=True)
class ScoreFlags(ModFlags):
    """What every score kernel's flags begin with: tiles, head-dim chunks, causality."""

    TILE_M: int  # query rows (forward, dQ: per program; dK/dV: per inner step)
    TILE_N: int  # keys (dK/dV: per program; forward, dQ: per inner step)
    NCHUNK: int  # head-dim chunks (1..3) of widths W0 >= W1 >= W2
    W0: int
    W1: int
    W2: int
    CAUSAL: bool


@dataclass(frozen=True, kw_only=True)
class BwdFlags(ScoreFlags):
    """What the two backward kernels' flags share next: the key tail and the mask."""

    EVEN_N: bool = flag("dense")  # Skv % TILE_N == 0: no key-tail masking needed
    HAS_MASK: bool = flag("dense")
    MASK_BATCH: bool = flag("dense")  # the mask's real axes (else broadcast)
    MASK_HEAD: bool = flag("dense")
    MASK_ROWS: bool = flag("dense")  # the mask has a query axis (False: key-padding mask, one row)
    MASK_BOOL: bool = flag("dense")  # a bool mask: its bytes, selected on (``body.with_mask``)
    # packed: load Q, dO, Lse, Delta (and K, V without SEQUSED) through the whole packed
    # arrays' host-built tensor maps at element row origins, masking the rows and keys
    # past the sequence in the compute; only the stores sliced (``workload.PACKED_BWD_WHOLE``,
    # benchmarks/notes/varlen-paged.md §42a)
    WHOLE_LOADS: bool = flag("seqs", False)
    # with WHOLE_LOADS: dK, dV (dQ) rows stored by a masked scatter into the whole packed
    # arrays, not through per-sequence slices whose tensor maps the epilogue builds in the
    # kernel (``workload.PACKED_BWD_SCATTER_OUT``, benchmarks/notes/varlen-paged.md §51f)
    SCATTER_OUT: bool = flag("seqs", False)


@dataclass(frozen=True, kw_only=True)
class FwdFlags(ScoreFlags):
    """The forward's flags (``attention.attention_fwd`` / ``attention_fwd_variant``)."""

    HEAVY_FIRST: bool = flag("dense")  # causal: launch the longest query tiles (last rows) first
    EVEN_N: bool = flag("dense")  # Skv % TILE_N == 0: no key-tail masking needed
    HAS_MASK: bool = flag("dense")
    MASK_BATCH: bool = flag("dense")  # the mask's real axes (else broadcast)
    MASK_HEAD: bool = flag("dense")
    MASK_ROWS: bool = flag("dense")  # the mask has a query axis (False: key-padding mask, one row)
    MASK_BOOL: bool = flag("dense")  # a bool mask: its bytes, selected on (``body.with_mask``)
    RETURN_LSE: bool
    LAT_K: int  # load latency hints of K and V
    LAT_V: int
    SPLIT_K: bool  # write per-split partials (fp32 Out, Lse) for the combine kernel
    PACKED: bool  # rows are (query head in group, query position) pairs
    PDL: bool = flag("dense")  # launched as a programmatic dependent: wait before the first load
    # e4m3 Q, K and V^T (``attention_fwd_fp8``): both products on fp8 (P rounded to e4m3,
    # as FA3), V read from its transpose (wgmma's fp8 operands are K-major), the softmax
    # factor and V's descale per (batch, K/V head) from the descale arrays
    FP8: bool = flag("fp8", False)
    # packed: load Q (and K, V without SEQUSED) through the whole packed arrays' host-built
    # tensor maps at element row origins, as ``BwdFlags.WHOLE_LOADS`` does in the backward;
    # Out and Lse stay sliced (``workload.PACKED_FWD_WHOLE``, benchmarks/notes/
    # varlen-paged.md §51d)
    WHOLE_LOADS: bool = flag("seqs", False)
    # with WHOLE_LOADS and packed q: Out's rows stored by a masked scatter into the whole
    # packed array, not through a per-sequence slice (whose tensor map the epilogue builds
    # in the kernel; ``workload.PACKED_FWD_SCATTER_OUT``, benchmarks/notes/varlen-paged.md
    # §51e)
    SCATTER_OUT: bool = flag("seqs", False)


@dataclass(frozen=True, kw_only=True)
class DkdvFlags(BwdFlags):
    """The dK/dV kernel's flags (``backward.attention_bwd_dkdv`` / ``..._variant``)."""

    DQ_ATOMIC: bool = flag("dense")  # also reduce-add dS K into the fp32 dQacc (TMA)
    MASK_ALL: bool = flag("dense")  # apply the causal mask on every query tile (one loop body)
    KEY_ROWS: bool  # keys as the MMA rows: S^T = K Q^T, P^T and dS^T untransposed
    ONE_HEAD: bool  # one query head per K/V head: no runtime loop over the group
    # packed: mask the key tail only in the program whose key tile holds the sequence's
    # end, not on every query tile of every program (``workload.PACKED_BWD_TAIL_TILE``,
    # benchmarks/notes/varlen-paged.md §43a)
    TAIL_TILE: bool = flag("seqs", False)


@dataclass(frozen=True, kw_only=True)
class DqFlags(BwdFlags):
    """The dQ kernel's flags (``backward.attention_bwd_dq`` / ``..._variant``)."""

    # compute the rows' delta here and store it (for dK/dV, run after); else load it.
    # Every entry point: the packed one stores only its sequence's rows
    # (``workload.PACKED_DQ_DELTA``, benchmarks/notes/varlen-paged.md §43b)
    DELTA: bool
    HAS_DLSE: bool  # that delta subtracts dlse


FAMILIES = {"attention_fwd": FwdFlags, "attention_bwd_dkdv": DkdvFlags,
            "attention_bwd_dq": DqFlags}



# Derived flags, as tile functions (constants of constants stay constants).
def has_seqs(f) -> bool:
    """A packed or paged call: per-sequence lengths, bottom-right alignment."""
    return f.VARLEN_Q or f.VARLEN_K or f.PAGED


def value_chunks(f: ScoreFlags):
    """(NCHUNK, W0, W1, W2) of V and what has its head dim (the forward's accumulators
    and output; the backward's O, dO and dV): their own (``VNCHUNK``..) when V's head dim
    differs from Q/K's, else Q/K's."""
    if f.VNCHUNK > 0:
        return f.VNCHUNK, f.VW0, f.VW1, f.VW2
    return f.NCHUNK, f.W0, f.W1, f.W2


def fwd_zero_safe(f: FwdFlags) -> bool:
    """A row may end up fully masked: a user mask, causal keys past the row in a later
    split, a mask_mod, a block mask that lists no tile for the row, or a score_mod
    returning -inf (FlexAttention's masking idiom). The plain kernels without a mask have
    none."""
    return (f.HAS_MASK or f.SPLIT_K or f.HAS_MASK_MOD or f.BLOCK_SPARSE or f.HAS_SCORE_MOD
            or has_seqs(f))


def bwd_zero_safe(f: DkdvFlags | DqFlags) -> bool:
    """``fwd_zero_safe`` of the backward kernels (no split-K)."""
    return (f.HAS_MASK or f.HAS_MASK_MOD or f.BLOCK_SPARSE or f.HAS_SCORE_MOD
            or has_seqs(f))
