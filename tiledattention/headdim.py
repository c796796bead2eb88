"""How a head dim is split into the power-of-two chunks cuTile tiles require.

Host-only arithmetic (no cuTile, no torch): ``schedules`` (register and shared-memory
estimates) and ``kernel`` (plans, geometry, checks) both read it, and ``kernel`` imports
``schedules``, so it sits in the package root below both rather than in either room.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

MAX_HEAD_DIM = 256  # forward and backward
# Forward only (inference, decode), beyond MAX_HEAD_DIM: Q/K's head dim up to 576 (MLA
# decode's 512 + 64 rope) and V's up to 512. A [64, 512] fp32 accumulator fits two
# consumer warp groups' registers without a spill; no backward is compiled for them
# (benchmarks/repro/d512_forward.py).
MAX_FWD_HEAD_DIM = 576
MAX_FWD_VALUE_DIM = 512
MAX_CHUNKS = 3
# Smallest chunk: fp16/bf16 MMA contracts over at least 16 elements.
MIN_CHUNK = 16


def value_dim(head_dim: int, head_dim_v: int | None) -> int:
    """V's (and the output's) head dim: ``head_dim_v``, or Q/K's where it is None (one head dim)."""
    return head_dim if head_dim_v is None else head_dim_v


@dataclass(frozen=True)
class HeadDimPlan:
    """Chunk widths (non-increasing powers of two) covering a head dim ``d``."""

    d: int
    widths: tuple[int, ...]

    @property
    def padded(self) -> int:
        """Columns computed, counting zero-padded ones."""
        return sum(self.widths)

    @property
    def exact(self) -> bool:
        """No zero-padded columns: every chunk lies inside the head dim."""
        return self.padded == self.d

    @property
    def waste(self) -> float:
        """Fraction of multiply-accumulate work spent on zero padding."""
        return 1.0 - self.d / self.padded

    def kernel_widths(self) -> tuple[int, int, int]:
        """(W0, W1, W2) for the kernel; unused slots repeat the last width (ignored)."""
        w = self.widths + (self.widths[-1],) * (MAX_CHUNKS - len(self.widths))
        return w[0], w[1], w[2]


def supported_head_dim(d: int, limit: int = MAX_HEAD_DIM) -> bool:
    return isinstance(d, int) and 8 <= d <= limit and d % 8 == 0


@functools.cache
def plan_head_dim(d: int) -> HeadDimPlan:
    """Greedy split into at most three power-of-two chunks.

    Every head dim with at most three set bits above 8 (64, 96, 128, 160, 192, 224, ...;
    past 256 the forward's 384, 512, 576 = 512 + 64) is split exactly; the rest round only
    their last chunk up (e.g. 120 = 64 + 32 + 32, 6.25% padding) and head dims below 16 are
    padded to 16.
    """
    if not supported_head_dim(d, MAX_FWD_HEAD_DIM):
        raise ValueError(f"head dim {d} is not a multiple of 8 in [8, {MAX_FWD_HEAD_DIM}]")
    widths: list[int] = []
    rest = d
    while rest > 0:
        if len(widths) == MAX_CHUNKS - 1:
            w = max(MIN_CHUNK, 1 << (rest - 1).bit_length())  # last chunk: round up
        else:
            w = max(MIN_CHUNK, 1 << (rest.bit_length() - 1))  # largest power of two <= rest
        widths.append(w)
        rest -= w
    return HeadDimPlan(d, tuple(widths))
