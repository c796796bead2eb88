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
def _kernel_for_hints(occupancy: int, num_ctas: int):
    return kernel_module().attention_fwd.replace_hints(occupancy=occupancy, num_ctas=num_ctas)


def kernel_for(schedule: Schedule):
    """The cuTile kernel object carrying this schedule's compiler hints (cached)."""
    return _kernel_for_hints(schedule.occupancy, schedule.num_ctas)


@dataclass(frozen=True)
class CompiledCubin:
    variant: Variant
    gpu_code: str
    cubin: bytes
    seconds: float


def signature_for(variant: Variant):
    """The export signature matching a launch with contiguous, 16-byte aligned tensors."""
    import cuda.tile as ct
    from cuda.tile.compilation import (
        ArrayConstraint,
        CallingConvention,
        KernelSignature,
        ScalarConstraint,
    )

    def array(dtype, ndim):
        return ArrayConstraint(
            dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
            may_alias_internally=False, stride_constant=[None] * (ndim - 1) + [1],
            stride_divisible_by=[8] * (ndim - 1) + [1], base_addr_divisible_by=16,
        )

    io_dtype = getattr(ct, variant.dtype)
    mask_dtype = getattr(ct, variant.mask_dtype or "float32")
    params = ordered(dict(
        Q=array(io_dtype, 4), K=array(io_dtype, 4), V=array(io_dtype, 4),
        Out=array(io_dtype, 4), Lse=array(ct.float32, 3), Mask=array(mask_dtype, 4),
        qk_scale_log2=ScalarConstraint(ct.float32), inv_scale=ScalarConstraint(ct.float32),
        GROUP=ScalarConstraint(ct.int32), **variant.constants(),
    ))
    return KernelSignature(list(params), CallingConvention.cutile_python_v1())


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
