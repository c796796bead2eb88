"""The drop-in mode on the CPU: which calls it routes, which it hands back to PyTorch and
under what reason (counted per call, logged once), and that results and gradients are
PyTorch's, eager and under torch.compile. Routing is checked with a stand-in kernel on CPU
tensors (``ROUTED_DEVICES``); the real kernel's runs are tests/gpu/test_dropin_gpu.py."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.errors import CompileError, ShapeError
from tiledattention.integrations import dropin


def qkv(b=1, h=2, s=16, d=32, dtype=torch.bfloat16, hkv=None, grad=False):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, s, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, hkv or h, s, d, generator=gen).to(dtype) for _ in range(2))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


class Recorder:
    """A stand-in kernel: records each call's arguments, answers with torch's result."""

    def __init__(self, raise_for=None):
        self.calls, self.raise_for = [], raise_for

    def __call__(self, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        if self.raise_for is not None:  # a fresh error, as sdpa's checks raise
            raise type(self.raise_for)(*self.raise_for.args)
        if not torch.compiler.is_compiling():  # a list Dynamo saw grow would recompile
            self.calls.append(dict(attn_mask=attn_mask, dropout_p=dropout_p,
                                   is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                                   mode_on=torch._C._is_torch_function_mode_enabled()))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                              scale=scale, enable_gqa=enable_gqa)


@pytest.fixture
def routed_on_cpu(monkeypatch):
    """CPU calls go to a Recorder instead of PyTorch."""
    kernel = Recorder()
    monkeypatch.setattr(dropin, "ROUTED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(dropin, "_kernel", kernel)
    return kernel


def test_mode_is_exported_lazily_from_the_package():
    assert ta.sdpa_mode is dropin.sdpa_mode and ta.SDPAMode is dropin.SDPAMode
    assert isinstance(ta.sdpa_mode(), torch.overrides.TorchFunctionMode)


def test_cpu_calls_fall_back_to_torch_with_its_numbers_and_are_counted():
    q, k, v = qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with ta.sdpa_mode() as mode:
        got = [F.scaled_dot_product_attention(q, k, v, is_causal=True) for _ in range(3)]
    assert all(torch.equal(g, want) for g in got)
    assert mode.fallbacks == {"device cpu": 3} and mode.routed == 0


def test_other_torch_functions_pass_through_untouched():
    x = torch.randn(4, 4)
    with ta.sdpa_mode() as mode:
        y = torch.softmax(x @ x.T, -1) + F.gelu(x)
    assert torch.equal(y, torch.softmax(x @ x.T, -1) + F.gelu(x))
    assert mode.routed == 0 and not mode.fallbacks


class Sub(torch.Tensor):
    pass


def _mask_requiring_grad(q):
    return torch.zeros(q.shape[2], q.shape[2], dtype=q.dtype, requires_grad=True)


@pytest.mark.parametrize("reason,make", [
    ("dtype float32", lambda: (qkv(dtype=torch.float32), {})),
    ("dtype float64", lambda: (qkv(dtype=torch.float64), {})),
    ("head dim 20", lambda: (qkv(d=20), {})),
    ("head dim 584", lambda: (qkv(d=584), {})),
    ("rank 3", lambda: (tuple(t[0] for t in qkv()), {})),
    ("nested or subclass tensor", lambda: (tuple(t.as_subclass(Sub) for t in qkv()), {})),
    ("attn_mask requires grad", lambda: (qkv(), {"attn_mask": _mask_requiring_grad(qkv()[0])})),
])
def test_what_the_kernel_does_not_do_falls_back_under_its_reason(routed_on_cpu, reason, make):
    (q, k, v), kw = make()
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    with ta.sdpa_mode() as mode:
        got = F.scaled_dot_product_attention(q, k, v, **kw)
    assert torch.equal(got, want)
    assert mode.fallbacks == {reason: 1} and mode.routed == 0 and not routed_on_cpu.calls


def test_dropout_falls_back_and_draws_torchs_random_numbers(routed_on_cpu):
    q, k, v = qkv()
    torch.manual_seed(3)
    want = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    with ta.sdpa_mode() as mode:
        got = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(got, want) and mode.fallbacks == {"dropout": 1}


def _outcome(q, k, v, kw):
    try:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    except RuntimeError as exc:
        return str(exc)


@pytest.mark.parametrize("reason,make", [
    ("dtypes differ", lambda: ((qkv()[0], *qkv(dtype=torch.float16)[1:]), {})),
    ("is_causal with attn_mask", lambda: (qkv(), {"is_causal": True, "attn_mask":
                                                  torch.rand(16, 16) > 0.5})),
])
def test_calls_torch_may_refuse_keep_torchs_outcome_and_are_counted(routed_on_cpu, reason,
                                                                    make):
    """Torch's result or torch's error, whichever torch gives (the CUDA backends refuse
    is_causal with a mask; the CPU math backend applies both)."""
    (q, k, v), kw = make()
    want = _outcome(q, k, v, kw)
    with ta.sdpa_mode() as mode:
        got = _outcome(q, k, v, kw)
    assert type(got) is type(want)
    assert got == want if isinstance(want, str) else torch.equal(got, want)
    assert mode.fallbacks == {reason: 1} and not routed_on_cpu.calls


def test_supported_calls_are_routed_with_torchs_arguments(routed_on_cpu):
    """...and with the mode off while the kernel runs: sdpa takes its plain eager path
    (no custom-op dispatch), as a call outside any mode would."""
    q, k, v = qkv(h=4, hkv=2)
    mask = torch.rand(16, 16) > 0.3
    with ta.sdpa_mode() as mode:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
        F.scaled_dot_product_attention(q, k, v, mask, 0.0, False, enable_gqa=True)
        F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask, enable_gqa=True)
    assert mode.routed == 3 and not mode.fallbacks
    first, second, third = routed_on_cpu.calls
    assert first == dict(attn_mask=None, dropout_p=0.0, is_causal=True, scale=0.3,
                         enable_gqa=True, mode_on=False)
    assert second["attn_mask"] is mask and second["enable_gqa"] and not second["is_causal"]
    assert third["attn_mask"] is mask and third["scale"] is None


def test_a_call_the_kernel_rejects_falls_back_under_the_error_name(monkeypatch, routed_on_cpu):
    monkeypatch.setattr(dropin, "_kernel", Recorder(raise_for=ShapeError("heads differ")))
    q, k, v = qkv()
    with ta.sdpa_mode() as mode:
        got = F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(got, F.scaled_dot_product_attention(q, k, v))
    assert mode.fallbacks == {"rejected: ShapeError": 1} and mode.routed == 0


def _plain_attend(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _sdpa_takes_torchs_names():
    import inspect

    from tiledattention import api

    return "is_causal" in inspect.signature(api.sdpa).parameters


@pytest.mark.skipif(not _sdpa_takes_torchs_names(), reason="tiledattention.sdpa does not take "
                    "PyTorch's argument names yet (issue 26, item 4: the coordinator's part)")
def test_the_real_kernels_argument_checks_send_a_call_back_to_torch(monkeypatch):
    """A value head dim the kernel does not run (20: not a multiple of 8): PyTorch takes
    it, sdpa's checks refuse it (before the device check, so on the CPU too); eager and
    compiled, the call goes to torch."""
    monkeypatch.setattr(dropin, "ROUTED_DEVICES", ("cuda", "cpu"))
    q, k, _ = qkv()
    v = qkv(d=20)[2]
    want = F.scaled_dot_product_attention(q, k, v)
    with ta.sdpa_mode() as mode:
        got = F.scaled_dot_product_attention(q, k, v)
        (compiled,), graphs = _compiled_counts(_plain_attend, (q, k, v), calls=1)
    assert torch.equal(got, want) and torch.allclose(compiled.float(), want.float())
    assert mode.fallbacks == {"rejected: UnsupportedHeadDimError": 2} and graphs == 1


def test_a_value_head_dim_needing_a_gradient_is_routed_to_the_kernel(routed_on_cpu):
    # The kernel runs D_qk != D_v forward and backward: a training call is not sent back.
    q, k, _ = qkv(grad=True)
    v = qkv(d=16, grad=True)[2]
    with ta.sdpa_mode() as mode:
        F.scaled_dot_product_attention(q, k, v)
    assert not mode.fallbacks and mode.routed == 1 and len(routed_on_cpu.calls) == 1


@pytest.mark.parametrize("failure", [CompileError("tileiras failed"), RuntimeError("CUDA")])
def test_a_kernel_failure_is_raised_not_hidden_by_a_fallback(monkeypatch, routed_on_cpu,
                                                              failure):
    monkeypatch.setattr(dropin, "_kernel", Recorder(raise_for=failure))
    q, k, v = qkv()
    with ta.sdpa_mode() as mode, pytest.raises(type(failure), match=str(failure)):
        F.scaled_dot_product_attention(q, k, v)
    assert mode.routed == 0 and not mode.fallbacks


def test_each_reason_is_logged_once_at_debug(caplog):
    q, k, v = qkv()
    with caplog.at_level(logging.DEBUG, logger="tiledattention.dropin"), ta.sdpa_mode():
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v)
            F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    lines = [r.getMessage() for r in caplog.records if r.name == "tiledattention.dropin"]
    assert len(lines) == 2 and all(r.levelno == logging.DEBUG for r in caplog.records)
    assert "(device cpu)" in lines[0] and "(dtype float32)" in lines[1]


def test_gradients_flow_through_both_paths(routed_on_cpu):
    def grads(dtype, inside):
        q, k, v = qkv(dtype=dtype, grad=True)
        if inside:
            with ta.sdpa_mode() as mode:
                F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        else:
            mode = None
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        return [t.grad for t in (q, k, v)], mode

    for dtype, counts in ((torch.bfloat16, (1, {})), (torch.float32, (0, {"dtype float32": 1}))):
        got, mode = grads(dtype, True)
        want, _ = grads(dtype, False)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        assert (mode.routed, dict(mode.fallbacks)) == counts


def test_multihead_attention_calls_are_seen_inside_the_mode(routed_on_cpu):
    """nn.MultiheadAttention (torchvision's ViT block) calls SDPA from inside
    F.multi_head_attention_forward; the mode sees those calls too."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(torch.bfloat16)
    x = torch.randn(2, 10, 64, dtype=torch.bfloat16)
    want, _ = mha(x, x, x, need_weights=False)
    with ta.sdpa_mode() as mode:
        got, _ = mha(x, x, x, need_weights=False)
    assert torch.equal(got, want) and mode.routed == 1 and not mode.fallbacks
    assert routed_on_cpu.calls[0]["is_causal"] is False


def _tiny_hf_llama():
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled-fullgraph"])
def test_an_unmodified_hf_model_runs_inside_the_mode(compiled):
    model = _tiny_hf_llama()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        want = model(ids).logits
        torch._dynamo.reset()
        run = torch.compile(model, fullgraph=True, backend="aot_eager") if compiled else model
        with ta.sdpa_mode() as mode:
            got = run(ids).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert mode.fallbacks == {"dtype float32": 2} and mode.routed == 0  # one call per layer


def test_multihead_attention_compiles_inside_the_mode():
    """Not fullgraph: Dynamo (torch 2.13) cannot trace Tensor.unflatten, which MHA calls,
    under any TorchFunctionMode (a pass-through mode fails alike); it breaks the graph."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    x = torch.randn(2, 10, 64)
    want, _ = mha(x, x, x, need_weights=False)
    torch._dynamo.reset()
    with ta.sdpa_mode() as mode:
        got, _ = torch.compile(mha, backend="aot_eager")(x, x, x, need_weights=False)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert set(mode.fallbacks) == {"dtype float32"}


def _compiled_counts(fn, args, calls=3):
    """(outputs, graphs compiled) of ``calls`` calls of torch.compile(fullgraph) of fn."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    return [compiled(*args) for _ in range(calls)], len(graphs)


def _attend(q, k, v):
    return F.scaled_dot_product_attention(q * 1.5, k, v, is_causal=True).relu()


def test_fallback_compiles_fullgraph_with_torchs_numbers_and_counts_the_compilation():
    q, k, v = qkv(dtype=torch.float32)
    with ta.sdpa_mode() as mode:
        outs, graphs = _compiled_counts(_attend, (q, k, v))
    want = _attend(q, k, v)
    assert graphs == 1  # counting adds no recompile
    assert all(torch.allclose(o, want, rtol=1e-5, atol=1e-6) for o in outs)
    assert mode.fallbacks == {"dtype float32": 1} and mode.routed == 0  # one compilation


def test_a_fresh_mode_reuses_the_compiled_graph():
    q, k, v = qkv(dtype=torch.float32)
    with ta.sdpa_mode():
        _, graphs = _compiled_counts(_attend, (q, k, v), calls=1)
    compiled = torch.compile(_attend, fullgraph=True)
    with ta.sdpa_mode():
        compiled(q, k, v)
    with ta.sdpa_mode() as again:
        compiled(q, k, v)
    assert graphs == 1 and not again.fallbacks  # counted where it compiled, not per mode


def test_routing_and_rejection_compile_fullgraph(monkeypatch, routed_on_cpu):
    q, k, v = qkv()
    with ta.sdpa_mode() as mode:
        outs, graphs = _compiled_counts(_attend, (q, k, v), calls=2)
    assert graphs == 1 and mode.routed == 1
    assert all(torch.equal(o, _attend(q, k, v)) for o in outs)
    monkeypatch.setattr(dropin, "_kernel", Recorder(raise_for=ShapeError("no")))
    with ta.sdpa_mode() as rejected:
        outs, graphs = _compiled_counts(_attend, (q, k, v), calls=2)
    assert graphs == 1 and rejected.fallbacks == {"rejected: ShapeError": 1}
    assert all(torch.equal(o, _attend(q, k, v)) for o in outs)


def test_a_compiled_training_step_inside_the_mode_matches_torchs_gradients():
    def step(attend, q, k, v):
        attend(q, k, v).square().sum().backward()
        return [t.grad for t in (q, k, v)]

    want = step(_attend, *qkv(dtype=torch.float32, grad=True))
    torch._dynamo.reset()
    compiled = torch.compile(_attend, fullgraph=True)
    with ta.sdpa_mode() as mode:
        got = step(compiled, *qkv(dtype=torch.float32, grad=True))
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want))
    assert mode.fallbacks == {"dtype float32": 1}


def test_unknown_arguments_are_left_to_torch():
    assert dropin._bind((1, 2, 3), {"is_causal": True})[5] is True
    assert dropin._bind((1, 2, 3), {"sinks": 1}) is None
    assert dropin._bind((1, 2, 3, None, 0.0, False, None, False, 9), {}) is None
