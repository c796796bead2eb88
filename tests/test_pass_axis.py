"""The `passes` axis: forward, backward alone and forward+backward as points of their own,
gradients judged against float64 autograd, the backward's FLOP count, the study tables."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tiledattention.bench import methods as M
from tiledattention.bench.config import ConfigError, from_dict
from tiledattention.bench.grid import Point, expand
from tiledattention.bench.runner import run_point
from tiledattention.flops import attention_flops

CPU = torch.device("cpu")
FWD = Point("float32", True, 32, 48, 40, 1, 4, 2)


def cfg(methods):
    return from_dict({"methods": list(methods), "device": "cpu",
                      "timing": {"warmup": 1, "reps": 2, "rounds": 1}})


def test_forward_keys_are_unchanged_and_other_passes_get_their_own():
    assert FWD.key() == "float32-causal-d32-sq48-skv40-b1-h4-g2"
    keys = {dataclasses.replace(FWD, pass_=p).key() for p in ("fwd", "bwd", "fwd+bwd")}
    assert len(keys) == 3
    assert Point.from_dict(dataclasses.replace(FWD, pass_="bwd").as_dict()).pass_ == "bwd"


def test_the_grid_expands_every_pass_and_refuses_unknown_ones():
    grid = {"seqs": [64], "head_dims": [32], "dtypes": ["float32"], "causal": [False]}
    points = expand(from_dict({"grid": {**grid, "passes": ["fwd", "fwd+bwd"]}}))
    assert [p.pass_ for p in points] == ["fwd", "fwd+bwd"]
    with pytest.raises(ConfigError, match="backward"):
        from_dict({"grid": {**grid, "passes": ["backward"]}})


def test_backward_flops_are_2_5x_the_forward():
    f = attention_flops(2, 4, 64, 64, 32, False)
    assert attention_flops(2, 4, 64, 64, 32, False, "bwd") == 2.5 * f
    assert attention_flops(2, 4, 64, 64, 32, True, "fwd+bwd") == 3.5 * f / 2


@pytest.mark.parametrize("pass_", ["bwd", "fwd+bwd"])
def test_backward_rows_check_every_gradient_and_count_backward_flops(pass_):
    point = dataclasses.replace(FWD, pass_=pass_)
    (row,) = run_point(point, ["eager"], cfg(["eager"]), CPU, None)
    assert row["status"] == "ok" and row["pass"] == pass_
    assert row["grads_correct"] and max(row["grad_rel_err"].values()) < 1e-5
    assert row["flops"] == attention_flops(1, 4, 48, 40, 32, True, pass_)


class _SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps 2 ms and counts itself."""

    runs = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        import time

        _SlowBackward.runs += 1
        time.sleep(0.002)
        return grad


@pytest.mark.parametrize("pass_", ["fwd+bwd", "bwd"])
def test_backward_rows_carry_the_call_latency_of_their_whole_pass(monkeypatch, pass_):
    """Like forward rows, backward rows time back-to-back calls (timing.time_calls) of what
    the pass runs, the backward included: each timed call ran it, and its 2 ms show."""
    def slow_backward(q, k, v, p):
        return _SlowBackward.apply(M.eager_attention(q, k, v, p))

    monkeypatch.setitem(M.METHODS, "slow_bwd", M.Method("slow_bwd", "", False, slow_backward))
    monkeypatch.setattr(_SlowBackward, "runs", 0)
    config = cfg(["slow_bwd"])
    (row,) = run_point(dataclasses.replace(FWD, pass_=pass_), ["slow_bwd"], config, CPU, None)
    assert row["status"] == "ok" and row["call_calls"] >= 10
    assert row["call_us"] >= 2000
    # The gradient check, warm-up and kernel timing run it too; the call timing adds at
    # least call_calls per round.
    timing = config.timing
    before_calls = (pass_ == "fwd+bwd") + timing.warmup + timing.reps
    assert _SlowBackward.runs >= before_calls + row["call_calls"] * timing.rounds


def test_wrong_gradients_are_wrong_rows(monkeypatch):
    def detached_v(q, k, v, p):  # right output, but v gets no gradient
        return M.eager_attention(q, k, v.detach(), p) + 0 * v.sum()

    monkeypatch.setitem(M.METHODS, "fake", M.Method("fake", "", False, detached_v))
    (row,) = run_point(dataclasses.replace(FWD, pass_="fwd+bwd"), ["fake"], cfg(["fake"]),
                       CPU, None)
    assert row["status"] == "wrong" and "gradient" in row["reason"]


def test_methods_without_a_backward_are_unsupported_there(monkeypatch):
    monkeypatch.setitem(M.METHODS, "fwd_only", M.Method("fwd_only", "", False,
                                                        M.eager_attention, has_backward=False))
    (row,) = run_point(dataclasses.replace(FWD, pass_="bwd"), ["fwd_only"], cfg(["fwd_only"]),
                       CPU, None)
    assert row["status"] == "unsupported"


def test_headline_reports_forward_and_forward_backward_separately():
    from tiledattention.study.presentation.tables import headline

    rows = []
    for pass_, ours in (("fwd", 1.0), ("fwd+bwd", 4.0)):
        p = dataclasses.replace(FWD, pass_=pass_)
        for m, ms in (("tiledattention", ours), ("torch_sdpa", 2.0 * ours),
                      ("flash", 3.0 * ours)):
            rows.append({"point_key": p.key(), **p.as_dict(), "method": m, "status": "ok",
                         "time_ms": {"median_ms": ms}})
    t = headline(rows)
    cells = {r[0]: r for r in t.rows}
    assert cells["torch_sdpa (fused SDPA), all points"][1] == 1  # forward rows only
    assert cells["torch_sdpa, fwd+bwd"][3] == pytest.approx(2.0)
    assert cells["flash, fwd+bwd"][3] == pytest.approx(3.0)
