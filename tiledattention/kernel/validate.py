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
# The FP8 forward (``check_fp8``): e4m3 q, k, v (e5m2 refused), bf16 or fp16 out, head
# dims 32-256 in steps of 32 (wgmma's fp8 contraction is 32 elements, so are the chunks).
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_INPUT = (torch.float8_e4m3fn,)
FP8_OUT_DTYPES = (torch.bfloat16, torch.float16)
FP8_HEAD_DIMS = range(32, 257, 32)


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


def _dtype_names(dtypes=SUPPORTED_DTYPES) -> str:
    names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
    if dtypes is SUPPORTED_DTYPES:
        names += " (and float8_e4m3fn for q, k and v together: the FP8 forward)"
    return names


def check_inputs(q, k, v, *, causal, scale, attn_mask, enable_gqa,
                 device: bool = True, dtypes=SUPPORTED_DTYPES) -> Problem:
    """The validated problem of a call, or its typed error. ``device`` False leaves the
    device check to run time (a trace under torch.compile: ``check_device``); ``dtypes``
    the accepted input dtypes (``FP8_INPUT`` for the FP8 forward)."""
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
        if t.dtype not in dtypes:
            raise DTypeError(f"{name}.dtype is {t.dtype}; supported dtypes are "
                             f"{_dtype_names(dtypes)}")
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
    check_backward_head_dims(q.shape[3], v.shape[3])


def check_backward_head_dims(head_dim: int, head_dim_v: int) -> None:
    """``check_head_dim_backward`` on the head dims alone (a backward plan's build)."""
    if max(head_dim, head_dim_v) > MAX_HEAD_DIM:
        raise BackwardNotSupportedError(
            f"backward of head dims above {MAX_HEAD_DIM} not supported (q/k head dim "
            f"{head_dim}, v's {head_dim_v}); the forward runs: call it without a gradient "
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


# ----------------------------------------------------------------------------- FP8
def check_fp8_call(q, *, descales, out_dtype, needs_grad: bool, attn_mask,
                   has_variant: bool) -> None:
    """What an FP8 call (or a call with an FP8 argument) may not ask for, each one typed
    error before anything else is read: FP8 arguments with other inputs, e5m2, a
    gradient, a mask or variant; ``out_dtype`` must be bf16 or fp16."""
    fp8 = isinstance(q, torch.Tensor) and q.dtype in FP8_DTYPES
    if not fp8:
        given = [n for n, d in zip(("q_descale", "k_descale", "v_descale"), descales)
                 if d is not None] + (["out_dtype"] if out_dtype is not None else [])
        got = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
        verb = "applies" if len(given) == 1 else "apply"
        raise InputError(f"{', '.join(given)} {verb} to float8_e4m3fn q, k, v only (the FP8 "
                         f"forward); q is {got}: leave {'it' if len(given) == 1 else 'them'} "
                         "out")
    if q.dtype != torch.float8_e4m3fn:
        raise DTypeError(f"q.dtype is {q.dtype}; the FP8 forward takes float8_e4m3fn "
                         "(e4m3) q, k and v only")
    if needs_grad:
        raise BackwardNotSupportedError(
            "the FP8 forward has no backward (inference only): call it under "
            "torch.no_grad() or with inputs that do not require grad")
    if attn_mask is not None or has_variant:
        raise InputError("the FP8 forward takes no attn_mask, score_mod, mask_mod or "
                         "block_mask (plain or causal attention only); use bf16/fp16 "
                         "inputs for them")
    if out_dtype is not None and out_dtype not in FP8_OUT_DTYPES:
        raise DTypeError(f"out_dtype is {out_dtype!r}; the FP8 forward writes "
                         "torch.bfloat16 (default) or torch.float16")


def check_fp8_shapes(problem: Problem) -> None:
    """The FP8 forward's head dims: 32-256 in steps of 32, one for q, k and v."""
    d, dv = problem.head_dim, problem.value_dim
    if d not in FP8_HEAD_DIMS or dv != d:
        raise UnsupportedHeadDimError(
            f"the FP8 forward takes one head dim for q, k and v in 32, 64, ..., 256 (steps "
            f"of 32); got q/k {d}, v {dv}")


def check_descale(name: str, d, q, batch: int, heads_kv: int) -> None:
    """A descale factor: None (checked by ``check_descales_given``), or an fp32 tensor on
    q's device of shape [], [1] (per tensor) or [B, Hkv] (per batch and K/V head, as FA3
    takes them)."""
    if d is None:
        return
    if not isinstance(d, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor or None, got {type(d).__name__}")
    if d.dtype != torch.float32:
        raise DTypeError(f"{name}.dtype is {d.dtype}; descale factors are torch.float32")
    if d.device != q.device:
        raise DeviceError(f"{name} is on {d.device}, q on {q.device}")
    if tuple(d.shape) not in ((), (1,), (batch, heads_kv)):
        raise ShapeError(f"{name} has shape {tuple(d.shape)}; accepted: [] or [1] (per "
                         f"tensor) or [B, Hkv] = [{batch}, {heads_kv}]")


def check_descales_given(names, descales) -> None:
    """Every descale of an FP8 call given. FA3 reads a missing one as 1.0, but e4m3
    inputs are almost always scaled, so a forgotten factor would give wrong numbers
    silently (issue 48 counts it as bad input)."""
    missing = [n for n, d in zip(names, descales) if d is None]
    if missing:
        raise InputError(f"the FP8 forward needs q_descale, k_descale and v_descale (fp32, "
                         f"[] or [1] per tensor, or [B, Hkv]); missing: {', '.join(missing)} "
                         "(unit scales: torch.ones((), device=q.device))")
