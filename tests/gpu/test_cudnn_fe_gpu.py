"""cuDNN through its Python frontend (``cudnn_fe``) on a CUDA GPU: through the harness
(``run_point``: output and gradients against float64 before timing) on the dense grid's
shapes (MHA, GQA, causal, D 64..256, decode, a CUDA-graph replay), and directly against torch
SDPA in fp32 where the grid has no point yet: D_qk != D_v forward and backward, D = 512, the
FP8 forward against the dequantized inputs. A shape this cuDNN refuses skips with cuDNN's
error (the row would say ``unavailable`` with it). Skipped, with the reason, where the
frontend is not importable (scripts/device-baselines.sh installs it on the device machine)
or the GPU is older than sm_90."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tiledattention.bench import cudnn_fe as fe
from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import Point
from tiledattention.bench.runner import run_point
from tiledattention.timing import L2Flusher
from tiledattention.tolerance import relative_error


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch"
    if torch.cuda.get_device_capability()[0] < 9:
        return "cudnn_fe is measured on sm_90 and newer"
    return fe.import_error() or fe.second_cudnn_error()


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def _rows(point, methods, **timing):
    cfg = from_dict({"timing": {"warmup": 1, "reps": 4, "rounds": 2, **timing},
                     "methods": methods})
    return {r["method"]: r for r in run_point(point, methods, cfg, torch.device("cuda"),
                                              L2Flusher())}


# (dtype, causal, D, Sq, Skv, B, H, GQA, pass)
POINTS = [
    ("bfloat16", False, 128, 1024, 1024, 2, 8, 1, "fwd"),
    ("float16", True, 64, 512, 512, 2, 8, 1, "fwd+bwd"),
    ("bfloat16", True, 128, 1024, 1024, 2, 8, 4, "fwd+bwd"),  # GQA 4
    ("bfloat16", False, 256, 1024, 1024, 2, 8, 1, "fwd"),
    ("bfloat16", True, 256, 1024, 1024, 1, 8, 1, "fwd+bwd"),
    ("bfloat16", False, 96, 512, 512, 2, 8, 1, "bwd"),
    ("bfloat16", False, 128, 1, 4096, 4, 32, 4, "fwd"),  # decode, GQA 4
]


@pytest.mark.parametrize("spec", POINTS, ids=lambda s: "-".join(map(str, s)))
def test_cudnn_fe_matches_float64_beside_torchs_cudnn_backend(spec):
    *shape, pass_ = spec
    point = Point(*shape, pass_)
    row = _rows(point, ["cudnn", "cudnn_fe"])["cudnn_fe"]
    if row["status"] == "unavailable" and "refuses" in row["reason"]:
        pytest.skip(row["reason"])
    assert row["status"] == "ok", row.get("reason")
    assert row["correct"] and row["tflops"] > 0, row
    assert pass_ == "fwd" or row["grads_correct"], row
    details = row["details"]
    assert details["cudnn"] == details["torch_cudnn"] and len(details["libcudnn"]) <= 1
    assert any(v for k, v in details.items() if k.startswith("plan_")), details


def test_the_forward_replays_from_a_cuda_graph():
    point = Point("bfloat16", True, 128, 1024, 1024, 2, 8, 1, "fwd")
    row = _rows(point, ["cudnn_fe"], cuda_graph=True)["cudnn_fe"]
    assert row["status"] == "ok", row.get("reason")


def test_a_second_call_executes_the_cached_graph_without_building():
    q, k, v = (torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    fe.sdpa(q, k, v, causal=True)
    built = fe.cached_graph(fe.key_of("fwd", q, k, v, True))
    fe.sdpa(q.clone(), k.clone(), v.clone(), causal=True)
    assert fe.cached_graph(fe.key_of("fwd", q, k, v, True)) is built


def _inputs(dqk, dv, h=8, hkv=8, s=512, dtype=torch.bfloat16, grad=False):
    q = torch.randn(2, h, s, dqk, device="cuda", dtype=dtype)
    k = torch.randn(2, hkv, s, dqk, device="cuda", dtype=dtype)
    v = torch.randn(2, hkv, s, dv, device="cuda", dtype=dtype)
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def _or_skip(fn):
    try:
        return fn()
    except fe.GraphRefused as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("dqk,dv", [(192, 128), (128, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_d_qk_other_than_d_v_forward_and_backward_match_torch_sdpa(dqk, dv, causal):
    q, k, v = _inputs(dqk, dv, grad=True)
    out = _or_skip(lambda: fe.sdpa(q, k, v, causal=causal))
    assert out.shape == (2, 8, 512, dv)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
    refs = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    assert relative_error(out.double(), ref.double()) < 1e-2
    for g, r in zip(grads, refs):
        assert relative_error(g.double(), r.double()) < 2e-2


def test_d512_forward_matches_torch_sdpa_or_names_what_cudnn_refuses():
    q, k, v = _inputs(512, 512, h=4, hkv=4, s=1024)
    out = _or_skip(lambda: fe.sdpa(q, k, v, causal=True))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert relative_error(out.double(), ref.double()) < 1e-2


def _quantized(t):
    """e4m3 of ``t`` at a per-tensor scale (amax -> 448), and the descale factor."""
    descale = t.abs().amax().float() / 448
    return (t.float() / descale).to(torch.float8_e4m3fn), descale.reshape(1)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_matches_the_dequantized_inputs_within_e4m3s_unit_roundoff(d, causal):
    q, k, v = _inputs(d, d, h=8, hkv=2, s=1024)  # GQA 4
    (q8, dq), (k8, dk), (v8, dv) = (_quantized(t) for t in (q, k, v))
    out = _or_skip(lambda: fe.sdpa_fp8(q8, k8, v8, dq, dk, dv, causal=causal))
    assert out.dtype == torch.bfloat16
    deq = [t.double() * s.double() for t, s in ((q8, dq), (k8, dk), (v8, dv))]
    ref = F.scaled_dot_product_attention(*deq, is_causal=causal, enable_gqa=True)
    # P goes through e4m3 (unit roundoff 2**-4) at P_SCALE; O is a P-weighted mean of V.
    assert relative_error(out.double(), ref) < 2 ** -4
