"""FP8 (e4m3) forward points in the benchmark grid (issue 48 item 4): the config takes
``float8_e4m3fn`` forward only, an FP8 point's inputs are its bf16 twin's quantized per
tensor, the reference is float64 attention of the dequantized inputs, the tolerance is
tolerance.RTOL's, and a method without an FP8 forward says so in one place (Method.fp8).
CPU only; the kernel's and cuDNN's own rows: tests/gpu/test_fp8_grid_gpu.py."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from study_kit import cli, one_line

from tiledattention.bench import methods as M
from tiledattention.bench.config import FP8, ConfigError, from_dict, load_config
from tiledattention.bench.grid import Point, expand
from tiledattention.bench.runner import (
    _bytes_moved,
    fp8_inputs,
    make_inputs,
    reference,
    run_point,
)
from tiledattention.reference import dequantized, quantized
from tiledattention.study.presentation.hardware import pct_at_clock
from tiledattention.tolerance import RTOL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = torch.device("cpu")
METHODS = ["tiledattention", "cudnn_fe", "torch_sdpa", "fa4"]


def _cfg(methods=METHODS, passes=("fwd",), dtypes=("bfloat16", FP8)):
    return from_dict({"grid": {"seqs": [128], "head_dims": [64], "dtypes": list(dtypes),
                               "causal": [True], "shape_policy": "explicit", "batch": 1,
                               "heads": 2, "passes": list(passes)},
                      "methods": list(methods), "device": "cpu",
                      "timing": {"warmup": 0, "reps": 1, "rounds": 1}})


def _fp8_point(cfg):
    return next(p for p in expand(cfg) if p.dtype == FP8)


def test_the_fp8_config_gives_fp8_points_beside_the_bf16_ones_of_the_same_shapes():
    cfg = load_config(os.path.join(ROOT, "config", "shapes-fp8.yaml"))
    points = expand(cfg)
    assert len(points) == 2 * 3 * 3 * 2
    shapes = lambda dt: {dataclasses.replace(p, dtype="x") for p in points if p.dtype == dt}  # noqa: E731
    assert shapes(FP8) == shapes("bfloat16") and len(shapes(FP8)) == 18
    assert {p.pass_ for p in points} == {"fwd"}


def test_fp8_with_a_backward_pass_is_one_config_error_naming_the_passes():
    with pytest.raises(ConfigError) as info:
        _cfg(passes=("fwd", "fwd+bwd"))
    msg = str(info.value)
    assert "forward only" in msg and "fwd+bwd" in msg and "\n" not in msg


def test_fp8_without_an_fp8_method_names_the_methods_that_run_it():
    with pytest.raises(ConfigError, match="methods that do: tiledattention, cudnn_fe"):
        _cfg(methods=("torch_sdpa", "fa4"))


def test_the_cli_refuses_fp8_fwd_bwd_with_exit_2_and_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("grid: {dtypes: [float8_e4m3fn], passes: [fwd, bwd]}\n"
                    "methods: [tiledattention]\n")
    err = one_line(cli("bench", "--config", str(path), "--out", str(tmp_path / "out")))
    assert "forward only" in err and "bwd" in err


def test_quantized_maps_amax_to_448_and_round_trips_within_e4m3_precision():
    x = torch.randn(2, 3, 64, 32, generator=torch.Generator().manual_seed(0)) * 7
    x8, descale = quantized(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (1,)
    assert descale.dtype == torch.float32
    assert x8.float().abs().max().item() == 448.0
    back = dequantized(x8, descale, x.shape[1])
    # e4m3 keeps 3 mantissa bits: half an ulp is 2^-4 relative in its normal range (>= 2^-6)
    normal = (x / descale).abs() >= 2.0 ** -6
    rel = ((back - x.double()).abs() / x.double().abs())[normal]
    assert rel.max().item() <= 2.0 ** -4


def test_an_all_zero_tensor_quantizes_with_descale_one():
    x8, descale = quantized(torch.zeros(4, 4))
    assert descale.item() == 1.0 and not x8.float().any()


def test_an_fp8_points_inputs_are_its_bf16_twins_quantized():
    point = _fp8_point(_cfg())
    twin = dataclasses.replace(point, dtype="bfloat16")
    (q8, k8, v8), descale = fp8_inputs(*make_inputs(point, 0, CPU))
    for t8, d, t in zip((q8, k8, v8), descale, make_inputs(twin, 0, CPU)):
        assert t8.dtype == torch.float8_e4m3fn
        back = dequantized(t8, d, t.shape[1])
        assert ((back - t.double()).abs() <= t.double().abs() * 2.0 ** -4 + d.item()
                * 2.0 ** -9).all()


def test_the_fp8_reference_is_attention_of_the_dequantized_inputs():
    point = _fp8_point(_cfg())
    (q8, k8, v8), descale = fp8_inputs(*make_inputs(point, 0, CPU))
    ref, hq = reference(q8, k8, v8, point, 4, descale)
    from tiledattention.reference import fp8_attention

    want, _ = fp8_attention(q8, k8, v8, q_descale=descale[0], k_descale=descale[1],
                            v_descale=descale[2], causal=True)
    assert hq == 2 and torch.equal(ref, want)


def test_only_tiledattention_and_cudnn_fe_run_fp8_and_the_rest_say_why():
    point = _fp8_point(_cfg())
    assert M.fp8_methods() == ["tiledattention", "cudnn_fe"]
    assert M.get_method("tiledattention@64x128_o2_c1_lk2_lv4").fp8
    for name, method in M.METHODS.items():
        why = M.fp8_unsupported(method, point)
        if name in ("tiledattention", "cudnn_fe"):
            assert why is None
        else:
            assert name in why and "no FP8" in why and "bfloat16 row" in why
        assert M.fp8_unsupported(method, dataclasses.replace(point, dtype="bfloat16")) is None


def test_a_cpu_run_of_an_fp8_point_gives_each_method_a_row_with_its_reason():
    cfg = _cfg()
    rows = {r["method"]: r for r in run_point(_fp8_point(cfg), METHODS, cfg, CPU, None)}
    for m in ("torch_sdpa", "fa4"):
        assert rows[m]["status"] == "unsupported" and "no FP8" in rows[m]["reason"]
    for m in ("tiledattention", "cudnn_fe"):  # they run FP8, on a GPU
        assert rows[m]["status"] == "unavailable" and "CUDA" in rows[m]["reason"]
    assert all(r["dtype"] == FP8 for r in rows.values())


def _dequantizing(q, k, v, point, descale=None):
    """A stand-in FP8 method: the descales the harness passes, applied; bf16 out."""
    parts = [dequantized(t, d, t.shape[1]).to(torch.bfloat16) for t, d in zip((q, k, v),
                                                                              descale)]
    return torch.nn.functional.scaled_dot_product_attention(*parts, is_causal=point.causal)


def test_an_fp8_method_gets_the_descales_and_is_judged_by_the_e4m3_tolerance(monkeypatch):
    fake = M.Method("fake_fp8", "test", False, _dequantizing, fp8=True)
    monkeypatch.setitem(M.METHODS, "fake_fp8", fake)
    cfg = _cfg(methods=("fake_fp8",))
    point = _fp8_point(cfg)
    (row,) = run_point(point, ["fake_fp8"], cfg, CPU, None)
    assert row["status"] == "ok", row.get("reason")
    assert row["correct"] and row["rtol"] == RTOL[FP8] and row["rel_err"] < RTOL[FP8]
    assert row["flops"] == dataclasses.replace(point, dtype="bfloat16").flops()
    # without the descales the output is 1/descale times off: the row must say wrong
    monkeypatch.setitem(M.METHODS, "fake_fp8", dataclasses.replace(
        fake, run=lambda q, k, v, p, descale=None: _dequantizing(
            q, k, v, p, [torch.ones(1)] * 3)))
    (row,) = run_point(point, ["fake_fp8"], cfg, CPU, None)
    assert row["status"] == "wrong"


def test_an_fp8_points_bytes_are_one_per_input_element_and_two_per_output_element():
    point = Point(FP8, False, 128, 1024, 1024, 2, 4)
    elems = 2 * 4 * 1024 * 128
    assert _bytes_moved(point) == 3 * elems + 2 * elems
    assert _bytes_moved(dataclasses.replace(point, dtype="bfloat16")) == 2 * 4 * elems


def test_an_fp8_rows_share_of_peak_is_taken_against_the_fp8_peak():
    row = {"status": "ok", "tflops": 500.0, "sm_clock_mhz": 1500, "dtype": "bfloat16"}
    bf16 = pct_at_clock(row, "NVIDIA H200")
    assert pct_at_clock({**row, "dtype": FP8}, "NVIDIA H200") == pytest.approx(bf16 / 2)
