"""The public entry point, ``sdpa``: the eager paths, the ``torch.library`` custom ops that
tracing and compiling see, and autograd for both.

Three ways through, one plan cache and one launch underneath (``kernel.plan``,
``kernel.launch``):

- an eager call without a gradient runs the plan directly;
- an eager call that needs a gradient runs ``_Attention`` (an ``autograd.Function``): the
  plan, the launch and the backward's plan without the custom op's dispatch;
- everything a tracer, compiler, mode or tensor subclass must see goes through the ops
  ``tiledattention::attention`` (no gradient), ``attention_fwd`` (autograd registered) and
  ``attention_bwd``, with fake kernels, so ``torch.compile`` (fullgraph) and CUDA graphs
  work.

A schedule crosses the op boundary as one string, its label ("" = the policy's choice); a
variant (``score_mod`` / ``mask_mod`` / ``block_mask``) as the key of a registry entry plus
the tensors its functions capture, which are op inputs so tracers see them.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

import torch

from . import mods as _mods
from .errors import BackwardNotSupportedError, InputError
from .kernel.launch import captured_buffers, captured_grads, launch, launch_fp8, run_backward
from .kernel.plan import bwd_plan_for, fp8_plan_for, pinned_schedule, plan_for
from .kernel.validate import (
    FP8_DTYPES,
    check_device,
    check_fp8_call,
    check_head_dim_backward,
    check_inputs,
    resolve_schedule,
)
from .schedules.backward import BwdSchedule
from .schedules.schedule import Schedule

# The variant registry of the ops: key -> (Mods, BlockMask or None, the backward's Mods,
# which captured tensors get a gradient). Keyed by value (the functions' compile identity,
# the block mask's ``key``), so equal variants share one entry; bounded: the least recently
# used entry goes (a process making a new block mask per step must not keep them all).
# Every traced call re-registers its entry right before its op runs, and the eager op's
# backward re-registers the one its forward used. Names are serials, never reused, so an
# evicted name is a typed error, never another variant.
MAX_VARIANTS = 1024
_PLAIN = (_mods.NONE, None, _mods.NONE, (), None)  # the last field: the identity
_variants: OrderedDict[str, tuple] = OrderedDict()
_names: dict[tuple, str] = {}  # identity -> name, for the entries in _variants
_serials = itertools.count(1)


def _variant_key(mods, block, bwd_mods=None, needs: tuple = ()) -> str:
    """The registry key of a (Mods, BlockMask) pair, the backward's Mods and which captured
    tensors need a gradient, by value."""
    if not mods.key and block is None:
        return ""
    bwd_mods = bwd_mods or mods
    identity = (mods.key, None if block is None else block.key, bwd_mods.key,
                tuple(bool(n) for n in needs))
    key = _names.get(identity)
    if key is None:
        key = _names[identity] = f"v{next(_serials)}"
    _register(key, (mods, block, bwd_mods, needs, identity))
    return key


def _register(key: str, entry: tuple) -> None:
    """Registers (or refreshes) ``key``; entries are (Mods, BlockMask, backward Mods, needs,
    identity)."""
    _variants[key] = entry
    _variants.move_to_end(key)
    _names.setdefault(entry[-1], key)
    while len(_variants) > MAX_VARIANTS:
        old_key, old = _variants.popitem(last=False)
        if _names.get(old[-1]) == old_key:
            del _names[old[-1]]


def _entry(key: str) -> tuple:
    """The registry entry of an op's ``variant`` argument."""
    if not key:
        return _PLAIN
    found = _variants.get(key)
    if found is None:
        raise InputError(f"variant {key!r} is no longer registered: more than {MAX_VARIANTS} "
                         "other variants were used since its call was traced; run the call "
                         "again (a backward long after its forward: keep fewer variants "
                         "alive in between)")
    return found


def _captured_needs(aux) -> tuple[bool, ...]:
    """Which captured tensors need a gradient (grad mode on and ``requires_grad``)."""
    if not aux or not _grad_enabled():
        return ()
    return tuple(bool(getattr(t, "requires_grad", False)) for t in aux)


