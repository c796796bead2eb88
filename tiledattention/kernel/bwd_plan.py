"""The backward's variant, cached plan, launch and ahead-of-time export (its schedule, search
space and default live in ``schedules.backward``; the policy picks one per bucket).

Three launches per backward on PyTorch's current stream: ``attention_bwd_delta`` (grid:
query tiles x heads x batch), ``attention_bwd_dkdv`` (key tiles x K/V heads x batch) and
``attention_bwd_dq`` (query tiles x heads x batch). Arguments are placed by the kernels'
own parameter names, as the forward's (``params``).
"""

from __future__ import annotations

import functools
import inspect
import io
import math
from dataclasses import dataclass

import torch

from ..errors import CompileError
from ..headdim import plan_head_dim
from ..schedules.backward import DQ_MODES, BwdSchedule, default_bwd_schedule

__all__ = ["DQ_MODES", "BwdSchedule", "BwdVariant", "default_bwd_schedule", "run_backward"]

LOG2E = 1.0 / math.log(2.0)
DELTA_TILE_M = 64
MAX_PLANS = 1024


@dataclass(frozen=True)
class BwdVariant:
    """Compile-time identity of the backward kernels of one call."""

    dtype: str
    head_dim: int
    causal: bool
    schedule: BwdSchedule
    even_n: bool = False  # Skv a multiple of both kernels' key tiles
    mask_dtype: str | None = None
    mask_axes: tuple[bool, bool, bool] = (False, False, False)
    has_dlse: bool = False

    @property
    def has_mask(self) -> bool:
        return self.mask_dtype is not None

    def _common(self) -> dict:
        w0, w1, w2 = plan_head_dim(self.head_dim).kernel_widths()
        mb, mh, mq = self.mask_axes
        return dict(NCHUNK=len(plan_head_dim(self.head_dim).widths), W0=w0, W1=w1, W2=w2,
                    CAUSAL=self.causal, HAS_MASK=self.has_mask, MASK_BATCH=mb, MASK_HEAD=mh,
                    MASK_ROWS=mq)

    def constants(self, kernel: str) -> dict:
        s = self.schedule
        if kernel == "attention_bwd_delta":
            return dict(TILE_M=DELTA_TILE_M, WD=1 << (self.head_dim - 1).bit_length(),
                        HAS_DLSE=self.has_dlse)
        if kernel == "attention_bwd_dkdv":
            return dict(TILE_M=s.dkdv_m, TILE_N=s.dkdv_n, EVEN_N=self.even_n,
                        DQ_ATOMIC=s.dq == "atomic", **self._common())
        return dict(TILE_M=s.dq_m, TILE_N=s.dq_n, EVEN_N=self.even_n, **self._common())

    def label(self) -> str:
        mask = "nomask" if not self.has_mask else "mask_" + "".join(
            a for a, on in zip("bhq", self.mask_axes) if on)
        return (f"bwd_{self.dtype}_d{self.head_dim}_{'causal' if self.causal else 'full'}_{mask}"
                f"{'_even' if self.even_n else ''}{'_dlse' if self.has_dlse else ''}"
                f"_{self.schedule.label()}")


KERNELS = ("attention_bwd_delta", "attention_bwd_dkdv", "attention_bwd_dq")
_TENSORS = {"attention_bwd_delta": ("Out", "dOut", "Delta", "Dlse"),
            "attention_bwd_dkdv": ("Q", "K", "V", "dOut", "Lse", "Delta", "Mask", "dK", "dV",
                                   "dQacc"),
            "attention_bwd_dq": ("Q", "K", "V", "dOut", "Lse", "Delta", "Mask", "dQ")}


@functools.cache
def _module():
    from .toolchain import kernel_module

    kernel_module()  # the forward's import check: cuTile present, or a typed error
    from . import backward

    return backward


