"""Table ``fp8`` (study/presentation/fp8_report.py): each FP8 point of ours against its bf16
twin (same shape, our kernel and the fastest fused baseline there), by kernel time, with the
error and its bound; the S >= 4k geomean per head dim in a note; empty, saying why, in a
study without FP8 points. Synthetic rows: the ratios are plain arithmetic on them."""

from __future__ import annotations

import pytest

from tiledattention.study.presentation.fp8_report import fp8_table
from tiledattention.study.presentation.tables import NAMES, write_all

FP8 = "float8_e4m3fn"


def _row(method, ms=None, *, d=128, s=4096, dtype="bfloat16", status="ok"):
    r = {"point_key": f"{dtype}-d{d}-s{s}", "method": method, "status": status,
         "pass": "fwd", "dtype": dtype, "causal": False, "head_dim": d, "seq_q": s,
         "seq_kv": s, "batch": 1, "heads": 16, "gqa": 1}
    if ms is not None:
        r |= {"time_ms": {"median_ms": ms}, "tflops": 100.0 / ms}
    if dtype == FP8 and method == "tiledattention":
        r |= {"rel_err": 0.025, "rtol": 0.0625}
    return r


def _rows():
    return [_row("tiledattention", 1.0), _row("fa4", 0.8), _row("math", 0.1),
            _row("tiledattention", 0.625, dtype=FP8),
            _row("fa4", dtype=FP8, status="unsupported"),
            _row("tiledattention", 2.0, d=256, s=1024), _row("torch_sdpa", 2.2, d=256, s=1024),
            _row("tiledattention", 1.6, d=256, s=1024, dtype=FP8)]


def test_each_fp8_point_is_set_against_ours_in_bf16_and_the_fastest_fused_bf16_baseline():
    t = fp8_table(_rows())
    by_d = {r[1]: r for r in t.rows}
    cols = {c: i for i, c in enumerate(t.columns)}
    d128 = by_d[128]
    assert d128[cols["fp8 ÷ bf16"]] == pytest.approx(1.6)  # 1.0 / 0.625
    # math is faster still but not fused: the fastest fused bf16 baseline is fa4's
    assert d128[cols["fastest bf16"]] == "fa4"
    assert d128[cols["fp8 ÷ fastest bf16"]] == pytest.approx(0.8 / 0.625)
    assert d128[cols["rel. err"]] == 0.025 and d128[cols["e4m3 bound"]] == 0.0625
    assert by_d[256][cols["fp8 ÷ bf16"]] == pytest.approx(1.25)
    assert by_d[256][cols["fastest bf16"]] == "torch_sdpa"


def test_the_geomean_note_counts_only_points_at_s_4096_and_above():
    note = fp8_table(_rows()).notes[1]
    assert note == "fp8 ÷ bf16 at S >= 4096, geometric mean: D=128 1.600x (1 point)."


def test_a_study_without_fp8_points_writes_the_table_empty_saying_so(tmp_path):
    t = fp8_table([_row("tiledattention", 1.0)])
    assert t.rows == [] and t.notes[0].startswith("No FP8 point in this study")
    assert "fp8" in NAMES
    write_all([_row("tiledattention", 1.0)], str(tmp_path))
    assert (tmp_path / "fp8.md").is_file()


def test_fp8_points_of_a_shapes_grid_reach_the_table(tmp_path):
    write_all([], str(tmp_path), stage_rows={"shapes": _rows()})
    assert "| full | 128 | 4096 |" in (tmp_path / "fp8.md").read_text()
