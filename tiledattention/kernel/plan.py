"""The per-call plans: what a launch needs, worked out once per set of launch-determining facts.

One cache holds the forward's and the backward's plans. A call's key holds every fact that
decides the launch: each tensor's type, shape, strides, dtype and device (the mask's too),
``causal`` and ``scale`` with their types, the GQA and LSE flags, the schedule, the variant
(``score_mod`` / ``mask_mod`` identity and block mask) and the generation of the schedule
table. The first call with a key runs the checks (typed errors), picks the schedule, and
fixes the variant, grid, compiled kernels and scalar arguments; a repeat call finds the plan
in one dict lookup. Tensor data and addresses are not facts of the plan: they are read at
every launch.

A decode loop whose KV cache grows by a token per step changes K's shape (and, for a dense
cache, its strides) every step: a new key. Its plan is found in a *family*: the key with
K/V's key length (and the strides that follow from it) and the mask's key axis taken out.
A plan depends on Skv only through the schedule table's S bucket, the key tiles the
longest row visits, ``Skv % tile_n == 0`` and the mask's target shape, so the family keeps
one plan per (bucket, key tiles, even) and hands it on with the call's Skv in
``mask_target`` (``tests/test_plan_growing_cache.py`` checks every field against
``build_plan`` step by step).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import mods as _mods
from ..headdim import MAX_HEAD_DIM, plan_head_dim
from ..schedules import policy
from ..schedules.backward import BwdSchedule, default_bwd_schedule
from ..schedules.schedule import Schedule, default_fp8_schedule, default_schedule
from ..schedules.table import seq_bucket
from .geometry import grid_for
from .mask import mask_layout
from .spec import COMBINE, DELTA, FWD_FP8, TRANSPOSE, score_specs
from .toolchain import check_gpu
from .validate import (
    FP8_INPUT,
    Problem,
    check_backward_head_dims,
    check_descale,
    check_descales_given,
    check_device,
    check_fp8_shapes,
    check_inputs,
    resolve_schedule,
    schedule_head_dim,
)
from .variant import DELTA_TILE_M, BwdVariant, Flags, Variant

LOG2E = 1.0 / math.log(2.0)
PACK_MAX_SEQ_Q = 16  # GQA packing up to speculative-decode lengths
SPLIT_BELOW = 2  # split-K: only grids of at most half a wave (sms / SPLIT_BELOW programs)
TARGET_WAVES = 2  # split-K: aim the grid at about two programs per SM
# ... but at one where the grid has at most sms / FEW_PROGRAMS programs (16 on an H100): two
# per SM leave each split a few key tiles, and each split adds a Q load and a partial.
# Measured on the H100 (benchmarks/notes/decode.md §35c): B1/B2 GQA decode (8 and 16 programs)
# 0.69-1.03x the time of two per SM; grids of 32 and 64 programs lost up to 6 % with one per SM.
FEW_PROGRAMS = 8
MIN_SPLIT_TILES = 2  # split-K: key tiles per split at least (each split writes partials)
MAX_PLANS = 4096  # a process that sees ever new shapes (growing decode) must not grow without end

_plans: dict[tuple, object] = {}
_Tensor = torch.Tensor


class Step(NamedTuple):
    """One kernel launch of a plan: its role ("fwd", "combine", "delta", "dq", "dkdv"), the
    compiled kernel, its grid and its arguments after the per-call tensors, in the kernel's
    order. A grid axis of 0 is sized per call (a packed plan's tile map, a paged batch)."""

    role: str
    kernel: object
    grid: tuple[int, int, int]
    tail: tuple


@dataclass(frozen=True, eq=False, kw_only=True)
class LaunchPlan:
    """What every plan (dense and packed, forward and backward) holds under the same names:
    the schedule, its launches in the order they run, the device. Each kind adds the facts
    its per-call tensors need (shapes, the mask's target, the packed workload)."""

    schedule: Schedule | BwdSchedule
    launches: tuple[Step, ...]
    device: torch.device


@dataclass(frozen=True, eq=False, kw_only=True)
class Plan(LaunchPlan):
    """One forward launch, fixed but for the tensors' data: the attention kernel's step
    (carrying the schedule's hints and variant functions), then with split-K the combine's."""

    variant: Variant
    out_shape: tuple[int, int, int, int]
    lse_shape: tuple[int, ...]
    dtype: torch.dtype
    copy_qkv: bool  # some head-dim axis is not unit-stride: copy before launching
    mask_target: tuple[int, int, int, int] | None  # [B, H, Sq, Skv] when a mask is given
    # GQA packing: q and out are viewed as [B, Hkv, GROUP * Sq, D] (None: not packed; out
    # with its own head dim, D_v).
    packed_shape: tuple[int, int, int, int] | None = None
    # Split-K: the partial outputs' shape [B, H' * splits, R, D] (fp32; the LSE drops D),
    # which the combine step reduces (None: no split, one step).
    part_shape: tuple[int, int, int, int] | None = None
    # Programmatic dependent launch of the attention kernel (the schedule's ``pdl``; the
    # kernel then waits before its first load). The combine kernel launches plainly.
    pdl: bool = False
    blocks: tuple = ()  # the block mask's (count, index) lists at this plan's tiles
    scale: float = 1.0  # the call's softmax scale (the backward needs it)

    @property
    def splits_per_head(self) -> int:
        """Key splits per (batch, head): 1 without split-K."""
        if self.part_shape is None:
            return 1
        return self.launches[0].grid[1] // self.launches[1].grid[1]


@dataclass(frozen=True, eq=False, kw_only=True)
class BwdPlan(LaunchPlan):
    """The backward launches of one call in the order they run, roles "delta", "dkdv" or
    "dq", and each score kernel's block lists (() without a block mask). Mostly two
    launches: dQ (which computes delta) then dK/dV; with dQ by reduce-add, delta (which
    zeroes dQ's fp32 buffer) then dK/dV; causal D > 128: delta, dQ, dK/dV
    (``BwdVariant.delta_in_dq``)."""

    variant: BwdVariant
    dtype: torch.dtype
    mask_target: tuple[int, int, int, int] | None
    blocks: tuple = ((), ())  # (dK/dV's transposed lists, dQ's lists)
    scale: float = 1.0  # the call's softmax scale (dQ by reduce-add is scaled after)


def _facts(t) -> tuple:
    return (type(t), t.shape, t.stride(), t.dtype, t.device)


def call_key(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse, schedule,
             variant=None) -> tuple | None:
    """The plan key, or None for a call that is not cached (not plain tensors, a mask that
    requires grad: its check depends on grad mode).

    ``type(x)`` is part of the key so that ``causal=1`` or ``scale=True`` never finds the
    plan of ``causal=True`` / ``scale=1.0`` (equal and equally hashed in Python) and still
    gets its typed error. ``variant``: (Mods, BlockMask or None): the functions by their
    compile identity, the block mask by its ``key``.
    """
    if not (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor):
        return None
    if attn_mask is None:
        mask = None
    elif type(attn_mask) is _Tensor and not attn_mask.requires_grad:
        mask = _facts(attn_mask)
    else:
        return None
    if type(schedule) is dict:  # checked (ScheduleError) when the plan is built
        try:
            schedule = (dict, *sorted(schedule.items()))
            hash(schedule)
        except TypeError:
            return None
    if variant is not None:
        variant = (variant[0].key, None if variant[1] is None else variant[1].key)
    return (_facts(q), _facts(k), _facts(v), mask, type(causal), causal, type(scale), scale,
            type(enable_gqa), enable_gqa, bool(return_lse), schedule, variant,
            policy.generation())


# Positions in ``call_key``'s tuple that ``family_key`` reads.
_KEY_SCHEDULE, _KEY_VARIANT = 11, 12


def _store(key, plan) -> None:
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def _cached(key, build):
    if key is not None:
        plan = _plans.get(key)
        if plan is not None:
            return plan
    plan = build()
    if key is not None:
        _store(key, plan)
    return plan


def plan_for(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse, schedule,
             variant=None) -> Plan:
    """The cached forward plan of this call, built (and every argument checked) on first
    sight, or found in its growing-cache family (``family_key``). ``variant``: (Mods,
    BlockMask or None) of a call with score/mask mods."""
    try:
        key = call_key(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse, schedule,
                       variant)
    except RuntimeError:  # a nested tensor has no strides to key: the build refuses it
        key = None  # (off the hot path: no per-call is_nested checks)
    if key is None:
        return build_plan(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse,
                          schedule, variant)
    plan = _plans.get(key)
    if plan is None:
        plan = _grown(key, q, k, v, attn_mask, causal, scale, enable_gqa, return_lse,
                      schedule, variant)
        _store(key, plan)
    return plan


def _dense(shape) -> tuple:
    """The strides of a contiguous tensor of ``shape``."""
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return tuple(reversed(out))


def _grown_facts(facts: tuple, skv: int) -> tuple | None:
    """K's or V's facts (``_facts``) without the key length: None unless rank 4 with
    ``skv`` keys, its strides dense (a ``torch.cat``-grown cache) or fixed (a slice of a
    preallocated one)."""
    typ, shape, stride, dtype, device = facts
    if len(shape) != 4 or shape[2] != skv:
        return None
    _, h, s, d = shape
    layout = "dense" if stride == (h * s * d, s * d, d, 1) else stride
    return (typ, shape[0], h, d, layout, dtype, device)


def _grown_mask(facts: tuple, skv: int) -> tuple | None:
    """The mask's facts without its key axis: that axis is ``skv`` ("kv") or its literal
    size (a size other than 1 or ``skv`` fails the check again in ``build_plan``)."""
    typ, shape, stride, dtype, device = facts
    if not shape:
        return None  # 0-d: refused by the checks
    last = "kv" if shape[-1] == skv else shape[-1]
    return (typ, shape[:-1], last, "dense" if stride == _dense(shape) else stride, dtype,
            device)


def family_key(key: tuple) -> tuple | None:
    """The growing-cache family of the call with ``key`` (``call_key``), or None (no
    family: strides that follow S but are not dense, a block mask, shapes the checks
    refuse). Every check ``check_inputs`` makes is decided by the family's facts alone,
    so a plan found through it skips no check the call could fail: K and V have the
    call's Skv (>= 1), the mask's key axis is Skv or the size it had. The schedule
    table's S bucket is part of it when the policy picks the schedule."""
    variant = key[_KEY_VARIANT]
    if variant is not None and variant[1] is not None:
        return None  # a block mask: its lists follow the key length
    qf, kf, vf, mf = key[:4]
    skv = kf[1][2] if len(kf[1]) == 4 else 0
    kf, vf = _grown_facts(kf, skv), _grown_facts(vf, skv)
    mask = None if mf is None else _grown_mask(mf, skv)
    if skv < 1 or kf is None or vf is None or len(qf[1]) != 4 or (mf and mask is None):
        return None
    bucket = seq_bucket(qf[1][2], skv) if key[_KEY_SCHEDULE] is None else None
    return ("family", qf, kf, vf, mask, key[4:], bucket)


@dataclass
class _Family:
    """What a family's plans share: how a call's Skv picks its plan (``key_tiles``)."""

    seq_q: int
    tile_n: int
    causal: bool
    key_tiles: object  # visit.key_tiles, taken when the family is made (cuTile loaded)

    def member(self, skv: int) -> tuple:
        return (self.key_tiles(self.seq_q, skv, self.tile_n, self.causal),
                skv % self.tile_n == 0)


def _grown(key, q, k, v, attn_mask, *args) -> Plan:
    """The plan of a call that missed the cache: its family's plan of the same key tiles
    and evenness (the call's Skv in ``mask_target``), else ``build_plan``'s."""
    fkey = family_key(key)
    family = None if fkey is None else _plans.get(fkey)
    if family is None:
        plan = build_plan(q, k, v, attn_mask, *args)
        if fkey is not None and isinstance(plan, Plan):
            from .visit import key_tiles

            family = _Family(q.shape[2], plan.schedule.tile_n, plan.variant.causal,
                             key_tiles)
            _store(fkey, family)
            _store((fkey, family.member(k.shape[2])), plan)
        return plan
    skv = k.shape[2]
    mkey = (fkey, family.member(skv))
    plan = _plans.get(mkey)
    if plan is None:
        plan = build_plan(q, k, v, attn_mask, *args)
        _store(mkey, plan)
        return plan
    if plan.mask_target is not None and plan.mask_target[3] != skv:
        plan = _retarget(plan, (*plan.mask_target[:3], skv))
    return plan


def _retarget(plan: Plan, mask_target: tuple) -> Plan:
    """``plan`` with another ``mask_target``: a shallow copy (``dataclasses.replace``
    re-runs ``__init__``, 3.7 us on the CPU of benchmarks/notes/decode.md §34c against 0.4)."""
    new = object.__new__(Plan)
    new.__dict__.update(plan.__dict__, mask_target=mask_target)
    return new


def clear() -> None:
    _plans.clear()


def build_plan(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse, schedule,
               variant=None) -> Plan:
    problem = check_inputs(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask,
                           enable_gqa=enable_gqa)
    chosen = resolve_schedule(schedule, problem)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    check_gpu(index)
    if chosen is None:
        chosen = choose_schedule(q, k, problem)
    copy_qkv = any(t.stride(-1) != 1 for t in (q, k, v))
    # q.view(B, Hkv, GROUP * Sq, D) needs the head axis to step over whole sequences.
    viewable = copy_qkv or q.shape[2] == 1 or q.stride(1) == q.shape[2] * q.stride(2)
    mods, block = variant or (_mods.NONE, None)
    return make_plan(problem, q.dtype, q.device, chosen, bool(return_lse),
                     copy_qkv=copy_qkv,
                     mask=None if attn_mask is None else mask_layout(attn_mask, (
                         problem.batch, problem.heads_q, problem.seq_q, problem.seq_kv)),
                     mods=mods, block=block, sm_count=sm_count(index), q_viewable=viewable)


def choose_schedule(q, k, problem: Problem) -> Schedule:
    """The policy's schedule for a call: the table's bucket of q's head dim, which bounds
    the registers when V's is no wider (``schedule_head_dim``: D_v < D_qk runs D_qk's
    tuned schedule, its accumulator narrower than tuned for); a wider V's head dim (no
    table bucket has that shape) runs the default schedule of V's head dim."""
    d = schedule_head_dim(problem)
    if d == problem.head_dim and d <= MAX_HEAD_DIM:  # no table bucket past 256
        return policy.choose_schedule(q, k, problem.causal)[0]
    return default_schedule(d, problem.causal)


@functools.cache
def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def packs(problem, mask_axes: tuple[bool, bool, bool] | None, q_viewable: bool,
          plain: bool = True) -> bool:
    """GQA packing: small Sq (decode, speculative lengths), no mask that varies per head
    or query row (a key-padding mask is shared by the packed rows), a viewable q, and no
    variant functions or block mask (they see one query head per program)."""
    return (plain and problem.group > 1 and problem.seq_q <= PACK_MAX_SEQ_Q and q_viewable
            and (mask_axes is None or not (mask_axes[1] or mask_axes[2])))


def split_count(schedule: Schedule, programs: int, key_tiles: int, sms: int) -> int:
    """Key splits per (batch, head): the schedule's, else (``splits=0``) enough to bring
    a grid of ``programs`` that fills at most half a wave of ``sms`` SMs to ~two programs
    per SM (one for grids of at most ``sms / FEW_PROGRAMS``), with at least
    ``MIN_SPLIT_TILES`` key tiles per split. 1 means no split."""
    if schedule.splits:
        want = schedule.splits
    elif sms and programs * SPLIT_BELOW <= sms:
        waves = 1 if programs * FEW_PROGRAMS <= sms else TARGET_WAVES
        want = min(math.ceil(waves * sms / programs), key_tiles // MIN_SPLIT_TILES)
    else:
        want = 1
    return max(1, min(want, key_tiles))


def flags_for(problem, dtype: torch.dtype, mask, mods, block) -> Flags:
    """The compile-time facts the forward and backward kernels of a call share."""
    return Flags(dtype=str(dtype).removeprefix("torch."), head_dim=problem.head_dim,
                 causal=problem.causal, mask_dtype=None if mask is None else mask[0],
                 mask_axes=(False, False, False) if mask is None else mask[1],
                 mods=mods.key, has_score_mod=mods.has_score_mod,
                 has_mask_mod=mods.has_mask_mod,
                 block_axes=None if block is None else block.axes)


def scalars(scale: float, mods, spec) -> dict[str, float]:
    """The softmax units (``body``) of the scalars ``spec``'s kernel declares: a score_mod
    sees scaled scores, so the exponent's factor is log2(e) and an additive mask adds as
    is (the plain forward folds ``scale`` into the other two and does not take it)."""
    if mods.has_score_mod:
        out = dict(qk_scale_log2=LOG2E, inv_scale=1.0, scale=scale)
    else:
        out = dict(qk_scale_log2=scale * LOG2E, inv_scale=1.0 / scale, scale=scale)
    return {k: v for k, v in out.items() if k in spec.names()}


def make_plan(problem, dtype: torch.dtype, device, schedule: Schedule, return_lse: bool, *,
              copy_qkv: bool, mask: tuple[str, tuple[bool, bool, bool]] | None,
              mods=_mods.NONE, block=None, sm_count: int = 0, q_viewable: bool = False,
              build_kernels: bool = True) -> Plan:
    """The plan of a validated problem; ``mask`` is the prepared mask's (dtype, axes).

    ``sm_count`` (0: unknown) lets a ``splits=0`` schedule split the keys; ``q_viewable``
    says q may be viewed packed (GQA decode); ``build_kernels`` False leaves the kernel
    objects out (plans made without cuTile, for tests and geometry)."""
    p = problem
    flags = flags_for(p, dtype, mask, mods, block)
    plain = not (mods.key or block is not None)
    packed = packs(p, None if mask is None else mask[1], q_viewable, plain)
    heads, rows, group = (p.heads_kv, p.group * p.seq_q, 1) if packed else (
        p.heads_q, p.seq_q, p.group)
    m_tiles = math.ceil(rows / schedule.tile_m)
    # Key tiles the longest row visits: under causality query i sees keys 0..i. (Imported
    # here: ``visit`` also holds the tile functions, and ``import tiledattention`` does
    # not load cuTile; plans are built once per key.)
    from .visit import key_tiles as visited

    key_tiles = visited(p.seq_q, p.seq_kv, schedule.tile_n, p.causal)
    splits = split_count(schedule, m_tiles * heads * p.batch, key_tiles, sm_count)
    split_tiles = math.ceil(key_tiles / splits)
    splits = math.ceil(key_tiles / split_tiles)  # no split left without a key tile
    variant = Variant(
        dtype=flags.dtype, head_dim=p.head_dim, causal=p.causal, schedule=schedule,
        even_n=p.seq_kv % schedule.tile_n == 0, mask_dtype=flags.mask_dtype,
        mask_axes=flags.mask_axes, return_lse=return_lse, split_k=splits > 1, packed=packed,
        flags=None if plain else flags, head_dim_v=p.head_dim_v)
    dv = p.value_dim  # the output's (and the partials') head dim
    fwd = score_specs(plain)[0]
    tail = fwd.ordered(dict(**scalars(p.scale, mods, fwd), GROUP=group, SEQ_Q=p.seq_q,
                            NUM_SPLITS=splits, SPLIT_TILES=split_tiles, **variant.constants()),
                       skip_tensors=True)
    steps = [Step(
        "fwd", fwd.kernel(mods, **fwd_hints(schedule)) if build_kernels else None,
        # Split-K multiplies the head axis; packing makes heads K/V heads of GROUP*Sq rows.
        grid_for(batch=p.batch, heads=heads * splits, seq_q=rows, tile_m=schedule.tile_m),
        tail)]
    if splits > 1:
        steps.append(combine_step(dv, rows, return_lse, splits, (heads, p.batch),
                                  build_kernels))
    blocks = () if block is None else block.lists(schedule.tile_m, schedule.tile_n, p.causal)
    return Plan(
        schedule=schedule, launches=tuple(steps), variant=variant,
        out_shape=(p.batch, p.heads_q, p.seq_q, dv),
        lse_shape=(p.batch, p.heads_q, p.seq_q) if return_lse else (1, 1, 1),
        dtype=dtype, device=device, copy_qkv=copy_qkv,
        mask_target=None if mask is None else (p.batch, p.heads_q, p.seq_q, p.seq_kv),
        packed_shape=(p.batch, heads, rows, p.head_dim) if packed else None,
        part_shape=(p.batch, heads * splits, rows, dv) if splits > 1 else None,
        pdl=schedule.pdl, blocks=blocks, scale=p.scale,
    )


def fwd_hints(schedule: Schedule) -> dict:
    return dict(occupancy=schedule.occupancy, num_ctas=schedule.num_ctas,
                num_worker_warps=schedule.worker_warps)


def combine_step(head_dim: int, rows: int, return_lse: bool, splits: int, grid: tuple,
                 build_kernel: bool = True) -> Step:
    """Split-K's combine launch over ``rows`` query rows per head: its grid is the row
    tiles, then ``grid`` (heads, batch)."""
    consts = combine_constants(head_dim, rows, return_lse)
    return Step("combine", COMBINE.kernel() if build_kernel else None,
                (math.ceil(rows / consts["TILE_R"]), *grid),
                COMBINE.ordered(dict(NUM_SPLITS=splits, **consts), skip_tensors=True))


def combine_constants(head_dim: int, rows: int, return_lse: bool) -> dict[str, int | bool]:
    """The combine kernel's ``ct.Constant`` arguments for ``rows`` query rows per head."""
    plan = plan_head_dim(head_dim)
    w0, w1, w2 = plan.kernel_widths()
    # A power of two covering small row counts (decode) without idle lanes; 32 rows of
    # fp32 accumulators (32 x 256) stay within one CTA's registers.
    # 16 past D = 256: 16 x 512 (a 32-row tile at D 512 keeps 128 KB of fp32). The cap is
    # floored to a power of two (cuTile tiles are), so D = 264 or 384 get 16 too.
    cap = 32 * 256 // max(plan.padded, 256)
    tile_r = min(1 << max(rows - 1, 0).bit_length(), 1 << (cap.bit_length() - 1))
    return dict(TILE_R=tile_r, NCHUNK=len(plan.widths), W0=w0, W1=w1, W2=w2,
                RETURN_LSE=return_lse)


# ----------------------------------------------------------------------------- FP8
DESCALES = ("q_descale", "k_descale", "v_descale")
FP8_MIN_CAPABILITY = (9, 0)  # QGMMA (wgmma on e4m3): Hopper and newer


@dataclass(frozen=True, eq=False, kw_only=True)
class Fp8Plan(LaunchPlan):
    """The FP8 forward's one launch, fixed but for the tensors' data: how q and k reach
    the kernel (16-byte strides, what TMA needs for 1-byte elements: else a copy) and V^T
    (a view of v when v is a transposed view of an aligned V^T, else a copy into rows of
    ``vt_cols`` keys, Skv rounded up to 16: by ``vt_step``, the ``transpose`` kernel, where
    v is TMA-readable, else by torch). The descales' layouts are in the key: the launch's
    ``QD_HEADS``.. say which are per (batch, K/V head)."""

    variant: Variant
    out_shape: tuple[int, int, int, int]
    lse_shape: tuple[int, ...]
    out_dtype: torch.dtype
    copy_q: bool
    copy_k: bool
    vt_view: bool
    vt_cols: int
    vt_step: Step | None


def tma_strides(t, axes=(0, 1, 2)) -> bool:
    """``axes`` of a 1-byte tensor step by multiples of 16 elements and its last axis (in
    the kernel's view) is unit-stride."""
    return all(t.stride(i) % 16 == 0 for i in axes)


def fp8_plan_for(q, k, v, causal, scale, enable_gqa, return_lse, schedule, out_dtype,
                 descales) -> Fp8Plan:
    """The cached FP8 forward plan of this call (``call_key`` plus the output dtype and the
    descales' facts), built and checked on first sight."""
    try:
        key = call_key(q, k, v, None, causal, scale, enable_gqa, return_lse, schedule)
    except RuntimeError:  # a nested tensor: the build refuses it
        key = None
    if key is not None and all(d is None or type(d) is _Tensor for d in descales):
        key = ("fp8", key, out_dtype, tuple(None if d is None else _facts(d)
                                            for d in descales))
    else:
        key = None
    return _cached(key, lambda: build_fp8_plan(q, k, v, causal, scale, enable_gqa,
                                               return_lse, schedule, out_dtype, descales))


def build_fp8_plan(q, k, v, causal, scale, enable_gqa, return_lse, schedule, out_dtype,
                   descales) -> Fp8Plan:
    problem = check_inputs(q, k, v, causal=causal, scale=scale, attn_mask=None,
                           enable_gqa=enable_gqa, dtypes=FP8_INPUT, device=False)
    check_fp8_shapes(problem)
    for name, d in zip(DESCALES, descales):
        check_descale(name, d, q, problem.batch, problem.heads_kv)
    check_descales_given(DESCALES, descales)
    check_device(q)  # last: the checks above run (and are tested) without a GPU
    chosen = resolve_schedule(schedule, problem)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    check_gpu(index)
    check_fp8_gpu(index)
    return make_fp8_plan(
        problem, q.device, chosen or default_fp8_schedule(problem.head_dim, problem.causal),
        bool(return_lse), out_dtype or torch.bfloat16, **fp8_layout(q, k, v),
        per_head=tuple(d is not None and d.dim() == 2 for d in descales))


def fp8_layout(q, k, v) -> dict[str, bool]:
    """What the launch does to reach 16-byte strides: copy q, copy k (unless already so,
    head dim unit-stride), whether v is a transposed view of an aligned V^T (its key
    axis unit-stride) to read in place, else whether the ``transpose`` kernel can read
    it (head dim unit-stride, 16-byte strides)."""
    vt_view = v.stride(2) == 1 and tma_strides(v, (0, 1, 3))
    return dict(copy_q=not (q.stride(3) == 1 and tma_strides(q)),
                copy_k=not (k.stride(3) == 1 and tma_strides(k)),
                vt_view=vt_view,
                vt_kernel=not vt_view and v.stride(3) == 1 and tma_strides(v))


def transpose_step(problem, build_kernel: bool = True) -> Step:
    """V [B, Hkv, Skv, D] -> V^T by ``transpose.keys_last``: ``TILE_S`` keys a program, the
    head dim padded to a power of two (a [TILE_S, D_PAD] e4m3 tile: 16 KB at most)."""
    p = problem
    d_pad = 1 << (p.head_dim - 1).bit_length()
    tile_s = 128 if d_pad <= 128 else 64
    return Step("vt", TRANSPOSE.kernel() if build_kernel else None,
                (-(-p.seq_kv // tile_s), p.heads_kv, p.batch),
                TRANSPOSE.ordered(dict(TILE_S=tile_s, D_PAD=d_pad), skip_tensors=True))


@functools.cache
def check_fp8_gpu(index: int) -> None:
    from ..errors import GPUTooOldError

    cap = torch.cuda.get_device_capability(index)
    if cap < FP8_MIN_CAPABILITY:
        raise GPUTooOldError(
            f"{torch.cuda.get_device_name(index)} has compute capability {cap[0]}.{cap[1]}; "
            "the FP8 forward needs 9.0 or newer (Hopper, Blackwell)")


def make_fp8_plan(problem, device, schedule: Schedule, return_lse: bool,
                  out_dtype: torch.dtype, *, copy_q: bool, copy_k: bool, vt_view: bool,
                  per_head: tuple[bool, bool, bool], vt_kernel: bool = False,
                  build_kernels: bool = True) -> Fp8Plan:
    """The plan of a validated FP8 problem (``build_kernels`` False: no cuTile needed)."""
    p = problem
    variant = Variant(dtype="float8_e4m3fn", head_dim=p.head_dim, causal=p.causal,
                      schedule=schedule, even_n=p.seq_kv % schedule.tile_n == 0,
                      return_lse=return_lse,
                      out_dtype=str(out_dtype).removeprefix("torch."))
    qd, kd, vd = (int(x) for x in per_head)
    tail = FWD_FP8.ordered(dict(qk_scale_log2=p.scale * LOG2E, GROUP=p.group, SEQ_Q=p.seq_q,
                                QD_HEADS=qd, KD_HEADS=kd, VD_HEADS=vd,
                                **variant.constants()), skip_tensors=True)
    step = Step("fwd", FWD_FP8.kernel(**fwd_hints(schedule)) if build_kernels else None,
                grid_for(batch=p.batch, heads=p.heads_q, seq_q=p.seq_q,
                         tile_m=schedule.tile_m), tail)
    return Fp8Plan(
        schedule=schedule, launches=(step,), device=device, variant=variant,
        out_shape=(p.batch, p.heads_q, p.seq_q, p.head_dim),
        lse_shape=(p.batch, p.heads_q, p.seq_q) if return_lse else (1, 1, 1),
        out_dtype=out_dtype, copy_q=copy_q, copy_k=copy_k, vt_view=vt_view,
        vt_cols=-(-p.seq_kv // 16) * 16,
        vt_step=transpose_step(p, build_kernels) if vt_kernel else None)


# ----------------------------------------------------------------------------- backward
_pinned: list[BwdSchedule | None] = [None]


class pinned_bwd_schedule:  # noqa: N801 - used as a context manager, like torch's
    """Within ``with pinned_bwd_schedule(s):`` every backward runs with schedule ``s``, and
    so does the backward of every forward run within it, whenever it runs (benchmarks
    compare backward schedules with it; None: the policy's choice, ``choose_bwd_schedule``).
    A packed backward (``sdpa_varlen``) takes the pin in force when it runs, and refuses a
    reduce-add (``_atomic``) one."""

    def __init__(self, schedule: BwdSchedule | None):
        self.schedule, self.saved = schedule, None

    def __enter__(self):
        self.saved, _pinned[0] = _pinned[0], self.schedule
        return self

    def __exit__(self, *exc):
        _pinned[0] = self.saved


def pinned_schedule() -> BwdSchedule | None:
    """The schedule of the innermost ``pinned_bwd_schedule``, or None."""
    return _pinned[0]


def bwd_plan_for(q, k, attn_mask, causal, scale, has_dlse, schedule, mods=_mods.NONE,
                 block=None, *, head_dim_v: int | None = None) -> BwdPlan:
    """The cached backward plan of a call (its forward was checked already); torch's
    deterministic mode is part of its key (it decides the schedule, ``make_bwd_plan``).
    ``head_dim_v``: V's head dim where it differs from Q/K's (None: theirs)."""
    key = ("bwd", _facts(q), _facts(k), None if attn_mask is None else _facts(attn_mask),
           causal, scale, has_dlse, schedule, mods.key, None if block is None else block.key,
           policy.generation(), torch.are_deterministic_algorithms_enabled(), head_dim_v)
    return _cached(key, lambda: make_bwd_plan(q, k, attn_mask, causal, scale, has_dlse,
                                              schedule, mods, block, head_dim_v=head_dim_v))


def choose_bwd_schedule(q, k, causal: bool, deterministic: bool, variant: bool,
                        head_dim_v: int | None) -> BwdSchedule:
    """The policy's backward schedule: the table's bucket of q's head dim, which bounds the
    registers when V's is no wider (D_v < D_qk: K/V's tiles and dV narrower than tuned
    for); a wider V's head dim (no bucket has that shape) runs the default of V's."""
    if head_dim_v is not None and head_dim_v > q.shape[3]:
        return default_bwd_schedule(head_dim_v, causal)
    return policy.choose_bwd_schedule(q, k, causal, deterministic, variant=variant)[0]


def make_bwd_plan(q, k, attn_mask, causal: bool, scale: float, has_dlse: bool,
                  schedule: BwdSchedule | None, mods=_mods.NONE, block=None, *,
                  head_dim_v: int | None = None) -> BwdPlan:
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    check_backward_head_dims(d, head_dim_v or d)  # no backward kernel past 256
    plain = not (mods.key or block is not None)
    if head_dim_v == d:
        head_dim_v = None  # one head dim: the same variant (and kernels) as without it
    # The table's dQ reduce-add (not deterministic) was measured and tested on plain
    # attention only: masks, variants and an LSE gradient keep the deterministic kernel.
    s = schedule or choose_bwd_schedule(
        q, k, causal, torch.are_deterministic_algorithms_enabled()
        or not plain or attn_mask is not None or has_dlse, not plain, head_dim_v)
    target = (b, hq, sq, sk)
    mask = None if attn_mask is None else mask_layout(attn_mask, target)
    problem = Problem(b, hq, hk, sq, sk, d, causal, scale)
    flags = flags_for(problem, q.dtype, mask, mods, block)
    v = BwdVariant(dtype=flags.dtype, head_dim=d, causal=causal, schedule=s,
                   even_n=sk % max(s.dkdv_n, s.dq_n) == 0, mask_dtype=flags.mask_dtype,
                   mask_axes=flags.mask_axes, has_dlse=has_dlse,
                   flags=None if plain else flags,
                   one_head=None if hq == hk else False, head_dim_v=head_dim_v)
    _, dkdv, dq = score_specs(plain)
    steps = {"delta": (DELTA, (math.ceil(sq / DELTA_TILE_M), hq, b)),
             "dkdv": (dkdv, (math.ceil(sk / s.dkdv_n), hk, b)),
             "dq": (dq, (math.ceil(sq / s.dq_m), hq, b))}
    launches = []
    # The dK/dV kernel reads delta: the step that writes it (dQ, or the delta kernel,
    # ``BwdVariant.delta_in_dq``) runs first.
    roles = (("dq", "dkdv") if v.delta_in_dq else
             ("delta", "dkdv") if s.dq == "atomic" else ("delta", "dq", "dkdv"))
    for role in roles:
        spec, grid = steps[role]
        values = dict(v.constants(spec.name))
        if spec is not DELTA:
            values.update(scalars(scale, mods, spec), GROUP=hq // hk)
        kernel = DELTA.kernel() if spec is DELTA else spec.kernel(mods, **s.hints())
        launches.append(Step(role, kernel, grid, spec.ordered(values, skip_tensors=True)))
    blocks = ((), ()) if block is None else (
        block.lists(s.dkdv_m, s.dkdv_n, causal, transposed=True),
        block.lists(s.dq_m, s.dq_n, causal))
    return BwdPlan(schedule=s, launches=tuple(launches), device=q.device, variant=v,
                   dtype=q.dtype, mask_target=None if mask is None else target, blocks=blocks,
                   scale=scale)
