"""The GPUs' spec-sheet peaks, in one table: the dashed lines of the figures and the README's
"peak" line both read it, so a figure never draws a peak the README does not state.

Dense (no sparsity) bf16/fp16 tensor-core TFLOP/s and HBM bandwidth in TB/s, NVIDIA's
data sheets for the SXM parts; a GPU not listed gets no peak line (never a guessed one).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    part: str  # the part the numbers are for, as the data sheet names it
    dense_tflops: float  # bf16/fp16 tensor cores, dense
    hbm_tbs: float  # HBM bandwidth, TB/s (10^12 B/s)

    @property
    def hbm_gbs(self) -> float:
        return self.hbm_tbs * 1000


# Matched by substring of the name torch reports (manifest gpu.name), most specific first.
PEAKS: tuple[tuple[str, Peak], ...] = (
    ("H200", Peak("H200 SXM", 989.0, 4.8)),
    ("H100 80GB HBM3", Peak("H100 SXM", 989.0, 3.35)),
    ("H100 SXM", Peak("H100 SXM", 989.0, 3.35)),
)


def peak_of(gpu: str | None) -> Peak | None:
    """The data-sheet peak of the GPU named ``gpu`` (None: not a GPU we list)."""
    for pattern, peak in PEAKS:
        if gpu and pattern in gpu:
            return peak
    return None


def gpu_title(gpu: str | None) -> str:
    """What a figure's title names the hardware as."""
    return gpu or "no GPU recorded"


def peak_sentence(gpu: str | None) -> str | None:
    """The README's one line of the peaks the figures draw, or None for an unlisted GPU."""
    peak = peak_of(gpu)
    if peak is None:
        return None
    return (f"Peaks (the figures' dashed lines, {peak.part} data sheet): "
            f"{peak.dense_tflops:g} TFLOP/s dense bf16/fp16, HBM {peak.hbm_tbs:g} TB/s")
