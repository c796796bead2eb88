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
    sms: int = 132  # streaming multiprocessors
    flop_per_sm_cycle: int = 4096  # dense bf16/fp16 tensor-core FLOP per SM per cycle

    @property
    def clock_mhz(self) -> float:
        """The clock the data-sheet peak assumes (989 TFLOP/s on 132 SMs: 1830 MHz)."""
        return self.dense_tflops * 1e6 / (self.sms * self.flop_per_sm_cycle)

    def at_clock(self, mhz: float, dtype: str = "bfloat16") -> float:
        """Dense tensor-core TFLOP/s at an SM clock of ``mhz``: SMs x clock x FLOP per SM
        per cycle (twice bf16's for 8-bit floats)."""
        per_cycle = self.flop_per_sm_cycle * (2 if "float8" in dtype else 1)
        return self.sms * mhz * 1e6 * per_cycle / 1e12

    @property
    def hbm_gbs(self) -> float:
        return self.hbm_tbs * 1000


# Matched by substring of the name torch reports (manifest gpu.name), most specific first.
PEAKS: tuple[tuple[str, Peak], ...] = (
    ("H200", Peak("H200 SXM", 989.0, 4.8)),
    ("H100 80GB HBM3", Peak("H100 SXM", 989.0, 3.35)),
    ("H100 SXM", Peak("H100 SXM", 989.0, 3.35)),
)


# Other parts of the same names (lower clocks, other memory): no peak rather than the SXM's.
NOT_SXM = ("NVL", "PCIe")


def peak_of(gpu: str | None) -> Peak | None:
    """The data-sheet peak of the GPU named ``gpu`` (None: not a GPU we list)."""
    if gpu and any(part in gpu for part in NOT_SXM):
        return None
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


def best_rows(rows: list[dict]) -> dict[str, list[tuple[str, dict]]]:
    """Per pass, each method's row of highest TFLOP/s at a prefill point (Sq = Skv; any D,
    dtype, mask): the top of its throughput figures. Methods in registry order; pinned
    schedules (the ladder's) are not methods."""
    from ...bench.methods import METHODS
    from ...flops import PASSES

    best: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("seq_q") == r.get("seq_kv") and r.get("tflops"):
            by = best.setdefault(r.get("pass", "fwd"), {})
            if r["tflops"] > by.get(r["method"], {}).get("tflops", 0.0):
                by[r["method"]] = r
    order = list(METHODS)
    return {p: sorted(best[p].items(), key=lambda kv: order.index(kv[0])
                      if kv[0] in order else len(order))
            for p in PASSES if p in best}


def best_throughput(rows: list[dict]) -> dict[str, list[tuple[str, float]]]:
    """``best_rows`` as (method, TFLOP/s)."""
    return {p: [(m, r["tflops"]) for m, r in ms] for p, ms in best_rows(rows).items()}


def share(tflops: float, gpu: str | None, mhz: float | None = None) -> str:
    """"432 TFLOP/s (44%)": a throughput and its share of the GPU's dense peak, as the
    README and the utilisation figure both print it; with the SM clock it ran at
    (``mhz``), also its share of the peak at that clock: "(44%; 47% at 1700 MHz)"."""
    peak = peak_of(gpu)
    if peak is None:
        return f"{tflops:.0f} TFLOP/s"
    at = f"; {100 * tflops / peak.at_clock(mhz):.0f}% at {mhz:.0f} MHz" if mhz else ""
    return f"{tflops:.0f} TFLOP/s ({100 * tflops / peak.dense_tflops:.0f}%{at})"


def clock_sentence(rows: list[dict], gpu: str | None) -> str | None:
    """The README's line of the SM clocks the kernels ran at and the peak there, for rows
    that recorded one (``sm_clock_mhz``); None for rows without (studies before it)."""
    peak = peak_of(gpu)
    clocks = sorted(r["sm_clock_mhz"] for r in rows
                    if r.get("status") == "ok" and r.get("sm_clock_mhz"))
    if not clocks or peak is None:
        return None
    mid = clocks[len(clocks) // 2]
    return (f"SM clock while timed (NVML, per row `sm_clock_mhz`): median {mid:.0f} MHz, "
            f"{clocks[0]:.0f}-{clocks[-1]:.0f} MHz over the rows; the dense bf16/fp16 peak "
            f"at a clock f is {peak.sms} SMs x f x {peak.flop_per_sm_cycle} FLOP per SM "
            f"per cycle ({peak.at_clock(mid):.0f} TFLOP/s at {mid:.0f} MHz; the data "
            f"sheet's {peak.dense_tflops:g} assumes {peak.clock_mhz:.0f} MHz).")


def utilisation_sentence(rows: list[dict], gpu: str | None) -> str | None:
    """The README's line of each method's best prefill throughput per pass, with its share
    of the dense peak (the utilisation figure's numbers); None without ok prefill rows."""
    names = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward+backward"}
    best = best_rows(rows)
    if not best:
        return None
    peak = peak_of(gpu)
    what = (f"share of the {peak.dense_tflops:g} TFLOP/s dense peak" if peak else
            "no data-sheet peak for this GPU")
    return (f"Best prefill throughput per method (the highest point of its throughput "
            f"figures; {what}): " + "; ".join(
                f"{names.get(p, p)}: " + ", ".join(
                    f"{m} {share(r['tflops'], gpu, r.get('sm_clock_mhz'))}" for m, r in ms)
                for p, ms in best.items()) + ".")