# The ops are defined with ``torch.library.Library`` rather than ``torch.library.custom_op``:
# the latter wraps every call in Python autograd and aliasing checks (~13 us a call on the
# CPU, ~21 us for an empty op on the H100 host: benchmarks/notes/backward.md §25). ``attention`` has
# no autograd kernel and serves traced calls that need no gradient (a compiled inference graph pays
# only the dispatcher); ``attention_fwd`` is the same forward with autograd registered.
_FWD_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor? attn_mask, Tensor[] aux, bool causal, "
             "float scale, bool return_lse, str schedule, str variant")
_lib = torch.library.Library("tiledattention", "DEF")
_lib.define(f"attention({_FWD_ARGS}) -> (Tensor, Tensor)")
_lib.define(f"attention_fwd({_FWD_ARGS}) -> (Tensor, Tensor)")
# The fourth output: one tensor per captured tensor, its gradient where the variant's
# backward computes one, else an empty placeholder (None to autograd).
_lib.define("attention_bwd(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, "
            "Tensor? dlse, Tensor? attn_mask, Tensor[] aux, bool causal, float scale, "
            "str bwd_schedule, str variant) -> (Tensor, Tensor, Tensor, Tensor[])")


def _fwd_cuda(q, k, v, attn_mask, aux, causal, scale, return_lse, schedule, variant):
    # schedule "" means "pick for me": resolved here, at run time, so that tracing under
    # torch.compile never queries the device. sdpa checked the arguments while tracing;
    # GQA is allowed here because it passed.
    mods, block = _entry(variant)[:2]
    plan = plan_for(q, k, v, attn_mask, causal, scale, True, return_lse,
                    Schedule.from_label(schedule) if schedule else None,
                    (mods, block) if variant else None)
    return launch(plan, q, k, v, attn_mask, aux=tuple(aux))


def _fwd_cpu(q, k, v, attn_mask, aux, causal, scale, return_lse, schedule, variant):
    # Reached from a compiled graph traced on CPU tensors: the device is refused at run
    # time, with sdpa's typed error (raising while tracing would end fullgraph compiles in
    # Dynamo's own error instead).
    check_device(q)


def _fwd_fake(q, k, v, attn_mask, aux, causal, scale, return_lse, schedule, variant):
    b, hq, sq, _ = q.shape
    out = q.new_empty((b, hq, sq, v.shape[3]))  # the output has V's head dim
    lse = q.new_empty((b, hq, sq) if return_lse else (1, 1, 1), dtype=torch.float32)
    return out, lse


def _bwd_cuda(q, k, v, out, lse, dout, dlse, attn_mask, aux, causal, scale, bwd_schedule,
              variant):
    # bwd_schedule: a BwdSchedule label, or "" for the policy's choice (table, default).
    _, block, bwd_mods, needs, _ = _entry(variant)
    captured = captured_buffers(tuple(aux), needs)
    plan = bwd_plan_for(q, k, attn_mask, causal, scale, dlse is not None,
                        BwdSchedule.from_label(bwd_schedule) if bwd_schedule
                        else pinned_schedule(), bwd_mods or _mods.NONE, block,
                        head_dim_v=v.shape[3])
    dq, dk, dv = run_backward(plan, q, k, v, out, lse, dout, dlse, attn_mask,
                              aux=tuple(aux), captured=captured)
    return dq, dk, dv, _captured_out(q, aux, captured)


def _captured_out(q, aux, captured) -> list:
    """The op's fourth output: each captured tensor's gradient in its dtype, or empty."""
    return [q.new_empty(0) if g is None else g.to(t.dtype)
            for t, g in zip(aux, (*captured, *([None] * (len(aux) - len(captured)))))]


def _bwd_fake(q, k, v, out, lse, dout, dlse, attn_mask, aux, causal, scale, bwd_schedule,
              variant):
    needs = _entry(variant)[3]
    needs = (*needs, *([False] * (len(aux) - len(needs))))
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            [torch.empty_like(t, memory_format=torch.contiguous_format) if n else q.new_empty(0)
             for t, n in zip(aux, needs)])


for _name in ("attention", "attention_fwd"):
    _lib.impl(_name, _fwd_cuda, "CUDA")
    _lib.impl(_name, _fwd_cpu, "CPU")
    torch.library.register_fake(f"tiledattention::{_name}", _fwd_fake, lib=_lib)
