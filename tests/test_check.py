"""`tiledattn check` can fail: its GPU speed check has a threshold, not just a printout."""

from tiledattention import check


def rows(ours: float, theirs: float, status: str = "ok") -> dict:
    base = {"point_key": check.SPEED_POINT.key()}
    return {"tiledattention": {**base, "method": "tiledattention", "status": status,
                               "reason": None if status == "ok" else "boom", "tflops": ours},
            "torch_sdpa": {**base, "method": "torch_sdpa", "status": "ok", "tflops": theirs}}


def test_speed_check_fails_below_the_documented_ratio_and_passes_above():
    ok, detail = check.speed_verdict(rows(400.0, 600.0), check.MIN_SPEED_RATIO)
    assert not ok and "ratio 0.667 (pass >= 0.8)" in detail
    ok, _ = check.speed_verdict(rows(500.0, 600.0), check.MIN_SPEED_RATIO)
    assert ok
    ok, detail = check.speed_verdict(rows(0.0, 600.0, status="wrong"), 0.8)
    assert not ok and "tiledattention: wrong (boom)" in detail


def test_a_slow_kernel_makes_tiledattn_check_exit_nonzero(monkeypatch, capsys):
    monkeypatch.setattr(check, "environment", lambda: {"cuda_gpu": "fake", "cuda_tile": None,
                                                       "tileiras": None})
    monkeypatch.setattr(check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(check, "_gpu_correctness", lambda: (True, "fake"))
    monkeypatch.setattr(check, "_gpu_speed",
                        lambda floor: check.speed_verdict(rows(300.0, 600.0), floor))
    assert check.run_check() == 1
    assert "[FAIL] speed vs torch SDPA (GPU)" in capsys.readouterr().out
    assert check.run_check(min_speed_ratio=0.4) == 0


def test_the_check_point_is_the_paper_grid_shape_the_help_names():
    p = check.SPEED_POINT
    assert (p.batch, p.heads, p.seq_q, p.head_dim, p.dtype) == (4, 16, 4096, 128, "float16")
