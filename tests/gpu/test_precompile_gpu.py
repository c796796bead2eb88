"""tiledattn precompile on a GPU: the planned points' kernels land in cuTile's disk cache,
and a new process then runs those points with the cache's kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _cached_files(root) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def test_precompile_fills_the_disk_cache_for_every_point(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(json.dumps({
        "grid": {"seqs": [256, 512], "head_dims": [64, 128], "dtypes": ["bfloat16"],
                 "causal": [False, True], "shape_policy": "explicit", "batch": 1, "heads": 4,
                 "passes": ["fwd", "fwd+bwd"]},
        "methods": ["tiledattention", "torch_sdpa"]}))
    cache = tmp_path / "cache"
    env = dict(os.environ, CUDA_TILE_CACHE_DIR=str(cache))
    run = subprocess.run([sys.executable, "-m", "tiledattention.cli", "precompile", "--config",
                          str(config), "--workers", "4"], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "precompile: 16 points, 4 workers" in run.stderr
    assert "0 point(s) failed" in run.stderr, run.stderr[-3000:]
    assert _cached_files(cache) > 0
