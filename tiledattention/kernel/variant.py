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
    split_k: bool = False  # partial outputs per key split (then the combine kernel)
    packed: bool = False  # GQA query heads packed into the rows of one tile

    @property
    def has_mask(self) -> bool:
        return self.mask_dtype is not None

    def constants(self) -> dict[str, int | bool]:
        """The kernel's ``ct.Constant`` arguments by parameter name (see ``params``)."""
        s = self.schedule
        plan = plan_head_dim(self.head_dim)
        w0, w1, w2 = plan.kernel_widths()
        mask_batch, mask_head, mask_rows = self.mask_axes
        return dict(
            TILE_M=s.tile_m, TILE_N=s.tile_n, NCHUNK=len(plan.widths), W0=w0, W1=w1, W2=w2,
            CAUSAL=self.causal, HEAVY_FIRST=s.heavy_first, EVEN_N=self.even_n,
            HAS_MASK=self.has_mask, MASK_BATCH=mask_batch, MASK_HEAD=mask_head,
            MASK_ROWS=mask_rows, RETURN_LSE=self.return_lse,
            LAT_K=s.latency_k, LAT_V=s.latency_v, SPLIT_K=self.split_k, PACKED=self.packed,
            PDL=s.pdl,
        )

    def label(self) -> str:
        mask = "nomask" if not self.has_mask else "mask_" + "".join(
            a for a, on in zip("bhq", self.mask_axes) if on)
        return (f"{self.dtype}_d{self.head_dim}_{'causal' if self.causal else 'full'}_{mask}"
                f"{'_even' if self.even_n else ''}{'_lse' if self.return_lse else ''}"
                f"{'_splitk' if self.split_k else ''}{'_packed' if self.packed else ''}"
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


def decode_variant_matrix(head_dims=(64, 96, 128, 256)) -> list[Variant]:
    """The decode flags (split-K, GQA packing) over dtype x causal x head dim, with a
    key-padding mask and LSE on some: a small slice for the compile-only checks."""
    from ..schedules.schedule import default_schedule

    out = []
    for i, (dtype, causal, d) in enumerate(
            (dt, c, d) for dt in DTYPES for c in (False, True) for d in head_dims):
        masked = i % 2 == 1
        out.append(Variant(
            dtype=dtype, head_dim=d, causal=causal, schedule=default_schedule(d, causal),
            mask_dtype=dtype if masked else None,
            mask_axes=mask_axes_for("key_padding" if masked else "none"),
            return_lse=masked, split_k=True, packed=i % 3 != 0,
        ))
    return out
