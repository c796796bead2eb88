"""Argument checks for ``sdpa``: every refusal is a typed error naming the argument."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import (
    BackwardNotSupportedError,
    DeviceError,
    DTypeError,
    InputError,
    MaskError,
    NoGPUError,
    ScheduleError,
    ShapeError,
    UnsupportedHeadDimError,
)
from ..headdim import (
    MAX_FWD_HEAD_DIM,
    MAX_FWD_VALUE_DIM,
    MAX_HEAD_DIM,
    supported_head_dim,
    value_dim,
)
from ..schedules.schedule import Schedule
from ..schedules.space import rejection

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Problem:
    """The validated shape of one call."""

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    scale: float
    head_dim_v: int | None = None  # V's and the output's head dim; None: ``head_dim``

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def value_dim(self) -> int:
        return value_dim(self.head_dim, self.head_dim_v)


def _dtype_names() -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)


def check_inputs(q, k, v, *, causal, scale, attn_mask, enable_gqa,
                 device: bool = True) -> Problem:
    """The validated problem of a call, or its typed error. ``device`` False leaves the
    device check to run time (a trace under torch.compile: ``check_device``)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_nested:  # its shape is ragged: nothing below can read it
            raise InputError(f"{name} is a nested tensor; sdpa takes dense [B, H, S, D] "
                             "tensors: pad it (torch.nested.to_padded_tensor) or pack the "
                             "sequences into one row with variants.document")
    if not (q.device == k.device == v.device):
        raise DeviceError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in SUPPORTED_DTYPES:
            raise DTypeError(f"{name}.dtype is {t.dtype}; supported dtypes are {_dtype_names()}")
    if not (q.dtype == k.dtype == v.dtype):
        raise DTypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ShapeError(f"{name} must have rank 4 [B, H, S, D], got shape {tuple(t.shape)}")
    (b, hq, sq, d), (bk, hk, sk, dk) = q.shape, k.shape
    if not (b == bk == v.shape[0]):
        raise ShapeError(f"batch sizes differ: q {b}, k {bk}, v {v.shape[0]}")
    if k.shape[:3] != v.shape[:3]:
        raise ShapeError(f"k and v must agree on [B, H, S], got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    dv = v.shape[3]
    if dk != d:
        raise ShapeError(f"head dims differ: q {d}, k {dk}; q and k need one head dim (v's "
                         "may differ, as in torch's SDPA)")
    for name, size in (("batch", b), ("query heads", hq), ("key/value heads", hk),
                       ("query sequence (q.shape[2])", sq), ("key sequence (k.shape[2])", sk)):
        if size < 1:
            raise ShapeError(f"empty {name}: got length {size}; every axis must be >= 1")
    # Past MAX_HEAD_DIM the forward only (``check_head_dim_backward``).
    for name, size, limit in (("head dim", d, MAX_FWD_HEAD_DIM),
                              ("v's head dim", dv, MAX_FWD_VALUE_DIM)):
        if not supported_head_dim(size, limit):
            raise UnsupportedHeadDimError(
                f"{name} {size} is not supported; accepted for q/k and for v (which may "
                f"differ): multiples of 8 from 8 to {MAX_HEAD_DIM}, and for the forward "
                f"only q/k up to {MAX_FWD_HEAD_DIM} with v up to {MAX_FWD_VALUE_DIM}")
    if not isinstance(enable_gqa, bool):
        raise InputError(f"enable_gqa must be a bool, got {enable_gqa!r}")
    if hq != hk:
        if hq % hk != 0:
            raise ShapeError(f"query heads ({hq}) must be a multiple of key/value heads ({hk})")
        if not enable_gqa:
            raise ShapeError(f"query heads ({hq}) != key/value heads ({hk}): pass "
                             "enable_gqa=True for grouped-query attention")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
            math.isfinite(scale) and scale > 0):
        raise InputError(f"scale must be a finite float > 0 or None (1/sqrt(D)), got {scale!r}")
    if not isinstance(causal, bool):
        raise InputError(f"causal must be a bool, got {causal!r}")
    if attn_mask is not None:
        check_mask(attn_mask, q, (b, hq, sq, sk))
    # Last, so every other check also runs (and is tested) on machines without a GPU.
    if device:
        check_device(q)
    return Problem(b, hq, hk, sq, sk, d, causal, float(scale), None if dv == d else dv)


