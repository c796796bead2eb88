"""Repro 3: host time of one kernel launch: ct.launch vs Triton vs a torch op (GPU needed).

Each row enqueues the same launch `calls` times while a spin kernel (torch.cuda._sleep)
keeps the GPU busy, so no launch waits on the device: the time is the host's alone
(argument handling, dispatch, the driver's launch). Median (min) over 5 rounds, µs per
launch. ct.launch gets the stream as a raw handle looked up once (no per-call stream
lookup); Triton looks its stream up itself on every launch; torch's op is a real
1-element fill launched from C++. "10 arrays + 18 scalars" is the argument list of our
dK/dV launch (torch tensors; 4 runtime scalars and 14 compile-time constants, as it
passes them); the kernel bodies are empty.

    python launch_floor.py [--calls 200]
"""

import argparse
import statistics
import sys
import time

try:  # Triton reads the (string) annotations of its kernels in their module's globals
    import triton.language as _tl

    C = _tl.constexpr
except ImportError:
    C = None


def host_us(fn, calls: int, rounds: int = 5):
    """(median, min) µs per call, and whether the spin outlasted every round's calls."""
    import torch

    fn()
    torch.cuda.synchronize()
    out, busy = [], True
    for _ in range(rounds):
        torch.cuda._sleep(2_000_000 * calls // 10)  # ~0.1 ms a call at H100 clocks
        spin_done = torch.cuda.Event()
        spin_done.record()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
        busy = busy and not spin_done.query()
        torch.cuda.synchronize()
    return statistics.median(out), min(out), busy


def rows():
    import cuda.tile as ct
    import torch

    Int, Bool = ct.Constant[int], ct.Constant[bool]

    stream = torch.cuda.current_stream().cuda_stream  # raw handle, looked up once
    arrays = [torch.empty(4096, device="cuda", dtype=torch.bfloat16) for _ in range(10)]
    # our dK/dV launch's list: 3 float + 1 int runtime scalars, 6 int + 8 bool constants
    scalars = [0.18, 8.0, 0.125, 1, 64, 64, 1, 128, 128, 128] + [True, True] + [False] * 6
    one = torch.zeros(1, device="cuda")

    @ct.kernel
    def ct_empty():
        pass

    @ct.kernel
    def ct_args(A0, A1, A2, A3, A4, A5, A6, A7, A8, A9, s0: float, s1: float, s2: float,
                g: int, c0: Int, c1: Int, c2: Int, c3: Int, c4: Int, c5: Int, b0: Bool,
                b1: Bool, b2: Bool, b3: Bool, b4: Bool, b5: Bool, b6: Bool, b7: Bool):
        pass

    out = {"torch op: 1-element zero_() (C++ dispatch + launch)": one.zero_,
           "ct.launch, no arguments": lambda: ct.launch(stream, (1,), ct_empty, ()),
           "ct.launch, 10 arrays + 18 scalars (14 constants)":
               lambda: ct.launch(stream, (1,), ct_args, (*arrays, *scalars))}
    try:
        import triton
    except ImportError:
        print("triton not installed: its rows are left out")
        return out

    @triton.jit
    def tr_empty():
        pass

    @triton.jit
    def tr_args(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, s0, s1, s2, g, c0: C, c1: C, c2: C,
                c3: C, c4: C, c5: C, b0: C, b1: C, b2: C, b3: C, b4: C, b5: C, b6: C, b7: C):
        pass

    out["triton, no arguments"] = lambda: tr_empty[(1,)]()
    out["triton, 10 arrays + 18 scalars (14 constexpr)"] = (
        lambda: tr_args[(1,)](*arrays, *scalars))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("skip: no CUDA device (this reproducer times launches on a GPU)")
        sys.exit(0)
    import cuda.tile as ct

    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "absent"
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | cuda-tile "
          f"{ct.__version__} | triton {tv} | host µs per launch, GPU kept busy, "
          f"{args.calls} calls x 5 rounds: median (min)")
    for label, fn in rows().items():
        med, low, busy = host_us(fn, args.calls)
        note = "" if busy else "  (spin ended early: the GPU went idle, raise it)"
        print(f"{label:52s} {med:7.2f} ({low:.2f}){note}", flush=True)


if __name__ == "__main__":
    main()
