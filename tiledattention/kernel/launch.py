"""Running a plan on CUDA tensors: the forward's and the backward's launches (plans: ``plan``)."""

from __future__ import annotations

import sys
from threading import get_ident

import torch

from ..mods import MAX_TENSORS as _MAX_TENSORS
from .mask import prepare_mask

# The current stream's raw handle without building a torch.cuda.Stream object (~9 us on
# the H100 host for torch.cuda.current_stream()); a CPU-only torch build has neither.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def _addressable(t: torch.Tensor) -> torch.Tensor:
    # The kernel addresses any strides as long as the head dim is unit-stride.
    return t if t.stride(-1) == 1 else t.contiguous()


def _to_a_graph_pool(device: torch.device) -> bool:
    """Whether this thread's allocations go to a CUDA graph's pool now: while a graph is
    captured, or while torch.compile's mode="reduce-overhead" warms one up (the call runs
    on its graph tree's stream with the allocator pointed at the graph's pool, no capture).
    Nothing made then may be kept: the tree requires every live tensor in its pool to be
    one it tracks ("tensor(s) in the cudagraph pool not tracked as outputs"), and hands
    the rest of that memory to its next graph. Asked only where a tensor would be kept."""
    if torch.cuda.is_current_stream_capturing():
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None or device.type != "cuda":
        return False
    try:
        index = device.index if device.index is not None else _current_device()
        manager = trees.get_manager(index, create_if_none_exists=False)
        return manager is not None and _raw_stream(index) == manager.stream.cuda_stream
    except Exception:  # torch moved its graph trees' internals: keep nothing, not guess
        return True


def _keep(store: dict, key, made, device: torch.device):
    """``made``, kept in ``store`` under ``key`` unless it came from a graph's pool."""
    if not _to_a_graph_pool(device):
        store[key] = made
    return made


_scratch: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_int_pads: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _placeholders(device: torch.device, fresh: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(lse, mask) arguments the kernel never touches (RETURN_LSE, HAS_MASK off).

    Kept per device for eager calls; fresh for the custom op, whose outputs must be new
    tensors, and during CUDA-graph capture, whose allocations belong to the graph's pool.
    """
    if not fresh:
        found = _scratch.get(device)
        if found is not None:
            return found
    lse = torch.empty((1, 1, 1), dtype=torch.float32, device=device)
    pair = (lse, lse.view(1, 1, 1, 1))
    return pair if fresh else _keep(_scratch, device, pair, device)


# fp32 scratch a call's kernels write and read but never return (split-K's partials and
# their LSEs, the backward's delta), kept per (shapes, device, stream, thread) where this
# small: the calls whose host cost matters (a decode step, a short training step) stop
# paying those allocations. One thread's calls on one stream run in order, so a call's
# kernels write the scratch only after the previous call's have read it, as a freed and
# reused block of the caching allocator would be; another thread's launches could fall
# between two of a call's kernels, so threads do not share it. Fresh while allocations go
# to a CUDA graph's pool (``_to_a_graph_pool``).
SCRATCH_KEPT_BYTES = 4 << 20
SCRATCH_KEPT_TOTAL = 32 << 20  # all kept scratch at most: then it starts over
_scratch_kept: dict[tuple, tuple[torch.Tensor, ...]] = {}
_kept_bytes = [0]


def kept_scratch(shapes: tuple, device: torch.device) -> tuple[torch.Tensor, ...]:
    """One fp32 tensor of each of ``shapes`` on ``device``, the same ones each call of this
    thread on this stream where they total at most ``SCRATCH_KEPT_BYTES``."""
    capturing = torch.cuda.is_current_stream_capturing()
    key = (shapes, device, _raw_stream(device.index) if _raw_stream is not None else None,
           get_ident())
    found = None if capturing else _scratch_kept.get(key)
    if found is not None:
        return found
    made = tuple(torch.empty(s, dtype=torch.float32, device=device) for s in shapes)
    size = sum(t.numel() for t in made) * 4
    if not capturing and size <= SCRATCH_KEPT_BYTES and not _to_a_graph_pool(device):
        if _kept_bytes[0] + size > SCRATCH_KEPT_TOTAL:  # a growing cache's shapes come and go
            _scratch_kept.clear()
            _kept_bytes[0] = 0
        _scratch_kept[key] = made
        _kept_bytes[0] += size
    return made


def split_partials(shape: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """split-K's (partials ``shape`` [B, H x splits, rows, D], their LSEs [B, H x splits,
    rows]): written by the split kernel, read by the combine."""
    return kept_scratch((shape, shape[:3]), device)


def _int_pad(device: torch.device) -> torch.Tensor:
    """A one-element int32 array for block lists and captured tensors a kernel never reads
    (made once per device, outside any graph capture: it is only ever read as an address)."""
    return int_pad_views(device)[0]


def int_pad_views(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_int_pad`` as [1, 1, 1, 1], [1] and [1, 1]: the packed and paged calls' unused
    sequence arrays, viewed once per device rather than on every call."""
    views = _int_pads.get(device)
    if views is None:
        pad = torch.zeros((1, 1, 1, 1), dtype=torch.int32, device=device)
        views = _keep(_int_pads, device, (pad, pad.view(1), pad.view(1, 1)), device)
    return views


