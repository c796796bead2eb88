"""The project's one FLOP model for attention: forward, backward and both."""

from __future__ import annotations

PASSES = ("fwd", "bwd", "fwd+bwd")
# The backward's five matmuls (S recomputed, dP, dV, dK, dQ) against the forward's two:
# 2.5x the forward's matmul FLOPs (FlashAttention's convention).
BWD_FACTOR = 2.5
_PASS_FACTOR = {"fwd": 1.0, "bwd": BWD_FACTOR, "fwd+bwd": 1.0 + BWD_FACTOR}


def attention_flops(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int,
                    causal: bool, pass_: str = "fwd") -> float:
    """4·B·H·Sq·Skv·D (two matmuls of 2·Sq·Skv·D each), half when causal; times 2.5 for
    the backward, 3.5 for forward plus backward.

    The convention of FlashAttention, Triton and the paper; for causal Sq != Skv it
    is the same nominal half, not the exact count of unmasked pairs.
    """
    flops = 4.0 * batch * heads * seq_q * seq_kv * head_dim * _PASS_FACTOR[pass_]
    return flops / 2 if causal else flops


def tflops_per_s(flops: float, milliseconds: float) -> float:
    return flops / (milliseconds * 1e-3) / 1e12
