"""The process Nsight Compute profiles: one point, one method, ``warmup`` + 1 launches.

    ncu -k regex:attention_fwd --launch-skip 5 --launch-count 1 \\
        python -m tiledattention.study.profile_target --method tiledattention ...
"""

from __future__ import annotations

import argparse

import torch

from ..bench.grid import Point
from ..bench.methods import get_method
from ..bench.runner import make_inputs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", required=True)
    ap.add_argument("--point", required=True, help="JSON of a bench Point")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    import json

    point = Point(**json.loads(args.point))
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
