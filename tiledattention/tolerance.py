"""The one tolerance table: how far an attention output (``RTOL``) and its gradients dQ,
dK, dV (``RTOL_BWD``, each tensor on its own) may lie from the float64 reference
(relative Frobenius error), per dtype. The benchmark harness (and so tuning),
``tiledattn check`` and the GPU tests all judge correctness by it.

The backward's bounds are wider than the forward's: P and dS are rounded to the input
dtype before their MMAs (as in FlashAttention), and dS = P * (dP - delta) subtracts two
nearly equal fp32 terms whose inputs carry the rounding of O and dO.

``float8_e4m3fn`` (the FP8 forward, measured against float64 from the dequantized e4m3
inputs, so their own rounding is not counted): P is rounded to e4m3 for P V, a relative
error of up to u = 2^-4 per probability, which O carries as ~u/sqrt(3) (about 0.036) at
most; emulated on the CPU the error was 0.007-0.027 at D 64-256
(benchmarks/notes/head-shapes.md §40h). The bound is u itself."""

from __future__ import annotations

RTOL = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-4, "float8_e4m3fn": 2.0 ** -4}
RTOL_BWD = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4}


def rtol(dtype) -> float:
    """The tolerance of a dtype, given as a name ("float16") or a torch dtype."""
    return RTOL[str(dtype).removeprefix("torch.")]


def rtol_bwd(dtype) -> float:
    """The gradients' tolerance of a dtype (each of dQ, dK, dV)."""
    return RTOL_BWD[str(dtype).removeprefix("torch.")]


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (``ref`` is the float64 reference)."""
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def captured_grad_error(out, ref, rounding) -> float:
    """The relative error of a captured tensor's gradient beyond ``rounding`` (the
    gradient's shift from delta's rounded O, ``reference.delta_rounding_effect``), of which
    up to 4x is allowed, as FlexAttention's tests allow a multiple of a low-precision
    reference's error: (||out - ref|| - 4 ||rounding||)+ / ||ref||. Where the exact gradient
    cancels to 0 (a per-head or per-query bias) every kernel gets only that rounding, which
    ``relative_error`` would call 1e11 times the gradient."""
    excess = (out.double() - ref).norm() - 4 * rounding.double().norm()
    return (excess.clamp_min(0.0) / ref.norm().clamp_min(1e-300)).item()
