"""The packed backward's delta launch at occupancy 4 against no hint
(``workload.PACKED_DELTA_OCCUPANCY``): forward+backward of ``ta.sdpa_varlen`` on lognormal
documents (median 512, D 128, 16k and 64k tokens, causal and not), interleaved rounds in
one process, kernel time with L2 flushed; the gradients of both compared bit for bit
(benchmarks/notes/varlen-paged.md §42j). GPU.

    python benchmarks/packed_delta_ab.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from varlen import BF16, doc_lengths  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.kernel import workload as W  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402

flush = L2Flusher()
for tokens in (16384, 65536):
    for causal in (False, True):
        d = 128
        h = 2048 // d
        lens = doc_lengths(tokens, seed=tokens + d)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                          device="cuda")
        mx = max(lens)
        q, k, v = (torch.randn(tokens, h, d, device="cuda", dtype=BF16).requires_grad_()
                   for _ in range(3))
        dout = torch.randn(tokens, h, d, device="cuda", dtype=BF16)

        def step(q=q, k=k, v=v, cu=cu, mx=mx, causal=causal, dout=dout):
            o = ta.sdpa_varlen(q, k, v, cu, cu, mx, mx, causal=causal)
            return torch.autograd.grad(o, (q, k, v), dout)
        ms = {0: [], 4: []}
        grads = {}
        for _ in range(2):  # rounds, interleaved
            for occ in (0, 4):
                W.PACKED_DELTA_OCCUPANCY = occ
                grads[occ] = step()
                ms[occ].append(summarize(time_cuda(step, flush=flush)).median_ms)
        same = all(torch.equal(a, b) for a, b in zip(grads[0], grads[4]))
        a, b = min(ms[0]), min(ms[4])
        print(f"tokens {tokens} causal {causal}: no hint {a:.3f} ms, occupancy 4 {b:.3f} ms, "
              f"gain {(a / b - 1) * 100:.1f} %, grads equal {same}  (rounds {ms})", flush=True)
