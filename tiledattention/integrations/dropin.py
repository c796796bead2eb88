"""A drop-in for models that call PyTorch: inside ``sdpa_mode()`` every
``torch.nn.functional.scaled_dot_product_attention`` call runs ``tiledattention.sdpa``.

    import tiledattention as ta
    with ta.sdpa_mode() as mode:
        logits = model(ids)           # an unmodified model (HF attn_implementation="sdpa",
    print(mode.routed, mode.fallbacks)  # timm/torchvision ViTs, nn.MultiheadAttention)

It is a ``torch.overrides.TorchFunctionMode``, PyTorch's own mechanism for redirecting
torch functions. What the kernel does not do goes to PyTorch unchanged, and every such
call is counted under its reason in ``mode.fallbacks`` (a ``Counter``) and logged once per
reason at DEBUG on the ``tiledattention.dropin`` logger:

- ``device cpu`` (any non-CUDA device), ``dtype float32`` (anything but fp16/bf16),
  ``dtypes differ``, ``dropout`` (dropout_p > 0), ``head dim N`` (the kernel takes
  multiples of 8 up to 256; forward only: q/k up to 576, v up to 512), ``head dim > 256
  backward`` (a gradient past 256: the kernel runs that forward only), ``rank N`` (the
  kernel takes [B, H, S, D]), ``nested or subclass tensor``, ``attn_mask requires grad``,
  ``is_causal with attn_mask`` (PyTorch's answer is kept: its CUDA backends refuse the
  pair), ``unknown argument``;
- ``rejected: <Error>``: any other refusal of ``tiledattention.sdpa``'s argument checks
  (an ``InputError``: shapes, GQA, mask layout). Only argument checks, which run before
  any kernel: a kernel or compiler failure is raised, never hidden by a fallback.

``mode.routed`` counts the calls that ran the kernel. Gradients flow through either path,
so a model trains inside the mode.

Under ``torch.compile`` (fullgraph included) Dynamo traces a mode entered outside the
compiled region: the routing is decided when Dynamo traces the call and the graph keeps
that decision. Such a call is counted once per compilation, on the mode active then
(``torch._dynamo.comptime``: no graph break, no recompile per mode); runs of the compiled
graph are not counted again, so a fresh mode around a function already compiled in
another mode counts nothing for it.

``F.multi_head_attention_forward`` (what ``nn.MultiheadAttention`` runs when its fast path
is off, as it is under any mode) calls SDPA from Python; a mode does not see calls made
inside a function it handles, so that one function runs with the mode active again.
(With ``need_weights=True``, MHA's default, it computes the weights itself and calls no
SDPA at all: torchvision's ViT passes ``need_weights=False``.)
Under torch.compile it compiles with graph breaks only: Dynamo (torch 2.13) cannot trace
the ``Tensor.unflatten`` MHA calls under any TorchFunctionMode, so ``fullgraph=True``
fails there (an unmodified HF model and a ViT calling SDPA directly compile fullgraph).

Cost: the mode sees every torch function call inside it (about a microsecond of Python per
call, in eager), so enter it around the model call, not around a whole program.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
import torch.nn.functional as F
from torch._dynamo.comptime import comptime
from torch.overrides import TorchFunctionMode

from ..errors import InputError
from ..headdim import MAX_FWD_HEAD_DIM, MAX_HEAD_DIM, supported_head_dim

log = logging.getLogger("tiledattention.dropin")

_SDPA = F.scaled_dot_product_attention
_MHA = F.multi_head_attention_forward
_DTYPES = (torch.float16, torch.bfloat16)
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
           "enable_gqa")
_DEFAULTS = (None, None, None, None, 0.0, False, None, False)
# The devices whose calls are routed; a module attribute so the CPU tests can route CPU
# tensors to a stand-in kernel.
ROUTED_DEVICES = ("cuda",)


def _count(mode: SDPAMode, reason: str | None = None, detail: str = "") -> None:
    """One more call routed (reason None) or handed to PyTorch under ``reason``."""
    if torch.compiler.is_compiling():
        comptime(_count_at_trace_time)
    else:
        mode._record(reason, detail)


def _count_at_trace_time(ctx) -> None:
    # Dynamo runs this while it traces ``_count``: once per compilation, as the compiled
    # graph holds the decision. Traced code reads nothing of the mode, so a fresh mode
    # object (a new ``with``) adds no guard, no recompile and no graph break.
    var = getattr(ctx.get_local("mode"), "_ComptimeVar__variable", None)
    mode = getattr(var, "value", None)
    reason, detail = (ctx.get_local(name).as_python_constant() for name in ("reason", "detail"))
    if isinstance(mode, SDPAMode):
        mode._record(reason, detail)
    else:  # a torch whose Dynamo hides the mode differently: say so, do not guess
        log.warning("torch.compile: cannot count an SDPA call on the mode (%s)",
                    reason or "routed")


def _bind(args, kwargs) -> list | None:
    """F.scaled_dot_product_attention's arguments by position, defaults filled in; None for
    an argument this torch version may know but the kernel does not."""
    if len(args) > len(_PARAMS) or not set(kwargs) <= set(_PARAMS[len(args):]):
        return None
    values = list(args) + list(_DEFAULTS[len(args):])
    for name, value in kwargs.items():
        values[_PARAMS.index(name)] = value
    return values


def _plain(t) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and not t.is_nested


def fallback_reason(q, k, v, attn_mask, dropout_p, is_causal) -> tuple[str, str] | None:
    """(reason, detail) when the call goes to PyTorch, None when the kernel takes it.

    Device last, so that each other reason is decided (and tested) on any machine."""
    if not all(_plain(t) for t in (q, k, v)) or (attn_mask is not None
                                                   and not _plain(attn_mask)):
        return "nested or subclass tensor", f"q is a {type(q).__name__}"
    if dropout_p:
        return "dropout", "the kernel has no attention dropout (dropout_p > 0)"
    if q.dtype not in _DTYPES:
        return f"dtype {str(q.dtype).removeprefix('torch.')}", "the kernel runs fp16 and bf16"
    if not q.dtype == k.dtype == v.dtype:
        return "dtypes differ", "q, k and v must share one dtype"
    if q.dim() != 4:
        return f"rank {q.dim()}", "the kernel takes [B, H, S, D] tensors"
    d = q.shape[-1]
    if not supported_head_dim(d, MAX_FWD_HEAD_DIM):
        return f"head dim {d}", ("the kernel takes head dims that are multiples of 8 up to "
                                 "256 (the forward: q/k up to 576, v up to 512)")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if grad and max(d, v.shape[-1]) > MAX_HEAD_DIM:
        return "head dim > 256 backward", "the kernel's backward takes head dims up to 256"
    if attn_mask is not None:
        if is_causal:
            return "is_causal with attn_mask", "PyTorch's answer to the pair is kept"
        if attn_mask.requires_grad and torch.is_grad_enabled():
            return "attn_mask requires grad", "the kernel computes no gradient for the mask"
    if q.device.type not in ROUTED_DEVICES:
        return f"device {q.device.type}", "the kernel runs on CUDA GPUs"
    return None


def _kernel(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    from ..api import sdpa

    return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                scale=scale, enable_gqa=enable_gqa)


class SDPAMode(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to ``tiledattention.sdpa``; see the module
    docstring. ``routed``: calls the kernel ran; ``fallbacks``: Counter of reason -> calls
    that PyTorch ran."""

    def __init__(self):
        super().__init__()
        self.routed = 0
        self.fallbacks: Counter[str] = Counter()
        self._logged: set[str] = set()

    def __repr__(self) -> str:
        return f"SDPAMode(routed={self.routed}, fallbacks={dict(self.fallbacks)})"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            return self._attention(func, args, kwargs)
        if func is _MHA:
            # The mode is off inside its own handler; MHA's SDPA call must still see it.
            with self:
                return _MHA_BODY(*args, **kwargs)
        return func(*args, **kwargs)

    def _record(self, reason: str | None, detail: str) -> None:
        if reason is None:
            self.routed += 1
            return
        self.fallbacks[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.debug("scaled_dot_product_attention falls back to PyTorch (%s): %s", reason,
                      detail)

    def _attention(self, func, args, kwargs):
        bound = _bind(args, kwargs)
        if bound is None:
            why = ("unknown argument", f"arguments {sorted(kwargs)} beyond {_PARAMS}")
        else:
            why = fallback_reason(*bound[:6])
        if why is None:
            try:
                out = _kernel(*bound)
            except InputError as exc:  # argument checks only: they run before any kernel
                why = (f"rejected: {type(exc).__name__}", str(exc))
            else:
                _count(self)
                return out
        _count(self, *why)
        return func(*args, **kwargs)


def _without_torch_function_check(fn):
    """``fn`` (a torch.nn.functional function) with its torch-function check answering
    False, so that run with the mode active it does not hand itself back to the mode."""
    import types

    env = dict(fn.__globals__, has_torch_function=lambda *_: False)
    copy = types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


_MHA_BODY = _without_torch_function_check(_MHA)


def sdpa_mode() -> SDPAMode:
    """A fresh ``SDPAMode``: ``with tiledattention.sdpa_mode() as mode: model(x)``."""
    return SDPAMode()
