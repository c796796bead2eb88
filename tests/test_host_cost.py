"""benchmarks/host_cost.py's path table on the CPU (its GPU run is the coordinator's): every
cell is built, checked against torch and timed on its own, so one that fails says why in
its cell and the table goes on; the ratios are ours over torch."""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EAGER = ["eager, no grad", "eager, forward+backward"]


@pytest.fixture
def script(monkeypatch):
    spec = importlib.util.spec_from_file_location("host_cost", ROOT / "benchmarks/host_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def cpu_inputs(shape, backward):
        b, hq, hkv, sq, skv, d, causal = shape
        gen = torch.Generator().manual_seed(0)

        def rand(h, s):
            t = torch.randn(b, h, s, d, generator=gen).to(torch.bfloat16)
            return t.requires_grad_(backward)

        return rand(hq, sq), rand(hkv, skv), rand(hkv, skv), rand(hq, sq).detach()

    monkeypatch.setattr(mod, "_path_inputs", cpu_inputs)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(mod, "PATH_SHAPES", {"prefill": (1, 2, 2, 32, 32, 16, True),
                                             "decode": (1, 4, 2, 1, 32, 16, False)})
    return mod


def _run(mod, paths, budget_s=600.0):
    args = argparse.Namespace(paths=paths, path_calls=3, path_rounds=2)
    return mod.paths_table(args, time.monotonic() + budget_s)


def test_a_failing_implementation_fills_its_cell_and_the_table_goes_on(script):
    results, lines = _run(script, EAGER)  # ours refuses CPU tensors
    cells = results["prefill"]["eager, no grad"]
    assert "q, k, v are on cpu" in cells["ta"]["error"] and cells["torch"]["us"] > 0
    assert lines[0] == "| path | prefill | decode |"
    assert len([ln for ln in lines if ln.startswith("| eager")]) == 2
    assert "eager, no grad: not measured on every shape" in lines


def test_cells_give_both_times_and_the_ratio_and_verdicts_the_targets(script, monkeypatch):
    attention = script._attention
    monkeypatch.setattr(script, "_attention", lambda impl, causal, gqa: attention(
        "torch", causal, gqa))  # ours stood in by torch: both measure
    results, lines = _run(script, EAGER)
    for shape in ("prefill", "decode"):
        for path in EAGER:
            text, ratio = script._cell(results[shape][path])
            cells = results[shape][path]
            assert ratio == pytest.approx(cells["ta"]["us"] / cells["torch"]["us"])
            assert text.startswith(f"{cells['ta']['us']:.1f} vs {cells['torch']['us']:.1f} us")
    assert any(v.startswith("eager, forward+backward: worst ") for v in lines)


def test_ours_disagreeing_with_torch_is_an_error_cell_not_a_time(script, monkeypatch):
    attention = script._attention

    def wrong(impl, causal, gqa):
        attend = attention("torch", causal, gqa)
        return attend if impl == "torch" else (lambda q, k, v: attend(q, k, v) * 1.5)

    monkeypatch.setattr(script, "_attention", wrong)
    results, _ = _run(script, ["eager, no grad"])
    assert "out differs from torch's" in results["decode"]["eager, no grad"]["ta"]["error"]


def test_cells_after_the_budget_say_so(script):
    results, _ = _run(script, ["eager, no grad"], budget_s=-1)
    assert results["prefill"]["eager, no grad"]["torch"] == {
        "error": "skipped: --budget-s spent"}
