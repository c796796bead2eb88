"""The schedule search space and the rules that reject a schedule before compiling."""

from __future__ import annotations

import itertools

from ..headdim import plan_head_dim
from .schedule import Schedule

# Register file per SM on Hopper and Blackwell: 64K 32-bit registers.
REGISTER_BYTES_PER_SM = 256 * 1024
# Registers one thread can address; the compiler's default for num_worker_warps is 4.
MAX_REGISTERS_PER_THREAD = 255
DEFAULT_WORKER_WARPS = 4
# Shared memory one CTA may take on sm_90 (227 KiB; sm_100 the same, sm_120 less).
SHARED_BYTES_PER_CTA = 227 * 1024


def rejection(schedule: Schedule, head_dim: int) -> str | None:
    """Why ``schedule`` cannot run well for ``head_dim``, or None when it may."""
    # The fp32 accumulator [M, D] and scores [M, N] must fit the register file share of
    # one CTA; the sweeps show schedules right at this bound (64x64 at occupancy 4 for
    # D=128) can still win, so only schedules past it are refused.
    padded = plan_head_dim(head_dim).padded
    live = 4 * schedule.tile_m * (padded + schedule.tile_n)
    budget = REGISTER_BYTES_PER_SM // schedule.occupancy
    if live > budget:
        return (f"{schedule.label()}: {live // 1024} KiB of fp32 accumulator and scores per "
                f"CTA at D={head_dim} exceed the {budget // 1024} KiB register share at "
                f"occupancy {schedule.occupancy}")
    # The same fp32 state is spread over the worker warps' threads; past 255 registers per
    # thread it spills (128x128 at D=128 with 4 worker warps: 256, and the sm_90 cubin has
    # a 264-byte stack; with 8 worker warps it is 128 per thread and no stack,
    # benchmarks/inspect_kernel.py, benchmarks/notes/forward.md §18).
    warps = schedule.worker_warps or DEFAULT_WORKER_WARPS
    per_thread = live // (4 * 32 * warps)
    if per_thread > MAX_REGISTERS_PER_THREAD:
        return (f"{schedule.label()}: {per_thread} registers of fp32 accumulator and scores "
                f"per worker thread at D={head_dim} exceed the {MAX_REGISTERS_PER_THREAD} a "
                f"thread holds with {warps} worker warps (it would spill)")
    # Q's tile and one K and one V tile (2-byte elements) sit in shared memory; past the
    # CTA's share tileiras drops warp specialisation for mma.sync and spills (D = 512 at
    # 64x128 with 8 warps: a 3 KB stack, benchmarks/repro/d512_forward.py). No schedule
    # at D <= 256 reaches it (128x128 at 256: 192 KiB).
    tiles = 2 * (schedule.tile_m + 2 * schedule.tile_n) * padded
    if tiles > SHARED_BYTES_PER_CTA:
        return (f"{schedule.label()}: its Q, K and V tiles take {tiles // 1024} KiB of shared "
                f"memory at D={head_dim}, past the {SHARED_BYTES_PER_CTA // 1024} KiB of a CTA")
    if schedule.tile_m < 64 or schedule.tile_n < 32:
        # Hopper's warpgroup MMA works on 64-row tiles; smaller tiles idle the tensor cores.
        return f"{schedule.label()}: tiles below 64x32 leave the tensor cores idle"
    if schedule.num_ctas > 1 and schedule.tile_m < 128:
        return f"{schedule.label()}: clusters (num_ctas > 1) need tile_m >= 128"
    return None


def candidates(head_dim: int, *, tiles=((64, 64), (64, 128), (128, 64), (128, 128), (64, 32),
                                         (128, 32)),
               occupancies=(1, 2, 3, 4), num_ctas=(1,),
               latencies=((2, 4), (3, 3)),
               worker_warps=(None, 8)) -> tuple[list[Schedule], list[str]]:
    """(valid schedules, rejection reasons) of the search space for one head dim."""
    valid, rejected = [], []
    for (tm, tn), occ, nc, (lk, lv), w in itertools.product(tiles, occupancies, num_ctas,
                                                            latencies, worker_warps):
        s = Schedule(tm, tn, occ, nc, lk, lv, worker_warps=w)
        reason = rejection(s, head_dim)
        (rejected if reason else valid).append(reason or s)
    return valid, rejected


# tiledattn tune --space: quick, the 8 schedules that won somewhere in the sweeps
# (benchmarks/notes/forward.md §2, §5) plus 8-worker-warp variants of the 128-row tiles and of the
# D=128 winner (benchmarks/notes/forward.md §18); full, every schedule of ``candidates``.
SPACES = ("quick", "full")
QUICK_SPACE = (Schedule(64, 64, 4), Schedule(64, 64, 2), Schedule(64, 128, 2),
               Schedule(64, 128, 1), Schedule(64, 128, 3), Schedule(128, 64, 2),
               Schedule(128, 64, 1), Schedule(128, 128, 1),
               Schedule(128, 128, 1, worker_warps=8), Schedule(128, 128, 2, worker_warps=8),
               Schedule(128, 64, 1, worker_warps=8), Schedule(128, 64, 2, worker_warps=8),
               Schedule(64, 128, 2, worker_warps=8))


def space_for(head_dim: int, space: str) -> list[Schedule]:
    """The valid schedules of a named search space for one head dim."""
    if space == "quick":
        return [s for s in QUICK_SPACE if rejection(s, head_dim) is None]
    if space == "full":
        return candidates(head_dim)[0]
    raise ValueError(f"unknown search space {space!r}; valid: {list(SPACES)}")