@functools.cache
def param_names(kernel: str) -> tuple[str, ...]:
    names = tuple(inspect.signature(getattr(_module(), kernel)._pyfunc).parameters)
    if names[:len(_TENSORS[kernel])] != _TENSORS[kernel]:
        raise TypeError(f"{kernel} must begin with {_TENSORS[kernel]}, got {names}")
    return names


def ordered(kernel: str, values: dict, *, skip: tuple[str, ...] = ()) -> tuple:
    names = [n for n in param_names(kernel) if n not in skip]
    missing = [n for n in names if n not in values]
    unknown = sorted(set(values) - set(names))
    if missing or unknown:
        raise TypeError(f"{kernel} arguments: missing {missing}, unknown {unknown}")
    return tuple(values[n] for n in names)


@functools.cache
def kernel_for(kernel: str, occupancy: int):
    return getattr(_module(), kernel).replace_hints(occupancy=occupancy)


@dataclass(frozen=True, eq=False)
class BwdPlan:
    variant: BwdVariant
    launches: tuple  # (kernel object, grid, tail) for delta, dkdv, dq
    dtype: torch.dtype
    device: torch.device
    mask_target: tuple[int, int, int, int] | None


_plans: dict[tuple, BwdPlan] = {}
_override: list[BwdSchedule | None] = [None]


class pinned_bwd_schedule:  # noqa: N801 - used as a context manager, like torch's
    """Within ``with pinned_bwd_schedule(s):`` every backward runs with schedule ``s``, and
    so does the backward of every forward run within it, whenever it runs (benchmarks
    compare backward schedules with it; None: the policy's choice, ``choose_bwd_schedule``)."""

    def __init__(self, schedule: BwdSchedule | None):
        self.schedule, self.saved = schedule, None

    def __enter__(self):
        self.saved, _override[0] = _override[0], self.schedule
        return self

    def __exit__(self, *exc):
        _override[0] = self.saved


def pinned_schedule() -> BwdSchedule | None:
    """The schedule of the innermost ``pinned_bwd_schedule``, or None."""
    return _override[0]


def _scalars(scale: float, group: int) -> dict:
    return dict(qk_scale_log2=scale * LOG2E, inv_scale=1.0 / scale, scale=scale, GROUP=group)


