"""What a decode step with a growing KV cache pays to find its plan (CPU; no GPU needed).

The GPU facts are stubbed as an H100 (capability 9.0, 132 SMs) and the tensors live on the
meta device: ``plan_for`` reads shapes, strides and dtypes only. Shape as benchmarks/notes/decode.md
§34c: B1, Hq 32 / Hkv 8, Sq 1, D 128, bf16, a dense cache growing over Skv 1025..1424 (400 steps),
medians of the 400 calls, per round; the rounds interleave:

- miss: the cache cleared before each call (build + family bookkeeping);
- build_plan: the build alone;
- grow: one call per step, the cache kept (family hits; a member build per new key tile
  class): median, mean and the builds it made;
- grow, no family: the same with ``family_key`` returning None (the behaviour before);
- build_plan, mask / grow, mask: the same with a bool key-padding mask [1, 1, 1, Skv]
  (the family hit rewrites ``mask_target``);
- hit: one key called again (the other layers of a step).

    python benchmarks/plan_growth.py [--rounds 3] [--steps 400]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

import torch

from tiledattention.kernel import plan as planning
from tiledattention.kernel import validate
from tiledattention.schedules import policy

B, HQ, HKV, SQ, D, SKV0 = 1, 32, 8, 1, 128, 1025


def stub_gpu() -> None:
    validate.check_device = lambda q: None
    torch.cuda.current_device = lambda: 0
    planning.check_gpu = lambda index: None
    planning.sm_count = lambda index: 132
    policy._capability = lambda index: "9.0"


def calls(steps: int, mask: bool) -> list[tuple]:
    q = torch.empty(B, HQ, SQ, D, dtype=torch.bfloat16, device="meta")
    out = []
    for skv in range(SKV0, SKV0 + steps):
        k = torch.empty(B, HKV, skv, D, dtype=torch.bfloat16, device="meta")
        v = torch.empty(B, HKV, skv, D, dtype=torch.bfloat16, device="meta")
        m = torch.empty(B, 1, 1, skv, dtype=torch.bool, device="meta") if mask else None
        out.append((q, k, v, m, False, None, True, False, None, None))
    return out


def timed(fn, args_list, before=None) -> list[float]:
    """Microseconds of ``fn(*args)`` for each args, ``before()`` untimed before each."""
    out = []
    for args in args_list:
        if before is not None:
            before()
        t0 = time.perf_counter_ns()
        fn(*args)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def grow(args_list, counted) -> tuple[list[float], int]:
    planning.clear()
    n = len(counted)
    times = timed(planning.plan_for, args_list)
    return times, len(counted) - n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    stub_gpu()
    plain, masked = calls(a.steps, False), calls(a.steps, True)
    build = planning.build_plan
    counted = []

    def counting(*args):
        counted.append(1)
        return build(*args)

    planning.build_plan = counting
    family_key = planning.family_key
    for args in plain[:2] + masked[:2]:  # imports, kernel objects, the table's lookups
        planning.clear()
        planning.plan_for(*args)
    rows: dict[str, list] = {}
    gc.disable()
    for _ in range(a.rounds):
        r = rows.setdefault
        r("miss", []).append(statistics.median(
            timed(planning.plan_for, plain, before=planning.clear)))
        r("build_plan", []).append(statistics.median(timed(build, plain)))
        r("build_plan, mask", []).append(statistics.median(timed(build, masked)))
        for name, args_list in (("grow", plain), ("grow, mask", masked)):
            for family in (True, False):
                planning.family_key = family_key if family else (lambda *x: None)
                times, builds = grow(args_list, counted)
                r(name + ("" if family else ", no family"), []).append(
                    (statistics.median(times), statistics.fmean(times), builds))
        planning.family_key = family_key
        planning.plan_for(*plain[0])
        r("hit", []).append(statistics.median(timed(planning.plan_for, [plain[0]] * a.steps)))
    gc.enable()
    print(f"B{B} Hq{HQ}/Hkv{HKV} Sq{SQ} D{D} bf16, Skv {SKV0}..{SKV0 + a.steps - 1}, "
          f"{a.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    print("                          median us per round (grow rows: median / mean / builds)")
    for name, vals in rows.items():
        cells = [f"{v:7.2f}" if not isinstance(v, tuple)
                 else f"{v[0]:6.2f}/{v[1]:6.2f}/{v[2]:3d}" for v in vals]
        print(f"{name:24s}" + "  ".join(cells))


if __name__ == "__main__":
    main()
