"""The project's one FLOP model for attention forward."""

from __future__ import annotations


def attention_flops(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int,
                    causal: bool) -> float:
    """4·B·H·Sq·Skv·D (two matmuls of 2·Sq·Skv·D each), half when causal.

    The convention of FlashAttention, Triton and the paper; for causal Sq != Skv it
    is the same nominal half, not the exact count of unmasked pairs.
    """
    flops = 4.0 * batch * heads * seq_q * seq_kv * head_dim
    return flops / 2 if causal else flops


def tflops_per_s(flops: float, milliseconds: float) -> float:
    return flops / (milliseconds * 1e-3) / 1e12
