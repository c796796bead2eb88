"""benchmarks/bwd_compare.py without a GPU: its grid follows the study's shape model, every
point has today's backward and the issue-37 candidates, and no GPU is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bwd_compare  # noqa: E402


def test_grid_is_the_tokens_shape_model_with_a_quick_slice():
    full, quick = bwd_compare.grid(False), bwd_compare.grid(True)
    assert len(quick) == 3 and len(full) == 38
    for p in full:
        assert p.batch * p.seq_q == 16384 and p.pass_ == "fwd+bwd"
        assert p.heads * p.head_dim == 2048 or p.head_dim in (160, 192)  # 16 heads there
    assert {p.head_dim for p in full} == {64, 128, 160, 192, 256}
    assert [p.head_dim for p in bwd_compare.grid(False, {256})] == [256] * 6


def test_given_lengths_replace_the_grid_at_both_masks_and_the_shape_model():
    points = bwd_compare.grid(False, {64, 128}, [512, 2048])
    assert [(p.head_dim, p.causal, p.seq_q) for p in points] == [
        (d, c, s) for d in (64, 128) for c in (False, True) for s in (512, 2048)]
    assert all(p.batch * p.seq_q == 16384 and p.heads * p.head_dim == 2048 for p in points)
    assert {p.head_dim for p in bwd_compare.grid(False, None, [512])} == {64, 128}


def test_every_point_times_today_and_a_five_matmul_candidate():
    for p in bwd_compare.grid(False):
        names = bwd_compare.ours_methods(p.head_dim)
        assert names["ours"] == names["ours-7mm"] == "tiledattention"
        assert any(n.startswith("5mm") for n in names), p.head_dim


def test_the_deterministic_column_runs_in_torchs_deterministic_mode_and_restores_it():
    seen = []
    fn = bwd_compare.in_mode(bwd_compare.Deterministic("tiledattention"),
                             lambda: seen.append(torch.are_deterministic_algorithms_enabled()))
    fn()
    plain = bwd_compare.in_mode(bwd_compare.Harness("tiledattention"),
                                lambda: seen.append(torch.are_deterministic_algorithms_enabled()))
    plain()
    assert seen == [True, False] and not torch.are_deterministic_algorithms_enabled()


def test_no_gpu_is_one_line_and_exit_2():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would run")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bwd_compare.py"),
                        "--quick"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout.strip() == "bwd_compare: no CUDA GPU visible"
