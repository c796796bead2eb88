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


def share(tflops: float, gpu: str | None, mhz: float | None = None,
          dtype: str | None = None) -> str:
    """"432 TFLOP/s (44% nominal)": a throughput and its share of the data sheet's dense
    peak (at the data sheet's clock: nominal, never the clock it ran at), as the README and
    the utilisation figure both print it; with the SM clock it ran at (``mhz``), also its
    share of the peak at that clock: "(44% nominal; 47% at 1700 MHz)"."""
    peak = peak_of(gpu)
    if peak is None:
        return f"{tflops:.0f} TFLOP/s"
    dtype = dtype or "bfloat16"
    nominal = peak.at_clock(peak.clock_mhz, dtype)  # the data sheet's (fp8: twice bf16's)
    at = f"; {100 * tflops / peak.at_clock(mhz, dtype):.0f}% at {mhz:.0f} MHz" if mhz else ""
    return f"{tflops:.0f} TFLOP/s ({100 * tflops / nominal:.0f}% nominal{at})"


# The column every table with a kernel's throughput or time gains, per method it times.
AT_CLOCK = "% peak @ clock"


def pct_at_clock(row: dict | None, gpu: str | None) -> float | None:
    """A row's share (%) of the dense peak at the SM clock it recorded while timed: its
    FLOP (flops.py's model, ``tflops`` = flops ÷ median kernel time) over SMs x its
    ``sm_clock_mhz`` x FLOP per SM per cycle for its dtype. None where the row is not ok,
    recorded no clock (rows before the clock sampler) or the GPU has no listed peak: never
    the data sheet's clock in place of a measured one."""
    peak = peak_of(gpu)
    if not row or row.get("status") != "ok" or peak is None:
        return None
    mhz, tflops = row.get("sm_clock_mhz"), row.get("tflops")
    if not tflops and row.get("flops") and (row.get("time_ms") or {}).get("median_ms"):
        tflops = row["flops"] / (row["time_ms"]["median_ms"] * 1e-3) / 1e12
    if not mhz or not tflops:
        return None
    return 100 * tflops / peak.at_clock(mhz, row.get("dtype") or "bfloat16")


def at_clock_note(rows: list[dict], gpu: str | None) -> str:
    """The footnote of a table with ``AT_CLOCK`` columns: what the number is and, where a
    cell reads —, why (no clock recorded, no peak listed for the GPU, no GPU named)."""
    peak = peak_of(gpu)
    ok = [r for r in rows if r.get("status") == "ok"]
    text = (f"{AT_CLOCK}: the row's FLOP ÷ its median kernel time ÷ the dense peak at the SM "
            "clock sampled (NVML) while it was timed, its own sm_clock_mhz (the README "
            "states the formula).")
    if gpu is None:
        return text + (" — throughout: no GPU named (aggregate --manifest), so no peak.")
    if peak is None:
        return text + f" — throughout: no data-sheet peak listed for {gpu}."
    missing = sum(not r.get("sm_clock_mhz") for r in ok)
    if missing:
        which = "these rows" if missing == len(ok) else f"{missing} of the {len(ok)} ok rows"
        return text + (f" —: the SM clock was not recorded for {which} (written before the "
                       "clock sampler, 2026-12-02); no nominal clock stands in for it.")
    return text


def clock_sentence(rows: list[dict], gpu: str | None) -> str | None:
    """The README's one statement of the peak-at-clock formula, with the SM clocks the
    kernels ran at (``sm_clock_mhz``) where the rows recorded them, or that they did not
    (studies before the clock sampler: their % peak @ clock read —); None for a GPU
    without a listed peak."""
    peak = peak_of(gpu)
    if peak is None:
        return None
    clocks = sorted(r["sm_clock_mhz"] for r in rows
                    if r.get("status") == "ok" and r.get("sm_clock_mhz"))
    formula = (f"the dense peak at an SM clock f is {peak.sms} SMs x f x "
               f"{peak.flop_per_sm_cycle} FLOP per SM per cycle for bf16/fp16 "
               f"({2 * peak.flop_per_sm_cycle} for fp8); a table's '{AT_CLOCK}' is a row's "
               "FLOP ÷ its median kernel time ÷ the peak at its own clock")
    nominal = (f"the data sheet's {peak.dense_tflops:g} TFLOP/s assumes "
               f"{peak.clock_mhz:.0f} MHz: the 'nominal' shares")
    if not clocks:
        return (f"SM clock while timed: not recorded in these rows (they predate the NVML "
                f"clock sampler), so every '{AT_CLOCK}' reads —; {formula} ({nominal}).")
    mid = clocks[len(clocks) // 2]
    return (f"SM clock while timed (NVML, per row `sm_clock_mhz`): median {mid:.0f} MHz, "
            f"{clocks[0]:.0f}-{clocks[-1]:.0f} MHz over the rows; {formula} "
            f"({peak.at_clock(mid):.0f} TFLOP/s at {mid:.0f} MHz; {nominal}).")


def utilisation_sentence(rows: list[dict], gpu: str | None) -> str | None:
    """The README's line of each method's best prefill throughput per pass, with its share
    of the dense peak (the utilisation figure's numbers); None without ok prefill rows."""
    names = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward+backward"}
    best = best_rows(rows)
    if not best:
        return None
    peak = peak_of(gpu)
    what = (f"nominal: share of the data sheet's {peak.dense_tflops:g} TFLOP/s dense peak, at "
            "its clock; at MHz: of the peak at the SM clock the row ran at" if peak else
            "no data-sheet peak for this GPU")
    return (f"Best prefill throughput per method (the highest point of its throughput "
            f"figures; {what}): " + "; ".join(
                f"{names.get(p, p)}: " + ", ".join(
                    f"{m} {share(r['tflops'], gpu, r.get('sm_clock_mhz'), r.get('dtype'))}"
                    for m, r in ms)
                for p, ms in best.items()) + ".")


def at_clock_cell(row: dict | None, gpu: str | None) -> str | None:
    """A row's % of the peak at its recorded SM clock as a table prints it (one decimal),
    None (—) where there is none (``pct_at_clock``)."""
    pct = pct_at_clock(row, gpu)
    return None if pct is None else f"{pct:.1f}"