_lib.impl("attention_bwd", _bwd_cuda, "CUDA")
torch.library.register_fake("tiledattention::attention_bwd", _bwd_fake, lib=_lib)
_attention = torch.ops.tiledattention.attention.default
_attention_fwd = torch.ops.tiledattention.attention_fwd.default
_attention_bwd = torch.ops.tiledattention.attention_bwd.default


def _pinned_label() -> str:
    # A backward schedule pinned around the forward (``pinned_bwd_schedule``) holds for its
    # backward too, whenever that runs (benchmarks pin it this way).
    pinned = pinned_schedule()
    return "" if pinned is None else pinned.label()


def _setup_context(ctx, inputs, output):
    q, k, v, attn_mask, aux, causal, scale, return_lse, _, variant = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask, *aux)
    ctx.causal, ctx.scale, ctx.return_lse, ctx.variant = causal, scale, return_lse, variant
    ctx.entry = _entry(variant)
    ctx.n_aux = len(aux)
    ctx.bwd_schedule = _pinned_label()
    # An output nobody used gets None, not zeros: an unused LSE costs no extra pass.
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, attn_mask, *aux = ctx.saved_tensors
    if not ctx.return_lse:
        # sdpa always asks for the LSE when a gradient is needed; a direct op call did not.
        raise BackwardNotSupportedError("attention_fwd was called with return_lse=False; the "
                                        "backward needs the log-sum-exp (call sdpa)")
    if dout is None:
        dout = torch.zeros_like(out)
    if ctx.variant:
        _register(ctx.variant, ctx.entry)  # the forward's entry, even if evicted since
    dq, dk, dv, daux = _attention_bwd(q, k, v, out, lse, dout, dlse, attn_mask, aux,
                                      ctx.causal, ctx.scale, ctx.bwd_schedule, ctx.variant)
    # No gradient for the mask and the other arguments; the captured tensors get theirs
    # where the variant's backward computes one (one entry each: autograd matches the
    # inputs' structure).
    needs = ctx.entry[3]
    daux = [g if i < len(needs) and needs[i] else None for i, g in enumerate(daux)]
    return dq, dk, dv, None, daux, None, None, None, None, None


torch.library.register_autograd("tiledattention::attention_fwd", _backward,
                                setup_context=_setup_context, lib=_lib)


class _Attention(torch.autograd.Function):
    """The eager path of a call that needs a gradient: the same plans and launches as the
    custom op, without its dispatch (NOTES: ~21 us an op call on the H100 host).

    Everything but the tensors autograd tracks travels as one tuple, ``call``: (plan,
    attn_mask, block mask, the backward's Mods, which captured tensors ``needs`` a
    gradient). ``Function.apply`` inspects every argument, so each costs ~0.5 us a call
    (benchmarks/notes/host-cost.md §54a)."""

    @staticmethod
    def forward(ctx, q, k, v, call, *aux):
        # ``aux``: the captured tensors, inputs here so that those requiring grad get it.
        out, lse = launch(call[0], q, k, v, call[1], aux=aux)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.call, ctx.aux, ctx.pinned = call, aux, pinned_schedule()
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        plan, mask, block, mods, needs = ctx.call
        captured = captured_buffers(ctx.aux, needs) if needs else ()
        bwd = bwd_plan_for(q, k, mask, plan.variant.causal, plan.scale, dlse is not None,
                           ctx.pinned or pinned_schedule(), mods, block,
                           head_dim_v=v.shape[3])
        dq, dk, dv = run_backward(bwd, q, k, v, out, lse, dout, dlse, mask, aux=ctx.aux,
                                  captured=captured)
        if not ctx.aux:
            return dq, dk, dv, None
        return (dq, dk, dv, None, *captured_grads(ctx.aux, captured))


_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled


def _plain_eager(q) -> bool:
    """True for a call that no tracer, compiler, mode or tensor subclass needs to see.

    Such calls skip the custom op's dispatch and run the plan directly; everything else
    goes through the op, as torch.compile, CUDA-graph trees, fake tensors, jit tracing and
    dispatch modes expect.
    """
    return (type(q) is _Tensor and not _is_compiling() and _tracing_state() is None
            and not _dispatch_modes() and not _function_modes())


