"""docs/API.md, "Writing your own variant": the test it shows, run as written on a CUDA GPU."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/readme_blocks.py

from readme_blocks import install_module  # noqa: E402


def test_the_readme_variant_test_passes_on_the_gpu(tmp_path, monkeypatch):
    _, test, _ = install_module(tmp_path, monkeypatch)
    scope: dict = {}
    exec(compile(test, "README test block", "exec"), scope)  # noqa: S102
    scope["test_distance_decay_matches_float64_forward_and_gradients"]()
    scope["test_distance_decay_gradient_is_derived"]()
