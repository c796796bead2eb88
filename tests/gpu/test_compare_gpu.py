"""The shipped H100 reference as an acceptance check on an H100: a slice of the paper's grid,
timed as the study times it, passes `compare` within the shipped tolerances."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch

from tiledattention.bench.config import from_dict
from tiledattention.bench.runner import run_bench
from tiledattention.study.references import compare


@pytest.mark.alone
def test_a_paper_grid_slice_on_an_h100_passes_the_shipped_h100_reference(tmp_path):
    name = torch.cuda.get_device_name()
    if "H100" not in name:
        pytest.skip(f"the shipped reference is an H100's; this GPU is {name}")
    cfg = from_dict({"grid": {"seqs": [2048, 8192], "head_dims": [128],
                              "dtypes": ["float16"], "causal": [False, True],
                              "shape_policy": "tokens", "tokens": 16384, "width": 2048},
                     "methods": ["tiledattention", "torch_sdpa", "cudnn"],
                     "timing": {"warmup": 10, "reps": 30, "rounds": 3, "flush_l2": True}})
    run_bench(cfg, str(tmp_path), shard_index=0, shard_count=1)
    rows = glob.glob(str(tmp_path / "rows-shard*.jsonl"))[0]
    checks, paths = compare.run(rows, "h100", tolerance=None, out=str(tmp_path / "cmp"))
    assert sum(c.verdict != "not measured" for c in checks) >= 4 * 3 * 2
    assert not compare.failed(checks), Path(paths[1]).read_text()
