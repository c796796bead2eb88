"""tests/gpu/conftest.py: a test that times kernels against a reference (``alone``) skips,
with its reason, when xdist workers share the GPU, and runs in a single process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace


def _conftest():
    path = Path(__file__).parent / "gpu" / "conftest.py"
    spec = importlib.util.spec_from_file_location("gpu_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_alone_test_gets_a_reason_to_skip_under_eight_workers():
    reason = _conftest()._shared_gpu_reason(SimpleNamespace(workerinput={"workercount": 8}))
    assert "8 xdist workers share the GPU" in reason and "-m alone" in reason


def test_an_alone_test_runs_in_one_process_or_one_worker():
    conftest = _conftest()
    assert conftest._shared_gpu_reason(SimpleNamespace()) is None
    assert conftest._shared_gpu_reason(SimpleNamespace(workerinput={"workercount": 1})) is None