@torch.compiler.disable
def _traced_variant(score_mod, mask_mod, block_mask, needs_grad: bool):
    """The op's (variant key, captured tensors, whether a gradient is needed) of a call
    under a tracer. Lifting reads source code, which Dynamo cannot trace: a variant call
    under ``torch.compile`` costs one graph break here, and the op after it is compiled as
    usual."""
    mods, block = _variant(score_mod, mask_mod, block_mask, needs_grad)
    aux = mods.tensors()
    bwd_mods, needs = _backward_mods(mods, aux, needs_grad)
    return _variant_key(mods, block, bwd_mods, needs), list(aux), needs_grad or any(needs)


def _backward_mods(mods, aux, needs_grad: bool):
    """(the backward's Mods, which captured tensors need a gradient), checked before
    anything runs: a score_mod with no derivative, or a captured tensor requiring grad
    whose gradient cannot be derived, is refused here (``VariantError``)."""
    # Only the score_mod's tensors (first in A0.. order) can have one: a mask_mod's output
    # is piecewise constant in them, so they get None, as torch gives them.
    needs = _captured_needs(aux)[:len(mods.score_mod.cells) if mods.score_mod else 0]
    if not any(needs):
        return mods, ()
    if mods.grad_error and not needs_grad:  # not checked by _variant then
        raise BackwardNotSupportedError(mods.grad_error)
    return _mods.with_captured_grads(mods, needs), needs


def _variant(score_mod, mask_mod, block_mask, needs_grad: bool):
    """(Mods, BlockMask or None) of a call, checked before anything runs."""
    from .kernel.blockmask import BlockMask

    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise InputError(f"block_mask must be made by tiledattention.block_mask(...), got "
                             f"{type(block_mask).__name__}")
        if mask_mod is not None and mask_mod is not block_mask.mask_mod:
            raise InputError("pass the mask_mod through block_mask only (it carries its own "
                             "mask_mod), or the block_mask of this mask_mod")
        mask_mod = block_mask.checked_mask_mod()
    mods = _mods.mods_for(score_mod, mask_mod)
    if needs_grad and mods.grad_error:
        raise BackwardNotSupportedError(mods.grad_error)
    return mods, block_mask


def _check_block(block, q, k) -> None:
    from .kernel.blockmask import BlockMask

    if not isinstance(block, BlockMask):  # before its fields are read
        raise InputError(f"block_mask must be made by tiledattention.block_mask(...), got "
                         f"{type(block).__name__}")
    if q.is_nested or k.is_nested:
        return  # no shape to compare: check_inputs refuses them
    b, h, sq, _ = q.shape
    want = (block.batch or 1, block.heads or 1, block.seq_q, block.seq_kv)
    if want[2:] != (sq, k.shape[2]) or want[0] not in (1, b) or want[1] not in (1, h):
        raise InputError(f"block_mask was made for [B, H, Sq, Skv] = {list(block.shape)} "
                         f"(None/1: broadcast), the call has {[b, h, sq, k.shape[2]]}")


