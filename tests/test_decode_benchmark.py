"""benchmarks/decode.py keeps no grid of its own: --grid runs the decode section of the
bench config the study measures (config/bench-decode.yaml)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tiledattention.bench.config import load_config
from tiledattention.bench.grid import decode_points

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("decode_bench", ROOT / "benchmarks/decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_grid_cases_are_the_configs_decode_points():
    cases = _script().decode_grid(str(ROOT / "config/bench-decode.yaml"))
    points = decode_points(load_config(str(ROOT / "config/bench-decode.yaml")).decode)
    assert len(cases) == len(points) > 0
    assert [(c[1], c[2], c[2] // c[3], c[4], c[5], c[6], c[7]) for c in cases] == [
        (p.batch, p.heads, p.gqa, p.seq_q, p.seq_kv, p.head_dim, p.dtype) for p in points]


def test_worst_case_sweep_pins_each_split_count_on_the_tuned_schedule():
    mod = _script()
    assert [c[0] for c in mod.WORST_CASES] == ["grid sq1 skv1024 b1 h32/8",
                                               "grid sq1 skv8192 b1 h32/8"]
    tuned = [v for v in mod.sweep_variants([1, 2, 4, 8]) if isinstance(v[1], int)]
    assert [v[1] for v in tuned] == [1, 2, 4, 8]
