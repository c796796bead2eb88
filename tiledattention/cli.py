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
    sweep = sub.add_parser("sweep", help="run a benchmark config's shards through a launcher "
                           "(slurm, local, debug) and wait for them; no Snakemake needed")
    sweep.add_argument("--config", required=True, help="YAML benchmark config")
    sweep.add_argument("--launcher", default="local", help="slurm, local or debug")
    sweep.add_argument("--launcher-options", default="{}",
                       help='JSON object of launcher options, e.g. \'{"partition": "gpu"}\'')
    sweep.add_argument("--shards", type=int, default=1, help="split the grid into N shards")
    sweep.add_argument("--only", type=int, nargs="+", help="run only these shard indices")
    sweep.add_argument("--out", default="results/bench")
    agg = sub.add_parser("aggregate", help="concatenate shard rows into one table")
    agg.add_argument("--rows", required=True, help="directory holding rows-shard*.jsonl")
    agg.add_argument("--out", required=True, help="directory for rows.jsonl and rows.csv")
    agg.add_argument("--expect-shards", type=int, help="fail unless this many shard files")
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
    if args.command == "sweep":
        import json
        import os

        from .bench.config import ConfigError, load_config
        from .launchers import LauncherError, ShardTask, get_launcher

        try:
            load_config(args.config)  # fail before anything is submitted
            if args.shards < 1:
                raise ConfigError("--shards must be >= 1")
            options = json.loads(args.launcher_options)
            launcher = get_launcher(args.launcher, os.path.join(args.out, "logs"), options)
            indices = args.only if args.only is not None else range(args.shards)
            tasks = [ShardTask(os.path.abspath(args.config), os.path.abspath(args.out), i,
                               args.shards) for i in indices]
            for r in launcher.run(tasks):
                print(f"sweep: shard {r['shard']}/{r['of']} done", file=sys.stderr)
        except (ConfigError, LauncherError, json.JSONDecodeError) as exc:
            print(f"tiledattn sweep: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "aggregate":
        import glob
        import os

        from .bench.aggregate import concat, write

        found = glob.glob(os.path.join(args.rows, "rows-shard*.jsonl"))
        if args.expect_shards is not None and len(found) != args.expect_shards:
            print(f"tiledattn aggregate: expected {args.expect_shards} shard files in "
                  f"{args.rows}, found {len(found)}", file=sys.stderr)
            return 1
        rows = concat(args.rows)
        jsonl, table = write(rows, args.out)
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
        print(f"aggregate: {len(rows)} rows ({counts}) -> {table}", file=sys.stderr)
        return 0
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
