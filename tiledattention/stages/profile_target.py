"""The process Nsight Compute profiles: one point, one method, ``warmup`` + 1 launches.

    ncu -k regex:attention_fwd --launch-skip 5 --launch-count 1 \\
        python -m tiledattention.stages.profile_target --method tiledattention \\
        --shape float16:full:128:4096
"""

from __future__ import annotations

import argparse
import json

import torch

from ..bench.grid import Point
from ..bench.methods import get_method
from ..bench.runner import make_inputs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", required=True, help="a bench method, e.g. tiledattention")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--point", help="JSON of a bench Point")
    where.add_argument("--shape", help="dtype:mask:D:S of the paper grid's tokens policy, "
                       "e.g. float16:causal:128:4096")
    ap.add_argument("--warmup", type=int, default=5, help="launches before the captured one")
    args = ap.parse_args(argv)
    if args.shape:
        from .profile import Shape

        point = Shape.parse(args.shape).point()
    else:
        point = Point.from_dict(json.loads(args.point))
    method = get_method(args.method)
    q, k, v = make_inputs(point, 0, torch.device("cuda"))
    for i in range(args.warmup + 1):
        # The last launch is the one captured; the range names it in an Nsight Systems trace.
        phase = "measure" if i == args.warmup else "warmup"
        with torch.cuda.nvtx.range(f"tiledattn:{args.method}:{phase}"):
            method.run(q, k, v, point)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
