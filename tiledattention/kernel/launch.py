"""Running the kernel on CUDA tensors: layout fixes, mask preparation, the launch."""

from __future__ import annotations

import functools
import math

import torch

from ..errors import GPUTooOldError, ToolchainMissingError
from ..schedules.schedule import Schedule
from .compile import kernel_for
from .toolchain import INSTALL_LINE, kernel_module, tileiras_path
from .variant import Variant

MIN_CAPABILITY = (8, 0)  # tileiras targets Ampere and newer; tested on Hopper (sm_90)
LOG2E = 1.0 / math.log(2.0)


@functools.cache
def check_device(index: int) -> None:
    """Once per device: capability and toolchain, so the call path stays cheap."""
    cap = torch.cuda.get_device_capability(index)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        raise GPUTooOldError(
            f"{name} has compute capability {cap[0]}.{cap[1]}; cuTile needs "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ampere, Hopper, Blackwell)")
    kernel_module()
    if tileiras_path() is None:
        raise ToolchainMissingError(f"tileiras (the cuTile compiler) was not found on PATH or "
                                    f"in $CUDA_HOME/bin; {INSTALL_LINE}")


def _addressable(t: torch.Tensor) -> torch.Tensor:
    # The kernel addresses any strides as long as the head dim is unit-stride.
    return t if t.stride(-1) == 1 else t.contiguous()


def prepare_mask(mask: torch.Tensor, dtype: torch.dtype, target) -> torch.Tensor:
    """4-D additive mask whose broadcast axes have size 1 and whose key axis is dense."""
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    # An expanded (stride-0) axis is a broadcast in disguise: keep one slice of it.
    index = tuple(slice(0, 1) if (mask.stride(i) == 0 and i < 3) else slice(None)
                  for i in range(4))
    mask = mask[index]
    if mask.shape[3] != target[3]:
        mask = mask.expand(*mask.shape[:3], target[3])
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf"))
    return _addressable(mask)


def run_attention(q, k, v, attn_mask, causal: bool, scale: float, return_lse: bool,
                  schedule: Schedule) -> tuple[torch.Tensor, torch.Tensor]:
    import cuda.tile as ct

    check_device(q.device.index if q.device.index is not None else torch.cuda.current_device())
    q, k, v = _addressable(q), _addressable(k), _addressable(v)
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    out = torch.empty((b, hq, sq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq) if return_lse else (1, 1, 1), dtype=torch.float32,
                      device=q.device)
    if attn_mask is not None:
        mask = prepare_mask(attn_mask, q.dtype, (b, hq, sq, sk))
        mask_dtype = str(mask.dtype).removeprefix("torch.")
        mask_axes = (mask.shape[0] > 1, mask.shape[1] > 1, mask.shape[2] > 1)
    else:
        mask = lse.view(1, 1, 1, -1)[..., :1]  # never read: HAS_MASK is False
        mask_dtype, mask_axes = None, (False, False, False)
    variant = Variant(
        dtype=str(q.dtype).removeprefix("torch."), head_dim=d, causal=causal,
        schedule=schedule, even_n=sk % schedule.tile_n == 0, mask_dtype=mask_dtype,
        mask_axes=mask_axes, return_lse=return_lse,
    )
    grid = (math.ceil(sq / schedule.tile_m), hq, b)
    args = (q, k, v, out, lse, mask, scale * LOG2E, 1.0 / scale, hq // hk, *variant.constants())
    with torch.cuda.device(q.device):
        ct.launch(torch.cuda.current_stream(), grid, kernel_for(schedule), args)
    return out, lse