def make_plan(q, k, attn_mask, causal: bool, scale: float, has_dlse: bool,
              schedule: BwdSchedule | None) -> BwdPlan:
    from ..schedules.policy import choose_bwd_schedule
    from .launch import mask_layout

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    s = schedule or choose_bwd_schedule(q, k, causal)[0]
    target = (b, hq, sq, sk)
    mask = None if attn_mask is None else mask_layout(attn_mask, q.dtype, target)
    v = BwdVariant(dtype=str(q.dtype).removeprefix("torch."), head_dim=d, causal=causal,
                   schedule=s, even_n=sk % max(s.dkdv_n, s.dq_n) == 0,
                   mask_dtype=None if mask is None else mask[0],
                   mask_axes=(False, False, False) if mask is None else mask[1],
                   has_dlse=has_dlse)
    scalars = _scalars(scale, hq // hk)
    grids = {"attention_bwd_delta": (math.ceil(sq / DELTA_TILE_M), hq, b),
             "attention_bwd_dkdv": (math.ceil(sk / s.dkdv_n), hk, b),
             "attention_bwd_dq": (math.ceil(sq / s.dq_m), hq, b)}
    launches = []
    for name in KERNELS:
        values = {**(scalars if name != "attention_bwd_delta" else {}), **v.constants(name)}
        launches.append((kernel_for(name, s.occupancy if name != "attention_bwd_delta" else 1),
                         grids[name], ordered(name, values, skip=_TENSORS[name])))
    return BwdPlan(v, tuple(launches), q.dtype, q.device,
                   None if mask is None else target)


def _facts(t) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


def plan_for(q, k, attn_mask, causal, scale, has_dlse, schedule) -> BwdPlan:
    from ..schedules.policy import generation

    key = (_facts(q), _facts(k), None if attn_mask is None else _facts(attn_mask), causal,
           scale, has_dlse, schedule, generation())
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        plan = _plans[key] = make_plan(q, k, attn_mask, causal, scale, has_dlse, schedule)
    return plan


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def run_backward(q, k, v, out, lse, dout, dlse, attn_mask, causal: bool, scale: float,
                 schedule: BwdSchedule | None = None):
    """(dq, dk, dv) of ``sdpa``'s forward, given its output and natural-log LSE."""
    import cuda.tile as ct

    from .launch import prepare_mask

    q, k, v, out, dout = (_unit(t) for t in (q, k, v, out, dout))
    schedule = schedule or _override[0]
    plan = plan_for(q, k, attn_mask, causal, scale, dlse is not None, schedule)
    b, hq, sq, _ = q.shape
    dev = q.device
    delta = torch.empty((b, hq, sq), dtype=torch.float32, device=dev)
    lse = lse.contiguous()
    dlse_arg = delta if dlse is None else dlse.to(torch.float32).contiguous()
    mask = lse.view(1, 1, 1, -1)[..., :1]  # never read without HAS_MASK
    if plan.mask_target is not None:
        mask = prepare_mask(attn_mask, plan.dtype, plan.mask_target)
    atomic = plan.variant.schedule.dq == "atomic"
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=dev) if atomic else \
        delta.view(b, hq, sq, 1)  # never read without DQ_ATOMIC
    tensors = ((out, dout, delta, dlse_arg),
               (q, k, v, dout, lse, delta, mask, dk, dv, dq_acc),
               (q, k, v, dout, lse, delta, mask, dq))
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev)
        for (kernel, grid, tail), args in zip(plan.launches[:2 if atomic else 3], tensors):
            ct.launch(stream, grid, kernel, (*args, *tail))
    if atomic:
        dq.copy_(dq_acc)
    return dq, dk, dv


def signature_for(variant: BwdVariant, kernel: str):
    """Export signature of one backward kernel for contiguous, 16-byte aligned tensors."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    from .compile import export_array as array

    io = getattr(ct, variant.dtype)
    mask = getattr(ct, variant.mask_dtype or "float32")
    arrays = dict(Q=array(io, 4), K=array(io, 4), V=array(io, 4), Out=array(io, 4),
                  dOut=array(io, 4), dQ=array(io, 4), dK=array(io, 4), dV=array(io, 4),
                  dQacc=array(ct.float32, 4),
                  Lse=array(ct.float32, 3), Delta=array(ct.float32, 3),
                  Dlse=array(ct.float32, 3), Mask=array(mask, 4))
    scalars = dict(qk_scale_log2=ScalarConstraint(ct.float32),
                   inv_scale=ScalarConstraint(ct.float32), scale=ScalarConstraint(ct.float32),
                   GROUP=ScalarConstraint(ct.int32))
    values = {n: arrays[n] for n in _TENSORS[kernel]}
    if kernel != "attention_bwd_delta":
        values.update(scalars)
    values.update(variant.constants(kernel))
    return KernelSignature(list(ordered(kernel, values)), CallingConvention.cutile_python_v1())


def export_cubins(variant: BwdVariant, gpu_code: str) -> dict[str, bytes]:
    """Compile the three backward kernels of ``variant`` for ``gpu_code``; no GPU needed."""
    from cuda.tile.compilation import export_kernel

    out = {}
    for name in KERNELS:
        buf = io.BytesIO()
        occ = variant.schedule.occupancy if name != "attention_bwd_delta" else 1
        try:
            export_kernel(kernel_for(name, occ), [signature_for(variant, name)], buf,
                          gpu_code=gpu_code, output_format="cubin")
        except Exception as exc:  # cuTile raises several types; name the variant
            raise CompileError(f"compiling {name} of {variant.label()} for {gpu_code} "
                               f"failed: {exc}") from exc
        out[name] = buf.getvalue()
    return out
