"""What a cluster login node needs for the workflow's CPU rules: the GPU jobs run inside the
image, but the config check, plan, aggregate, figures, manifest and bundle run in the
Snakemake process on the login node. containers/README.md says they need Python, torch
(a CPU build) and the `workflow` extra, but no GPU and no cuTile toolchain: checked here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("rocrate")

ROOT = Path(__file__).resolve().parent.parent

# A login node's Python: the cuTile toolchain (the `gpu` extra) unimportable, no GPU.
NO_CUTILE = "import sys; sys.modules['cuda'] = sys.modules['cuda.tile'] = None; "
CLI = NO_CUTILE + "from tiledattention.cli import main; sys.exit(main(sys.argv[1:]))"
# What common.smk does with the study config before any job starts.
CONFIG_CHECK = NO_CUTILE + ("import yaml; from tiledattention.bench.config import from_dict; "
                            "from_dict(yaml.safe_load(open(sys.argv[1]))['bench'])")


def _row(method: str, seq: int, ms: float) -> dict:
    flops = 4 * 8 * seq * seq * 64
    return {"format": "tiledattention-bench-row/1", "method": method, "status": "ok",
            "point_key": f"float16-full-d64-sq{seq}-skv{seq}-b1-h8-g1", "dtype": "float16",
            "causal": False, "head_dim": 64, "seq_q": seq, "seq_kv": seq, "batch": 1,
            "heads": 8, "gqa": 1, "seed": 0, "device": "cuda:0", "correct": True,
            "time_ms": {"median_ms": ms, "p95_ms": ms, "mean_ms": ms, "min_ms": ms,
                        "std_ms": 0.0, "reps": 3},
            "flops": flops, "tflops": flops / (ms * 1e-3) / 1e12, "gbytes_per_s": 1.0}


def _cli(*args: str, cwd: Path, code: str = CLI) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)


def test_config_check_runs_on_a_login_node_without_cutile_or_gpu(tmp_path):
    out = _cli(str(ROOT / "config" / "config.yaml"), cwd=tmp_path, code=CONFIG_CHECK)
    assert out.returncode == 0, out.stderr[-2000:]


def test_cpu_rules_run_on_a_login_node_without_cutile_or_gpu(tmp_path):
    shards = tmp_path / "study" / "shards"
    shards.mkdir(parents=True)
    rows = [_row(m, s, ms) for s in (512, 1024) for m, ms in
            (("tiledattention", 1.0), ("torch_sdpa", 1.1))]
    (shards / "rows-shard0of1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (shards / "manifest-shard0of1.json").write_text(json.dumps({
        "tiledattention": "0.1.0", "python": "3.12", "torch": "2.11.0",
        "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"},
        "git_commit": "abc", "environment": {}}))
    study = tmp_path / "study"
    (study / "profile").mkdir()
    (study / "profile" / "summary.md").write_text("# Nsight Compute summary\n")
    config = tmp_path / "config.yaml"
    config.write_text("results_dir: study\n")
    steps = [("aggregate", "--rows", str(shards), "--out", str(study / "aggregate")),
             ("figures", "--rows", str(study / "aggregate" / "rows.jsonl"), "--out",
              str(study / "figures")),
             ("manifest", "--runs", str(shards), "--out", str(study / "manifest.json")),
             ("bundle", "create", "--study", str(study), "--config", str(config), "--out",
              str(tmp_path / "bundle")),
             ("bundle", "verify", str(tmp_path / "bundle.zip"))]
    for step in steps:
        out = _cli(*step, cwd=tmp_path)
        assert out.returncode == 0, f"{step[0]}: {out.stderr[-2000:]}"
    assert (tmp_path / "bundle.zip").stat().st_size > 0
