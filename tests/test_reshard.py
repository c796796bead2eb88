"""A changed shard count on a results directory deals the measured rows out to the new
shards: nothing measured again, and no directory holding rows files of two counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GRID = ("grid: {seqs: [64, 96, 128], head_dims: [32], dtypes: [float32], causal: [false],"
        " shape_policy: explicit, batch: 1, heads: 2}\nmethods: [eager, math]\n"
        "timing: {warmup: 1, reps: 2, rounds: 1}\ndevice: cpu\n")


def _sweep(config: Path, out: Path, shards: int):
    return subprocess.run(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "debug", "--shards", str(shards), "--out", str(out)],
        capture_output=True, text=True, timeout=600)


def _rows(out: Path) -> list[str]:
    return sorted(ln for p in out.glob("rows-shard*.jsonl")
                  for ln in p.read_text().splitlines() if ln.strip())


def test_a_changed_shard_count_reshards_measured_rows_without_measuring_again(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(GRID)
    out = tmp_path / "out"
    assert _sweep(config, out, 2).returncode == 0
    (out / "shard0of2.done").touch()  # a workflow's marker of the old count
    first = _rows(out)
    run = _sweep(config, out, 3)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "re-sharded 6 measured rows of the 2-shard run into 3 shards" in run.stderr
    assert sorted(p.name for p in out.glob("rows-shard*")) == [
        f"rows-shard{i}of3.jsonl" for i in range(3)]
    assert _rows(out) == first  # the same rows, value for value: nothing re-measured
    assert not (out / "shard0of2.done").exists()
    # Each new file holds exactly its shard's points (round-robin, as grid.shard deals).
    for i in range(3):
        keys = {json.loads(ln)["point_key"] for ln in
                (out / f"rows-shard{i}of3.jsonl").read_text().splitlines()}
        assert len(keys) == 1 and f"sq{[64, 96, 128][i]}-" in keys.pop()
    # And back: the old count works again.
    assert _sweep(config, out, 2).returncode == 0 and _rows(out) == first
