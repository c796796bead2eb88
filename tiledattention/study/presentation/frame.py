"""All rows as one table (Parquet + CSV) with a column dictionary.

Rows are flattened (``time_ms.median_ms``); every column a row can carry is documented
here, and a row with an undocumented column is an error rather than a silent gap in the
dictionary that ships with the data.
"""

from __future__ import annotations

import csv
import os

from ...bench.aggregate import flatten
from ...errors import StudyError
from ...safeio import atomic_path, write_text

__all__ = ["COLUMNS", "StudyError", "columns_markdown", "columns_of", "write_rows_table"]


# name: (unit, description)
COLUMNS: dict[str, tuple[str, str]] = {
    "format": ("", "row format id (tiledattention-bench-row/N)"),
    "point_key": ("", "the benchmark point: dtype, mask, D, Sq, Skv, B, H, GQA ratio"),
    "method": ("", "implementation measured (tiledattention@<label>: a pinned schedule)"),
    "status": ("", "ok | wrong | oom | error | unavailable | unsupported"),
    "reason": ("", "why the status is not ok"),
    "dtype": ("", "element type of q, k, v"),
    "causal": ("", "causal (top-left aligned) mask"),
    "head_dim": ("", "head dimension D"),
    "head_dim_v": ("", "V's head dimension D_v where it differs from D (MLA's 192/128); "
                   "absent: D"),
    "seq_q": ("tokens", "query sequence length Sq"),
    "seq_kv": ("tokens", "key/value sequence length Skv"),
    "batch": ("", "batch size B"),
    "heads": ("", "query heads H"),
    "gqa": ("", "query heads per key/value head"),
    "pass": ("", "what was timed: fwd; bwd (the backward alone, given dO); fwd+bwd"),
    "grad_rel_err.dq": ("", "||dq - ref|| / ||ref|| on the reference slice (backward passes)"),
    "grad_rel_err.dk": ("", "||dk - ref|| / ||ref|| on the reference slice (backward passes)"),
    "grad_rel_err.dv": ("", "||dv - ref|| / ||ref|| on the reference slice (backward passes)"),
    "grad_rtol": ("", "tolerance applied to each gradient (tolerance.RTOL_BWD)"),
    "grads_correct": ("", "every gradient within grad_rtol of the float64 autograd reference"),
    "seed": ("", "input seed (same inputs for every method of a point)"),
    "device": ("", "torch device the point ran on"),
    "recorded": ("UTC", "when the row was written"),
    "config_hash": ("", "hash of the config settings that affect a measurement (seed, timing, "
                        "tolerances, device); one per study"),
    "correct": ("", "output within rtol of the float64 reference"),
    "rel_err": ("", "max |out - ref| / max |ref| on the reference slice"),
    "max_abs_err": ("", "max |out - ref| on the reference slice"),
    "rtol": ("", "tolerance applied for this dtype"),
    "ref_batch": ("", "batches covered by the float64 reference"),
    "ref_heads": ("", "heads covered by the float64 reference"),
    "flops": ("FLOP", "4*B*H*Sq*Skv*D, halved when causal; x2.5 for bwd, x3.5 for fwd+bwd "
                      "(flops.py)"),
    "tflops": ("TFLOP/s", "flops / median time"),
    "tokens_per_s": ("1/s", "B*H*Sq / median time"),
    "bytes_moved": ("B", "compulsory bytes: read q, k, v once, write out once (bwd: read q, "
                         "k, v, out, dO, write dq, dk, dv)"),
    "gbytes_per_s": ("GB/s", "bandwidth proxy: bytes_moved / median time"),
    "call_us": ("us", "call latency: steady-state wall time per call of call_calls "
                      "back-to-back eager calls (host work included; no L2 flush, no spin, "
                      "one synchronisation per round), median of timing.rounds rounds"),
    "sm_clock_mhz": ("MHz", "SM clock while the kernel time was measured: median of NVML "
                            "samples every 2 ms (absent without NVML); the peak at this "
                            "clock is SMs x clock x dense FLOP per SM per cycle"),
    "call_calls": ("", "back-to-back calls per call_us round (about 50 ms at the point's "
                       "fastest kernel time, 10 to 2000)"),
    "time_ms.mean_ms": ("ms", "mean time per call"),
    "time_ms.median_ms": ("ms", "kernel time: median time per call between CUDA events, a "
                                "GPU spin before each hiding host work"),
    "time_ms.min_ms": ("ms", "fastest call"),
    "time_ms.p95_ms": ("ms", "95th percentile time per call"),
    "time_ms.std_ms": ("ms", "standard deviation of the call times"),
    "time_ms.reps": ("", "timed calls"),
    "timing.warmup": ("", "untimed warm-up calls before the first round"),
    "timing.reps": ("", "timed calls requested per method"),
    "timing.rounds": ("", "rounds, methods interleaved, order alternating"),
    "timing.flush_l2": ("", "L2 flushed before each timed call"),
    "timing.cpu_threads": ("", "torch intra-op threads of a CPU run (1: a core shared with "
                               "other processes stalls every parallel op)"),
    "timing.cuda_graph": ("", "calls replayed from a CUDA graph (forward passes only; "
                              "backward passes run eager)"),
    "details.backend": ("", "the torch SDPA backend that actually ran"),
    "details.schedule": ("", "tiledattention schedule label (tile_m x tile_n, occupancy, ...)"),
    "details.schedule_source": ("", "where the schedule came from: table, nearest, default, "
                                    "pinned"),
    "details.bwd_schedule": ("", "tiledattention backward schedule label (bwd and fwd+bwd "
                                 "passes: dK/dV tile, dQ tile, occupancy)"),
    "details.bwd_schedule_source": ("", "where the backward schedule came from: exact, "
                                        "nearest, default, pinned"),
    "details.mask": ("", "sdpa_mask: the materialised mask's dtype (bool or float bias)"),
    # What a baseline ran (bench/methods.py describe): FA4's release and its arguments.
    "details.version": ("", "the baseline's release (FA4: the flash-attn-4 distribution's "
                            "version)"),
    "details.kwargs.causal": ("", "FA4 flash_attn_func: causal"),
    "details.kwargs.window_size": ("", "FA4 flash_attn_func: (left, right) window"),
    "details.kwargs.softcap": ("", "FA4 flash_attn_func: tanh soft cap"),
    "details.kwargs.score_mod": ("", "FA4 flash_attn_func: CuTe DSL score_mod, by name"),
    "details.kwargs.score_mod_bwd": ("", "FA4 flash_attn_func: its derivative, by name"),
    "details.kwargs.aux_tensors": ("", "FA4 flash_attn_func: the score_mod's tensors, by "
                                       "shape"),
    # Launch geometry of tiledattention rows (tiledattention/kernel/geometry.py).
    "geometry.programs": ("", "programs launched: the product of the plan's grid (query "
                              "tiles x heads x batch)"),
    "geometry.per_sm": ("", "programs per SM that fit (see geometry.per_sm_source)"),
    "geometry.per_sm_source": ("", "where per_sm came from: occupancy hint (the schedule's "
                                   "occupancy; cuTile does not expose the compiled kernel's "
                                   "registers and shared memory)"),
    "geometry.sms": ("", "streaming multiprocessors of the GPU"),
    "geometry.slots": ("", "programs running at once: sms x per_sm / num_ctas"),
    "geometry.waves": ("", "programs / slots (wave quantization: 2.01 costs about what 3 "
                           "does)"),
    "geometry.tail_efficiency": ("", "share of the last wave's slots holding a program "
                                     "(133 programs on 132 slots: 1/132)"),
    "geometry.head_dim_padded": ("", "head-dim columns computed: D split into power-of-two "
                                     "chunks, zero padding included"),
    "geometry.head_dim_pad_fraction": ("", "1 - D / head_dim_padded (tile quantization of D)"),
    "geometry.seq_q_padded": ("tokens", "ceil(Sq / tile_m) x tile_m"),
    "geometry.seq_q_pad_fraction": ("", "1 - Sq / seq_q_padded (the last query tile's "
                                        "padding)"),
    "geometry.seq_kv_padded": ("tokens", "ceil(Skv / tile_n) x tile_n"),
    "geometry.seq_kv_pad_fraction": ("", "1 - Skv / seq_kv_padded (the last key tile's "
                                         "padding)"),
}


