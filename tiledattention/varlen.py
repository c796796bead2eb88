"""Packed variable-length batches and a paged KV cache: FlashAttention's workload APIs.

``sdpa_varlen`` takes sequences packed back to back (``[total, H, D]`` with int32
``cu_seqlens``, what ``flash_attn_varlen_func`` and transformers' padding-free training
take); ``sdpa_paged`` reads keys and values through a block table from a cache of
fixed-size pages (``[num_pages, page_size, Hkv, D]``, FA4's and vLLM's layout) for decode
and chunked prefill. The conventions are FlashAttention's: causality aligned bottom-right
when a sequence's Sq != Skv, ``window_size=(left, right)`` with -1 unbounded, ``softcap``,
GQA whenever Hq is a multiple of Hkv, the log-sum-exp as ``[Hq, total_q]``.

Nothing reads ``cu_seqlens`` on the host per call: a small kernel maps the grid's programs
to (sequence, tile) on the GPU (``kernel.seqmap``), so a call never synchronises and can
be captured in a CUDA graph. ``max_seqlen_*`` only pick the schedule (the grid is sized
from the packed length): an understated one costs speed, never a row. The offsets' values
are checked (one sync) on the first eager call of each plan, outside graph capture and
compilation; the kernels clamp every offset and page id into the tensors given, so a bad
value later can give wrong rows, never a read or write outside them.

The float64 definitions are ``workload_reference.varlen_reference`` / ``paged_reference``.
Three ways through, as ``sdpa`` (``api``): eager without a gradient runs the plan; eager
with one an ``autograd.Function``; anything traced the ``torch.library`` ops below.
"""

from __future__ import annotations

import torch

from . import api as _api
from . import mods as _mods
from . import variants as _variants
from .errors import BackwardNotSupportedError, InputError
from .kernel import workload as _w
from .kernel.launch import captured_buffers, captured_grads
from .kernel.plan import pinned_schedule
from .kernel.workload_check import check_paged, check_varlen


def _needs_grad(*ts) -> bool:
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in ts)


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                seqused_k=None, causal: bool = False, scale: float | None = None,
                window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                score_mod=None, mask_mod=None, return_lse: bool = False, schedule=None):
    """Attention over packed variable-length sequences, forward and backward.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D] (fp16/bf16, one dtype and device, D a
    multiple of 8 up to 256, Hq a multiple of Hkv). cu_seqlens_q / cu_seqlens_k: int32
    [B + 1], non-decreasing from 0 (sequence b is rows ``cu[b]:cu[b+1]``). max_seqlen_q /
    max_seqlen_k: Python ints, the longest sequence (they pick the schedule). seqused_k:
    optional int32 [B], the keys of sequence b actually used (the first ``seqused_k[b]``
    of its span). causal: bottom-right aligned. window_size: (left, right) keys around the
    diagonal, -1 unbounded. softcap: ``softcap * tanh(score / softcap)`` when > 0.
    score_mod / mask_mod: as ``sdpa``'s, with ``b`` the sequence index and ``q_idx`` /
    ``kv_idx`` positions within the sequence.

    Rows past ``cu_seqlens_q[-1]`` / ``cu_seqlens_k[-1]`` must be finite (zeros, say): the
    backward loads whole tiles from the packed arrays, and a NaN there can reach the
    gradients.

    Returns out [total_q, Hq, D] (and lse [Hq, total_q] fp32 with ``return_lse``).
    Differentiable in q, k and v (and in tensors a score_mod captures, as ``sdpa``)."""
    mods = varlen_mods(score_mod, mask_mod, softcap)
    needs_grad = _needs_grad(q, k, v)
    if not _api._plain_eager(q):
        return _traced_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              seqused_k, causal, scale, window_size, softcap, score_mod,
                              mask_mod, return_lse, needs_grad)
    if needs_grad and mods.grad_error:
        raise BackwardNotSupportedError(mods.grad_error)
    aux = mods.tensors() if mods.key else ()
    bwd_mods, needs = _api._backward_mods(mods, aux, needs_grad) if aux else (mods, ())
    plan = _w.varlen_setup(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_k, causal, scale, window_size, softcap, mods,
                           bool(return_lse) or needs_grad or any(needs), schedule)
    if needs_grad or any(needs):
        out, lse = _Varlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                 (plan, bwd_mods, needs), *aux)
    else:
        out, lse = _w.run_varlen(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, aux)
    return (out, lse) if return_lse else out


