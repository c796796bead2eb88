"""Compiling kernel variants: the launch-time kernel cache and ahead-of-time export.

cuTile compiles on first launch and caches per specialisation in memory; it also keeps
cubins on disk under ``$CUDA_TILE_CACHE_DIR`` (default ``~/.cache/cutile-python``, one per
user), so a new process reuses them. ``export_cubin`` runs the same compiler for any
target without a GPU, which is how CI proves every variant compiles for Hopper and
Blackwell.
"""

from __future__ import annotations

import functools
import io
import time
from dataclasses import dataclass

from ..errors import CompileError
from ..schedules.schedule import Schedule
from .params import ordered
from .toolchain import kernel_module
from .variant import Variant


@functools.cache
def _kernel_for_hints(occupancy: int, num_ctas: int, worker_warps: int | None = None):
    return kernel_module().attention_fwd.replace_hints(
        occupancy=occupancy, num_ctas=num_ctas, num_worker_warps=worker_warps)


def kernel_for(schedule: Schedule):
    """The cuTile kernel object carrying this schedule's compiler hints (cached)."""
    return _kernel_for_hints(schedule.occupancy, schedule.num_ctas, schedule.worker_warps)


@functools.cache
def combine_kernel():
    """The split-K combine kernel (``combine.attention_combine``)."""
    kernel_module()  # cuTile importable, or the install line
    from .combine import attention_combine

    return attention_combine


def combine_constants(head_dim: int, rows: int, return_lse: bool) -> dict[str, int | bool]:
    """The combine kernel's ``ct.Constant`` arguments for ``rows`` query rows per head."""
    from ..headdim import plan_head_dim

    plan = plan_head_dim(head_dim)
    w0, w1, w2 = plan.kernel_widths()
    # A power of two covering small row counts (decode) without idle lanes; 32 rows of
    # fp32 accumulators (32 x 256) stay within one CTA's registers.
    tile_r = min(1 << max(rows - 1, 0).bit_length(), 32)
    return dict(TILE_R=tile_r, NCHUNK=len(plan.widths), W0=w0, W1=w1, W2=w2,
                RETURN_LSE=return_lse)


@dataclass(frozen=True)
class CompiledCubin:
    variant: Variant
    gpu_code: str
    cubin: bytes
    seconds: float


def export_array(dtype, ndim: int, *, stride_divisible_by: int = 8):
    """The export constraint of a contiguous-last-axis, 16-byte aligned tensor argument
    (what a launch passes); ``stride_divisible_by`` applies to the outer axes."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    return ArrayConstraint(
        dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
        may_alias_internally=False, stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[stride_divisible_by] * (ndim - 1) + [1],
        base_addr_divisible_by=16,
    )


def signature_for(variant: Variant):
    """The export signature matching a launch with contiguous, 16-byte aligned tensors."""
    import cuda.tile as ct
    from cuda.tile.compilation import CallingConvention, KernelSignature, ScalarConstraint

    array = export_array
    io_dtype = getattr(ct, variant.dtype)
    mask_dtype = getattr(ct, variant.mask_dtype or "float32")
    params = ordered(dict(
        Q=array(io_dtype, 4), K=array(io_dtype, 4), V=array(io_dtype, 4),
        Out=array(ct.float32 if variant.split_k else io_dtype, 4), Lse=array(ct.float32, 3),
        Mask=array(mask_dtype, 4),
        qk_scale_log2=ScalarConstraint(ct.float32), inv_scale=ScalarConstraint(ct.float32),
        GROUP=ScalarConstraint(ct.int32), SEQ_Q=ScalarConstraint(ct.int32),
        NUM_SPLITS=ScalarConstraint(ct.int32), SPLIT_TILES=ScalarConstraint(ct.int32),
        **variant.constants(),
    ))
    return KernelSignature(list(params), CallingConvention.cutile_python_v1())


def export_combine_cubin(dtype: str, head_dim: int, return_lse: bool,
                         gpu_code: str) -> bytes:
    """Compile the combine kernel for one dtype and head dim (rows: a decode tile)."""
    import cuda.tile as ct
    from cuda.tile.compilation import (
        CallingConvention,
        KernelSignature,
        ScalarConstraint,
        export_kernel,
    )

    def array(dt, ndim):
        return export_array(dt, ndim, stride_divisible_by=1)

    consts = combine_constants(head_dim, 4, return_lse)
    params = [array(ct.float32, 4), array(ct.float32, 3), array(getattr(ct, dtype), 4),
              array(ct.float32, 3), ScalarConstraint(ct.int32), *consts.values()]
    buf = io.BytesIO()
    try:
        export_kernel(combine_kernel(), [KernelSignature(
            params, CallingConvention.cutile_python_v1())], buf, gpu_code=gpu_code,
            output_format="cubin")
    except Exception as exc:
        raise CompileError(f"compiling the combine kernel ({dtype}, D={head_dim}) for "
                           f"{gpu_code} failed: {exc}") from exc
    return buf.getvalue()


def export_cubin(variant: Variant, gpu_code: str) -> CompiledCubin:
    """Compile one variant to a cubin for ``gpu_code`` (e.g. ``"sm_90"``); no GPU needed."""
    from cuda.tile.compilation import export_kernel

    buf = io.BytesIO()
    start = time.perf_counter()
    try:
        export_kernel(kernel_for(variant.schedule), [signature_for(variant)], buf,
                      gpu_code=gpu_code, output_format="cubin")
    except Exception as exc:  # cuTile raises several types; keep the variant in the message
        raise CompileError(f"compiling {variant.label()} for {gpu_code} failed: {exc}") from exc
    return CompiledCubin(variant, gpu_code, buf.getvalue(), time.perf_counter() - start)
