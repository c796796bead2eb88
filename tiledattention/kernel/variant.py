"""A kernel variant: everything that is fixed at compile time for one launch."""

from __future__ import annotations

from dataclasses import dataclass

from ..headdim import plan_head_dim
from ..schedules.schedule import Schedule

DTYPES = ("float16", "bfloat16")
MASK_KINDS = ("none", "key_padding", "full")


@dataclass(frozen=True)
class Variant:
    """Compile-time identity of the kernel: the in-memory cache key besides hints.

    ``mask_axes`` says which of the mask's (batch, head, query) axes are real (True)
    or broadcast (False); ``mask_dtype`` is the additive mask's dtype name.
    """

    dtype: str
    head_dim: int
    causal: bool
    schedule: Schedule
    even_n: bool = False  # Skv % tile_n == 0
    mask_dtype: str | None = None
    mask_axes: tuple[bool, bool, bool] = (False, False, False)
    return_lse: bool = False

    @property
    def has_mask(self) -> bool:
        return self.mask_dtype is not None

    def constants(self) -> tuple:
        """The kernel's ``ct.Constant`` arguments, in declaration order."""
        s = self.schedule
        plan = plan_head_dim(self.head_dim)
        return (
            s.tile_m, s.tile_n, len(plan.widths), *plan.kernel_widths(),
            self.causal, s.heavy_first, self.even_n, self.has_mask, *self.mask_axes,
            self.return_lse,
            s.latency_k, s.latency_v,
        )

    def label(self) -> str:
        mask = "nomask" if not self.has_mask else "mask_" + "".join(
            a for a, on in zip("bhq", self.mask_axes) if on)
        return (f"{self.dtype}_d{self.head_dim}_{'causal' if self.causal else 'full'}_{mask}"
                f"{'_even' if self.even_n else ''}{'_lse' if self.return_lse else ''}"
                f"_{self.schedule.label()}")


def mask_axes_for(kind: str) -> tuple[bool, bool, bool]:
    """Representative mask layouts: key padding [B,1,1,Skv] and a full [B,H,Sq,Skv]."""
    return {"none": (False, False, False), "key_padding": (True, False, False),
            "full": (True, True, True)}[kind]


def variant_matrix(head_dims=(64, 96, 128, 160, 256), schedule_for=None) -> list[Variant]:
    """Every dtype x causal x mask kind x head dim, for compile-only checks."""
    from ..schedules.schedule import default_schedule

    schedule_for = schedule_for or default_schedule
    out = []
    for dtype in DTYPES:
        for causal in (False, True):
            for kind in MASK_KINDS:
                for d in head_dims:
                    out.append(Variant(
                        dtype=dtype, head_dim=d, causal=causal,
                        schedule=schedule_for(d, causal),
                        mask_dtype=None if kind == "none" else dtype,
                        mask_axes=mask_axes_for(kind),
                        # Exercise the LSE store on the masked variants.
                        return_lse=kind != "none",
                    ))
    return out
