"""The project's one FLOP model for attention: forward, backward and both."""

from __future__ import annotations

PASSES = ("fwd", "bwd", "fwd+bwd")
# The backward's five matmuls (S recomputed, dP, dV, dK, dQ) against the forward's two:
# 2.5x the forward's matmul FLOPs (FlashAttention's convention).
BWD_FACTOR = 2.5
_PASS_FACTOR = {"fwd": 1.0, "bwd": BWD_FACTOR, "fwd+bwd": 1.0 + BWD_FACTOR}


def attention_flops(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int,
                    causal: bool, pass_: str = "fwd", head_dim_v: int | None = None) -> float:
    """4·B·H·Sq·Skv·D (two matmuls of 2·Sq·Skv·D each), half when causal; times 2.5 for
    the backward, 3.5 for forward plus backward. With V's head dim ``head_dim_v``
    (MLA's 192 / 128), 2·B·H·Sq·Skv·(D + D_v): Q K^T and P V each at their own width.

    The convention of FlashAttention, Triton and the paper; for causal Sq != Skv it
    is the same nominal half, not the exact count of unmasked pairs.
    """
    width = 2 * head_dim if head_dim_v is None else head_dim + head_dim_v
    flops = 2.0 * batch * heads * seq_q * seq_kv * width * _PASS_FACTOR[pass_]
    return flops / 2 if causal else flops


def tflops_per_s(flops: float, milliseconds: float) -> float:
    return flops / (milliseconds * 1e-3) / 1e12


def attended_pairs(seq_q: int, seq_kv: int, causal: bool) -> int:
    """(query, key) pairs one sequence computes: Sq·Skv, or with causality aligned
    bottom-right (FlashAttention's varlen and paged convention: query i sees keys
    j <= i + Skv - Sq) the exact count of unmasked pairs."""
    if not causal:
        return seq_q * seq_kv
    blind = max(0, seq_q - seq_kv)  # leading queries with no key (Sq > Skv)
    first = blind + seq_kv - seq_q + 1  # keys the first seeing query attends
    return (seq_q - blind) * (first + seq_kv) // 2


def ragged_attention_flops(heads: int, seqs_q, seqs_kv, head_dim: int, causal: bool,
                           pass_: str = "fwd") -> float:
    """Useful-token FLOPs of a ragged batch (packed or paged): 4·H·D per attended pair,
    summed over the sequences, each counted on its own lengths (padding never counts;
    causal pairs exactly, per sequence, as ``attended_pairs``); the passes as above."""
    pairs = sum(attended_pairs(q, k, causal) for q, k in zip(seqs_q, seqs_kv, strict=True))
    return 4.0 * heads * head_dim * pairs * _PASS_FACTOR[pass_]
