"""The backward's schedule: tiles and occupancy of the dK/dV and dQ kernels, its label,
the rules that reject one for a head dim, its search space and its default.

The kernels and their launch plan live in ``kernel.plan`` / ``kernel.backward``; this
room only says how they are tiled, as ``schedule.py`` and ``space.py`` do for the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ScheduleError
from ..headdim import plan_head_dim
from .label import label
from .label import parse as parse_label
from .label import write as write_label
from .space import DEFAULT_WORKER_WARPS, MAX_REGISTERS_PER_THREAD, REGISTER_BYTES_PER_SM

DQ_MODES = ("kernel", "atomic")
BWD_TILES = (32, 64, 128)


@dataclass(frozen=True)
class BwdSchedule:
    """Tiles and occupancy of the two backward kernels.

    dkdv_m x dkdv_n: query rows per inner step x keys per dK/dV program; dq_m x dq_n:
    query rows per dQ program x keys per inner step.
    """

    dkdv_m: int = label(0, "kv", default=64)
    dkdv_n: int = label(1, "x", default=64)
    dq_m: int = label(2, "_q", default=64)
    dq_n: int = label(3, "x", default=64)
    occupancy: int = label(4, "_o", default=1)
    # "kernel": dQ in its own program over query tiles (deterministic, seven matmuls);
    # "atomic": the dK/dV programs reduce-add dS K into an fp32 buffer by TMA (five
    # matmuls; the order of the additions varies between runs), converted after.
    dq: str = label(6, "_atomic", default="kernel", when="atomic")
    # cuTile's num_worker_warps for both score kernels: None = the compiler's default (4),
    # 8 = two consumer warp groups sharing the CTA's fp32 state (half the registers each).
    worker_warps: int | None = label(5, "_w", default=None, absent=None)
    # The dK/dV program's orientation: False, queries as the MMA rows (S = Q K^T, P and dS
    # transposed into dV and dK); True, keys as the rows (S^T = K Q^T: P^T and dS^T are
    # the row operands as they come; ``kernel.backward.dkdv_tile``). Label ``_keyrows``.
    key_rows: bool = label(7, "_keyrows", default=False, when=True)

    def __post_init__(self) -> None:
        if self.dq not in DQ_MODES:
            raise ScheduleError(f"BwdSchedule.dq={self.dq!r} is not one of {DQ_MODES}")
        for name in ("dkdv_m", "dkdv_n", "dq_m", "dq_n"):
            if getattr(self, name) not in BWD_TILES:
                raise ScheduleError(f"BwdSchedule.{name}={getattr(self, name)} is not one of "
                                    f"{BWD_TILES}")
        if not 1 <= self.occupancy <= 4:
            raise ScheduleError(f"BwdSchedule.occupancy={self.occupancy} is not in [1, 4]")
        if self.worker_warps not in (None, 8):
            raise ScheduleError(f"BwdSchedule.worker_warps={self.worker_warps} is not None "
                                "or 8")

    def label(self) -> str:
        return write_label(self)

    def hints(self) -> dict:
        """cuTile's compiler hints of the dK/dV and dQ kernels."""
        return dict(occupancy=self.occupancy, num_worker_warps=self.worker_warps)

    @property
    def deterministic(self) -> bool:
        return self.dq == "kernel"

    @classmethod
    def from_label(cls, label: str) -> BwdSchedule:
        """Inverse of :meth:`label`, e.g. ``kv64x128_q128x64_o1`` (``_w8``: eight worker
        warps; ``_atomic``: dQ by atomics; ``_keyrows``: keys as the dK/dV MMA rows)."""
        schedule = parse_label(cls, label)
        if schedule is None:
            raise ScheduleError(f"backward schedule label {label!r} is not like "
                                "kv64x64_q64x64_o1 (optionally ending in _w8, _atomic, "
                                "_keyrows)")
        return schedule