def check_device(q) -> None:
    """CUDA tensors, or NoGPUError / DeviceError naming where they are."""
    if q.device.type != "cuda":
        if not torch.cuda.is_available():
            raise NoGPUError(
                f"q, k, v are on {q.device} and no CUDA GPU is visible to PyTorch "
                "(torch.cuda.is_available() is False); tiledattention runs on CUDA GPUs")
        raise DeviceError(f"q, k, v are on {q.device}; tiledattention needs CUDA tensors "
                          "(move them with .cuda())")


def check_mask(mask, q, target: tuple[int, int, int, int]) -> None:
    if not isinstance(mask, torch.Tensor):
        raise MaskError(f"attn_mask must be a torch.Tensor or None, got {type(mask).__name__}")
    allowed = (torch.bool, q.dtype, torch.float32)
    if mask.dtype not in allowed:
        raise MaskError(f"attn_mask.dtype is {mask.dtype}; accepted: torch.bool (True = attend) "
                        f"or an additive mask of {q.dtype} or torch.float32")
    if mask.device != q.device:
        raise MaskError(f"attn_mask is on {mask.device}, q on {q.device}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise BackwardNotSupportedError(
            "attn_mask requires grad; tiledattention computes gradients for q, k and v only "
            "(the mask is a constant): detach it")
    if mask.dim() > 4 or mask.dim() < 1:
        raise MaskError(f"attn_mask must have rank 1 to 4, got shape {tuple(mask.shape)}")
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    for size, want, axis in zip(shape, target, ("B", "H", "Sq", "Skv")):
        if size not in (1, want):
            raise MaskError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                            f"[B, H, Sq, Skv] = {list(target)} (axis {axis}: {size} vs {want})")


def check_head_dim_backward(q, v) -> None:
    """A gradient of a call whose head dim is past ``MAX_HEAD_DIM`` (the forward-only
    head dims, ``headdim.forward_only_head_dims``) is refused before anything runs."""
    if not (isinstance(q, torch.Tensor) and isinstance(v, torch.Tensor)) or q.is_nested \
            or v.is_nested or q.dim() != 4 or v.dim() != 4:
        return  # check_inputs names what is wrong with these
    if max(q.shape[3], v.shape[3]) > MAX_HEAD_DIM:
        raise BackwardNotSupportedError(
            f"backward of head dims above {MAX_HEAD_DIM} not supported (q/k head dim "
            f"{q.shape[3]}, v's {v.shape[3]}); the forward runs: call it without a gradient "
            "(torch.no_grad(), or inputs that do not require grad)")


def schedule_head_dim(problem: Problem) -> int:
    """The head dim whose schedules (table bucket, default, register check) a call runs:
    Q/K's, or V's where that is wider. The forward holds Q [M, D_qk] and the fp32
    accumulator [M, D_v]; a schedule tuned for max(D_qk, D_v) in both fits both (for the
    MLA-style D_v < D_qk: Q/K's, with the accumulator narrower than it was tuned for)."""
    return max(problem.head_dim, problem.value_dim)


def resolve_schedule(schedule, problem: Problem) -> Schedule | None:
    """The explicit schedule, validated for this head dim; None lets the policy choose."""
    if schedule is None:
        return None
    if isinstance(schedule, dict):
        schedule = Schedule.from_dict(schedule)
    if isinstance(schedule, Schedule):
        # The wider of Q/K's and V's chunks bounds the registers (``schedule_head_dim``).
        reason = rejection(schedule, schedule_head_dim(problem))
        if reason:
            raise ScheduleError(reason)
        return schedule
    raise ScheduleError(f"schedule must be a Schedule, a dict of its fields or None, got "
                        f"{type(schedule).__name__}")
