"""Kernel variants: everything fixed at compile time for one launch, forward and backward.

A variant names its kernels' ``ct.Constant`` values by parameter name (``constants``);
``spec.KernelSpec.ordered`` places them. The flags every score kernel shares (head-dim
chunks, causality, the additive mask's layout, the variant functions, block sparsity) come
from one place, ``Flags``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..headdim import plan_head_dim, value_dim
from ..schedules.backward import BwdSchedule
from ..schedules.schedule import Schedule

DTYPES = ("float16", "bfloat16")
MASK_KINDS = ("none", "key_padding", "full")
# A bool mask reaches the kernels as its bytes (``mask.prepare_mask``), under this dtype name.
BOOL_MASK = "uint8"
DELTA_TILE_M = 64


@dataclass(frozen=True)
class Flags:
    """Compile-time facts every score kernel of a call shares.

    ``mask_axes`` says which of the additive mask's (batch, head, query) axes are real
    (True) or broadcast; ``mods`` is the variant functions' compile identity (``mods.Mods.
    key``; () for none); ``block_axes`` the block mask's (batch, head) axes, None without
    one.
    """

    dtype: str
    head_dim: int
    causal: bool
    mask_dtype: str | None = None
    mask_axes: tuple[bool, bool, bool] = (False, False, False)
    mods: tuple = ()
    has_score_mod: bool = False
    has_mask_mod: bool = False
    block_axes: tuple[bool, bool] | None = None

    @property
    def has_mask(self) -> bool:
        return self.mask_dtype is not None

    @property
    def bool_mask(self) -> bool:
        return self.mask_dtype == BOOL_MASK

    @property
    def plain(self) -> bool:
        """No variant functions and no block mask: the plain kernels run."""
        return not self.mods and self.block_axes is None

    def constants(self) -> dict[str, int | bool]:
        """The constants of the score kernels; the variant kernels' flags only when the
        variant kernels run (the plain ones do not declare them)."""
        plan = plan_head_dim(self.head_dim)
        w0, w1, w2 = plan.kernel_widths()
        mb, mh, mq = self.mask_axes
        out = dict(NCHUNK=len(plan.widths), W0=w0, W1=w1, W2=w2, CAUSAL=self.causal,
                   HAS_MASK=self.has_mask, MASK_BATCH=mb, MASK_HEAD=mh, MASK_ROWS=mq,
                   MASK_BOOL=self.bool_mask)
        if not self.plain:
            bb, bh = self.block_axes or (False, False)
            out.update(HAS_SCORE_MOD=self.has_score_mod, HAS_MASK_MOD=self.has_mask_mod,
                       BLOCK_SPARSE=self.block_axes is not None, BLK_BATCH=bb, BLK_HEAD=bh)
        return out

    def label(self) -> str:
        mask = "nomask" if not self.has_mask else "mask_" + "".join(
            a for a, on in zip("bhq", self.mask_axes) if on) + (
            "_bool" if self.bool_mask else "")
        mods = "".join(f"_{n}" for n, on in (("smod", self.has_score_mod),
                                               ("mmod", self.has_mask_mod)) if on)
        sparse = "" if self.block_axes is None else "_sparse"
        return (f"{self.dtype}_d{self.head_dim}_{'causal' if self.causal else 'full'}_{mask}"
                f"{mods}{sparse}")


def value_constants(head_dim_v: int) -> dict[str, int]:
    """The score kernels' ``VNCHUNK``.. (``FwdFlags``, ``DkdvFlags``, ``DqFlags``): the
    chunks of V's head dim (passed also when it equals Q/K's: the same constants, the
    same kernel)."""
    plan = plan_head_dim(head_dim_v)
    w0, w1, w2 = plan.kernel_widths()
    return dict(VNCHUNK=len(plan.widths), VW0=w0, VW1=w1, VW2=w2)


class _Shared:
    """What the forward and backward variants derive alike from their fields."""

    @property
    def has_mask(self) -> bool:
        return self.mask_dtype is not None

    def shared(self) -> Flags:
        return self.flags or Flags(self.dtype, self.head_dim, self.causal, self.mask_dtype,
                                   self.mask_axes)


@dataclass(frozen=True)
class Variant(_Shared):
    """Compile-time identity of the forward kernel (the in-memory cache key besides hints)."""

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
    flags: Flags | None = None  # variant functions and block sparsity (None: plain)
    head_dim_v: int | None = None  # V's (and the output's) head dim; None: ``head_dim``
    # The FP8 forward (``attention_fwd_fp8``, ``dtype`` "float8_e4m3fn"): the output's
    # dtype ("bfloat16" / "float16"); None: not FP8, the output has ``dtype``.
    out_dtype: str | None = None

    @property
    def value_dim(self) -> int:
        return value_dim(self.head_dim, self.head_dim_v)

    @property
    def fp8(self) -> bool:
        return self.out_dtype is not None

    def constants(self) -> dict[str, int | bool]:
        """The kernel's ``ct.Constant`` arguments by parameter name."""
        s = self.schedule
        fp8 = dict(FP8=True) if self.fp8 else {}  # only the FP8 entry point declares it
        return dict(
            TILE_M=s.tile_m, TILE_N=s.tile_n, HEAVY_FIRST=s.heavy_first, EVEN_N=self.even_n,
            RETURN_LSE=self.return_lse, LAT_K=s.latency_k, LAT_V=s.latency_v,
            SPLIT_K=self.split_k, PACKED=self.packed, PDL=s.pdl, **self.shared().constants(),
            **value_constants(self.value_dim), **fp8)

    def label(self) -> str:
        dv = "" if self.value_dim == self.head_dim else f"_dv{self.value_dim}"
        out = "" if self.out_dtype is None else f"_out_{self.out_dtype}"
        return (f"{self.shared().label()}{dv}{out}{'_even' if self.even_n else ''}"
                f"{'_lse' if self.return_lse else ''}{'_splitk' if self.split_k else ''}"
                f"{'_packed' if self.packed else ''}_{self.schedule.label()}")