def _sdpa_fp8(q, k, v, attn_mask, causal, scale, enable_gqa, return_lse, schedule,
              has_variant: bool, needs_grad: bool, descales: tuple, out_dtype):
    """The FP8 forward's eager path (``sdpa``'s FP8 arguments): checks, the cached plan,
    one launch (V transposed first unless v is a transposed view)."""
    check_fp8_call(q, descales=descales, out_dtype=out_dtype, needs_grad=needs_grad,
                   attn_mask=attn_mask, has_variant=has_variant)
    if not _plain_eager(q):
        raise InputError("the FP8 forward runs eagerly only (no torch.compile, tracing, "
                         "dispatch mode or tensor subclass: it has no custom op yet)")
    plan = fp8_plan_for(q, k, v, causal, scale, enable_gqa, return_lse, schedule, out_dtype,
                        descales)
    out, lse = launch_fp8(plan, q, k, v, descales, fresh_lse=False)
    return (out, lse) if return_lse else out


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
         is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *,
         causal: bool | None = None, return_lse: bool = False,
         schedule: Schedule | dict | None = None, score_mod=None, mask_mod=None,
         block_mask=None, q_descale: torch.Tensor | None = None,
         k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None):
    """Scaled-dot-product attention with cuTile kernels, forward and backward.

    The first eight parameters are ``torch.nn.functional.scaled_dot_product_attention``'s,
    in its order, so ``sdpa`` is a drop-in for it.

    ``q``, ``k``: [B, Hq, Sq, D], [B, Hkv, Skv, D]; ``v``: [B, Hkv, Skv, D_v]; fp16 or bf16
    CUDA tensors of one dtype and device. D and D_v are any multiples of 8 up to 256 (96
    and 160 run without padding); the output has D_v, as in PyTorch (D_v != D: MLA's
    (192, 128), forward and backward; dV has D_v). Forward only, past 256: D up to 576 and
    D_v up to 512 (D = 512; MLA decode's (576, 512)); a gradient there is refused before
    anything runs. Scores, softmax statistics and the accumulator are fp32.

    attn_mask: bool (True = attend) or additive (q's dtype or float32), broadcastable
        to [B, Hq, Sq, Skv]. Key-padding masks [B, 1, 1, Skv] are read one row per key
        tile. A bool mask is turned into an additive one of q's dtype first (one pass
        over the mask), and a mask whose key axis is broadcast is expanded along it.
    dropout_p: must be 0.0 (the kernels have no dropout).
    is_causal (or ``causal``): query i attends keys j <= i (top-left aligned, also when
        Sq != Skv), as PyTorch's. Unlike PyTorch, it may be combined with ``attn_mask``.
    scale: multiplies q @ k^T; default 1/sqrt(D) (q's head dim); must be finite and > 0.
    enable_gqa: allow Hq to be a multiple of Hkv (grouped-query / multi-query).
    return_lse: also return the natural-log log-sum-exp of each query row's scaled
        scores, fp32 [B, Hq, Sq].
    schedule: a ``Schedule`` (or dict of its fields) overriding the tuned choice. By
        default the schedule comes from the tuning table for this GPU and shape bucket
        (exact bucket, else the nearest tuned one, else ``default_schedule``); see
        ``set_schedule_table`` and ``$TILEDATTENTION_SCHEDULE_TABLE``.
    score_mod: ``score_mod(score, b, h, q_idx, kv_idx)`` returns the modified fp32 score
        tile; ``score`` is ``scale * q.k`` (so a modified score is not scaled again),
        ``q_idx`` a [TILE_M, 1] and ``kv_idx`` a [1, TILE_N] tile of absolute positions.
        It is cuTile tile code compiled into the forward and backward kernels
        (``mods``); tensors it captures are indexed with subscripts. An additive
        ``attn_mask`` is added after it. Its gradient: ``ScoreMod(fn, grad=dfn)``, or
        derived symbolically from a one-expression body (``+ - * /``, ``ct.tanh``,
        ``ct.exp``, ``ct.where``); a ``score_mod`` with neither is refused, before
        anything runs, when an input requires grad. A captured tensor that requires grad
        (a learnable bias, ALiBi slopes, a per-head gate) gets its gradient from the
        backward (``mods.with_captured_grads``), or the call is refused before anything
        runs (``VariantError``) where it cannot be derived; a mask_mod's captured tensors
        get none (a mask is piecewise constant), as in torch.
    mask_mod: ``mask_mod(b, h, q_idx, kv_idx)`` returns a bool tile (True: attend),
        evaluated on every tile the kernels visit.
    block_mask: ``tiledattention.block_mask(mask_mod, B, H, Sq, Skv)``: the same mask,
        classified per tile once, so empty tiles are never loaded and full tiles skip the
        mask (the fast way to run a sparse mask_mod).

    Fully masked rows (every key masked out, by a mask, a mask_mod, a block mask or a
    score_mod returning -inf, FlexAttention's idiom) are defined as zeros, with
    log-sum-exp -inf, and get zero gradients; PyTorch's math backend returns NaN there. A
    score_mod returning +inf makes that row NaN, as torch's softmax does.

    A repeat call with the same shapes, strides, dtypes, devices, flags, mask layout,
    variant and schedule (and the same schedule table) reuses the launch plans of the
    first: one dict lookup and one launch per kernel (``kernel.plan``).

    Any strides are accepted: a tensor is copied only when its last (head-dim) axis is
    not unit-stride. The output is a new contiguous tensor allocated by PyTorch, and the
    kernels run on PyTorch's current CUDA stream, also under ``torch.compile`` (fullgraph)
    and CUDA-graph capture. A call with a variant costs one graph break under
    ``torch.compile`` (lifting reads the functions' source, which Dynamo cannot trace);
    the op itself is compiled as usual.

    Differentiable in q, k and v, and in the LSE output when returned. ``attn_mask`` gets
    no gradient: a mask that requires grad is refused (``BackwardNotSupportedError``).
    The backward's schedule comes from the table's backward entries unless
    ``pinned_bwd_schedule`` pins one; every shipped choice is deterministic (no atomics).

    FP8 (forward only, as FlashAttention-3's): float8_e4m3fn ``q``, ``k``, ``v`` with one
    head dim in 32, 64, ..., 256; both products on e4m3 with fp32 accumulation, P rounded
    to e4m3 for P V. ``q_descale``, ``k_descale``, ``v_descale``: fp32 factors that
    dequantize the inputs (the scores are ``scale * (q * q_descale) . (k * k_descale)``,
    the values ``v * v_descale``), each of shape [] or [1] (per tensor) or [B, Hkv] (per
    batch and K/V head); all three are required (a call without one is refused: pass
    ``torch.ones(())`` for unit scales). ``out_dtype``: torch.bfloat16 (default) or
    torch.float16. Causal and GQA run; a mask, variant, dropout or gradient is refused
    (typed errors), and so is any of these arguments on a non-FP8 call. V is transposed
    once per call into a 16-byte-aligned copy (wgmma reads fp8 operands K-major only; a
    cuTile kernel where v has 16-byte strides, else torch's copy), unless ``v`` is already
    a transposed view (``vt.transpose(2, 3)`` of a [B, Hkv, D, Skv] tensor whose key axis
    is padded to a multiple of 16). Eager only.

    Returns ``out``, or ``(out, lse)`` when ``return_lse``.
    """
    if causal is not None:
        if is_causal and not causal:
            raise InputError("is_causal=True and causal=False disagree; pass one of them")
        is_causal = causal
    if dropout_p != 0.0:
        raise InputError(f"dropout_p={dropout_p!r}: tiledattention has no dropout (pass 0.0, "
                         "or use torch's scaled_dot_product_attention for dropout)")
    needs_grad = _grad_enabled() and (getattr(q, "requires_grad", False) or getattr(
        k, "requires_grad", False) or getattr(v, "requires_grad", False))
    has_variant = score_mod is not None or mask_mod is not None or block_mask is not None
    if (q_descale is not None or k_descale is not None or v_descale is not None
            or out_dtype is not None or (isinstance(q, _Tensor) and q.dtype in FP8_DTYPES)):
        return _sdpa_fp8(q, k, v, attn_mask, is_causal, scale, enable_gqa, return_lse,
                         schedule, has_variant, needs_grad, (q_descale, k_descale, v_descale),
                         out_dtype)
    if block_mask is not None and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
        _check_block(block_mask, q, k)
    if _plain_eager(q):
        variant = _variant(score_mod, mask_mod, block_mask, needs_grad) if has_variant else None
        mods = _mods.NONE if variant is None else variant[0]
        aux = mods.tensors() if mods.key else ()
        bwd_mods, needs = _backward_mods(mods, aux, needs_grad) if aux else (mods, ())
        needs_grad = needs_grad or any(needs)
        if needs_grad:
            check_head_dim_backward(q, v)
        plan = plan_for(q, k, v, attn_mask, is_causal, scale, enable_gqa,
                        bool(return_lse) or needs_grad, schedule, variant)
        if not needs_grad:
            out, lse = launch(plan, q, k, v, attn_mask, fresh_lse=False, aux=aux)
        else:
            out, lse = _Attention.apply(q, k, v, (plan, attn_mask, None if variant is None
                                                  else variant[1], bwd_mods, needs), *aux)
        return (out, lse) if return_lse else out
    problem = check_inputs(q, k, v, causal=is_causal, scale=scale, attn_mask=attn_mask,
                           enable_gqa=enable_gqa, device=not _is_compiling())
    s = resolve_schedule(schedule, problem)
    key, aux = "", []
    if has_variant:
        key, aux, needs_grad = _traced_variant(score_mod, mask_mod, block_mask, needs_grad)
    if needs_grad:
        check_head_dim_backward(q, v)
    # With a gradient to compute, the forward always keeps the LSE: the backward needs it.
    op = _attention_fwd if needs_grad else _attention
    out, lse = op(q, k, v, attn_mask, aux, problem.causal, problem.scale,
                  bool(return_lse) or needs_grad, "" if s is None else s.label(), key)
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