class _Varlen(torch.autograd.Function):
    """The eager path of a packed call that needs a gradient (the plans of the op, without
    its dispatch). As ``api._Attention``, what autograd does not track travels as one
    tuple, ``call``: (plan, the backward's Mods, which captured tensors ``needs`` a
    gradient); the offsets are saved tensors (an in-place change before the backward is
    refused by autograd)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, seqused_k, call, *aux):
        out, lse = _w.run_varlen(call[0], q, k, v, cu_q, cu_k, seqused_k, aux)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k)
        ctx.call, ctx.aux = call, aux
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k, seqused_k = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        fwd, mods, needs = ctx.call
        w = fwd.work
        captured = captured_buffers(ctx.aux, needs) if needs else ()
        plan = _bwd_plan(w, q.device, mods, dlse is not None)
        dq, dk, dv = _w.run_varlen_backward(plan, w, q, k, v, out, lse, dout, dlse, cu_q,
                                            cu_k, seqused_k, ctx.aux, captured)
        if not ctx.aux:
            return dq, dk, dv, None, None, None, None
        return (dq, dk, dv, None, None, None, None, *captured_grads(ctx.aux, captured))


def _bwd_plan(w, device, mods, has_dlse: bool):
    pinned = pinned_schedule()  # a benchmark's ``pinned_bwd_schedule``, in force at the backward
    key = ("varlen_bwd", w, device, mods.key, has_dlse, _w.PACKED_BWD_WHOLE,
           _w.PACKED_BWD_SCATTER_OUT,
           _w.PACKED_DELTA_OCCUPANCY, _w.PACKED_BWD_TAIL_TILE, _w.PACKED_BWD_KEY_ROWS,
           _w.PACKED_DQ_DELTA, _w.VARLEN_BWD_HEAD_BLOCKS, _w.VARLEN_HEAVY_MAP,
           _w.policy.generation(), pinned)
    return _w._cached(key, lambda: _w.varlen_bwd_plan(w, device, mods, has_dlse, pinned))


# ----------------------------------------------------------------------------- the ops
_lib = _api._lib
_VARLEN_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor cu_q, Tensor cu_k, Tensor? seqused_k, "
                "Tensor[] aux, int max_q, int max_k, bool causal, float scale, int win_l, "
                "int win_r, bool return_lse, str variant")
_lib.define(f"varlen({_VARLEN_ARGS}) -> (Tensor, Tensor)")
_lib.define("varlen_bwd(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, "
            "Tensor? dlse, Tensor cu_q, Tensor cu_k, Tensor? seqused_k, Tensor[] aux, "
            "int max_q, int max_k, bool causal, float scale, int win_l, int win_r, "
            "str variant) -> (Tensor, Tensor, Tensor, Tensor[])")


def _op_plan(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, win_l, win_r,
             return_lse, variant):
    mods = _api._entry(variant)[0]
    return _w.varlen_setup(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale,
                           (win_l, win_r), 0.0, mods, return_lse, None)


def _varlen_cuda(q, k, v, cu_q, cu_k, seqused_k, aux, max_q, max_k, causal, scale, win_l,
                 win_r, return_lse, variant):
    plan = _op_plan(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, win_l,
                    win_r, return_lse, variant)
    out, lse = _w.run_varlen(plan, q, k, v, cu_q, cu_k, seqused_k, tuple(aux))
    return out, lse if lse is not None else q.new_empty((1, 1), dtype=torch.float32)


def _varlen_fake(q, k, v, cu_q, cu_k, seqused_k, aux, max_q, max_k, causal, scale, win_l,
                 win_r, return_lse, variant):
    return (q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]) if return_lse else (1, 1),
                                              dtype=torch.float32))


def _varlen_bwd_cuda(q, k, v, out, lse, dout, dlse, cu_q, cu_k, seqused_k, aux, max_q, max_k,
                     causal, scale, win_l, win_r, variant):
    _, _, bwd_mods, needs, _ = _api._entry(variant)
    plan = _op_plan(q, k, v, cu_q, cu_k, seqused_k, max_q, max_k, causal, scale, win_l,
                    win_r, True, variant)
    captured = captured_buffers(tuple(aux), needs)
    bplan = _bwd_plan(plan.work, q.device, bwd_mods or _api._mods.NONE, dlse is not None)
    dq, dk, dv = _w.run_varlen_backward(bplan, plan.work, q, k, v, out, lse, dout, dlse, cu_q,
                                        cu_k, seqused_k, tuple(aux), captured)
    return dq, dk, dv, _api._captured_out(q, aux, captured)


def _varlen_bwd_fake(q, k, v, out, lse, dout, dlse, cu_q, cu_k, seqused_k, aux, max_q, max_k,
                     causal, scale, win_l, win_r, variant):
    needs = _api._entry(variant)[3]
    needs = (*needs, *([False] * (len(aux) - len(needs))))
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            [torch.empty_like(t) if n else q.new_empty(0) for t, n in zip(aux, needs)])


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, seqused_k, aux, max_q, max_k, causal, scale, win_l, win_r,
     return_lse, variant) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, *aux)
    ctx.args = (max_q, max_k, causal, scale, win_l, win_r, variant)
    ctx.entry = _api._entry(variant)
    ctx.return_lse = return_lse
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, seqused_k, *aux = ctx.saved_tensors
    if not ctx.return_lse:
        raise BackwardNotSupportedError("tiledattention::varlen was called with return_lse="
                                        "False; the backward needs the log-sum-exp (call "
                                        "sdpa_varlen)")
    if dout is None:
        dout = torch.zeros_like(out)
    variant = ctx.args[-1]
    if variant:
        _api._register(variant, ctx.entry)
    dq, dk, dv, daux = _varlen_bwd(q, k, v, out, lse, dout, dlse, cu_q, cu_k, seqused_k, aux,
                                   *ctx.args)
    needs = ctx.entry[3]
    daux = [g if i < len(needs) and needs[i] else None for i, g in enumerate(daux)]
    return (dq, dk, dv, None, None, None, daux, None, None, None, None, None, None, None,
            None)


_lib.impl("varlen", _varlen_cuda, "CUDA")
torch.library.register_fake("tiledattention::varlen", _varlen_fake, lib=_lib)
_lib.impl("varlen_bwd", _varlen_bwd_cuda, "CUDA")
torch.library.register_fake("tiledattention::varlen_bwd", _varlen_bwd_fake, lib=_lib)
torch.library.register_autograd("tiledattention::varlen", _backward,
                                setup_context=_setup_context, lib=_lib)
_varlen_op = torch.ops.tiledattention.varlen.default
_varlen_bwd = torch.ops.tiledattention.varlen_bwd.default


@torch.compiler.disable
def _traced_mods(score_mod, mask_mod, softcap, needs_grad: bool):
    """(variant key, captured tensors) of a traced call: lifting reads source code, which
    Dynamo cannot trace (one graph break with a variant, as ``sdpa``)."""
    mods = varlen_mods(score_mod, mask_mod, softcap)
    if needs_grad and mods.grad_error:
        raise BackwardNotSupportedError(mods.grad_error)
    aux = mods.tensors()
    bwd_mods, needs = _api._backward_mods(mods, aux, needs_grad)
    return _api._variant_key(mods, None, bwd_mods, needs), list(aux), any(needs)


def _traced_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale, window_size,
                   softcap, score_mod, mask_mod, return_lse, needs_grad):
    w = check_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale,
                     window_size, softcap)
    variant, aux = "", []
    if score_mod is not None or mask_mod is not None or softcap:
        variant, aux, captured_grad = _traced_mods(score_mod, mask_mod, softcap, needs_grad)
        needs_grad = needs_grad or captured_grad
    out, lse = _varlen_op(q, k, v, cu_q, cu_k, seqused_k, aux, max_q, max_k, w.causal,
                          w.scale, w.window[0], w.window[1], bool(return_lse) or needs_grad,
                          variant)
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- paged
def sdpa_paged(q, k_cache, v_cache, page_table, cache_seqlens, *, cu_seqlens_q=None,
               max_seqlen_q: int | None = None, causal: bool = False,
               scale: float | None = None, window_size: tuple[int, int] = (-1, -1),
               softcap: float = 0.0, score_mod=None, mask_mod=None, return_lse: bool = False,
               schedule=None):
    """Attention of new tokens against a paged KV cache (decode, chunked prefill).

    q: [B, Sq, Hq, D] (Sq new tokens per sequence; Sq = 1 for decode) or packed [total_q,
    Hq, D] with ``cu_seqlens_q`` and ``max_seqlen_q`` (chunked prefill, ragged Sq).
    k_cache, v_cache: [num_pages, page_size, Hkv, D]; page_size a power of two from 16 to
    256. page_table: int32 [B, max_pages], the pages of sequence b in order.
    cache_seqlens: int32 [B], the tokens of sequence b in the cache **including** the new
    ones (append them first: writing the cache is the caller's, e.g.
    ``k_cache[page, slot] = k_new``); its keys are positions 0 .. cache_seqlens[b] - 1.
    causal: bottom-right aligned (the new tokens are the last Sq of the context).
    Inference only: a call whose inputs require grad is refused.

    Returns out shaped like q (and lse fp32 [B, Hq, Sq], or [Hq, total_q] when packed).
    Long contexts split their keys across programs (flash-decoding) and GQA decode packs a
    group's query heads into one tile, as the dense decode does."""
    if _needs_grad(q, k_cache, v_cache):
        raise BackwardNotSupportedError("sdpa_paged is inference only (no gradient): call it "
                                        "under torch.no_grad(), or use sdpa_varlen to train")
    mods = varlen_mods(score_mod, mask_mod, softcap)
    if not _api._plain_eager(q):
        return _traced_paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q,
                             max_seqlen_q, causal, scale, window_size, softcap, score_mod,
                             mask_mod, return_lse)
    plan = _w.paged_setup(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q,
                          max_seqlen_q, causal, scale, window_size, softcap, mods,
                          bool(return_lse), schedule)
    aux = mods.tensors() if mods.key else ()
    out, lse = _w.run_paged(plan, q, k_cache, v_cache, page_table, cache_seqlens,
                            cu_seqlens_q, aux)
    return (out, lse) if return_lse else out


