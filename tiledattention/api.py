"""The public entry point, ``sdpa``, and its ``torch.library`` custom op."""

from __future__ import annotations

import torch

from .kernel.launch import launch
from .kernel.plan import plan_for
from .schedules.schedule import Schedule
from .validate import check_inputs, resolve_schedule


@torch.library.custom_op("tiledattention::attention_fwd", mutates_args=(), device_types="cuda")
def _attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
    causal: bool, scale: float, return_lse: bool, tile_m: int, tile_n: int, occupancy: int,
    num_ctas: int, latency_k: int, latency_v: int, heavy_first: bool, splits: int,
    worker_warps: int, pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    # tile_m == 0 means "pick for me": resolved here, at run time, so that tracing under
    # torch.compile never queries the device. worker_warps == 0: the compiler's choice.
    schedule = None if tile_m == 0 else Schedule(tile_m, tile_n, occupancy, num_ctas,
                                                 latency_k, latency_v, heavy_first, splits,
                                                 worker_warps or None, pdl)
    # sdpa checked the arguments while tracing; GQA is allowed here because it passed.
    plan = plan_for(q, k, v, attn_mask, causal, scale, True, return_lse, schedule)
    return launch(plan, q, k, v, attn_mask)


@_attention_fwd.register_fake
def _(q, k, v, attn_mask, causal, scale, return_lse, tile_m, tile_n, occupancy, num_ctas,
      latency_k, latency_v, heavy_first, splits, worker_warps, pdl=False):
    b, hq, sq, d = q.shape
    out = q.new_empty((b, hq, sq, d))
    lse = q.new_empty((b, hq, sq) if return_lse else (1, 1, 1), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("tiledattention::attention_bwd", mutates_args=(), device_types="cuda")
def _attention_bwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    dout: torch.Tensor, dlse: torch.Tensor | None, attn_mask: torch.Tensor | None,
    causal: bool, scale: float, bwd_schedule: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from .kernel.bwd_plan import run_backward
    from .schedules.backward import BwdSchedule

    # bwd_schedule: a BwdSchedule label, or "" for the policy's choice (table, default).
    schedule = BwdSchedule.from_label(bwd_schedule) if bwd_schedule else None
    return run_backward(q, k, v, out, lse, dout, dlse, attn_mask, causal, scale, schedule)


@_attention_bwd.register_fake
def _(q, k, v, out, lse, dout, dlse, attn_mask, causal, scale, bwd_schedule):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, causal, scale, return_lse = inputs[:7]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask)
    ctx.causal, ctx.scale, ctx.return_lse = causal, scale, return_lse
    ctx.n_inputs = len(inputs)
    # A backward schedule pinned around the forward (``pinned_bwd_schedule``) holds for
    # its backward too, whenever that runs (benchmarks pin it this way).
    from .kernel.bwd_plan import pinned_schedule

    pinned = pinned_schedule()
    ctx.bwd_schedule = "" if pinned is None else pinned.label()
    # An output nobody used gets None, not zeros: an unused LSE costs no extra pass.
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, attn_mask = ctx.saved_tensors
    if not ctx.return_lse:
        # sdpa always asks for the LSE when a gradient is needed; a direct op call did not.
        from .errors import BackwardNotSupportedError

        raise BackwardNotSupportedError("attention_fwd was called with return_lse=False; the "
                                        "backward needs the log-sum-exp (call sdpa)")
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = _attention_bwd(q, k, v, out, lse, dout, dlse, attn_mask, ctx.causal,
                                ctx.scale, ctx.bwd_schedule)
    # No gradient for the mask and the scalar arguments.
    return dq, dk, dv, *([None] * (ctx.n_inputs - 3))


torch.library.register_autograd("tiledattention::attention_fwd", _backward,
                                setup_context=_setup_context)

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled


