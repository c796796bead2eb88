"""The harness on a CUDA GPU: every available method gives an ok row."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import expand
from tiledattention.bench.runner import run_point
from tiledattention.schedules.schedule import Schedule
from tiledattention.timing import L2Flusher
from tiledattention.torch_backends import _KERNEL_MARKERS, torch_sdpa

METHODS = ["tiledattention", "torch_sdpa", "flash", "cudnn", "efficient", "math", "eager",
           "flash_attn"]


def small_config():
    return from_dict({"grid": {"seqs": [1024], "head_dims": [64, 128], "dtypes": ["float16"],
                               "causal": [False, True], "shape_policy": "explicit",
                               "batch": 2, "heads": 8},
                      "methods": METHODS, "timing": {"warmup": 2, "reps": 6, "rounds": 2}})


def test_small_grid_gives_ok_rows_for_every_available_method():
    cfg = small_config()
    flush = L2Flusher()
    for point in expand(cfg):
        rows = {r["method"]: r for r in run_point(point, METHODS, cfg, torch.device("cuda"),
                                                  flush)}
        for m in METHODS[:-1]:
            assert rows[m]["status"] == "ok", (m, rows[m].get("reason"))
            assert rows[m]["tflops"] > 0 and rows[m]["correct"]
            assert 0 < rows[m]["call_us"] < 1e6 and rows[m]["call_calls"] >= 10
        assert rows["flash_attn"]["status"] in ("ok", "unavailable")
        assert rows["tiledattention"]["details"]["schedule"]
        # The launch geometry of the plan that ran: query tiles x heads x batch programs.
        geo, details = rows["tiledattention"]["geometry"], rows["tiledattention"]["details"]
        tile_m = Schedule.from_label(details["schedule"]).tile_m
        assert geo["programs"] == -(-point.seq_q // tile_m) * point.heads * point.batch
        assert geo["sms"] == torch.cuda.get_device_properties(0).multi_processor_count
        assert "geometry" not in rows["torch_sdpa"]


def test_recorded_torch_sdpa_backend_matches_the_profiled_kernels():
    cfg = small_config()
    point = expand(cfg)[0]
    (row,) = run_point(point, ["torch_sdpa"], cfg, torch.device("cuda"), None)
    backend = row["details"]["backend"]
    q = torch.randn(point.batch, point.heads, point.seq_q, point.head_dim, device="cuda",
                    dtype=torch.float16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch_sdpa(q, q, q, causal=point.causal)
        torch.cuda.synchronize()
    names = " ".join(e.name.lower() for e in prof.events() if e.device_type.name == "CUDA")
    markers = dict(_KERNEL_MARKERS)[backend]
    assert any(m in names for m in markers), (backend, names[:500])


def test_cuda_graph_timing_mode_gives_ok_rows():
    cfg = from_dict({"grid": {"seqs": [512], "head_dims": [64], "dtypes": ["bfloat16"],
                              "causal": [True], "shape_policy": "explicit", "batch": 2,
                              "heads": 4},
                     "methods": ["tiledattention", "torch_sdpa"],
                     "timing": {"warmup": 2, "reps": 6, "rounds": 2, "cuda_graph": True}})
    rows = run_point(expand(cfg)[0], list(cfg.methods), cfg, torch.device("cuda"), None)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(r["timing"]["cuda_graph"] for r in rows)
    assert all(r["call_us"] > 0 for r in rows)  # eager call latency, graph or not
