"""Every refusal of sdpa is a typed TiledAttentionError naming the argument."""

from __future__ import annotations

import sys

import pytest
import torch

import tiledattention as ta
from tiledattention.kernel import toolchain


def t(*shape, dtype=torch.float16, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


QKV = (t(2, 4, 16, 64), t(2, 4, 16, 64), t(2, 4, 16, 64))


@pytest.mark.parametrize("args,error,words", [
    (("q", QKV[1], QKV[2]), ta.InputError, "q must be a torch.Tensor"),
    ((t(2, 4, 16, 64, dtype=torch.float32), *QKV[1:]), ta.DTypeError, "float16, bfloat16"),
    ((t(2, 4, 16, 64, dtype=torch.float64), *QKV[1:]), ta.DTypeError, "q.dtype"),
    ((QKV[0], t(2, 4, 16, 64, dtype=torch.bfloat16), QKV[2]), ta.DTypeError, "one dtype"),
    ((t(4, 16, 64), *QKV[1:]), ta.ShapeError, "rank 4"),
    ((QKV[0], t(3, 4, 16, 64), t(3, 4, 16, 64)), ta.ShapeError, "batch"),
    ((QKV[0], t(2, 4, 16, 64), t(2, 4, 15, 64)), ta.ShapeError, "k and v"),
    ((QKV[0], t(2, 4, 16, 32), t(2, 4, 16, 32)), ta.ShapeError, "head dims differ"),
    ((t(2, 4, 0, 64), *QKV[1:]), ta.ShapeError, "empty query sequence"),
    ((QKV[0], t(2, 4, 0, 64), t(2, 4, 0, 64)), ta.ShapeError, "empty key sequence"),
    ((t(2, 4, 16, 36), t(2, 4, 16, 36), t(2, 4, 16, 36)), ta.UnsupportedHeadDimError,
     "multiples of 8"),
    ((t(2, 4, 16, 584), t(2, 4, 16, 584), t(2, 4, 16, 584)), ta.UnsupportedHeadDimError, "256"),
    ((t(2, 6, 16, 64), t(2, 4, 16, 64), t(2, 4, 16, 64)), ta.ShapeError, "multiple of"),
    ((t(2, 8, 16, 64), t(2, 2, 16, 64), t(2, 2, 16, 64)), ta.ShapeError, "enable_gqa=True"),
    ((QKV[0], QKV[1], torch.zeros(2, 4, 16, 64, dtype=torch.float16, device="meta")),
     ta.DeviceError, "one device"),
])
def test_bad_tensors_raise_typed_errors_naming_the_problem(args, error, words):
    with pytest.raises(error, match=words):
        ta.sdpa(*args)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "0.1", True])
def test_bad_scale_is_refused(scale):
    with pytest.raises(ta.InputError, match="scale"):
        ta.sdpa(*QKV, scale=scale)


def test_non_bool_causal_is_refused():
    with pytest.raises(ta.InputError, match="causal"):
        ta.sdpa(*QKV, causal=1)


@pytest.mark.parametrize("mask,words", [
    (torch.zeros(2, 4, 16, 16, dtype=torch.int32), "attn_mask.dtype"),
    (torch.zeros(2, 4, 16, 17, dtype=torch.bool), "does not broadcast"),
    (torch.zeros(3, 1, 1, 16, dtype=torch.bool), "axis B"),
    (torch.zeros(1, 2, 3, 4, 16, dtype=torch.bool), "rank 1 to 4"),
    (torch.zeros(16, dtype=torch.bool, device="meta"), "is on meta"),
    ([[True]], "torch.Tensor"),
])
def test_bad_masks_raise_mask_error(mask, words):
    with pytest.raises(ta.MaskError, match=words):
        ta.sdpa(*QKV, attn_mask=mask)


def test_inputs_requiring_grad_pass_the_checks_but_a_grad_mask_is_refused():
    q = QKV[0].clone().requires_grad_()
    # q, k, v have a backward: the next check is the device one.
    with pytest.raises((ta.NoGPUError, ta.DeviceError)):
        ta.sdpa(q, *QKV[1:])
    mask = torch.zeros(QKV[0].shape[2], QKV[1].shape[2], requires_grad=True)
    with pytest.raises(ta.BackwardNotSupportedError, match="q, k and v only"):
        ta.sdpa(*QKV, attn_mask=mask)


def test_requires_grad_under_no_grad_passes_the_grad_check():
    q = QKV[0].clone().requires_grad_()
    # The next check is the device one: NoGPUError here, DeviceError on a GPU machine.
    with torch.no_grad(), pytest.raises((ta.NoGPUError, ta.DeviceError)):
        ta.sdpa(q, *QKV[1:])


def test_cpu_tensors_without_gpu_raise_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ta.NoGPUError, match="no CUDA GPU"):
        ta.sdpa(*QKV)


def test_cpu_tensors_with_a_gpu_present_raise_device_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ta.DeviceError, match="needs CUDA tensors"):
        ta.sdpa(*QKV)


def test_bad_schedule_is_refused_before_compiling():
    from tiledattention.kernel.validate import Problem, resolve_schedule

    problem = Problem(2, 4, 4, 16, 16, 64, False, 0.125)
    with pytest.raises(ta.ScheduleError, match="tile_m"):
        resolve_schedule({"tile_m": 48}, problem)
    with pytest.raises(ta.ScheduleError, match="Schedule, a dict"):
        resolve_schedule("64x64", problem)


def test_old_gpu_raises_gpu_too_old(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Tesla T4")
    with pytest.raises(ta.GPUTooOldError, match="7.5"):
        toolchain.check_gpu.__wrapped__(0)


def test_missing_tileiras_raises_toolchain_missing_with_install_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(toolchain, "tileiras_path", lambda: None)
    with pytest.raises(ta.ToolchainMissingError, match="pip install"):
        toolchain.check_gpu.__wrapped__(0)


def test_missing_cutile_raises_toolchain_missing_with_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tiledattention.kernel.attention", None)
    toolchain.kernel_module.cache_clear()
    try:
        with pytest.raises(ta.ToolchainMissingError, match="cuda-tile"):
            toolchain.kernel_module()
    finally:
        toolchain.kernel_module.cache_clear()


def test_every_error_is_a_tiledattention_error():
    for name in ta.__all__:
        obj = getattr(ta, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, ta.TiledAttentionError), name


def test_backward_schedule_names_the_readme_uses_are_exported_lazily():
    # README: `BwdSchedule(dq="atomic")`, `default_bwd_schedule`; as ta.* without torch.
    import subprocess

    code = ("import sys, tiledattention as ta; assert 'BwdSchedule' in ta.__all__; "
            "assert 'default_bwd_schedule' in ta.__all__; "
            "s = ta.default_bwd_schedule(128, True); assert isinstance(s, ta.BwdSchedule); "
            "ta.BwdSchedule(dq='atomic'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # still no torch import for schedules


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_call_on_cpu_tensors_raises_the_typed_device_error(fullgraph):
    # The device is refused at run time (the op's CPU kernel), so a fullgraph compile ends
    # in sdpa's own one-line error, not in Dynamo's "Observed exception".
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU (NoGPUError)")
    from tiledattention.errors import NoGPUError

    q = torch.randn(1, 2, 64, 64, dtype=torch.float16)
    fn = torch.compile(lambda q, k, v: ta.sdpa(q, k, v, is_causal=True), fullgraph=fullgraph)
    with pytest.raises(NoGPUError, match="no CUDA GPU is visible"):
        fn(q, q, q)
