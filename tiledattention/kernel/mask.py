"""The user's mask as the kernels read it: its per-call preparation and the layout
facts a plan keys on (dtype, which axes are real).

A bool mask goes to the kernels as its bytes (a uint8 view, ``variant.BOOL_MASK``), which
they select on (``MASK_BOOL``); an additive one as it is. Turning a bool mask into an
additive one cost three launches and an allocation per call, per layer of a transformers
model with a padding mask and of every compiled one (benchmarks/notes/host-cost.md §58a)."""

from __future__ import annotations

import torch


def prepare_mask(mask: torch.Tensor, target) -> torch.Tensor:
    """4-D mask (additive, or a bool one's bytes) whose broadcast axes have size 1 and whose
    key axis is dense."""
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    # An expanded (stride-0) axis is a broadcast in disguise: keep one slice of it.
    index = tuple(slice(0, 1) if (mask.stride(i) == 0 and i < 3) else slice(None)
                  for i in range(4))
    mask = mask[index]
    if mask.shape[3] != target[3]:
        mask = mask.expand(*mask.shape[:3], target[3])
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    # The kernel addresses any strides as long as the key axis is unit-stride.
    return mask if mask.stride(-1) == 1 else mask.contiguous()


def mask_layout(mask: torch.Tensor, target) -> tuple[str, tuple]:
    """(dtype name, real (batch, head, query) axes) of the mask as ``prepare_mask`` leaves it.

    Worked out on a meta copy: it follows from shape, strides and dtype alone.
    """
    meta = torch.empty_strided(mask.shape, mask.stride(), dtype=mask.dtype, device="meta")
    prepared = prepare_mask(meta, target)
    return (str(prepared.dtype).removeprefix("torch."),
            (prepared.shape[0] > 1, prepared.shape[1] > 1, prepared.shape[2] > 1))