def columns_of(rows: list[dict]) -> list[str]:
    """The flattened columns of ``rows``, in dictionary order; undocumented ones refused."""
    seen = {k for r in rows for k in flatten(r)}
    unknown = sorted(seen - set(COLUMNS))
    if unknown:
        raise StudyError(f"rows carry undocumented columns {unknown}: add them to "
                         "tiledattention/study/presentation/frame.py COLUMNS")
    return [c for c in COLUMNS if c in seen]


def write_rows_table(rows: list[dict], out_dir: str) -> dict[str, str]:
    """rows.parquet, rows.csv and columns.md (the column dictionary) in ``out_dir``."""
    import pandas as pd

    os.makedirs(out_dir, exist_ok=True)
    cols = columns_of(rows)
    frame = pd.DataFrame([flatten(r) for r in rows], columns=cols)
    paths = {"parquet": os.path.join(out_dir, "rows.parquet"),
             "csv": os.path.join(out_dir, "rows.csv"),
             "columns": os.path.join(out_dir, "columns.md")}
    # Each file appears whole or not at all: a killed aggregate leaves no truncated table.
    with atomic_path(paths["parquet"]) as tmp:
        frame.to_parquet(tmp, index=False)
    with atomic_path(paths["csv"]) as tmp:
        frame.to_csv(tmp, index=False, quoting=csv.QUOTE_MINIMAL)
    write_text(paths["columns"], columns_markdown(cols))
    return paths


def columns_markdown(cols: list[str]) -> str:
    lines = ["| column | unit | meaning |", "|---|---|---|"]
    lines += [f"| `{c}` | {COLUMNS[c][0]} | {COLUMNS[c][1]} |" for c in cols]
    return "\n".join(lines) + "\n"