def _live_bytes(schedule: BwdSchedule, head_dim: int) -> dict[str, int]:
    """fp32 bytes a CTA of each kernel keeps live: its accumulators plus one score tile
    (the forward's count, ``space.rejection``). dK/dV: dK and dV [keys, D] plus [M, keys],
    plus the [M, D] dQ share it reduce-adds when dQ is ``atomic``; dQ: dQ [M, D] plus
    [M, N]."""
    d = plan_head_dim(head_dim).padded
    s = schedule
    share = s.dkdv_m * d if s.dq == "atomic" else 0
    return {"dK/dV": 4 * (2 * s.dkdv_n * d + s.dkdv_m * s.dkdv_n + share),
            "dQ": 4 * (s.dq_m * d + s.dq_m * s.dq_n)}


def bwd_rejection(schedule: BwdSchedule, head_dim: int) -> str | None:
    """Why ``schedule`` cannot run the backward well for ``head_dim``, or None when it may.

    The forward's register reasoning per kernel: the fp32 state must fit the CTA's share of
    the register file at the schedule's occupancy and the 255 registers of each of the
    worker warps' threads (4, or the schedule's 8). It matches the measurement
    (benchmarks/notes/backward.md §17): 128-key dK/dV tiles over 4 worker warps count 192 registers
    per thread at D=64 (the fastest there) and 320 at D=128, where they ran 1.49-1.57x slower than
    the default.
    """
    for kernel, live in _live_bytes(schedule, head_dim).items():
        budget = REGISTER_BYTES_PER_SM // schedule.occupancy
        if live > budget:
            return (f"{schedule.label()}: {kernel} keeps {live // 1024} KiB of fp32 state per "
                    f"CTA at D={head_dim}, over the {budget // 1024} KiB register share at "
                    f"occupancy {schedule.occupancy}")
        per_thread = live // (4 * 32 * (schedule.worker_warps or DEFAULT_WORKER_WARPS))
        if per_thread > MAX_REGISTERS_PER_THREAD:
            return (f"{schedule.label()}: {kernel} needs {per_thread} registers of fp32 state "
                    f"per thread at D={head_dim}, over {MAX_REGISTERS_PER_THREAD} (it would "
                    "spill)")
    if schedule.worker_warps is None and plan_head_dim(head_dim).padded > 160:
        # Below the count above, what the sm_90 SASS showed (benchmarks/notes/backward.md §28): four
        # worker warps spill the fp32 dK/dV at D = 192 (144 bytes) and 256 (1024 bytes); eight do
        # not.
        return (f"{schedule.label()}: four worker warps spill the fp32 dK/dV at "
                f"D={head_dim}; eight (_w8) keep them in registers")
    if schedule.key_rows and schedule.dkdv_n >= 128 and plan_head_dim(head_dim).padded > 128:
        # What the sm_90 SASS showed (benchmarks/notes/backward.md §35b): keys as rows over 128 keys
        # spill the fp32 dK/dV from D = 160 (a 192-byte stack; 384 bytes at D = 192), none at D = 96
        # / 128.
        return (f"{schedule.label()}: keys as rows over {schedule.dkdv_n} keys spill the "
                f"fp32 dK/dV at D={head_dim}")
    if schedule.dkdv_m >= 128 and plan_head_dim(head_dim).padded > 192:
        # What the sm_90 SASS and the H100 showed (benchmarks/notes/backward.md §37c,
        # benchmarks/repro/dkdv_accumulators.py): 128 query rows per dK/dV step at D = 256 compile
        # without warp-group MMAs (mma.sync, a 2.5 KB stack) and ran at 52-57 TFLOP/s; at D = 160 /
        # 192 the same schedule is the fastest.
        return (f"{schedule.label()}: {schedule.dkdv_m} query rows per dK/dV step at "
                f"D={head_dim} compile without warp-group MMAs")
    if min(schedule.dkdv_n, schedule.dq_m) < 64:
        # The output rows of each kernel's MMAs: Hopper's warpgroup MMA works on 64 rows.
        return f"{schedule.label()}: output tiles below 64 rows leave the tensor cores idle"
    return None