def variant_arrays(plan_blocks, aux, device) -> tuple:
    """(BlkCnt, BlkIdx, A0..A3): a block mask's lists and the tensors the variant functions
    capture, padded with placeholders the kernel never reads."""
    pad = _int_pad(device)
    blocks = plan_blocks or (pad, pad)
    return (*blocks, *aux, *([pad] * (_MAX_TENSORS - len(aux))))


def captured_buffers(aux: tuple, needs: tuple) -> tuple:
    """The fp32 zero accumulators of the captured tensors that ``needs`` a gradient (None
    for the others), in A0.. order: ``run_backward(captured=...)`` adds into them."""
    return tuple(torch.zeros(t.shape, dtype=torch.float32, device=t.device) if n else None
                 for t, n in zip(aux, needs))


def captured_grads(aux: tuple, captured: tuple) -> tuple:
    """What autograd gets for the captured tensors ``aux``: each one's gradient from its
    ``captured_buffers`` accumulator, in the tensor's dtype, or None."""
    return (*(None if g is None else g.to(t.dtype) for t, g in zip(aux, captured)),
            *([None] * (len(aux) - len(captured))))


def launch(plan, q, k, v, attn_mask, *, fresh_lse: bool = True, aux: tuple = ()):
    """Launch ``plan`` on PyTorch's current stream; returns (out, lse), both new unless
    ``fresh_lse`` is False and the plan returns no LSE (then lse is a shared placeholder).

    A split-K plan launches the attention kernel into fp32 partials, then the combine.
    ``aux``: the tensors the call's variant functions capture."""
    if plan.copy_qkv:
        q, k, v = _addressable(q), _addressable(k), _addressable(v)
    device = plan.device
    out = torch.empty(plan.out_shape, dtype=plan.dtype, device=device)
    if plan.variant.return_lse:
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device)
        mask = lse.view(1, 1, 1, -1)[..., :1]
    else:
        lse, mask = _placeholders(device, fresh_lse)
    if plan.mask_target is not None:
        mask = prepare_mask(attn_mask, plan.mask_target)
    # The variant kernels take the block lists and captured tensors; plain ones do not.
    extra = () if plan.variant.flags is None else variant_arrays(plan.blocks, aux, device)
    kout, klse = out, lse
    if plan.packed_shape is not None:
        # GQA packing: the heads of a group are consecutive rows of one K/V head.
        q = q.view(plan.packed_shape)
        kout = out.view(*plan.packed_shape[:3], out.shape[3])  # out: V's head dim
        if plan.variant.return_lse:
            klse = lse.view(plan.packed_shape[:3])
    _, kernel, grid, tail = plan.launches[0]
    if plan.part_shape is None:
        launch_kernel(device, grid, kernel, (q, k, v, kout, klse, mask, *extra, *tail),
                      plan.pdl)
    else:
        part, part_lse = split_partials(plan.part_shape, device)
        launch_kernel(device, grid, kernel, (q, k, v, part, part_lse, mask, *extra, *tail),
                      plan.pdl)
        _, kernel, grid, tail = plan.launches[1]
        launch_kernel(device, grid, kernel, (part, part_lse, kout, klse, *tail))
    return out, lse


_ones: dict[torch.device, torch.Tensor] = {}


def _one(device: torch.device) -> torch.Tensor:
    """A [1, 1] fp32 1.0: a descale left out (made once per device)."""
    one = _ones.get(device)
    if one is None:
        one = _keep(_ones, device, torch.ones((1, 1), dtype=torch.float32, device=device),
                    device)
    return one


def transposed_copy(v: torch.Tensor, cols: int, step=None) -> torch.Tensor:
    """V^T [B, H, D, Skv] in a new buffer whose rows hold ``cols`` keys (Skv rounded up to
    16: 16-byte strides for TMA), one pass over V (wgmma takes fp8 operands K-major only):
    by the plan's ``transpose`` launch ``step``, else by torch's copy."""
    b, h, s, d = v.shape
    buf = torch.empty((b, h, d, cols), dtype=v.dtype, device=v.device)
    vt = buf if cols == s else buf[..., :s]
    if step is None:
        vt.copy_(v.transpose(2, 3))
    else:
        launch_kernel(v.device, step.grid, step.kernel, (v, vt, *step.tail))
    return vt


