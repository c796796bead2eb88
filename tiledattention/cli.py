"""The ``tiledattn`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiledattn", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    check = sub.add_parser("check", help="environment, correctness and speed check "
                           "(CPU checks always; GPU checks when a CUDA GPU is visible)")
    check.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    tune = sub.add_parser("tune", help="time candidate schedules per shape bucket on this GPU "
                          "and write the tuning table (resumable)")
    tune.add_argument("--grid", choices=("paper",), default="paper",
                      help="paper: S 512..8192 x D 64,96,128,160 x fp16/bf16 x causal/not")
    tune.add_argument("--seqs", type=int, nargs="+", help="restrict the grid's S values")
    tune.add_argument("--head-dims", type=int, nargs="+", help="restrict the grid's D values")
    tune.add_argument("--dtypes", nargs="+", choices=("float16", "bfloat16"))
    tune.add_argument("--space", choices=("quick", "full"), default="quick")
    tune.add_argument("--state", default="results/tune-state.jsonl",
                      help="JSON-lines record of finished measurements (resume from it)")
    tune.add_argument("--out", default="results/schedule-table.json")
    tune.add_argument("--reps", type=int, default=20)
    tune.add_argument("--compile-timeout", type=float, default=120.0)
    bench = sub.add_parser("bench", help="benchmark tiledattention against PyTorch's SDPA "
                           "backends and eager attention over a config's grid (resumable)")
    bench.add_argument("--config", help="YAML benchmark config (default: the paper's grid)")
    bench.add_argument("--out", default="results/bench", help="directory for rows + manifest")
    bench.add_argument("--shard", default="0/1", help="i/n: run the i-th of n grid shards")
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if args.command == "check":
        from .check import run_check

        return run_check(args.json)
    if args.command == "bench":
        from .bench.config import BenchConfig, ConfigError, load_config, validate
        from .bench.grid import parse_shard
        from .bench.runner import run_bench

        try:
            cfg = load_config(args.config) if args.config else validate(BenchConfig())
            index, count = parse_shard(args.shard)
        except ConfigError as exc:
            print(f"tiledattn bench: {exc}", file=sys.stderr)
            return 2
        return run_bench(cfg, args.out, shard_index=index, shard_count=count)
    if args.command == "tune":
        import os

        from .tune import PAPER_HEAD_DIMS, PAPER_SEQS, paper_grid, run_tune

        points = paper_grid(seqs=args.seqs or PAPER_SEQS, head_dims=args.head_dims or
                            PAPER_HEAD_DIMS, dtypes=args.dtypes or ("float16", "bfloat16"))
        for path in (args.state, args.out):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return run_tune(points, space=args.space, state_path=args.state, out_path=args.out,
                        reps=args.reps, compile_timeout=args.compile_timeout)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
