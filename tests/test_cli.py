"""`tiledattn check` runs its CPU checks anywhere and says clearly when no GPU is there."""

import json
import subprocess
import sys

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_check_without_gpu_passes_cpu_checks_and_says_no_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", "check", "--json",
                          str(tmp_path / "check.json")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no CUDA GPU" in out.stdout
    report = json.loads((tmp_path / "check.json").read_text())
    names = {r["name"]: r["ok"] for r in report["results"]}
    assert names["reference algorithm (CPU)"] and names["input validation (CPU)"]
    assert all(names.values())


def test_cli_without_command_prints_help_and_fails():
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "check" in out.stdout