_lib.define("paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, "
            "Tensor cache_seqlens, Tensor? cu_q, Tensor[] aux, int max_q, bool causal, "
            "float scale, int win_l, int win_r, bool return_lse, str variant) "
            "-> (Tensor, Tensor)")


def _paged_cuda(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, aux, max_q, causal,
                scale, win_l, win_r, return_lse, variant):
    mods = _api._entry(variant)[0]
    plan = _w.paged_setup(q, k_cache, v_cache, page_table, cache_seqlens, cu_q,
                          max_q if cu_q is not None else None, causal, scale, (win_l, win_r),
                          0.0, mods, return_lse, None)
    out, lse = _w.run_paged(plan, q, k_cache, v_cache, page_table, cache_seqlens, cu_q,
                            tuple(aux))
    return out, lse if lse is not None else q.new_empty((1, 1), dtype=torch.float32)


def _paged_fake(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, aux, max_q, causal,
                scale, win_l, win_r, return_lse, variant):
    if not return_lse:
        lse_shape = (1, 1)
    elif cu_q is not None:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


_lib.impl("paged", _paged_cuda, "CUDA")
torch.library.register_fake("tiledattention::paged", _paged_fake, lib=_lib)
_paged_op = torch.ops.tiledattention.paged.default


def _traced_paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, max_q, causal, scale,
                  window_size, softcap, score_mod, mask_mod, return_lse):
    w = check_paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, max_q, causal,
                    scale, window_size, softcap)
    variant, aux = "", []
    if score_mod is not None or mask_mod is not None or softcap:
        variant, aux, _ = _traced_mods(score_mod, mask_mod, softcap, False)
    out, lse = _paged_op(q, k_cache, v_cache, page_table, cache_seqlens, cu_q, aux, w.max_q,
                         w.causal, w.scale, w.window[0], w.window[1], bool(return_lse),
                         variant)
    return (out, lse) if return_lse else out


def varlen_mods(score_mod, mask_mod, softcap: float):
    """The call's Mods: ``softcap`` is the built-in softcap score_mod (with its
    derivative); with a score_mod of the caller's, pass the cap inside it."""
    if softcap:
        if score_mod is not None:
            raise InputError("pass either softcap or a score_mod (write the cap into the "
                             "score_mod: cap * tanh(score / cap))")
        score_mod = _variants.softcap(softcap)
    return _mods.mods_for(score_mod, mask_mod)
