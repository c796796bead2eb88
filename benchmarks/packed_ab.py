"""An A/B of one packed-backward switch of ``tiledattention.kernel.workload`` (each read
when a backward plan is built, and in the plan's key): forward+backward of
``ta.sdpa_varlen`` on lognormal documents (median 512, 16k and 64k tokens, causal and
not), interleaved rounds in one process, kernel time with L2 flushed; the gradients of
the two settings compared bit for bit. With ``--schedules`` the backward is pinned to each
schedule in turn (``pinned_bwd_schedule``) against the packed policy's own, the gradients
compared by their largest relative difference. GPU.

    python benchmarks/packed_ab.py --switch PACKED_BWD_TAIL_TILE --values False True
    python benchmarks/packed_ab.py --switch PACKED_DELTA_OCCUPANCY --values 0 4
    python benchmarks/packed_ab.py --switch PACKED_DQ_DELTA --values False True
    python benchmarks/packed_ab.py --schedules kv64x128_q128x64_o1_w8_keyrows   # vs the policy's

§42j (benchmarks/notes/varlen-paged.md) ran the second line, §43a the first, §43b is to
run the third (its gradients may differ in the last bits: delta summed in dQ's layout).
"""
import argparse
import ast
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from varlen import BF16, doc_lengths  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.kernel import workload as W  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402


def packed_step(tokens, d, causal):
    """One forward+backward of a packed batch of ``tokens`` (H = 2048 // d), as a closure."""
    h = 2048 // d
    lens = doc_lengths(tokens, seed=tokens + d)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    mx = max(lens)
    q, k, v = (torch.randn(tokens, h, d, device="cuda", dtype=BF16).requires_grad_()
               for _ in range(3))
    dout = torch.randn(tokens, h, d, device="cuda", dtype=BF16)

    def step():
        o = ta.sdpa_varlen(q, k, v, cu, cu, mx, mx, causal=causal)
        return torch.autograd.grad(o, (q, k, v), dout)
    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switch", help="a workload module constant")
    p.add_argument("--values", nargs=2, help="A and B (Python literals)")
    p.add_argument("--schedules", nargs="+", help="backward schedule labels, each against "
                                                  "the policy's")
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--head-dims", type=int, nargs="+", default=[128])
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    if a.schedules:
        return schedule_ab(a)
    if not a.switch or not a.values:
        p.error("--switch and --values, or --schedules")
    if not hasattr(W, a.switch):
        p.error(f"workload has no {a.switch}")
    values = [ast.literal_eval(v) for v in a.values]
    flush = L2Flusher()
    for tokens in a.tokens:
        for d in a.head_dims:
            for causal in (False, True):
                step = packed_step(tokens, d, causal)
                ms = {i: [] for i in range(2)}
                grads = {}
                for _ in range(a.rounds):  # interleaved
                    for i, value in enumerate(values):
                        setattr(W, a.switch, value)
                        grads[i] = step()
                        ms[i].append(summarize(time_cuda(step, flush=flush)).median_ms)
                same = all(torch.equal(x, y) for x, y in zip(grads[0], grads[1]))
                x, y = min(ms[0]), min(ms[1])
                print(f"tokens {tokens} D {d} causal {causal}: {a.switch}={values[0]!r} "
                      f"{x:.3f} ms, ={values[1]!r} {y:.3f} ms, gain {(x / y - 1) * 100:.1f} %, "
                      f"grads equal {same}  (rounds {ms})", flush=True)
    return 0


def schedule_ab(a) -> int:
    """Each --schedules label against the packed policy's schedule, interleaved."""
    from tiledattention.schedules.backward import BwdSchedule

    flush = L2Flusher()
    for tokens in a.tokens:
        for d in a.head_dims:
            for causal in (False, True):
                pins = [None, *(BwdSchedule.from_label(x) for x in a.schedules)]
                ms, grads = pinned_rounds(packed_step(tokens, d, causal), pins, a.rounds, flush)
                for pin, t, g in zip(pins, ms, grads):
                    print(f"tokens {tokens} D {d} causal {causal}: "
                          f"{pin.label() if pin else 'policy':34s} {t:.3f} ms  "
                          f"x{ms[0] / t:.3f} of the policy's  max rel |dgrad - "
                          f"policy's| {rel_diff(g, grads[0]):.1e}", flush=True)
    return 0


def pinned_rounds(step, pins, rounds, flush):
    """(best ms, gradients) of ``step`` under each backward schedule of ``pins`` (None: the
    policy's), pinned in turn (``pinned_bwd_schedule``), in interleaved rounds."""
    ms = [[] for _ in pins]
    grads = [None] * len(pins)
    for _ in range(rounds):
        for i, pin in enumerate(pins):
            with ta.pinned_bwd_schedule(pin):
                grads[i] = step()
                ms[i].append(summarize(time_cuda(step, flush=flush)).median_ms)
    return [min(m) for m in ms], grads


def rel_diff(a, b) -> float:
    """The largest relative difference between two tuples of gradients."""
    return max(float((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-30))
               for x, y in zip(a, b))


if __name__ == "__main__":
    sys.exit(main())
