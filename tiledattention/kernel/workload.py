"""The host path of packed (varlen) and paged calls: validate once per plan, launch.

A plan (``plan.LaunchPlan``: the schedule, its launches in order, the device) holds what a
call's launches need but the tensors and the packed length: the compiled kernels, the
schedule, the scalar and constant arguments. It is keyed on the
facts that decide them (heads, head dim, dtype, device, strides of a token, batch size,
flags, the variant, the schedule table's bucket of ``max_seqlen``), not on the packed
length, which changes with every training batch; per call the grid axes that follow it (0 in
the plan's steps) are sized from the packed length (``programs``) or the batch, the tile map
launched (``seqmap``), then the attention kernel.

Layouts the kernels see: packed ``[total, H, D]`` tensors as ``[1, H, total, D]`` views,
the log-sum-exp ``[H, total]`` as ``[1, H, total]``; a page cache ``[pages, P, Hkv, D]`` as
``[pages, Hkv, P, D]``; ``q [B, Sq, H, D]`` of a paged call as ``[B, H, Sq, D]`` (or, for
GQA decode, its heads packed into the rows of their K/V head: ``[B, Hkv, G * Sq, D]``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import torch

from ..errors import InputError, ScheduleError
from ..headdim import plan_head_dim
from ..schedules import policy
from ..schedules.backward import BwdSchedule
from ..schedules.schedule import Schedule
from .launch import _placeholders, int_pad_views, launch_kernel, split_partials, variant_arrays
from .plan import LaunchPlan, Step, _cached, combine_step, fwd_hints, scalars, sm_count, split_count
from .spec import DELTA, DKDV_SEQS, DQ_SEQS, FWD_SEQS, SEQMAP
from .toolchain import check_gpu
from .validate import check_device
from .variant import DELTA_TILE_M, ONE_HEAD_DIMS
from .workload_check import Workload, check_paged, check_varlen, checked_cache, checked_offsets

NO_WINDOW = 1 << 30  # a window edge that never masks
PAGED_SPLIT_KEYS = 2048  # keys per program of a paged decode at most (split-K beyond)
MAX_PAGED_SPLITS = 64
# A paged decode's key splits are sized by the longest context, so a short context's
# later splits hold no key: with this on they store only -inf log-sum-exps and load
# nothing (``FwdFlags.SPLIT_SKIP``, benchmarks/notes/varlen-paged.md §50a); off: they load
# q and write a zero partial, as a dense decode's splits past a causal row do. Read when a
# plan is built; the paged plan's key holds it.
PAGED_SKIP_EMPTY = True
# A paged decode's MMA warps when the caller pins no schedule: the table's pick for the
# bucket (64 x 128, 8 worker warps, one CTA an SM at 168 registers) drew half the H200's
# bandwidth; 4 worker warps ran 1.01-1.35x at the stage's decode points (B 1-64, pages
# 16/64/256; benchmarks/notes/varlen-paged.md §50e). 0: the table's. The plan's key holds it.
PAGED_DECODE_WORKER_WARPS = 4
# ... and its occupancy at pages of ``PAGED_DECODE_OCCUPANCY_FROM`` keys and more (0: the
# table's). Occupancy 2 on 4 warps ran 1.01-1.17x at page 64 on the H200 (§50e) and
# 1.00-1.08x at pages 64/256 on the H100, but 0.92-0.95x at page 16 (§55b): pages below
# keep the table's. The plan's key holds both.
PAGED_DECODE_OCCUPANCY = 2
PAGED_DECODE_OCCUPANCY_FROM = 64


def head_dim_constants(d: int) -> dict:
    plan = plan_head_dim(d)
    w0, w1, w2 = plan.kernel_widths()
    return dict(NCHUNK=len(plan.widths), W0=w0, W1=w1, W2=w2)


def window_scalars(window: tuple[int, int]) -> dict:
    left, right = window
    return dict(WIN_L=NO_WINDOW if left < 0 else left, WIN_R=NO_WINDOW if right < 0 else right)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _bucket(w: Workload, cc: str, seq_q: int, seq_k: int):
    return policy.bucket_for(cc=cc, dtype=w.dtype, head_dim=w.head_dim, causal=w.causal,
                             seq_q=max(seq_q, 1), seq_kv=max(seq_k, 1),
                             gqa=w.heads_q // w.heads_kv)


def _index(device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@dataclass(frozen=True)
class Target:
    """What a plan reads of its GPU: the compute capability ("9.0": the schedule table's
    buckets) and the SM count (split-K). A device's (``device_target``), or one named: the
    ahead-of-time compile plans for a target it has no GPU of, so that it compiles the
    kernels a call on that GPU launches."""

    cc: str
    sms: int


def device_target(device) -> Target:
    index = _index(device)
    check_gpu(index)
    return Target(policy._capability(index), sm_count(index))


# ----------------------------------------------------------------------------- the tile map
def programs(total: int, batch: int, tile: int) -> int:
    """The grid of a packed launch: an upper bound on sum_b ceil(len_b / tile) from the
    packed length alone (no sync): each sequence wastes less than one tile."""
    return math.ceil(total / tile) + batch


def map_steps(total: int, tile: int) -> int:
    """``sequence_tile``'s bisection rounds: 2**steps exceeds any sequence's tile count."""
    return max(math.ceil(total / tile), 1).bit_length()


def tile_map(cu: torch.Tensor, total: int, tile: int, bpad: int,
             first_heavy: bool = False, zero: tuple = (), weights=None,
             offsets: bool = True) -> torch.Tensor:
    """The [programs, 2] int32 (sequence, tile) map of a packed grid, made on the GPU
    (``first_heavy``: a sequence's first tiles are its heaviest, causal dK/dV;
    ``weights``: sequence-major, the sequences with the most keys first, their key counts
    as offsets [B + 1] when ``offsets`` else values [B]). ``zero``: up to two contiguous
    [total, ...] tensors whose rows past ``cu[-1]`` the same launch sets to zero (the
    backward's gradients, allocated empty)."""
    batch = cu.shape[0] - 1
    n = programs(total, batch, tile)
    tmap = torch.empty((n, 2), dtype=torch.int32, device=cu.device)
    rows = [t.view(total, -1) for t in zero] or [int_pad_views(cu.device)[2]]
    kernel, tail = _map_launch(tile, bpad, first_heavy, len(zero), map_steps(total, tile),
                               weights is not None, offsets)
    launch_kernel(cu.device, (n, 1, 1), kernel,
                  (cu, cu if weights is None else weights, tmap, rows[0], rows[-1], *tail))
    return tmap


@functools.lru_cache(maxsize=1024)
def _map_launch(tile: int, bpad: int, first_heavy: bool, zeros: int, steps: int,
                by_weight: bool, offsets: bool) -> tuple:
    """(kernel, ordered scalar arguments) of a tile map launch, made once per set of
    values: a packed training call launches three maps, and across packed lengths only
    ``steps`` varies (host-cost.md §54d)."""
    values = seqmap_values(tile, bpad, first_heavy, zeros, steps, by_weight, offsets)
    return SEQMAP.kernel(), SEQMAP.ordered(values, skip_tensors=True)


def seqmap_values(tile: int, bpad: int, first_heavy: bool, zeros: int, steps: int = 1,
                  by_weight: bool = False, offsets: bool = True) -> dict:
    """The tile map launch's scalar and constant arguments (launch and compile alike);
    ``steps``: ``map_steps`` of the packed length."""
    return dict(STEPS=steps, TILE=tile, BPAD=bpad, FIRST_HEAVY=first_heavy,
                BY_WEIGHT=by_weight, W_OFFSETS=offsets, ZEROS=zeros)


# A packed launch's order (benchmarks/notes/varlen-paged.md §48a). ``HEAD_BLOCK`` (a
# runtime kernel argument, ``visit.mapped_program``): grid axis 0 runs blocks of heads, in
# each (map entry, head) pairs, heads fastest, so every head of a block starts its
# heaviest programs first; 0: axis 0 runs each head's whole map, axis 1 the heads, and
# the last heads' heaviest tiles start at the grid's end. A heavy map is sequence-major,
# the sequences with the most keys first, where a tile's work follows its sequence's keys
# rather than its depth (full attention; a paged cache's contexts). Measured on the
# workloads stage's points (H200): chunked prefill, every head in one block and maps by
# context, 1.18-1.25x at B 4 / 16 (B 1 unchanged). Packed batches with every head in one
# block: 0.87-1.17x, the larger batches losing (every head's K/V in flight at once); so
# their blocks hold as many heads as keep their K/V within ``L2_BLOCK_BYTES``
# (``varlen_head_block``, per call: it follows the packed length). Read when a plan is
# built; the plans' keys hold them, so an A/B may flip them.
PAGED_HEAVY_FIRST = True  # chunked prefill (packed queries on a paged cache): both
VARLEN_HEAD_BLOCKS = True  # packed forward: blocks of heads by ``varlen_head_block``
VARLEN_BWD_HEAD_BLOCKS = True  # packed backward (dQ, dK/dV): the same
VARLEN_HEAVY_MAP = True  # packed, full attention: sequence-major maps by keys
# A block's K/V bytes at most: two thirds of the H100's and H200's 50 MB L2.
L2_BLOCK_BYTES = 32 << 20
# The sequence-major map ranks the sequences by one [BPAD, BPAD] comparison per program;
# with more sequences than this (a power of two), the level-major map (many short
# sequences leave little to balance).
HEAVY_MAP_MAX_BPAD = 64


def heavy_map(bpad: int, by_keys: bool) -> bool:
    """Whether a packed launch's map is sequence-major by weight: asked for (``by_keys``),
    and few enough sequences to rank."""
    return by_keys and bpad <= HEAVY_MAP_MAX_BPAD


@functools.lru_cache(maxsize=256)  # per call, keyed by the packed length's bytes
def varlen_head_block(heads_q: int, heads_kv: int, head_bytes: int) -> int:
    """Query heads per block of a packed launch: the most (a power of two dividing
    ``heads_q``) whose K/V heads' keys and values (``head_bytes`` each) fit
    ``L2_BLOCK_BYTES``; 0 (the two-axis grid, one head at a time) where a block of two
    does not: blocks of one head, the same order on one axis, ran 1-4 % slower (§48a)."""
    group = heads_q // heads_kv
    block = 1
    while heads_q % (2 * block) == 0 and -(-2 * block // group) * head_bytes <= L2_BLOCK_BYTES:
        block *= 2
    return block if block > 1 else 0


def paged_head_block(w: Workload) -> int:
    """Chunked prefill's ``HEAD_BLOCK``: every query head (``PAGED_HEAVY_FIRST``), else 0."""
    return w.heads_q if PAGED_HEAVY_FIRST else 0


def kv_row_bytes(w: Workload) -> int:
    """One token's keys and values of one K/V head in bytes (x the packed length: one K/V
    head's, ``varlen_head_block``)."""
    return 2 * w.head_dim * w.dtype.itemsize


def kv_block(block: int, group: int, heads_kv: int) -> int:
    """The K/V heads of a block of ``block`` query heads (dK/dV's ``HEAD_BLOCK``)."""
    return math.gcd(max(block // group, 1), heads_kv) if block else 0


def packed_grid(programs_: int, heads: int, block: int) -> tuple[int, int, int]:
    """A packed launch's grid: (map entries x heads) on one axis in blocks of heads
    (``HEAD_BLOCK``), or the entries on axis 0 and the heads on axis 1."""
    return (programs_ * heads, 1, 1) if block else (programs_, heads, 1)


def with_block(tail: tuple, at: int, block: int) -> tuple:
    """A launch's prebuilt arguments with ``HEAD_BLOCK`` (position ``at``) set."""
    return (*tail[:at], block, *tail[at + 1:])


def block_tail(tails: dict, tail: tuple, spec, block: int) -> tuple:
    """``spec``'s ``tail`` with ``HEAD_BLOCK`` = ``block``, kept in the plan's ``tails`` (a
    handful of block sizes per plan): a call rebuilds no argument tuple."""
    got = tails.get((spec.name, block))
    if got is None:
        got = tails[spec.name, block] = with_block(tail, block_at(spec), block)
    return got


@functools.cache
def block_at(spec) -> int:
    """Where ``HEAD_BLOCK`` sits in a packed entry point's arguments after its tensors."""
    return spec.names()[len(spec.tensors):].index("HEAD_BLOCK")


def packed4(t: torch.Tensor) -> torch.Tensor:
    """[total, H, D] as the kernels' [1, H, total, D] (a view)."""
    return t.unsqueeze(0).transpose(1, 2)


# ----------------------------------------------------------------------------- forward plans
@dataclass(frozen=True, eq=False, kw_only=True)
class SeqPlan(LaunchPlan):
    """One packed or paged forward, fixed but for the tensors and the packed length: the
    attention kernel's step, then (paged split-K) the combine's."""

    work: Workload
    bpad: int
    return_lse: bool
    # paged only: the partials' (rows per head, heads) and key splits (1: no combine step)
    rows: int = 0
    heads: int = 0
    splits: int = 1
    packed_heads: bool = False  # GQA decode: q's heads packed into their K/V head's rows
    head_block: int = 0  # packed q: ``HEAD_BLOCK`` (``packed_grid``) unless ``l2_blocks``
    l2_blocks: bool = False  # packed q: ``HEAD_BLOCK`` per call (``varlen_head_block``)
    heavy_map: bool = False  # packed q: the map sequence-major by keys (``heavy_map``)
    tails: dict = field(default_factory=dict)  # ``l2_blocks``: the tail per block size


def _forward_schedule(w: Workload, cc: str, seq_q: int, seq_k: int, schedule) -> Schedule:
    if schedule is not None:
        return schedule if isinstance(schedule, Schedule) else Schedule.from_dict(schedule)
    return policy._choose(_bucket(w, cc, seq_q, seq_k))[0]


def _fwd_values(w: Workload, s: Schedule, mods, *, return_lse, varlen_q, varlen_k, paged,
                page_tiles=1, page_span=1, page_gather=False, split=1, split_tiles=1,
                packed=False, seq_q=0, group=1, block=0) -> dict:
    """The packed forward kernel's scalar and constant arguments by name."""
    joins = paged and page_span > 1 and not page_gather and w.page_size < PAGE_JOIN_BELOW
    values = dict(
        **scalars(w.scale, mods, FWD_SEQS), GROUP=group, SEQ_Q=seq_q, NUM_SPLITS=split,
        SPLIT_TILES=split_tiles, **window_scalars(w.window), TILE_M=s.tile_m, TILE_N=s.tile_n,
        **head_dim_constants(w.head_dim), CAUSAL=w.causal, RETURN_LSE=return_lse,
        LAT_K=s.latency_k, LAT_V=s.latency_v, SPLIT_K=split > 1, PACKED=packed,
        HAS_SCORE_MOD=mods.has_score_mod, HAS_MASK_MOD=mods.has_mask_mod, VARLEN_Q=varlen_q,
        VARLEN_K=varlen_k, SEQUSED=paged or w.seqused, PAGED=paged, PAGE_TILES=page_tiles,
        PAGE_SPAN=page_span, WINDOW=w.window != (-1, -1), PAGE_GATHER=page_gather,
        PAGE_JOIN=joins and not PAGE_KEYS_GATHERED,
        PAGE_GATHER_K=joins and PAGE_KEYS_GATHERED,
        SPLIT_SKIP=paged and split > 1 and PAGED_SKIP_EMPTY,
        **packed_fwd_rows(w.head_dim, varlen_q, varlen_k), HEAD_BLOCK=block)
    return values


def _fwd_tail(*args, **kwargs) -> tuple:
    """``_fwd_values`` in the kernel's order, after its tensors."""
    return FWD_SEQS.ordered(_fwd_values(*args, **kwargs), skip_tensors=True)


def _packed_plan(w: Workload, s: Schedule, mods, tail: tuple, device, return_lse: bool,
                 block: int, by_keys: bool, l2_blocks: bool = False) -> SeqPlan:
    """A forward over a tile map of packed query rows: the grid's programs follow the
    packed length (0, sized per call), one per (map entry, query head); ``by_keys``: the
    map sequence-major by keys (``heavy_map``)."""
    step = Step("fwd", FWD_SEQS.kernel(mods, **fwd_hints(s)), (0, w.heads_q, 1), tail)
    bpad = max(_pow2(w.batch + 1), 16)
    return SeqPlan(schedule=s, launches=(step,), device=device, work=w, bpad=bpad,
                   return_lse=return_lse, head_block=block, l2_blocks=l2_blocks,
                   heavy_map=heavy_map(bpad, by_keys))


def varlen_plan(w: Workload, device, schedule, mods, return_lse: bool,
                target: Target | None = None) -> SeqPlan:
    target = target or device_target(device)
    s = _forward_schedule(w, target.cc, w.max_q, w.max_k, schedule)
    s = replace(s, splits=1, heavy_first=False, pdl=False)
    tail = _fwd_tail(w, s, mods, return_lse=return_lse, varlen_q=True, varlen_k=True,
                     paged=False, group=w.heads_q // w.heads_kv)
    return _packed_plan(w, s, mods, tail, device, return_lse, 0,
                        VARLEN_HEAVY_MAP and not w.causal, VARLEN_HEAD_BLOCKS)


def run_varlen(plan: SeqPlan, q, k, v, cu_q, cu_k, seqused_k, aux=()):
    """(out [total_q, Hq, D], lse [Hq, total_q] or None) of a packed forward."""
    w, dev = plan.work, plan.device
    _, kernel, grid, tail = plan.launches[0]
    total = q.shape[0]
    out = torch.empty(q.shape, dtype=q.dtype, device=dev)
    lse = torch.empty((w.heads_q, total), dtype=torch.float32, device=dev) \
        if plan.return_lse else None
    if total == 0 or w.batch == 0 or k.shape[0] == 0:
        # no key anywhere: every row attends nothing (zeros, log-sum-exp -inf)
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    _, pad1, pad2 = int_pad_views(dev)
    lse_ph, mask_ph = _placeholders(dev, False)
    tmap = tile_map(cu_q, total, plan.schedule.tile_m, plan.bpad,
                    weights=cu_k if plan.heavy_map else None)
    lse_arg = lse_ph if lse is None else lse.unsqueeze(0)
    block = plan.head_block
    if plan.l2_blocks:
        block = varlen_head_block(w.heads_q, w.heads_kv, k.shape[0] * kv_row_bytes(w))
        tail = block_tail(plan.tails, tail, FWD_SEQS, block)
    args = (packed4(q), packed4(k), packed4(v), packed4(out), lse_arg, mask_ph,
            *variant_arrays(None, aux, dev), cu_q, cu_k,
            pad1 if seqused_k is None else seqused_k, pad2, tmap, *tail)
    launch_kernel(dev, packed_grid(tmap.shape[0], grid[1], block), kernel, args)
    return out, lse


MAX_PAGE_SPAN = 8  # pages per key tile at most, where pages are smaller than the tile
# Pages smaller than this many keys are gathered row by row (cp.async through the block
# table) into GATHER_TILE-key tiles (``FwdFlags.PAGE_GATHER``); 0: every page its own TMA
# load (benchmarks/notes/varlen-paged.md §40f). Page 16 gathers (1.15-1.32x the per-page
# loads on the H200 at 64-key tiles; 128-key tiles: §50a); page 32 keeps its 128-key TMA
# tiles, which beat 64-key gathered ones (1.13-1.97x, §41b). Only decode gathers (at most
# GATHER_MAX_Q new tokens a sequence): chunked prefill of 512 tokens at page 16 ran the
# per-page TMA loads 1.26x / 1.63x faster at B 8 / 64 (B 1: 0.87x; §42c), its K/V tiles
# being re-read by every query tile. Read when a plan is built (plans are cached).
PAGE_GATHER_BELOW = 32
# Key tiles over pages below this many keys join their pages' K loads into one Q K^T
# operand (``FwdFlags.PAGE_JOIN``, §49a) instead of one 16-key MMA per page; 0: never.
# The join copies K through registers, so pages of 32 and more, whose MMAs are wide
# enough, run 0.76-0.85x with it. Read when a plan is built.
PAGE_JOIN_BELOW = 32
# Those key tiles' K rows gathered by cp.async straight into the operand
# (``FwdFlags.PAGE_GATHER_K``) instead of joined from per-page TMA loads; V stays per page.
# Read when a plan is built; the paged plan's key holds it (§50b).
PAGE_KEYS_GATHERED = True
GATHER_MAX_Q = 16
# A chunked prefill whose key tiles gather rows (pages below ``PAGE_JOIN_BELOW``) runs this
# schedule (a label, e.g. ``64x128_o1_c1_lk2_lv4_w4``) where the caller pins none; "": the
# table's. tileiras moves cp.async gathers into their own pipelined loop only at 4 worker
# warps and occupancy 1; at the table's 8 warps each tile waits for its own rows
# (benchmarks/notes/varlen-paged.md §51b; repro 7). With K and V both gathered on 4 warps
# it ran 1.13-1.18x the 8-warp gather but 0.88x the default (K gathered, V per page) on
# the H100 (§55b): not taken. The plan's key holds it.
GATHERED_PREFILL_SCHEDULE = ""
# Keys per gathered tile: 128 halves the softmax steps and doubles each MMA's width
# against 64 (decode at page 16 on 8 warps: 1.46-1.50x at B 8-64, 1.08x at B 1, §50a; on
# 4 warps the H100 read 0.99-1.00x at B 8-64 and 0.92x at B 1, §55b). The plan's key
# holds it.
GATHER_TILE = 128


def _paged_tiles(s: Schedule, page: int, seq_q: int) -> tuple[Schedule, int, int, bool]:
    """(schedule, key tiles per page, pages per key tile, gathered): a key tile lies within
    one page, or spans up to ``MAX_PAGE_SPAN`` whole pages (one TMA load and MMA each, one
    softmax step: benchmarks/notes/varlen-paged.md §39b) when pages are smaller than the
    schedule's tile; pages below ``PAGE_GATHER_BELOW`` keys are gathered into
    ``GATHER_TILE``-key tiles (§40f) where a sequence has at most ``GATHER_MAX_Q`` new
    tokens (``seq_q``, the longest)."""
    if page < PAGE_GATHER_BELOW and seq_q <= GATHER_MAX_Q:
        span = max(1, min(GATHER_TILE // page, MAX_PAGE_SPAN))
        return replace(s, tile_n=span * page), 1, span, True
    if s.tile_n <= page:
        return s, page // s.tile_n, 1, False
    span = max(1, min(s.tile_n // page, MAX_PAGE_SPAN))
    return replace(s, tile_n=span * page), 1, span, False


def paged_plan(w: Workload, device, schedule, mods, return_lse: bool,
               target: Target | None = None) -> SeqPlan:
    target = target or device_target(device)
    group = w.heads_q // w.heads_kv
    if w.packed_q:
        s = _forward_schedule(w, target.cc, w.max_q, w.max_k, schedule)
        if schedule is None and GATHERED_PREFILL_SCHEDULE and w.page_size < PAGE_JOIN_BELOW:
            s = Schedule.from_label(GATHERED_PREFILL_SCHEDULE)
        s, tiles, span, gather = _paged_tiles(
            replace(s, splits=1, heavy_first=False, pdl=False), w.page_size, w.max_q)
        tail = _fwd_tail(w, s, mods, return_lse=return_lse, varlen_q=True, varlen_k=False,
                         paged=True, page_tiles=tiles, page_span=span, page_gather=gather,
                         group=group, block=paged_head_block(w))
        return _packed_plan(w, s, mods, tail, device, return_lse, paged_head_block(w),
                            PAGED_HEAVY_FIRST)
    seq_q = w.max_q
    # GQA decode: the group's query heads share the rows of one tile (K/V read once).
    packed = group > 1 and seq_q <= 16 and not mods.key
    heads, rows, kgroup = (w.heads_kv, group * seq_q, 1) if packed else (w.heads_q, seq_q,
                                                                           group)
    s = _forward_schedule(w, target.cc, seq_q, w.max_k, schedule)
    if schedule is None:
        s = decode_schedule(s, w.page_size)
    s, tiles, span, gather = _paged_tiles(replace(s, heavy_first=False, pdl=False),
                                          w.page_size, seq_q)
    if rows <= 64 and s.tile_m > 64:
        s = replace(s, tile_m=64)
    m_tiles = math.ceil(rows / s.tile_m)
    key_tiles = math.ceil(w.max_k / s.tile_n)
    splits = split_count(s, m_tiles * heads * w.batch, key_tiles, target.sms)
    if not s.splits:
        # Ragged contexts: the longest sequence's program would run alone at the end of
        # the grid; no program takes more than PAGED_SPLIT_KEYS keys
        # (benchmarks/notes/varlen-paged.md §38c).
        splits = min(max(splits, math.ceil(w.max_k / PAGED_SPLIT_KEYS)), MAX_PAGED_SPLITS,
                     key_tiles)
    split_tiles = math.ceil(key_tiles / splits)
    splits = math.ceil(key_tiles / split_tiles)
    tail = _fwd_tail(w, s, mods, return_lse=return_lse or splits > 1, varlen_q=False,
                     varlen_k=False, paged=True, page_tiles=tiles, page_span=span,
                     page_gather=gather, split=splits, split_tiles=split_tiles, packed=packed,
                     seq_q=seq_q, group=kgroup)
    # The batch axis (0) is the call's: B of q [B, Sq, H, D].
    steps = [Step("fwd", FWD_SEQS.kernel(mods, **fwd_hints(s)),
                  (m_tiles, heads * splits, 0), tail)]
    if splits > 1:
        steps.append(combine_step(w.head_dim, rows, return_lse, splits, (heads, 0)))
    return SeqPlan(schedule=s, launches=tuple(steps), device=device, work=w, bpad=16,
                   return_lse=return_lse, rows=rows, heads=heads, splits=splits,
                   packed_heads=packed)


def decode_schedule(s: Schedule, page: int) -> Schedule:
    """The table's schedule of a paged decode over pages of ``page`` keys, with
    ``PAGED_DECODE_WORKER_WARPS`` and (from ``PAGED_DECODE_OCCUPANCY_FROM`` keys a page)
    ``PAGED_DECODE_OCCUPANCY`` where set."""
    if PAGED_DECODE_WORKER_WARPS:
        s = replace(s, worker_warps=PAGED_DECODE_WORKER_WARPS)
    if PAGED_DECODE_OCCUPANCY and page >= PAGED_DECODE_OCCUPANCY_FROM:
        s = replace(s, occupancy=PAGED_DECODE_OCCUPANCY)
    return s


def _paged_q(plan: SeqPlan, q: torch.Tensor) -> torch.Tensor:
    """q [B, Sq, Hq, D] as the kernel's [B, H, rows, D]: a view, or for packed GQA with
    Sq > 1 a copy (its rows interleave heads and positions)."""
    w = plan.work
    b, sq = q.shape[0], q.shape[1]
    if not plan.packed_heads:
        return q.transpose(1, 2)
    group = w.heads_q // w.heads_kv
    if sq == 1:  # a decode step: the heads already in the packed order, one view
        return q.reshape(b, w.heads_kv, group, w.head_dim)
    return q.reshape(b, sq, w.heads_kv, group, w.head_dim).permute(0, 2, 3, 1, 4).reshape(
        b, w.heads_kv, group * sq, w.head_dim)


def run_paged(plan: SeqPlan, q, k_cache, v_cache, page_table, cache_seqlens, cu_q, aux=()):
    w, dev = plan.work, plan.device
    _, pad1, pad2 = int_pad_views(dev)
    lse_ph, mask_ph = _placeholders(dev, False)
    kc, vc = k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    variant = variant_arrays(None, aux, dev)
    _, kernel, grid, tail = plan.launches[0]
    if w.packed_q:
        total = q.shape[0]
        out = torch.empty(q.shape, dtype=q.dtype, device=dev)
        lse = torch.empty((w.heads_q, total), dtype=torch.float32, device=dev) \
            if plan.return_lse else None
        if total == 0 or w.batch == 0:
            return out, lse
        tmap = tile_map(cu_q, total, plan.schedule.tile_m, plan.bpad,
                        weights=cache_seqlens if plan.heavy_map else None, offsets=False)
        lse_arg = lse_ph if lse is None else lse.unsqueeze(0)
        launch_kernel(dev, packed_grid(tmap.shape[0], grid[1], plan.head_block), kernel,
                      (packed4(q), kc, vc, packed4(out), lse_arg, mask_ph, *variant, cu_q,
                       cu_q, cache_seqlens, page_table, tmap, *tail))
        return out, lse
    b, sq = q.shape[0], q.shape[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=dev)
    lse = torch.empty((b, w.heads_q, sq), dtype=torch.float32, device=dev) \
        if plan.return_lse else None
    if b == 0 or sq == 0:
        return out, lse
    kq = _paged_q(plan, q)
    rows_shape = (b, plan.heads, plan.rows, w.head_dim)
    seqs = (pad1, pad1, cache_seqlens, page_table, pad2)
    grid = (grid[0], grid[1], b)
    direct = not plan.packed_heads or sq == 1  # out viewed as the kernel's rows
    kout = out.transpose(1, 2) if not plan.packed_heads else (
        out.view(rows_shape) if sq == 1 else torch.empty(rows_shape, dtype=q.dtype,
                                                          device=dev))
    if plan.splits == 1:
        klse = lse_ph if lse is None else (
            lse if not plan.packed_heads else lse.view(b, plan.heads, plan.rows))
        launch_kernel(dev, grid, kernel, (kq, kc, vc, kout, klse, mask_ph, *variant, *seqs,
                                          *tail))
    else:
        part, part_lse = split_partials((b, plan.heads * plan.splits, plan.rows, w.head_dim),
                                        dev)
        launch_kernel(dev, grid, kernel, (kq, kc, vc, part, part_lse, mask_ph, *variant,
                                          *seqs, *tail))
        klse = lse_ph if lse is None else (
            lse if not plan.packed_heads else lse.view(b, plan.heads, plan.rows))
        _, combine, (r_tiles, heads, _), combine_tail = plan.launches[1]
        launch_kernel(dev, (r_tiles, heads, b), combine,
                      (part, part_lse, kout, klse, *combine_tail))
    if not direct:
        group = w.heads_q // w.heads_kv
        out.copy_(kout.view(b, w.heads_kv, group, sq, w.head_dim).permute(0, 3, 1, 2, 4)
                  .reshape(b, sq, w.heads_q, w.head_dim))
    return out, lse


# ----------------------------------------------------------------------------- backward
@dataclass(frozen=True, eq=False, kw_only=True)
class SeqBwdPlan(LaunchPlan):
    """A packed backward: the delta (unless dQ computes it: ``PACKED_DQ_DELTA``), dQ and
    dK/dV steps in that order, each over its tile map (programs sized per call: 0), one
    program row per query (K/V, for dK/dV) head."""

    bpad: int
    l2_blocks: bool = False  # dQ and dK/dV: ``HEAD_BLOCK`` per call (``varlen_head_block``)
    heavy_map: bool = False  # full attention: both maps sequence-major by keys
    tails: dict = field(default_factory=dict)  # ``l2_blocks``: the tails per block size


# The packed backward loads Q, dO, Lse, Delta (and K, V without seqused_k) through the
# whole packed arrays' host-built tensor maps at element row origins, masking what lies
# past each sequence in the compute, instead of slicing every array per program (each
# slice a tensor map built in the kernel: ~8 per dK/dV program, ~7 per dQ one;
# ``DkdvFlags.WHOLE_LOADS``, benchmarks/notes/varlen-paged.md §42a). Read when a plan is
# built; the backward plan's key holds it (``varlen._bwd_plan``), so an A/B may flip it.
# On: 3-4 % faster forward+backward on the H200, gradients bit-identical (§42h).
PACKED_BWD_WHOLE = True
# The packed forward's loads likewise: Q (packed or chunked-prefill rows) and K, V (packed,
# without seqused_k) through the whole arrays' tensor maps, Out and Lse sliced
# (``FwdFlags.WHOLE_LOADS``). The sliced forward builds a tensor map in the kernel per
# sliced array and program: 4 in a packed one, 3 in a page-16 chunked prefill (sm_90
# SASS, §51d). On: packed forward 1.013-1.064x on the H200 (geomean 1.032, causal D 128
# 1.04-1.06x), chunked prefill 1.000-1.019x, outputs bit-identical (§53c). The varlen and
# paged plans' keys hold it, so an A/B may flip it.
PACKED_FWD_WHOLE = True
# With it, the packed forward's Out rows stored by a masked scatter into the whole array
# (``FwdFlags.SCATTER_OUT``): no tensor map left to build in the epilogue, where its
# global round trip is exposed (§51e). Off until timed; the plans' keys hold it.
PACKED_FWD_SCATTER_OUT = False
# The packed backward's dK, dV and dQ rows likewise (``BwdFlags.SCATTER_OUT``, §51f). Off
# until timed; the backward plan's key holds it.
PACKED_BWD_SCATTER_OUT = False
SCATTER_OUT_MAX_HEAD_DIM = 128  # D 256's [64, 256] scatter spilled (56 STL, §51e)


def packed_fwd_rows(head_dim: int, varlen_q: bool, varlen_k: bool) -> dict:
    """How the packed forward loads and stores its rows (the switches above): its
    ``WHOLE_LOADS`` (where q, or k and v, are packed) and ``SCATTER_OUT`` (with them, the
    origin it stores from, and packed query rows) constants."""
    whole = PACKED_FWD_WHOLE and (varlen_q or varlen_k)
    return dict(WHOLE_LOADS=whole, SCATTER_OUT=whole and PACKED_FWD_SCATTER_OUT and varlen_q
                and head_dim <= SCATTER_OUT_MAX_HEAD_DIM)


def packed_bwd_rows(head_dim: int) -> dict:
    """How the packed backward loads and stores its rows (the switches above): its
    ``WHOLE_LOADS`` and ``SCATTER_OUT`` constants."""
    return dict(WHOLE_LOADS=PACKED_BWD_WHOLE,
                SCATTER_OUT=PACKED_BWD_SCATTER_OUT and head_dim <= SCATTER_OUT_MAX_HEAD_DIM)
# The packed backward's delta launch at occupancy 4 (64 registers): without a hint tileiras
# gives it 255 registers, one CTA of 256 threads an SM, and it ran 63 µs of a 1.6 ms step
# at 16k causal D 128 (ncu: 12.5 % theoretical occupancy; benchmarks/notes/varlen-paged.md
# §42j). 0: no hint. The backward plan's key holds it.
PACKED_DELTA_OCCUPANCY = 4
# The causal packed dK/dV masks the key tail only in the program whose key tile holds the
# sequence's end (``DkdvFlags.TAIL_TILE``), so the tiles below the diagonal run unmasked;
# off: on every query tile of every program, as a dense kernel whose Skv is not a tile
# multiple. Measured on the H200 (benchmarks/notes/varlen-paged.md §43a): causal 1.8-3.9 %
# faster forward+backward, non-causal -1.1..+1.2 % (its one masked tile per sequence does
# not pay for the runtime branch), so causal only; and D <= 192: at D 256 the branch's
# second loop body spills more (stack 120 -> 152 bytes, sm_90). The backward plan's key
# holds it.
PACKED_BWD_TAIL_TILE = True
TAIL_TILE_MAX_HEAD_DIM = 192
# The packed dQ computes its rows' delta = rowsum(dO * O) [- dlse] and stores it for the
# dK/dV kernel (``DqFlags.DELTA``: a masked scatter of the sequence's rows only,
# ``backward.seq_row_stats``), as the dense dQ does: no delta launch (two launches, not
# three). Off: the ``attention_bwd_delta`` launch over the packed rows first (its 63 µs of
# a 1.6 ms step at 16k causal D 128, 45 µs at occupancy 4: benchmarks/notes/varlen-paged.md
# §42j, §43b). The backward plan's key holds it.
PACKED_DQ_DELTA = True


def packed_bwd_roles() -> tuple[str, ...]:
    """The packed backward's launches in order."""
    return ("dq", "dkdv") if PACKED_DQ_DELTA else ("delta", "dq", "dkdv")


def packed_tail_tile(causal: bool, head_dim: int) -> bool:
    """``DkdvFlags.TAIL_TILE`` of a packed backward."""
    return PACKED_BWD_TAIL_TILE and causal and head_dim <= TAIL_TILE_MAX_HEAD_DIM


# The packed gradients are allocated empty; the dQ and dK/dV tile maps' launches zero the
# rows past the last sequence (``seqmap.zero_tail``), the only rows no program writes.
# Off: zero-filled allocations, three full writes of dQ, dK, dV per call (~60 µs of a
# 1.3 ms step at 16k causal D 128 on the H200; benchmarks/notes/varlen-paged.md §44a).
# Read per call.
PACKED_ZERO_TAIL = True


# The packed backward's own schedules (``schedules.backward.key_rows_bwd_schedule``: keys as
# the dK/dV MMA rows at 64 < D <= 128, benchmarks/notes/varlen-paged.md §43c); off: the
# default. The backward plan's key holds it.
PACKED_BWD_KEY_ROWS = True


# tileiras 13.4.92 exits 5 ("failed to compile Tile IR program") on the packed dQ program
# for sm_100 at 64 x 64 dQ tiles, at D 128 and 256, and at some other tiles; 64 x 128 at
# occupancy 2 compiles at every D, mask and flag (benchmarks/notes/varlen-paged.md §52e).
# sm_90 and sm_120 compile the default. Not timed on a Blackwell GPU.
BLACKWELL_DQ = dict(dq_m=64, dq_n=128, occupancy=2)


def varlen_bwd_schedule(w: Workload, cc: str) -> BwdSchedule:
    """Not the table's: its backward entries were tuned on dense batches of one length, and
    on packed documents (median 512 tokens) its 128-key picks ran our varlen backward slower
    than the block-mask packing on the default (benchmarks/notes/varlen-paged.md §38c). The
    default, with keys as the MMA rows at 64 < D <= 128 (§43c). dQ has its own kernel (the
    packed kernels have no reduce-add dQ). On sm_100 (capability 10.x) dQ's tiles are
    ``BLACKWELL_DQ``'s, which compile there."""
    from ..schedules.backward import default_bwd_schedule, key_rows_bwd_schedule

    s = (key_rows_bwd_schedule if PACKED_BWD_KEY_ROWS else default_bwd_schedule)(
        w.head_dim, w.causal)
    return replace(s, **BLACKWELL_DQ) if cc.split(".")[0] == "10" else s


def varlen_bwd_plan(w: Workload, device, mods, has_dlse: bool, schedule=None,
                    roles: tuple[str, ...] | None = None,
                    target: Target | None = None) -> SeqBwdPlan:
    """The packed backward's launches: ``roles`` (default ``packed_bwd_roles``) in order;
    the ahead-of-time compile names "delta" to compile it whichever the switch. Without a
    pinned ``schedule``, ``varlen_bwd_schedule`` for ``target`` (default the device's)."""
    if schedule is not None and schedule.dq != "kernel":  # a pinned one (a benchmark's)
        raise ScheduleError(f"backward schedule {schedule.label()}: the packed backward has "
                            "no reduce-add dQ; pin one without _atomic")
    s = schedule or varlen_bwd_schedule(w, (target or device_target(device)).cc)
    hd = head_dim_constants(w.head_dim)
    common = dict(**scalars(w.scale, mods, DKDV_SEQS), GROUP=w.heads_q // w.heads_kv,
                  **window_scalars(w.window), **hd, CAUSAL=w.causal,
                  HAS_SCORE_MOD=mods.has_score_mod, HAS_MASK_MOD=mods.has_mask_mod,
                  SEQUSED=w.seqused, WINDOW=w.window != (-1, -1),
                  **packed_bwd_rows(w.head_dim), HEAD_BLOCK=0)
    one_head = w.heads_q == w.heads_kv and w.head_dim in ONE_HEAD_DIMS
    dkdv_values = dict(common, TILE_M=s.dkdv_m, TILE_N=s.dkdv_n, KEY_ROWS=s.key_rows,
                       ONE_HEAD=one_head, TAIL_TILE=packed_tail_tile(w.causal, w.head_dim))
    dq_values = dict(common, TILE_M=s.dq_m, TILE_N=s.dq_n, **packed_dq_delta(has_dlse))
    steps = {
        "delta": lambda: Step("delta", DELTA.kernel(**delta_hints()), (0, w.heads_q, 1),
                              DELTA.ordered(packed_delta_values(w.head_dim, has_dlse),
                                            skip_tensors=True)),
        "dq": lambda: Step("dq", DQ_SEQS.kernel(mods, **s.hints()), (0, w.heads_q, 1),
                           DQ_SEQS.ordered(dq_values, skip_tensors=True)),
        "dkdv": lambda: Step("dkdv", DKDV_SEQS.kernel(mods, **s.hints()), (0, w.heads_kv, 1),
                             DKDV_SEQS.ordered(dkdv_values, skip_tensors=True))}
    bpad = max(_pow2(w.batch + 1), 16)
    roles = packed_bwd_roles() if roles is None else roles
    return SeqBwdPlan(schedule=s, launches=tuple(steps[r]() for r in roles),
                      device=device, bpad=bpad, l2_blocks=VARLEN_BWD_HEAD_BLOCKS,
                      heavy_map=heavy_map(bpad, VARLEN_HEAVY_MAP and not w.causal))


def packed_dq_delta(has_dlse: bool) -> dict:
    """The packed dQ's delta constants (``PACKED_DQ_DELTA``)."""
    return dict(DELTA=PACKED_DQ_DELTA, HAS_DLSE=PACKED_DQ_DELTA and has_dlse)


def packed_delta_values(head_dim: int, has_dlse: bool) -> dict:
    """The packed delta launch's constants."""
    wd = _pow2(head_dim)
    return dict(TILE_M=DELTA_TILE_M, WD=wd, WQ=wd, HAS_DLSE=has_dlse, ZERO_DQ=False)


def delta_hints() -> dict:
    return {"occupancy": PACKED_DELTA_OCCUPANCY} if PACKED_DELTA_OCCUPANCY else {}


def run_varlen_backward(plan: SeqBwdPlan, w: Workload, q, k, v, out, lse, dout, dlse, cu_q,
                        cu_k, seqused_k, aux=(), captured=()):
    """(dq, dk, dv) of a packed forward: delta over the packed rows (unless the dQ
    programs compute their rows' own, ``PACKED_DQ_DELTA`` when the plan was built), then dQ
    over the query tiles and dK/dV over the key tiles, each through its tile map.

    Delta's rows that no sequence covers (past ``cu_q[-1]``) stay unwritten when dQ
    computes it: the dK/dV programs read them only as rows past their sequence's end,
    through the whole arrays (``backward.rows_past_end`` selects delta 0 there) or a
    slice that ends at the sequence (TMA zeros past it)."""
    dev = q.device
    total_q, total_k = q.shape[0], k.shape[0]
    if total_q == 0 or w.batch == 0 or total_k == 0:
        return tuple(torch.zeros_like(t, memory_format=torch.contiguous_format)
                     for t in (q, k, v))
    # every row is written: a sequence's by its programs, the rest by the tile maps' launches
    fresh = torch.empty_like if PACKED_ZERO_TAIL else torch.zeros_like
    dq, dk, dv = (fresh(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    zero_q, zero_kv = ((dq,), (dk, dv)) if PACKED_ZERO_TAIL else ((), ())
    pad, pad1, _ = int_pad_views(dev)
    q4, k4, v4, o4 = packed4(q), packed4(k), packed4(v), packed4(out)
    do4 = packed4(dout if dout.stride(-1) == 1 else dout.contiguous())
    delta = torch.empty((1, w.heads_q, total_q), dtype=torch.float32, device=dev)
    lse3 = lse.unsqueeze(0).contiguous()
    dlse3 = delta if dlse is None else dlse.to(torch.float32).unsqueeze(0).contiguous()
    steps = {step.role: step for step in plan.launches}
    (_, qkernel, qgrid, qtail), (_, kkernel, kgrid, ktail) = steps["dq"], steps["dkdv"]
    if "delta" in steps:
        _, dkernel, dgrid, dtail = steps["delta"]
        launch_kernel(dev, (math.ceil(total_q / DELTA_TILE_M), dgrid[1], dgrid[2]), dkernel,
                      (o4, do4, delta, dlse3, delta.view(1, w.heads_q, total_q, 1), *dtail))
    seqused = pad1 if seqused_k is None else seqused_k
    mask = _placeholders(dev, False)[1]
    variant = variant_arrays(None, aux, dev)
    qmap = tile_map(cu_q, total_q, plan.schedule.dq_m, plan.bpad, zero=zero_q,
                    weights=cu_k if plan.heavy_map else None)
    qblock = kblock = 0
    if plan.l2_blocks:
        qblock = varlen_head_block(w.heads_q, w.heads_kv, total_k * kv_row_bytes(w))
        kblock = kv_block(qblock, w.heads_q // w.heads_kv, w.heads_kv)
        qtail = block_tail(plan.tails, qtail, DQ_SEQS, qblock)
        ktail = block_tail(plan.tails, ktail, DKDV_SEQS, kblock)
    launch_kernel(dev, packed_grid(qmap.shape[0], qgrid[1], qblock), qkernel,
                  (q4, k4, v4, do4, lse3, delta, mask, *variant, o4, dlse3, packed4(dq), cu_q,
                   cu_k, seqused, qmap, *qtail))
    kmap = tile_map(cu_k, total_k, plan.schedule.dkdv_n, plan.bpad, w.causal,
                    zero=zero_kv, weights=cu_q if plan.heavy_map else None)
    grads = tuple(pad if g is None else g for g in captured)
    grads = (*grads, *([pad] * (4 - len(grads))))
    launch_kernel(dev, packed_grid(kmap.shape[0], kgrid[1], kblock), kkernel,
                  (q4, k4, v4, do4, lse3, delta, mask, *variant, *grads, packed4(dk),
                   packed4(dv), delta.view(1, w.heads_q, total_q, 1), cu_q, cu_k, seqused,
                   kmap, *ktail))
    return dq, dk, dv


# ----------------------------------------------------------------------------- entry
def _facts(t) -> tuple:
    """A packed tensor's plan facts: not its length, nor the strides that follow from it
    (a [1, H, T, D] view's token stride is D, its head stride T * D): one plan serves every
    packed length. cuTile specialises on the strides' alignment at launch."""
    return None if t is None else (type(t), t.shape[1:], t.stride(-1), t.dtype, t.device)


_Tensor, _STRIDED = torch.Tensor, torch.strided


def _keyable(*ts) -> bool:
    """Plain dense tensors (or None): their facts make a plan key. Anything else is
    checked first (the typed error) and never cached. A loop, not ``all`` over a
    generator: 0.7 against 1.2 µs a call (host-cost.md §54e)."""
    for t in ts:
        if t is not None and (type(t) is not _Tensor or t.layout is not _STRIDED
                              or t.is_nested):
            return False
    return True


def _checked_now(t) -> bool:
    """Whether an offsets tensor's values may be read here: not while a CUDA graph is
    captured or a compiler traces (a sync would break both)."""
    return (t.device.type == "cuda" and not torch.cuda.is_current_stream_capturing()
            and not torch.compiler.is_compiling())


# Plan keys whose call has not read its offsets' values yet (``checked_offsets``,
# ``checked_cache``): added when a plan is built, removed once a call of it could read them
# (``_checked_now``). Empty on the hot path, so a call pays one truth test, not a lookup.
_unread: set = set()


def _unread_plan(key, build):
    """``_cached``'s plan of ``key``, its key marked unread when it is built here."""
    def fresh():
        plan = build()  # a build that raises leaves nothing unread
        _unread.add(key)
        return plan

    return _cached(key, fresh)


def varlen_setup(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale, window_size,
                 softcap, mods, return_lse, schedule):
    """(plan, work) of a packed call: checked and planned on the first call of a plan key
    (its offsets' values read then, once: a sync), found in one lookup afterwards."""
    def build():
        w = check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale,
                         window_size, softcap)
        check_device(q)
        return varlen_plan(w, q.device, schedule, mods, return_lse)

    if not _keyable(q, k, v, cu_q, cu_k, seqused_k):
        return build()
    key = ("varlen", _facts(q), _facts(k), _facts(v), _facts(cu_q), _facts(cu_k),
           _facts(seqused_k), max_q, max_k, type(causal), causal, type(scale), scale,
           tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size,
           softcap, mods.key, bool(return_lse), None if schedule is None else str(schedule),
           policy.generation(), VARLEN_HEAD_BLOCKS, VARLEN_HEAVY_MAP, PACKED_FWD_WHOLE,
           PACKED_FWD_SCATTER_OUT)
    plan = _unread_plan(key, build)
    if _unread and key in _unread and _checked_now(cu_q):
        if plan.work.batch:
            checked_offsets(cu_q, cu_k, seqused_k, max_q, max_k, q.shape[0], k.shape[0])
        _unread.discard(key)
    if max_q > q.shape[0] or max_k > k.shape[0]:
        raise InputError(f"max_seqlen_q={max_q} / max_seqlen_k={max_k} exceed the packed "
                         f"tokens ({q.shape[0]} / {k.shape[0]})")
    return plan


def paged_setup(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, max_q, causal, scale,
                window_size, softcap, mods, return_lse, schedule):
    packed = cu_q is not None

    def build():
        w = check_paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, max_q, causal,
                        scale, window_size, softcap)
        check_device(q)
        return paged_plan(w, q.device, schedule, mods, return_lse)

    if not _keyable(q, k_cache, v_cache, page_table, cache_seqlens, cu_q):
        return build()
    key = ("paged", _facts(q) if packed else (type(q), q.shape, q.stride(), q.dtype,
                                              q.device),
           (k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device), _facts(v_cache),
           (page_table.shape, page_table.dtype), _facts(cache_seqlens), _facts(cu_q), max_q,
           type(causal), causal, type(scale), scale,
           tuple(window_size) if isinstance(window_size, (tuple, list)) else window_size,
           softcap, mods.key, bool(return_lse), None if schedule is None else str(schedule),
           policy.generation(), PAGED_HEAVY_FIRST, PAGE_JOIN_BELOW, MAX_PAGE_SPAN,
           PAGED_SKIP_EMPTY, PAGED_SPLIT_KEYS, GATHER_TILE, PAGE_GATHER_BELOW,
           PAGE_KEYS_GATHERED, GATHER_MAX_Q, PAGED_DECODE_WORKER_WARPS,
           PAGED_DECODE_OCCUPANCY, PAGED_DECODE_OCCUPANCY_FROM, GATHERED_PREFILL_SCHEDULE,
           PACKED_FWD_WHOLE, PACKED_FWD_SCATTER_OUT)
    plan = _unread_plan(key, build)
    if _unread and key in _unread and _checked_now(cache_seqlens):
        checked_cache(page_table, cache_seqlens, k_cache.shape[0], k_cache.shape[1], cu_q,
                      max_q, q.shape[0] if packed else None)
        _unread.discard(key)
    return plan
