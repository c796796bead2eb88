"""Where the tiny Llama's time goes: torch.profiler over one phase of the model stage's
tiny Llama (``stages/model.py``) per attention implementation, ours vs transformers' sdpa.

For a gap in ``model_e2e.py``'s tokens/s (host-cost.md §57b: the compiled prefill at
0.811x) this prints, per implementation, the call's time as the model stage measures it
(CUDA events around the call), the GPU kernels' time per call with the top kernels, and the
top rows by self CPU time, so the gap can be put on the attention kernel, the mask it is
given, or the host.

    python benchmarks/model_profile.py [--phase prefill_compiled] [--batch 1]
                                       [--prompt 512] [--calls 20] [--rows 14]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from tiledattention.stages.model import ModelConfig, _Runners

PHASES = ("prefill", "prefill_compiled", "train", "train_compiled")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", default="prefill_compiled", choices=PHASES)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rows", type=int, default=14)
    args = ap.parse_args()
    impls = ("tiledattention", "sdpa")
    run = _Runners(ModelConfig(enabled=True, batches=[args.batch], prompt=args.prompt), impls)
    run.new_batch()
    ids = torch.randint(0, 1024, (args.batch, args.prompt), device="cuda")
    for impl in impls:
        for _ in range(3):  # compiles, allocator, plans
            run(args.phase, impl, ids, warmup=True)
        secs = [run(args.phase, impl, ids, warmup=False) for _ in range(args.calls)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                run(args.phase, impl, ids, warmup=False)
            torch.cuda.synchronize()
        avg = prof.key_averages()
        kernels = [e for e in avg if e.device_type.name == "CUDA"]
        gpu = sum(e.self_device_time_total for e in kernels) / args.calls
        print(f"\n=== {args.phase} B{args.batch} S{args.prompt} | {impl}: "
              f"{statistics.median(secs) * 1e6:.0f} us per call (events), "
              f"GPU kernels {gpu:.0f} us per call, {sum(e.count for e in kernels) / args.calls:.0f}"
              " kernels ===")
        for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:args.rows]:
            print(f"  {e.self_device_time_total / args.calls:8.1f} us  "
                  f"{e.count / args.calls:5.1f}x  {e.key[:100]}")
        print(avg.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                        max_name_column_width=70))


if __name__ == "__main__":
    main()
