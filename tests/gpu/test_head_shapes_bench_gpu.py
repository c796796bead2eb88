"""The new head shapes through the benchmark harness on a CUDA GPU (config/shapes-heads.yaml's
shapes at a small S): ours ok forward at every shape and forward+backward at 192/128 and
128/64, ``unsupported`` with the reason past 256; torch SDPA ok everywhere; FA4 where it runs."""

from __future__ import annotations

import pytest
import torch

from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import expand
from tiledattention.bench.runner import run_point
from tiledattention.timing import L2Flusher

METHODS = ["tiledattention", "torch_sdpa", "fa4"]
CFG = from_dict({"grid": {"seqs": [1024], "head_dims": [[192, 128], [128, 64], 512, [576, 512]],
                          "dtypes": ["bfloat16"], "causal": [False, True],
                          "shape_policy": "explicit", "batch": 1, "heads": 4,
                          "passes": ["fwd", "fwd+bwd"]},
                 "methods": METHODS, "timing": {"warmup": 1, "reps": 3, "rounds": 1},
                 "correctness": {"max_ref_heads": 2}})


@pytest.mark.parametrize("point", expand(CFG), ids=lambda p: p.key())
def test_each_head_shape_gives_ok_rows_or_says_why(point):
    rows = {r["method"]: r for r in run_point(point, METHODS, CFG, torch.device("cuda"),
                                              L2Flusher())}
    ours, sdpa = rows["tiledattention"], rows["torch_sdpa"]
    assert sdpa["status"] == "ok", sdpa.get("reason")
    if point.pass_ != "fwd" and max(point.head_dim, point.value_dim) > 256:
        assert ours["status"] == "unsupported" and "BackwardNotSupportedError" in ours["reason"]
    else:
        assert ours["status"] == "ok", ours.get("reason")
        assert ours["correct"] and ours["details"]["schedule"]
        assert ours["flops"] == point.flops()
    fa4 = rows["fa4"]
    # FA4 takes one head dim up to 256, or V's apart only as (192, 128) (FA4_HEAD_PAIRS).
    runs_fa4 = point.head_label == "192/128" or (point.head_dim_v is None
                                                 and point.head_dim <= 256)
    assert fa4["status"] in (("ok", "unavailable") if runs_fa4 else ("unsupported",)), fa4
