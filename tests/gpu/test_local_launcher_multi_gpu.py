"""On a node with two or more GPUs the local launcher runs shards at once, one GPU each."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import torch

from tiledattention.launchers import get_launcher
from tiledattention.stages.bench import ShardTask


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"needs 2 GPUs, {torch.cuda.device_count()} visible")
def test_two_shards_run_concurrently_on_different_gpus(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({
        "grid": {"seqs": [2048, 4096], "head_dims": [64, 128], "dtypes": ["float16"],
                 "causal": [False, True], "shape_policy": "tokens"},
        "methods": ["torch_sdpa", "math", "eager"],
        "timing": {"warmup": 5, "reps": 30, "rounds": 2}}))
    out = tmp_path / "out"
    tasks = [ShardTask(str(config), str(out), i, 2) for i in range(2)]
    get_launcher("local", str(tmp_path / "logs"), {"timeout_s": 900}).run(tasks)
    manifests = [json.loads((out / f"manifest-shard{i}of2.json").read_text()) for i in range(2)]
    uuids = {m["gpu"]["uuid"] for m in manifests}
    assert len(uuids) == 2, f"both shards ran on one GPU: {uuids}"
    spans = [(dt.datetime.fromisoformat(m["started"]), dt.datetime.fromisoformat(m["finished"]))
             for m in manifests]
    assert max(s for s, _ in spans) < min(f for _, f in spans), f"shards did not overlap: {spans}"
