"""The eager training call's autograd node on the CPU, with real plans and the launches
recorded instead of run: which kernels a forward+backward launches, in what order, and
which gradients autograd hands back (the numbers are the GPU tests'; this is the wiring of
``api._Attention``, which the GPU suites run but no CPU test reached)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import tiledattention as ta  # noqa: E402
from tiledattention.kernel import launch as launching  # noqa: E402
from tiledattention.kernel import plan as planning  # noqa: E402


def _qkv(d=64, s=128):
    return [torch.zeros(1, 2, s, d, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)]


def _names(seen):
    return [name for name, _ in seen]


def test_a_training_call_launches_the_forward_then_its_backward_plan_and_sets_every_grad(
        launches):
    q, k, v = _qkv()
    out = ta.sdpa(q, k, v, is_causal=True)
    assert len(launches) == 1 and out.shape == q.shape
    out.backward(torch.ones_like(out))
    bwd = planning.bwd_plan_for(q, k, None, True, 64 ** -0.5, False, None,
                                head_dim_v=64)
    # the plan the node ran is the cached one for this call
    assert [launches[i + 1][0] for i in range(len(bwd.launches))] == \
        [getattr(s.kernel, "__name__", None) or s.kernel._pyfunc.__name__
         for s in bwd.launches]
    assert len(launches) == 1 + len(bwd.launches)
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_a_second_training_call_reuses_both_plans(launches, monkeypatch):
    q, k, v = _qkv()
    ta.sdpa(q, k, v).sum().backward()
    first = len(launches)
    built = []
    monkeypatch.setattr(planning, "make_bwd_plan", lambda *a, **k: built.append(a))
    monkeypatch.setattr(planning, "build_plan", lambda *a, **k: built.append(a))
    ta.sdpa(q, k, v).sum().backward()
    assert built == [] and len(launches) == 2 * first


def test_an_lse_gradient_reaches_the_backward_only_where_the_lse_was_used(launches,
                                                                          monkeypatch):
    from tiledattention import api

    runs = []

    def recording(plan, *args, **kwargs):
        runs.append((plan.variant.has_dlse, args[6] is not None))  # dlse
        return real(plan, *args, **kwargs)

    real = api.run_backward
    monkeypatch.setattr(api, "run_backward", recording)
    for use_lse in (True, False):
        q, k, v = _qkv()
        out, lse = ta.sdpa(q, k, v, return_lse=True)
        (out.sum() + lse.sum() if use_lse else out.sum()).backward()
        assert q.grad is not None
    assert runs == [(True, True), (False, False)]


def test_a_captured_tensor_that_requires_grad_gets_one_in_its_own_dtype(launches):
    q, k, v = _qkv()
    bias = torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)

    def head_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    ta.sdpa(q, k, v, score_mod=head_bias).sum().backward()
    assert bias.grad is not None and bias.grad.dtype == torch.bfloat16
    assert bias.grad.shape == bias.shape
    assert all(t.grad is not None for t in (q, k, v))


def test_a_captured_tensor_without_grad_gets_none_and_the_inputs_still_do(launches):
    q, k, v = _qkv()
    bias = torch.zeros(2, dtype=torch.float32)

    def head_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    ta.sdpa(q, k, v, score_mod=head_bias).sum().backward()
    assert bias.grad is None and all(t.grad is not None for t in (q, k, v))


@pytest.fixture
def packed_launches(monkeypatch):
    """The packed path's plans for an sm_90 with 132 SMs; each launch's kernel name."""
    from tiledattention.kernel import workload

    seen = []
    monkeypatch.setattr(workload, "device_target", lambda device: workload.Target("9.0", 132))
    monkeypatch.setattr(workload, "check_device", lambda q: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(workload, "launch_kernel",
                        lambda device, grid, kernel, args, pdl=False: seen.append(
                            _name(kernel)))
    yield seen


def _name(kernel) -> str:
    return getattr(kernel, "__name__", None) or kernel._pyfunc.__name__


def _programs(names) -> list:
    return [n for n in names if n != "sequence_map"]


def _packed(lens=(100, 300, 50, 62), heads=4, d=64):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    qkv = [torch.zeros(sum(lens), heads, d, dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3)]
    return qkv, cu, max(lens)


def test_a_packed_training_call_launches_its_forward_then_backward_and_sets_every_grad(
        packed_launches):
    (q, k, v), cu, longest = _packed()
    out = ta.sdpa_varlen(q, k, v, cu, cu, longest, longest, causal=True)
    forward = list(packed_launches)
    assert forward and out.shape == q.shape
    out.backward(torch.ones_like(out))
    from tiledattention import mods, varlen
    from tiledattention.kernel.workload import varlen_setup

    plan = varlen_setup(q, k, v, cu, cu, longest, longest, None, True, None, (-1, -1), 0.0,
                        mods.NONE, True, None)  # the call's, cached
    # each call also builds its tile maps (``sequence_map``) before the programs that read them
    assert _programs(forward) == _programs(_name(s.kernel) for s in plan.launches)
    bwd = varlen._bwd_plan(plan.work, q.device, mods.NONE, False)
    assert _programs(packed_launches[len(forward):]) == \
        _programs(_name(s.kernel) for s in bwd.launches)
    assert _programs(forward) == ["attention_fwd_seqs"]
    for t in (q, k, v):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_a_packed_calls_offsets_changed_in_place_before_its_backward_are_refused(
        packed_launches):
    (q, k, v), cu, longest = _packed()
    out = ta.sdpa_varlen(q, k, v, cu, cu, longest, longest)
    cu.add_(0)  # an in-place write: the forward's offsets may no longer be these
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_captured_gradients_come_back_in_each_tensors_dtype_and_none_past_the_score_mods():
    # a mask_mod's tensors come after the score_mod's and get no accumulator (a mask is
    # piecewise constant): None, as torch gives them
    aux = (torch.zeros(2, dtype=torch.bfloat16), torch.zeros(3), torch.zeros(4))
    captured = (torch.ones(2), None)
    grads = launching.captured_grads(aux, captured)
    assert len(grads) == 3 and grads[1] is None and grads[2] is None
    assert grads[0].dtype == torch.bfloat16 and bool((grads[0] == 1).all())