def default_bwd_schedule(head_dim: int, causal: bool) -> BwdSchedule:
    """The backward schedule where the table has none (benchmarks/notes/backward.md §17b).

    From the H100 backward tune (fp16, D 64/96/128/160, causal and not, S 1024 and 4096,
    fwd+bwd TFLOP/s): D <= 64 kv128x64_q64x128_o2 won all 4 buckets (e.g. causal S=4096
    335 vs 145 for the first default kv64x64_q64x64_o1); D 96-128 kv64x64_q64x64_o2 won 7 of
    8 and was within 0.2% in the 8th; D=160 kv128x64_q64x128_o2 won causal (184 vs 153) and
    was within 2% non-causal. Occupancy 2 wins everywhere under causality. Larger D (192,
    256) keeps 64x64 tiles at occupancy 1, the only ones that fit (``bwd_rejection``), over
    eight worker warps: two consumer warp groups share the fp32 dK and dV, 128 registers of
    them per thread at D = 256 where four warps spill (§28: 1.45-1.85x faster at D = 256,
    1.02-1.04x at D = 192, bf16, causal and not).
    """
    del causal  # the same schedule won causal and non-causal buckets per head dim
    base = BwdSchedule(64, 64, 64, 64, 1, worker_warps=8)
    if head_dim <= 64:
        best = BwdSchedule(128, 64, 64, 128, 2)
    elif head_dim <= 128:
        best = BwdSchedule(64, 64, 64, 64, 2)
    else:
        best = BwdSchedule(128, 64, 64, 128, 2)
    return base if bwd_rejection(best, head_dim) else best


# Keys as the dK/dV MMA rows at 64 < D <= 128, for the backwards the table was not tuned on.
# Packed (varlen) batches (benchmarks/notes/varlen-paged.md §43c, H200, lognormal documents
# of median 512, 16k and 64k tokens): against the default, fwd+bwd 1.03-1.07x at D 96 and
# 128. Variants (score_mod, mask_mod, block mask; variants.md §45a, H200, B8 H16 S4096 D 128):
# window, softcap, ALiBi, documents, prefix-LM 1.025-1.053x, gradients bit-identical. At D 64
# the default's 128-key tiles gain 1-4 % swapped but keep one register on the stack (sm_90:
# STACK 8); at D 192 / 256 the swapped orientation lost 1-7 % (packed).
KEY_ROWS_HEAD_DIMS = (65, 128)


def key_rows_bwd_schedule(head_dim: int, causal: bool) -> BwdSchedule:
    """``default_bwd_schedule`` with ``key_rows`` for head dims in ``KEY_ROWS_HEAD_DIMS``
    (where the rejection rules accept it): the packed backward's and the variants'."""
    base = default_bwd_schedule(head_dim, causal)
    lo, hi = KEY_ROWS_HEAD_DIMS
    if not lo <= head_dim <= hi:
        return base
    swapped = replace(base, key_rows=True)
    return base if bwd_rejection(swapped, head_dim) else swapped


# The quick backward space: the measured schedules (benchmarks/notes/backward.md §17) and their
# occupancy-2 versions, plus 128-key dK/dV and 128-row dQ tiles over eight worker warps (FA3's
# tiling at D=128: two consumer warp groups over 128 keys). 128 x 128 dK/dV tiles compile to a
# spilling kernel without warp-group MMAs at D=128 (offline): left out. Full: every tile
# combination of 64 and 128 at occupancy 1 and 2, with 4 or 8 worker warps.
BWD_QUICK_SPACE = tuple(BwdSchedule.from_label(label) for label in (
    "kv64x64_q64x64_o1", "kv64x64_q64x64_o2", "kv128x64_q64x128_o1", "kv64x128_q128x64_o1",
    "kv128x64_q64x128_o2", "kv64x128_q128x64_o2", "kv64x128_q128x64_o1_w8",
    "kv64x128_q128x128_o1_w8",
    # eight worker warps over 64 keys: at D = 160 these keep their MMAs in flight without
    # spilling where the four-warp programs wait on every MMA (benchmarks/notes/backward.md §37c)
    "kv128x64_q64x128_o1_w8", "kv64x64_q64x64_o1_w8"))


