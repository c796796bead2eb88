"""The project's one timing room: kernel time (CUDA events, host hidden), call latency
(back-to-back calls, host included) and host cost (enqueue time while the GPU is busy)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

SPIN_CYCLES = 2_000_000  # ~1 ms at H100 clocks: longer than any host-side launch path


@dataclass(frozen=True)
class TimingStats:
    median_ms: float
    p95_ms: float
    min_ms: float
    mean_ms: float
    std_ms: float
    reps: int

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(samples_ms: list[float]) -> TimingStats:
    s = sorted(samples_ms)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    return TimingStats(statistics.median(s), p95, s[0], statistics.fmean(s),
                       statistics.pstdev(s), len(s))


class L2Flusher:
    """Writes a buffer larger than L2 so each timed call starts with a cold cache."""

    def __init__(self, device=None):
        props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
        size = max(2 * getattr(props, "L2_cache_size", 50 << 20), 64 << 20)
        self._buf = torch.empty(size // 4, dtype=torch.int32, device=device or "cuda")

    def __call__(self) -> None:
        self._buf.zero_()


def time_cuda(fn: Callable[[], object], *, warmup: int = 10, reps: int = 40,
              flush: L2Flusher | None = None) -> list[float]:
    """Milliseconds of ``fn`` per call, one CUDA-event pair per repetition.

    Warmup calls (which also trigger compilation) are not timed; the L2 flush, when
    given, runs before each repetition outside the timed region. A short GPU spin
    before each start event keeps the GPU busy while the host enqueues ``fn``, so the
    events time the device work, not Python launch overhead (measured separately).
    """
    for _ in range(warmup):
        fn()
    stream = torch.cuda.current_stream()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(reps)]
    for start, end in pairs:
        if flush is not None:
            flush()
        torch.cuda._sleep(SPIN_CYCLES)
        start.record(stream)
        fn()
        end.record(stream)
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def time_cpu(fn: Callable[[], object], *, warmup: int = 2, reps: int = 10) -> list[float]:
    """Milliseconds per call on the host clock, for CPU runs of the harness."""
    import time

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def time_calls(fn: Callable[[], object], *, calls: int, rounds: int = 5, warmup: int = 3,
               sync: Callable[[], object] | None = None) -> list[float]:
    """Microseconds per call of ``calls`` back-to-back calls, one sample per round.

    What a caller waits per call in steady state: no L2 flush, no spin, one
    synchronisation at the end of a round, so whichever of host work and device work is
    slower sets the pace.
    """
    import time

    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - start) / calls * 1e6)
    return out


def time_host(fn: Callable[[], object], *, calls: int, rounds: int = 5,
              busy_us_per_call: float = 200.0) -> tuple[list[float], bool]:
    """(microseconds of host time per call, GPU stayed busy) with the GPU kept busy.

    A spin long enough to outlast ``calls`` enqueues runs first, so no call waits on the
    device: the time is the host's alone (Python, dispatch, argument packing, launch).
    The flag is False if the spin ended before the last enqueue (then raise the budget).
    """
    import time

    fn()
    out, busy = [], True
    cycles = int(SPIN_CYCLES * calls * busy_us_per_call / 1000.0)
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        spin_done = torch.cuda.Event()
        spin_done.record()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        busy = busy and not spin_done.query()
        out.append(elapsed / calls * 1e6)
    torch.cuda.synchronize()
    return out, busy


def as_cuda_graph(fn: Callable[[], object]) -> Callable[[], None]:
    """Capture ``fn`` (already warmed up) into a CUDA graph; the result replays it."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # a warm call on the side stream, as torch's graph docs require
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
