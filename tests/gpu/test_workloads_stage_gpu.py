"""The workloads stage on a CUDA GPU, end to end: a two-point grid (a packed varlen batch
forward and forward+backward, and a paged decode) through the harness; every row is ok
(checked against float64 before it was timed) or says why it could not run — never wrong,
never an error; SDPA on the padded batch runs every point, and the tables take the ratio
to the fastest baseline wherever ours is ok."""

from __future__ import annotations

from tiledattention.stages import stage_from_dict
from tiledattention.stages.workloads import load_rows, points, run_workloads
from tiledattention.study.presentation.workloads_report import ratio_rows

GRID = {"kinds": ["varlen", "decode"], "varlen_tokens": [2048], "varlen_head_dims": [64],
        "varlen_gqa": [1], "causal": [True], "doc_max": 1024, "page_sizes": [64],
        "decode_batches": [4], "context_max": 4096, "warmup": 1, "reps": 3, "rounds": 1}


def test_a_two_point_grid_is_ok_or_says_why_for_every_method(tmp_path):
    cfg = stage_from_dict("workloads", GRID)
    assert {(p.kind, p.pass_) for p in points(cfg)} == {("varlen", "fwd"),
                                                        ("varlen", "fwd+bwd"),
                                                        ("decode", "fwd")}
    out = run_workloads(cfg, str(tmp_path))
    assert out["status"] == "ok", out  # "incomplete": which rows are missing, and why
    rows = load_rows(str(tmp_path))
    assert len(rows) == len(points(cfg)) * len(cfg.methods)
    for r in rows:
        st = r["status"]
        assert st in ("ok", "unavailable", "unsupported"), r  # never wrong, never an error
        if st == "ok":
            assert r["correct"] and r["rel_err"] <= r["rtol"], r
            assert r["pass"] == "fwd" or r["grads_correct"], r
            assert r["tflops"] > 0 and r["device"].startswith("cuda"), r
        else:
            assert r["reason"], r
        if r["method"] == "sdpa_padded":
            assert st == "ok", r
    for rec in ratio_rows(rows):
        if rec["ours_status"] == "ok":
            assert rec["x_best"] and rec["best"] not in (None, "none ok"), rec