def _plain_eager(q) -> bool:
    """True for a call that no tracer, compiler, mode or tensor subclass needs to see.

    Such calls skip the custom op's dispatch (~21 us per call on the H100 host) and run
    the plan directly; everything else goes through the op, as torch.compile, CUDA-graph
    trees, fake tensors, jit tracing and dispatch modes expect.
    """
    return (type(q) is _Tensor and not _is_compiling() and _tracing_state() is None
            and not _dispatch_modes() and not _function_modes())


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
         scale: float | None = None, attn_mask: torch.Tensor | None = None,
         enable_gqa: bool = False, return_lse: bool = False,
         schedule: Schedule | dict | None = None):
    """Scaled-dot-product attention forward with a cuTile kernel.

    ``q``: [B, Hq, Sq, D]; ``k``, ``v``: [B, Hkv, Skv, D]; fp16 or bf16 CUDA tensors of one
    dtype and device. D is any multiple of 8 up to 256 (96 and 160 run without padding).
    Scores, softmax statistics and the accumulator are fp32.

    causal: as ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``:
        query i attends keys j <= i (top-left aligned, also when Sq != Skv). Unlike
        PyTorch, it may be combined with ``attn_mask``.
    scale: multiplies q @ k^T; default 1/sqrt(D); must be finite and > 0.
    attn_mask: bool (True = attend) or additive (q's dtype or float32), broadcastable
        to [B, Hq, Sq, Skv]. Key-padding masks [B, 1, 1, Skv] are read one row per key
        tile. A bool mask is turned into an additive one of q's dtype first (one pass
        over the mask), and a mask whose key axis is broadcast is expanded along it.
    enable_gqa: allow Hq to be a multiple of Hkv (grouped-query / multi-query).
    return_lse: also return the natural-log log-sum-exp of each query row's scaled
        scores, fp32 [B, Hq, Sq].
    schedule: a ``Schedule`` (or dict of its fields) overriding the tuned choice. By
        default the schedule comes from the tuning table for this GPU and shape bucket
        (exact bucket, else the nearest tuned one, else ``default_schedule``); see
        ``set_schedule_table`` and ``$TILEDATTENTION_SCHEDULE_TABLE``.

    Fully masked rows (every key masked out) are defined as zeros, with log-sum-exp
    -inf; PyTorch's math backend returns NaN there.

    A repeat call with the same shapes, strides, dtypes, devices, flags, mask layout and
    schedule (and the same schedule table) reuses the launch plan of the first: one dict
    lookup and one launch (``kernel.plan``).

    Any strides are accepted: a tensor is copied only when its last (head-dim) axis is
    not unit-stride. The output is a new contiguous tensor allocated by PyTorch, and the
    kernel runs on PyTorch's current CUDA stream; it works under ``torch.compile``
    (fullgraph) and CUDA-graph capture.

    Differentiable in q, k and v (``torch.library.register_autograd`` on the custom op, so
    it also trains under torch.compile): cuTile backward kernels recompute the softmax
    from the saved log-sum-exp (``kernel.backward``); GQA's dK/dV are summed over each
    group; the LSE output, when returned, is differentiable too. ``attn_mask`` gets no
    gradient: a mask that requires grad is refused (``BackwardNotSupportedError``); an
    additive mask is a constant. Fully masked rows get zero gradients. The backward's
    schedule comes from the table's backward entries (``choose_bwd_schedule``: exact
    bucket, nearest, else ``default_bwd_schedule``) unless ``pinned_bwd_schedule`` pins
    one; every shipped choice is deterministic (no atomics).

    Returns ``out``, or ``(out, lse)`` when ``return_lse``.
    """
    needs_grad = _grad_enabled() and (getattr(q, "requires_grad", False) or getattr(
        k, "requires_grad", False) or getattr(v, "requires_grad", False))
    if _plain_eager(q) and not needs_grad:
        plan = plan_for(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse, schedule)
        out, lse = launch(plan, q, k, v, attn_mask, fresh_lse=False)
        return (out, lse) if return_lse else out
    problem = check_inputs(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask,
                           enable_gqa=enable_gqa)
    s = resolve_schedule(schedule, problem)
    hints = (0, 0, 0, 0, 0, 0, True, 0, 0) if s is None else (
        s.tile_m, s.tile_n, s.occupancy, s.num_ctas, s.latency_k, s.latency_v, s.heavy_first,
        s.splits, s.worker_warps or 0, s.pdl)
    # With a gradient to compute, the forward always keeps the LSE: the backward needs it.
    out, lse = _attention_fwd(q, k, v, attn_mask, problem.causal, problem.scale,
                              bool(return_lse) or needs_grad, *hints)
    return (out, lse) if return_lse else out


def timed_call(q, k, v, **kwargs) -> float:
    """Seconds for one synchronised ``sdpa`` call.

    The first call of a variant in a process includes its compilation: cold when
    cuTile's disk cache (``$CUDA_TILE_CACHE_DIR``, default ``~/.cache/cutile-python``) has
    no cubin for it, warm when an earlier process left one; later calls hit the
    in-memory cache. ``benchmarks/compile_time.py`` measures all three.
    """
    import time

    torch.cuda.synchronize(q.device)
    start = time.perf_counter()
    sdpa(q, k, v, **kwargs)
    torch.cuda.synchronize(q.device)
    return time.perf_counter() - start