def _dense_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` in canonical contiguous strides (``contiguous`` keeps odd strides of size-1
    axes, which would cost TMA)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def launch_fp8(plan, q, k, v, descales, *, fresh_lse: bool = True):
    """Launch an FP8 plan (``plan.Fp8Plan``): q, k copied only where the plan says, V^T a
    view or a copy, the descales as [1, 1] or [B, Hkv] arrays (a left-out one: 1.0)."""
    device = plan.device
    if plan.copy_q:
        q = _dense_copy(q)
    if plan.copy_k:
        k = _dense_copy(k)
    vt = v.transpose(2, 3) if plan.vt_view else transposed_copy(v, plan.vt_cols,
                                                                plan.vt_step)
    out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=device)
    if plan.variant.return_lse:
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device)
    else:
        lse = _placeholders(device, fresh_lse)[0]
    ds = tuple(_one(device) if d is None else d if d.dim() == 2 else d.view(1, 1)
               for d in descales)
    _, kernel, grid, tail = plan.launches[0]
    launch_kernel(device, grid, kernel, (q, k, vt, out, lse, *ds, *tail))
    return out, lse


def run_backward(plan, q, k, v, out, lse, dout, dlse, attn_mask, *, aux: tuple = (),
                 captured: tuple = ()):
    """(dq, dk, dv) of ``sdpa``'s forward by ``plan`` (``plan.bwd_plan_for``), given its
    output and natural-log LSE, by ``plan.launches`` in order (dQ computing delta, then
    dK/dV, mostly; ``BwdPlan``), on PyTorch's current stream. ``aux``: the tensors the
    variant functions capture; ``captured``: ``captured_buffers`` of those that need a
    gradient (their ``mods`` from ``mods.with_captured_grads``); the dK/dV kernel adds the
    gradients in. Head dims past 256 (no backward kernel) were refused by the plan's build."""
    q, k, v, out, dout = (_addressable(t) for t in (q, k, v, out, dout))
    b, hq, sq, _ = q.shape
    dev = q.device
    delta, = kept_scratch(((b, hq, sq),), dev)
    lse = lse.contiguous()
    dlse_arg = delta if dlse is None else dlse.to(torch.float32).contiguous()
    mask = lse.view(1, 1, 1, -1)[..., :1]  # never read without HAS_MASK
    if plan.mask_target is not None:
        mask = prepare_mask(attn_mask, plan.mask_target)
    atomic = plan.schedule.dq == "atomic"
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    # dQ by reduce-add: the delta kernel zeroes dQacc (ZERO_DQ) before dK/dV adds into it.
    dq_acc = torch.empty(q.shape, dtype=torch.float32, device=dev) if atomic else \
        delta.view(b, hq, sq, 1)  # never read without DQ_ATOMIC
    dkdv_extra = dq_extra = ()
    if plan.variant.flags is not None:
        pad = _int_pad(dev)
        grads = tuple(pad if g is None else g for g in captured)
        dkdv_extra = (*variant_arrays(plan.blocks[0], aux, dev), *grads,
                      *([pad] * (_MAX_TENSORS - len(grads))))
        dq_extra = variant_arrays(plan.blocks[1], aux, dev)
    tensors = {"delta": (out, dout, delta, dlse_arg, dq_acc),
               "dkdv": (q, k, v, dout, lse, delta, mask, *dkdv_extra, dk, dv, dq_acc),
               "dq": (q, k, v, dout, lse, delta, mask, *dq_extra, out, dlse_arg, dq)}
    for role, kernel, grid, tail in plan.launches:
        launch_kernel(dev, grid, kernel, (*tensors[role], *tail))
    if atomic:
        torch.mul(dq_acc, plan.scale, out=dq)  # the reduce-add summed dS K unscaled
    return dq, dk, dv


def launch_kernel(device, grid, kernel, args, pdl: bool = False) -> None:
    """The one launch of every kernel: PyTorch's current stream on ``device``."""
    import cuda.tile as ct

    index = device.index
    if _raw_stream is not None and _current_device() == index:
        ct.launch(_raw_stream(index), grid, kernel, args, programmatic_dependent_launch=pdl)
    else:
        with torch.cuda.device(device):
            ct.launch(torch.cuda.current_stream(device), grid, kernel, args,
                      programmatic_dependent_launch=pdl)
