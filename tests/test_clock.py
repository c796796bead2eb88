"""The SM clock a row was timed at, and the peak at that clock (issue 48 item 4): the
formula, the README's sentence, and what a machine without NVML or a GPU records."""

from __future__ import annotations

import torch

from tiledattention.bench.clock import ClockSampler
from tiledattention.study.presentation.hardware import clock_sentence, peak_of, share


def test_the_data_sheet_peak_is_132_sms_at_1830_mhz_and_4096_flop_per_cycle():
    peak = peak_of("NVIDIA H200")
    assert round(peak.clock_mhz) == 1829
    assert abs(peak.at_clock(peak.clock_mhz) - peak.dense_tflops) < 1e-6
    assert abs(peak.at_clock(1500) - 132 * 1500e6 * 4096 / 1e12) < 1e-9
    assert peak.at_clock(1500, "float8_e4m3fn") == 2 * peak.at_clock(1500)


def test_a_share_names_the_peak_at_the_clock_the_row_ran():
    assert share(400.0, "NVIDIA H100 80GB HBM3") == "400 TFLOP/s (40% nominal)"
    assert share(400.0, "NVIDIA H100 80GB HBM3", 1500) == \
        "400 TFLOP/s (40% nominal; 49% at 1500 MHz)"
    # fp8: twice the FLOP per cycle, at the data sheet's clock and at the measured one
    assert share(800.0, "NVIDIA H100 80GB HBM3", 1500, "float8_e4m3fn") == \
        "800 TFLOP/s (40% nominal; 49% at 1500 MHz)"
    assert share(400.0, "some GPU", 1500) == "400 TFLOP/s"


def test_the_readme_states_the_formula_once_with_the_clocks_or_that_none_was_recorded():
    rows = [dict(status="ok", sm_clock_mhz=c) for c in (1980, 1755, 1600)]
    line = clock_sentence(rows, "NVIDIA H200")
    assert "median 1755 MHz, 1600-1980 MHz" in line
    assert "132 SMs x f x 4096 FLOP per SM per cycle for bf16/fp16 (8192 for fp8)" in line
    assert "(949 TFLOP/s at 1755 MHz" in line
    old = clock_sentence([dict(status="ok", tflops=1.0)], "NVIDIA H200")
    assert old.startswith("SM clock while timed: not recorded in these rows")
    assert "132 SMs x f x 4096" in old and "reads —" in old and "MHz over" not in old
    assert clock_sentence(rows, "some GPU") is None


def test_without_a_gpu_the_sampler_records_nothing():
    with ClockSampler(torch.device("cpu")) as clock:
        pass
    assert clock.samples == []
