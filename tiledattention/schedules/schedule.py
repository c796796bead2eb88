"""The schedule: how the kernel is tiled and hinted, independent of the inputs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..errors import ScheduleError
from .label import label
from .label import parse as parse_label
from .label import write as write_label

TILE_SIZES = (16, 32, 64, 128, 256)
NUM_CTAS = (1, 2, 4, 8, 16)
MAX_SPLITS = 64
# cuTile's num_worker_warps hint: warps of the CUDA-core (MMA and softmax) warpgroups of a
# warp-specialised kernel, not counting the compiler's producer warps. tileiras 13.4 (the
# version the package pins) accepts only 4 and 8; None leaves the choice to the compiler.
WORKER_WARPS = (None, 4, 8)


@dataclass(frozen=True)
class Schedule:
    """Tile sizes and compiler hints of one kernel launch.

    tile_m: query rows per program; tile_n: keys per inner step; occupancy: CTAs the
    compiler plans to co-reside per SM (1..32); num_ctas: CTAs per cluster;
    latency_k / latency_v: DRAM latency hints (1..10) for K and V loads (higher means
    deeper prefetch); heavy_first: for causal attention, launch the query tiles with the
    most keys first (ignored otherwise); splits: key splits per (batch, head) for
    flash-decoding (split-K): 0 lets the launch pick from the GPU's SM count when the
    grid would not fill it, 1 never splits, n > 1 asks for up to n splits; worker_warps:
    cuTile's ``num_worker_warps`` hint, 4 or 8 warps in the MMA/softmax warp groups (None:
    the compiler's choice, which is 4 for every shipped variant; 8 gives a 128-row tile
    two consumer warp groups); pdl: programmatic dependent launch, the kernel may start
    while the previous kernel on the stream finishes, its index math overlapping that
    kernel's tail, and waits (``grid_dependency_control_wait``) before its first load.
    """

    tile_m: int = label(0, "", default=64)
    tile_n: int = label(1, "x", default=64)
    occupancy: int = label(2, "_o", default=4)
    num_ctas: int = label(3, "_c", default=1)
    latency_k: int = label(4, "_lk", default=2)
    latency_v: int = label(5, "_lv", default=4)
    heavy_first: bool = label(7, "_natural", default=True, when=False)
    splits: int = label(8, "_k", default=0, absent=0)
    worker_warps: int | None = label(6, "_w", default=None, absent=None)
    pdl: bool = label(9, "_pdl", default=False, when=True)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "worker_warps" and value is None:
                continue
            if f.name in ("heavy_first", "pdl"):
                if not isinstance(value, bool):
                    raise ScheduleError(f"Schedule.{f.name} must be a bool, got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ScheduleError(f"Schedule.{f.name} must be an int, got {value!r}")
        for name in ("tile_m", "tile_n"):
            if getattr(self, name) not in TILE_SIZES:
                raise ScheduleError(
                    f"Schedule.{name}={getattr(self, name)} is not one of {TILE_SIZES}"
                )
        if not 1 <= self.occupancy <= 32:
            raise ScheduleError(f"Schedule.occupancy={self.occupancy} is not in [1, 32]")
        if self.num_ctas not in NUM_CTAS:
            raise ScheduleError(f"Schedule.num_ctas={self.num_ctas} is not one of {NUM_CTAS}")
        for name in ("latency_k", "latency_v"):
            if not 1 <= getattr(self, name) <= 10:
                raise ScheduleError(f"Schedule.{name}={getattr(self, name)} is not in [1, 10]")
        if not 0 <= self.splits <= MAX_SPLITS:
            raise ScheduleError(f"Schedule.splits={self.splits} is not in [0, {MAX_SPLITS}] "
                                "(0: chosen per call)")
        if self.worker_warps not in WORKER_WARPS:
            raise ScheduleError(f"Schedule.worker_warps={self.worker_warps} is not one of "
                                f"{WORKER_WARPS} (None: the compiler's choice)")

    def as_dict(self) -> dict[str, int | bool]:
        """The fields; ``worker_warps`` and ``pdl`` only when set, so tables and rows of
        schedules without them read as before these fields existed."""
        d = asdict(self)
        if d["worker_warps"] is None:
            del d["worker_warps"]
        if not d["pdl"]:
            del d["pdl"]
        return d

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise ScheduleError(f"unknown schedule keys {unknown}; valid keys are {valid}")
        return cls(**data)

    @classmethod
    def from_label(cls, label: str) -> Schedule:
        """Inverse of :meth:`label`, e.g. ``64x128_o2_c1_lk2_lv4`` (``_w8``: 8 worker warps,
        absent: the compiler's choice; ``_natural``: no heavy-first order; ``_k4``:
        splits=4, absent means 0, chosen per call; ``_pdl``: programmatic dependent launch)."""
        schedule = parse_label(cls, label)
        if schedule is None:
            raise ScheduleError(f"schedule label {label!r} is not like 64x128_o2_c1_lk2_lv4 "
                                "(optionally followed by _w4 or _w8, then _natural, then "
                                "_k<splits>)")
        return schedule

    def label(self) -> str:
        return write_label(self)


def default_schedule(head_dim: int, causal: bool) -> Schedule:
    """A measured-good starting point per (head dim, causal) until the tuning table.

    From the schedule sweep on an H100 (fp16, B*S=16k, H*D=2048; see
    benchmarks/NOTES.md): 64x128 at occupancy 2 wins at D=128 and 160 (615 vs 538
    TFLOP/s for 64x64 at D=128 S=4096) and non-causal D=64; 64x64 at occupancy 4 wins
    causal D=64 at S=1024; 128x64 at occupancy 2 wins non-causal D=96 (482 vs 467).
    D above 192 takes 64x128 at occupancy 1 (benchmarks/notes/forward.md §15, B2 H8 S1000 bf16:
    0.88x of SDPA causal and 0.81x non-causal, against 0.77x and 0.68x for the former 64x64 o2;
    where the nearest tuned bucket's occupancy does not fit D=256 the policy lands here). D
    above 256 (forward only) takes 64x64 with 8 worker warps (compiled, not yet timed).
    """
    if head_dim <= 64:
        return Schedule(64, 64, occupancy=4) if causal else Schedule(64, 128, occupancy=2)
    if head_dim > 256:
        # The forward-only head dims (to 512, MLA's 576 / 512): the [64, 512] fp32
        # accumulator is 128 registers a thread over 8 worker warps (two consumer warp
        # groups, 232 each), no spill; Q, K and V's tiles take 207-223 KB of shared memory
        # (benchmarks/repro/d512_forward.py). 4 warps spill, 128 keys leave shared memory.
        return Schedule(64, 64, occupancy=1, worker_warps=8)
    if head_dim > 192:
        return Schedule(64, 128, occupancy=1)
    if not causal and head_dim & (head_dim - 1) and head_dim < 128:
        return Schedule(128, 64, occupancy=2)  # chunked D below 128, e.g. 96 = 64 + 32
    return Schedule(64, 128, occupancy=2)


def default_fp8_schedule(head_dim: int, causal: bool) -> Schedule:
    """The FP8 forward's schedule (untuned; no table entries yet): D <= 128 the bf16
    default (64x128 at occupancy 2: 128 registers, no stack, sm_90); wider, 128x128 tiles
    on 8 worker warps (D 256: 168 registers, no stack; benchmarks/notes/head-shapes.md
    §40h). An e4m3 tile is half a bf16 one's bytes, so these fit shared memory as bf16's do."""
    if head_dim > 128:
        return Schedule(128, 128, occupancy=1, worker_warps=8)
    return default_schedule(head_dim, causal)