# MHA's dK/dV program without the runtime loop over a GQA group, for these head dims: there it
# removes the causal D = 192 spill and runs 2-5 % faster (D 128-192); at D = 256 tileiras then
# waits on every MMA of the query loop (8 % slower), at D 64-96 it is 0-1 % slower
# (benchmarks/notes/backward.md §37a).
ONE_HEAD_DIMS = range(97, 193)


@dataclass(frozen=True)
class BwdVariant(_Shared):
    """Compile-time identity of the backward kernels of one call."""

    dtype: str
    head_dim: int
    causal: bool
    schedule: BwdSchedule
    even_n: bool = False  # Skv a multiple of both kernels' key tiles
    mask_dtype: str | None = None
    mask_axes: tuple[bool, bool, bool] = (False, False, False)
    has_dlse: bool = False
    flags: Flags | None = None
    # ``DkdvFlags.ONE_HEAD``: dK/dV without the loop over a GQA group (only for one query
    # head per K/V head). None: as an MHA call ships it, at ONE_HEAD_DIMS.
    one_head: bool | None = None
    head_dim_v: int | None = None  # V's (O's, dO's, dV's) head dim; None: ``head_dim``

    @property
    def value_dim(self) -> int:
        return value_dim(self.head_dim, self.head_dim_v)

    @property
    def wide_dim(self) -> int:
        """The wider of Q/K's and V's head dims, which the register-bound choices below
        (MASK_ALL, delta's own kernel) compare: with one head dim, that one, as before."""
        return max(self.head_dim, self.value_dim)

    @property
    def loop_free(self) -> bool:
        return self.head_dim in ONE_HEAD_DIMS if self.one_head is None else self.one_head

    @property
    def delta_in_dq(self) -> bool:
        """The dQ kernel computes delta (one launch fewer), except with dQ by reduce-add
        (no dQ kernel) and causal D > 128: there its extra O tile made the dQ kernel up to
        2x slower on the H100 (benchmarks/notes/backward.md §36a) and the delta kernel stays."""
        return self.schedule.dq != "atomic" and not (self.causal and self.wide_dim > 128)

    def constants(self, kernel: str) -> dict:
        """The ``ct.Constant`` arguments of one of the three backward kernels."""
        s = self.schedule
        if kernel == "attention_bwd_delta":
            return dict(TILE_M=DELTA_TILE_M, WD=1 << (self.value_dim - 1).bit_length(),
                        WQ=1 << (self.head_dim - 1).bit_length(), HAS_DLSE=self.has_dlse,
                        ZERO_DQ=s.dq == "atomic")
        # The score kernels' V chunks (``DkdvFlags.VNCHUNK``..), passed also when V's head
        # dim is Q/K's (the same constants, the same kernel), as the forward's.
        values = value_constants(self.value_dim)
        if kernel.startswith("attention_bwd_dkdv"):
            return dict(TILE_M=s.dkdv_m, TILE_N=s.dkdv_n, EVEN_N=self.even_n,
                        DQ_ATOMIC=s.dq == "atomic", MASK_ALL=self.causal and self.wide_dim > 128,
                        KEY_ROWS=s.key_rows, ONE_HEAD=self.loop_free,
                        **self.shared().constants(), **values)
        return dict(TILE_M=s.dq_m, TILE_N=s.dq_n, EVEN_N=self.even_n, HAS_DLSE=self.has_dlse,
                    DELTA=self.delta_in_dq, **self.shared().constants(), **values)

    def label(self) -> str:
        dv = "" if self.value_dim == self.head_dim else f"_dv{self.value_dim}"
        return (f"bwd_{self.shared().label()}{dv}{'_even' if self.even_n else ''}"
                f"{'_dlse' if self.has_dlse else ''}{'' if self.loop_free else '_loop'}"
                f"_{self.schedule.label()}")


def mask_axes_for(kind: str) -> tuple[bool, bool, bool]:
    """Representative mask layouts: key padding [B,1,1,Skv] and a full [B,H,Sq,Skv]."""
    return {"none": (False, False, False), "key_padding": (True, False, False),
            "full": (True, True, True)}[kind]


def variant_matrix(head_dims=(64, 96, 128, 160, 256), schedule_for=None) -> list[Variant]:
    """Every dtype x causal x mask kind x head dim, for compile-only checks; each mask
    kind both as a bool mask (its bytes) and as an additive one, alternating by dtype."""
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
                        mask_dtype=None if kind == "none" else BOOL_MASK if (
                            kind == "key_padding") == (dtype == "float16") else dtype,
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
            mask_dtype=(BOOL_MASK if i % 4 == 1 else dtype) if masked else None,
            mask_axes=mask_axes_for("key_padding" if masked else "none"),
            return_lse=masked, split_k=True, packed=i % 3 != 0,
        ))
    return out
