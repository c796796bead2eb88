"""The one tolerance table: how far an attention output may lie from the float64
reference (relative Frobenius error), per dtype. The benchmark harness (and so tuning),
``tiledattn check`` and the GPU tests all judge correctness by it."""

from __future__ import annotations

RTOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-4}


def rtol(dtype) -> float:
    """The tolerance of a dtype, given as a name ("float16") or a torch dtype."""
    return RTOL[str(dtype).removeprefix("torch.")]


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (``ref`` is the float64 reference)."""
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()
