"""Host cost of each step of a forward+backward call, with the GPU kept busy.

Times (``timing.time_host``: enqueue time while a spin keeps the GPU busy, µs per call)
the pieces of the eager training call on issue 26's two shapes: the forward plan lookup,
the forward launch, the backward plan lookup, each backward launch with its arguments
precomputed, the allocations, ``run_backward`` whole, and the whole autograd call; next
to torch's SDPA forward+backward. What is left between the sum of the pieces and the
whole call is autograd's own cost.

``ct.launch``'s own cost (issue 37 item 4), on the dK/dV launch: with torch tensors (each
read through its ``__cuda_array_interface__`` property), with the arrays' interfaces
precomputed once (objects holding the dict: what a launch costs when nothing about the
arrays is looked up), with those objects built per call from the tensors, the property
alone for the launch's arrays, and an argument-free kernel (the floor: cuTile's dispatch
and the driver's launch).

    python benchmarks/launch_cost.py
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention import mods as _mods
from tiledattention.kernel import launch as L
from tiledattention.kernel.plan import bwd_plan_for, plan_for
from tiledattention.timing import time_host

SHAPES = {  # name: (B, Hq, Hkv, Sq, Skv, D, causal), bf16
    "prefill B1 H16 S512 D128 causal": (1, 16, 16, 512, 512, 128, True),
    "decode B1 H32/8 Sq1 Skv1024 D128": (1, 32, 8, 1, 1024, 128, False),
}


class Cai:
    """An array as ``ct.launch`` reads it: only a ``__cuda_array_interface__`` dict."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, cai: dict):
        self.__cuda_array_interface__ = cai


_TYPESTR = {torch.bfloat16: "<f2", torch.float16: "<f2", torch.float32: "<f4",  # as torch
            torch.int32: "<i4", torch.int64: "<i8", torch.bool: "|b1"}


def cai_of(t: torch.Tensor) -> Cai:
    """The interface built directly (torch's property checks and converts more)."""
    strides = None if t.is_contiguous() else tuple(x * t.element_size() for x in t.stride())
    return Cai(dict(typestr=_TYPESTR[t.dtype], shape=tuple(t.shape), strides=strides,
                    data=(t.data_ptr(), False), version=2))


def launch_rows(dev, kernel, grid, arrays, tail) -> dict:
    """``ct.launch``'s own cost on one launch, argument handling varied (module doc)."""
    import cuda.tile as ct

    @ct.kernel
    def empty():
        pass

    pre = tuple(Cai(a.__cuda_array_interface__) for a in arrays)
    return {
        f"ct.launch dkdv, torch tensors ({len(arrays)} arrays)":
            lambda: L.launch_kernel(dev, grid, kernel, (*arrays, *tail)),
        "ct.launch dkdv, interfaces precomputed":
            lambda: L.launch_kernel(dev, grid, kernel, (*pre, *tail)),
        "ct.launch dkdv, interfaces built per call":
            lambda: L.launch_kernel(dev, grid, kernel, (*map(cai_of, arrays), *tail)),
        "__cuda_array_interface__ of its arrays alone":
            lambda: [a.__cuda_array_interface__ for a in arrays],
        "ct.launch of an argument-free kernel": lambda: L.launch_kernel(dev, (1,), empty, ()),
    }


def us(fn, calls=300) -> float:
    samples, busy = time_host(fn, calls=calls, rounds=5)
    return statistics.median(samples) if busy else float("nan")


def run_shape(name, shape) -> None:
    b, hq, hk, sq, sk, d, causal = shape
    dt, dev = torch.bfloat16, "cuda"
    q = torch.randn(b, hq, sq, d, device=dev, dtype=dt)
    k = torch.randn(b, hk, sk, d, device=dev, dtype=dt)
    v = torch.randn(b, hk, sk, d, device=dev, dtype=dt)
    dout = torch.randn_like(q)
    gqa = hq != hk
    scale = d ** -0.5
    plan = plan_for(q, k, v, None, causal, None, gqa, True, None)
    out, lse = L.launch(plan, q, k, v, None)
    bplan = bwd_plan_for(q, k, None, causal, scale, False, None)
    delta = torch.empty((b, hq, sq), dtype=torch.float32, device=dev)
    mask = lse.view(1, 1, 1, -1)[..., :1]
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    args = {"delta": (out, dout, delta, delta, delta.view(b, hq, sq, 1)),
            "dkdv": (q, k, v, dout, lse, delta, mask, dk, dv, delta.view(b, hq, sq, 1)),
            "dq": (q, k, v, dout, lse, delta, mask, out, delta, dq)}
    rows = {
        "fwd plan_for (lookup)": lambda: plan_for(q, k, v, None, causal, None, gqa, True,
                                                  None),
        "fwd launch (with allocs)": lambda: L.launch(plan, q, k, v, None),
        "bwd_plan_for (lookup)": lambda: bwd_plan_for(q, k, None, causal, scale, False,
                                                      None),
        "6 allocations": lambda: [torch.empty_like(q) for _ in range(6)],
    }
    for kname, kernel, grid, tail in bplan.launches:
        full = (*args[kname], *tail)
        rows[f"launch {kname} ({len(args[kname])} arrays, {len(tail)} scalars)"] = (
            lambda kernel=kernel, grid=grid, full=full:
            L.launch_kernel(q.device, grid, kernel, full))
    _, kernel, grid, tail = next(x for x in bplan.launches if x[0] == "dkdv")
    rows.update(launch_rows(q.device, kernel, grid, args["dkdv"], tail))
    # "whole" as before the plan moved out of run_backward: its lookup included
    rows["run_backward whole"] = lambda: L.run_backward(
        bwd_plan_for(q, k, None, causal, scale, False, None, _mods.NONE, None), q, k, v, out,
        lse, dout, None, None)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def ours():
        ta.sdpa(qg, kg, vg, is_causal=causal, enable_gqa=gqa).backward(dout)
        qg.grad = kg.grad = vg.grad = None

    def theirs():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                       enable_gqa=gqa).backward(dout)
        qg.grad = kg.grad = vg.grad = None

    def ours_nograd():
        with torch.no_grad():
            ta.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    rows["sdpa no-grad whole"] = ours_nograd
    rows["sdpa fwd+bwd whole (autograd)"] = ours
    rows["torch SDPA fwd+bwd whole"] = theirs
    print(f"\n{name}: host us per call, GPU kept busy")
    for label, fn in rows.items():
        print(f"  {label:44s} {us(fn, 100 if 'whole' in label else 300):8.1f}", flush=True)


def main() -> None:
    for name, shape in SHAPES.items():
        run_shape(name, shape)


if __name__ == "__main__":
    main()
