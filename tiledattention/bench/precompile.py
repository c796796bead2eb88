"""Compile a study's kernels ahead of its GPU steps, in parallel processes.

``tiledattn precompile --config BENCH.yaml... --workers N``: every point of the benchmark
configs (a study's ``plan/*.yaml``) is run once with each of its TiledAttention methods
(the tuned table's, a pinned schedule's), in the point's own pass (forward, or forward and
backward), by N worker processes spread over the visible GPUs. Each first call compiles
its kernels into cuTile's disk cache (``$CUDA_TILE_CACHE_DIR``), so the study's own
processes (one per shard, run one after another on one GPU) find the compiler's output
there instead of each compiling every variant again, one at a time. Compiling is CPU-bound
and the calls are small: the GPUs idle meanwhile. Nothing is measured or written besides
the cache; a point that fails here fails again, and is recorded, in the study.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from .methods import SUBJECT


def _items(paths: list[str]) -> list[tuple[dict, tuple[str, ...], int]]:
    """(point as a dict, its TiledAttention methods, seed) of every config, each point once."""
    from .config import load_config
    from .grid import expand

    seen: dict[tuple, tuple[dict, set, int]] = {}
    for path in paths:
        cfg = load_config(path)
        methods = [m for m in cfg.methods if m == SUBJECT or m.startswith(SUBJECT + "@")]
        for p in expand(cfg):
            key = tuple(sorted(p.as_dict().items()))
            entry = seen.setdefault(key, (p.as_dict(), set(), cfg.seed))
            entry[1].update(methods)
    return [(d, tuple(sorted(m)), seed) for d, m, seed in seen.values() if m]


def _input_bytes(point) -> int:
    item = 4 if point.dtype == "float32" else 2
    n = point.batch * point.head_dim * (2 * point.heads * point.seq_q
                                        + 2 * point.heads_kv * point.seq_kv)
    return n * item * (3 if point.pass_ != "fwd" else 1)  # gradients and dO alongside


def _warm(args) -> list[str]:
    """One worker: its share of the points on GPU ``gpu``; the failures, one line each."""
    chunk, gpu, cap = args
    import torch

    from .grid import Point
    from .methods import get_method
    from .runner import make_dout, make_inputs, pass_callable

    torch.cuda.set_device(gpu)
    device = torch.device("cuda", gpu)
    bad = []
    for data, methods, seed in chunk:
        point = Point.from_dict(data)
        if _input_bytes(point) > cap:
            continue  # left to the study's own first call
        try:
            q, k, v = make_inputs(point, seed, device)
            dout = None
            if point.pass_ != "fwd":
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                dout = make_dout(point, seed, device)
            for m in methods:
                method = get_method(m)
                method.check(point, device)
                run = functools.partial(method.run, q, k, v, point)
                if dout is None:
                    with torch.no_grad():
                        run()
                else:
                    pass_callable(run, q, k, v, dout, "fwd+bwd")()
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001 - the study records it again, as a row
            bad.append(f"{point.key()}: {type(exc).__name__}: {str(exc)[:160]}")
        finally:
            q = k = v = dout = None
            torch.cuda.empty_cache()
    return bad


def precompile(paths: list[str], workers: int, log=sys.stderr) -> int:
    """Warm the cache for every point of ``paths``; the number of points that failed."""
    import multiprocessing as mp

    import torch

    from ..errors import NoGPUError

    if not torch.cuda.is_available():
        raise NoGPUError("no CUDA GPU visible: the kernels compile on their first call on "
                         "a GPU, so there is nothing to compile ahead here")
    items = _items(paths)
    gpus = torch.cuda.device_count()
    workers = max(1, min(workers, len(items)))
    # Each worker holds at most its share of a GPU's free memory for one point's tensors.
    per_gpu = -(-workers // gpus)
    cap = min(torch.cuda.mem_get_info(g)[0] for g in range(gpus)) // (2 * per_gpu)
    # Round-robin over points sorted by variant facts: neighbours differ in S only and
    # mostly share kernels, so each worker gets a spread of variants.
    items.sort(key=lambda it: (it[0]["pass"], it[0]["dtype"], it[0]["causal"],
                               it[0]["head_dim"], it[0]["gqa"], it[0]["seq_q"], it[0]["seq_kv"]))
    chunks = [(items[i::workers], i % gpus, cap) for i in range(workers)]
    start = time.monotonic()
    print(f"precompile: {len(items)} points, {workers} workers on {gpus} GPU(s)", file=log,
          flush=True)
    with mp.get_context("spawn").Pool(workers) as pool:
        bad = [line for part in pool.map(_warm, chunks) for line in part]
    print(f"precompile: done in {time.monotonic() - start:.0f}s, {len(bad)} point(s) failed"
          + "".join(f"\n  {b}" for b in bad[:10]), file=log, flush=True)
    return len(bad)


def default_workers() -> int:
    return max(1, min(16, (os.cpu_count() or 2) - 1))
