"""The shipped reference of this GPU's model (H100 or H200) as an acceptance check: a slice
of the paper's grid, timed as the study times it, passes `compare` within the shipped
tolerances. Another GPU has no reference of its own: skipped, saying so."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch

from tiledattention.bench.config import from_dict
from tiledattention.bench.runner import run_bench
from tiledattention.study.references import compare


@pytest.mark.alone
def test_a_paper_grid_slice_passes_the_shipped_reference_of_this_gpu(tmp_path):
    name = torch.cuda.get_device_name()
    system = compare.shipped_system(name)
    if system is None:
        pytest.skip(f"no shipped reference for this GPU ({name}); shipped: "
                    f"{', '.join(compare.systems())}")
    cfg = from_dict({"grid": {"seqs": [2048, 8192], "head_dims": [128],
                              "dtypes": ["float16"], "causal": [False, True],
                              "shape_policy": "tokens", "tokens": 16384, "width": 2048},
                     "methods": ["tiledattention", "torch_sdpa", "cudnn"],
                     "timing": {"warmup": 10, "reps": 30, "rounds": 3, "flush_l2": True}})
    run_bench(cfg, str(tmp_path), shard_index=0, shard_count=1)
    rows = glob.glob(str(tmp_path / "rows-shard*.jsonl"))[0]
    checks, paths = compare.run(rows, system, tolerance=None, out=str(tmp_path / "cmp"))
    assert sum(c.verdict != "not measured" for c in checks) >= 4 * 3 * 2
    assert not compare.failed(checks), Path(paths[1]).read_text()
