"""FP8 (e4m3) grid points through the benchmark harness on a CUDA GPU (config/shapes-fp8.yaml's
shapes at a small S): ours ``ok`` and correct within tolerance.RTOL's e4m3 bound with the
per-tensor descales the harness passes; cuDNN's FP8 SDPA ``ok`` or ``unavailable`` with
cuDNN's reason (9.19 builds bf16 output on Blackwell only); torch SDPA and FA4
``unsupported``, their bf16 rows beside."""

from __future__ import annotations

import pytest
import torch

from tiledattention.bench.config import FP8, from_dict
from tiledattention.bench.grid import expand
from tiledattention.bench.runner import run_point
from tiledattention.timing import L2Flusher
from tiledattention.tolerance import RTOL

METHODS = ["tiledattention", "cudnn_fe", "torch_sdpa", "fa4"]
CFG = from_dict({"grid": {"seqs": [1024], "head_dims": [64, 128, 256],
                          "dtypes": ["bfloat16", FP8], "causal": [False, True],
                          "shape_policy": "explicit", "batch": 1, "heads": 4},
                 "methods": METHODS, "timing": {"warmup": 1, "reps": 3, "rounds": 1},
                 "correctness": {"max_ref_heads": 2}})


@pytest.mark.parametrize("point", [p for p in expand(CFG) if p.dtype == FP8],
                         ids=lambda p: p.key())
def test_each_fp8_point_gives_our_correct_row_and_the_others_say_why(point):
    rows = {r["method"]: r for r in run_point(point, METHODS, CFG, torch.device("cuda"),
                                              L2Flusher())}
    ours = rows["tiledattention"]
    assert ours["status"] == "ok", ours.get("reason")
    assert ours["correct"] and ours["rtol"] == RTOL[FP8] and ours["rel_err"] < RTOL[FP8]
    assert ours["details"]["schedule"] and ours["flops"] == point.flops()
    fe = rows["cudnn_fe"]
    assert fe["status"] in ("ok", "unavailable"), fe
    if fe["status"] == "ok":
        assert fe["correct"]
    else:
        assert fe["reason"]
    for m in ("torch_sdpa", "fa4"):
        assert rows[m]["status"] == "unsupported" and "no FP8" in rows[m]["reason"]