def bwd_space_for(head_dim: int, space: str) -> list[BwdSchedule]:
    """The valid backward schedules of a named search space for one head dim; the default
    when none fits (D=256: every candidate spills by the count above)."""
    if space == "quick":
        pool = BWD_QUICK_SPACE
    elif space == "full":
        pool = tuple(BwdSchedule(a, b, c, e, o, worker_warps=w) for a in (64, 128)
                     for b in (64, 128) for c in (64, 128) for e in (64, 128) for o in (1, 2)
                     for w in (None, 8))
    else:
        raise ValueError(f"unknown search space {space!r}; valid: ['quick', 'full']")
    valid = [s for s in pool if bwd_rejection(s, head_dim) is None]
    return valid or [default_bwd_schedule(head_dim, False)]


# Candidates that benchmarks/bwd_compare.py times side by side with the table's choice
# (issue 37), not table entries until measured. Picked from the sm_90 SASS of each
# (benchmarks/bwd_sass.py; counts in benchmarks/notes/backward.md §28): warp-group MMAs
# kept, the dQ share by UTMAREDG, no (or, at D = 256, little) local-memory spilling of the
# fp32 accumulators. Where the register count admits more, the SASS did not: 128-key
# programs at D = 160 lost every HGMMA (1960-byte stack), 64 keys at occupancy 2 spilled.
# "5mm": dQ reduce-added from the dK/dV program (five matmuls); "7mm": its own kernel.
BWD_CANDIDATES = (
    # D <= 128: 128 keys per program over two warp groups (half the reduction traffic of
    # 64 keys), and 64 keys at occupancy 2. "kr": the same 128-key programs with keys as
    # the dK/dV MMA rows (``_keyrows``: no P / dS transposes through shared memory; the
    # seven-matmul one has no CTA barrier left in its step; sm_90 SASS in
    # benchmarks/notes/backward.md §34a). 64 keys at occupancy 2 spill with it (the
    # row statistics per column cost registers at the 128 of two CTAs): not a candidate.
    (128, {"5mm-k128w8": BwdSchedule.from_label("kv64x128_q128x64_o1_w8_atomic"),
           "5mm-k64o2": BwdSchedule.from_label("kv64x64_q64x64_o2_atomic"),
           "5mm-k128w8kr": BwdSchedule.from_label("kv64x128_q128x64_o1_w8_atomic_keyrows"),
           "7mm-k128w8kr": BwdSchedule.from_label("kv64x128_q128x64_o1_w8_keyrows")}),
    (160, {"5mm-k64w8": BwdSchedule.from_label("kv64x64_q64x64_o1_w8_atomic"),
           # pipelined MMAs, no spill at D = 160 (benchmarks/notes/backward.md §37c)
           "7mm-k64w8": BwdSchedule.from_label("kv64x64_q64x64_o1_w8"),
           "7mm-q128w8": BwdSchedule.from_label("kv128x64_q64x128_o1_w8")}),
    # D > 160: 64 keys, the fp32 dK and dV [64, D] over two warp groups (eight worker
    # warps: 128 registers of state per thread at D = 256 where today's four spill).
    (256, {"7mm-w8": BwdSchedule.from_label("kv64x64_q64x64_o1_w8"),
           "5mm-k64w8": BwdSchedule.from_label("kv64x64_q64x64_o1_w8_atomic")}),
)


def bwd_candidates(head_dim: int) -> dict[str, BwdSchedule]:
    """The named candidate schedules worth timing at ``head_dim`` (issue 37)."""
    for up_to, named in BWD_CANDIDATES:
        if head_dim <= up_to:
            return {name: s for name, s in named.items() if bwd_rejection(s, head_dim) is None}
    return {}
