"""Launch geometry: how one call's programs tile onto the GPU, and what the tiles pad.

The one place that computes it, as a pure function of the plan's grid, the problem's
sizes, the schedule's tiles, the SM count and the programs per SM that fit, so that the
benchmark rows, ``tiledattn advise`` and the tests all agree. The grid is taken from the
plan (its first launch's grid, ``Plan.launches``) rather than rebuilt from the shape, so a
new grid axis (e.g. split-K for decode) is counted without a change here.

Wave quantization: ``programs`` run in waves of ``sms * per_sm / num_ctas`` slots; a last
wave that is barely filled (133 programs on 132 one-program SMs) costs a whole wave's time
for a sliver of the work. Tile quantization: a sequence that is not a multiple of the tile
computes the last tile's padding, and a head dim that is not split exactly into
power-of-two chunks (``headdim.plan_head_dim``) multiplies zero columns.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..headdim import plan_head_dim

# Where ``per_sm`` came from: the schedule's occupancy hint (cuTile 1.7 exposes neither
# the loaded function nor its registers / shared memory, so the compiled kernel's own
# occupancy is not read back; the hint is what the compiler was asked to fit).
PER_SM_HINT = "occupancy hint"


@dataclass(frozen=True)
class Geometry:
    programs: int  # grid size: product of the plan's grid
    per_sm: int  # programs (CTAs) per SM that fit
    per_sm_source: str
    sms: int
    slots: int  # programs that run at once: sms * per_sm // num_ctas
    waves: float  # programs / slots
    tail_efficiency: float  # share of the last wave's slots that hold a program
    head_dim_padded: int  # columns computed (chunks, zero padding included)
    head_dim_pad_fraction: float  # 1 - D / head_dim_padded
    seq_q_padded: int  # ceil(Sq / tile_m) * tile_m
    seq_q_pad_fraction: float
    seq_kv_padded: int  # ceil(Skv / tile_n) * tile_n
    seq_kv_pad_fraction: float

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def wave_efficiency(self) -> float:
        """Share of all launched waves' slots doing work: waves / ceil(waves)."""
        return self.programs / (math.ceil(self.waves) * self.slots)


def _padded(n: int, tile: int) -> tuple[int, float]:
    padded = math.ceil(n / tile) * tile
    return padded, 1.0 - n / padded


def launch_geometry(grid: tuple[int, ...], *, head_dim: int, seq_q: int, seq_kv: int,
                    tile_m: int, tile_n: int, sms: int, per_sm: int, num_ctas: int = 1,
                    per_sm_source: str = PER_SM_HINT) -> Geometry:
    """The geometry of a launch of ``grid`` programs; see the module docstring."""
    if sms < 1 or per_sm < 1 or num_ctas < 1 or min(grid, default=0) < 1:
        raise ValueError(f"launch_geometry: need positive grid {grid}, sms {sms}, per_sm "
                         f"{per_sm}, num_ctas {num_ctas}")
    programs = math.prod(grid)
    slots = max(1, sms * per_sm // num_ctas)
    rest = programs % slots
    hd = plan_head_dim(head_dim)
    q_padded, q_frac = _padded(seq_q, tile_m)
    kv_padded, kv_frac = _padded(seq_kv, tile_n)
    return Geometry(programs=programs, per_sm=per_sm, per_sm_source=per_sm_source, sms=sms,
                    slots=slots, waves=programs / slots,
                    tail_efficiency=rest / slots if rest else 1.0,
                    head_dim_padded=hd.padded, head_dim_pad_fraction=hd.waste,
                    seq_q_padded=q_padded, seq_q_pad_fraction=q_frac,
                    seq_kv_padded=kv_padded, seq_kv_pad_fraction=kv_frac)


def plan_geometry(plan, seq_kv: int, sms: int) -> Geometry:
    """The geometry of a built ``kernel.plan.Plan`` (its grid, schedule and sizes)."""
    s = plan.schedule
    return launch_geometry(plan.launches[0].grid, head_dim=plan.variant.head_dim,
                           seq_q=plan.out_shape[2], seq_kv=seq_kv, tile_m=s.tile_m,
                           tile_n=s.tile_n, sms=sms, per_sm=s.occupancy,
                           num_ctas=s.num_ctas)


def grid_for(*, batch: int, heads: int, seq_q: int, tile_m: int) -> tuple[int, int, int]:
    """The forward kernel's grid: (query tiles, query heads, batch). ``make_plan`` builds its
    grid with this, and ``tiledattn advise`` uses it for shapes it has no plan for."""
    return (math.ceil(seq_q / tile_m), heads, batch)
