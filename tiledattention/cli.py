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
    check.add_argument("--min-speed-ratio", type=float, default=0.80,
                       help="the GPU speed check fails below this share of torch SDPA's "
                       "TFLOP/s (fp16, D=128, S=4096, B=4, H=16)")
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
    tune.add_argument("--launcher", help="run the tuning as a job of this launcher (slurm: on a "
                      "GPU node; local: on a free local GPU); default: in this process")
    tune.add_argument("--launcher-options", default="{}", help="JSON launcher options")
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
    sweep.add_argument("--step", default="bench", help="the study step the shards belong to "
                       "(names the jobs, e.g. tiledattn-ladder-shard0of1)")
    agg = sub.add_parser("aggregate", help="all shard rows into one table (JSON lines, CSV, "
                         "Parquet, column dictionary) and the summary tables (Markdown, CSV, "
                         "LaTeX)")
    agg.add_argument("--rows", required=True, help="directory holding rows-shard*.jsonl")
    agg.add_argument("--out", required=True, help="directory for rows.* and tables/")
    agg.add_argument("--expect-shards", type=int, help="fail unless this many shard files")
    agg.add_argument("--ladder", help="directory of the schedule-ladder rows (Table 6)")
    agg.add_argument("--tune-table", help="the study's tuning table (Table 5)")
    agg.add_argument("--rows-only", action="store_true",
                     help="only rows.jsonl and rows.csv (no pandas/pyarrow needed)")
    fig = sub.add_parser("figures", help="the study's figures (PNG and PDF) from aggregated "
                         "rows")
    fig.add_argument("--rows", required=True, help="aggregated rows.jsonl")
    fig.add_argument("--out", required=True, help="directory for the figures")
    fig.add_argument("--ladder", help="directory of the schedule-ladder rows")
    fig.add_argument("--tune-table", help="the study's tuning table")
    prof = sub.add_parser("profile", help="Nsight Compute on the attention kernels of "
                          "representative shapes (records why when it cannot run)")
    prof.add_argument("--shape", action="append", required=True,
                      help="dtype:mask:D:S, e.g. float16:causal:128:4096 (repeatable)")
    prof.add_argument("--methods", nargs="+", default=["tiledattention", "torch_sdpa"])
    prof.add_argument("--out", required=True, help="directory for reports and summary.md")
    prof.add_argument("--clock-control", default="base", help="base (locked base clocks, "
                      "ncu's default) or none (boost clocks, as the benchmark runs)")
    prof.add_argument("--warmup", type=int, default=5, help="launches skipped before the "
                      "captured one")
    prof.add_argument("--tokens", type=int, default=16384, help="B*S of the profiled point")
    prof.add_argument("--width", type=int, default=2048, help="H*D of the profiled point")
    prof.add_argument("--launcher", help="run the profiling as a job of this launcher (slurm: "
                      "on a GPU node); default: in this process")
    prof.add_argument("--launcher-options", default="{}", help="JSON launcher options")
    man = sub.add_parser("manifest", help="merge run manifests into the study manifest and "
                         "flag mixed GPUs or software stacks")
    man.add_argument("--runs", nargs="+", required=True,
                     help="directories holding manifest-*.json")
    man.add_argument("--config", help="the study config (YAML or JSON) whose hash to record")
    man.add_argument("--image", help="container image the jobs ran in")
    man.add_argument("--out", required=True, help="manifest.json to write")
    bun = sub.add_parser("bundle", help="build (create) or check (verify) the study's "
                         "Zenodo-ready bundle")
    bsub = bun.add_subparsers(dest="bundle_command", required=True)
    bcreate = bsub.add_parser("create", help="gather a finished study into DIR and DIR.zip")
    bcreate.add_argument("--study", required=True, help="the study's results directory")
    bcreate.add_argument("--config", required=True, help="the study config (YAML)")
    bcreate.add_argument("--out", required=True, help="bundle directory (DIR.zip next to it)")
    bverify = bsub.add_parser("verify", help="recompute checksums, validate the metadata")
    bverify.add_argument("path", help="bundle directory or zip")
    off = sub.add_parser("offline", help="wheelhouse for nodes without network")
    osub = off.add_subparsers(dest="offline_command", required=True)
    opack = osub.add_parser("pack", help="the project, its locked dependencies and the cuTile "
                            "toolchain as wheels for one Python version and platform")
    opack.add_argument("dest", help="directory for the wheels, SHA256SUMS and install.sh")
    opack.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                       help="target Python version, e.g. 3.12 (default: this one)")
    opack.add_argument("--platform", default="manylinux_2_28_x86_64",
                       help="target platform tag (older compatible manylinux tags included)")
    opack.add_argument("--extras", nargs="+", default=["gpu", "node"],
                       help="gpu: cuda-tile + tileiras/ptxas/libnvvm; node: submitit, pyyaml")
    opack.add_argument("--torch", help="also pack this torch, e.g. torch==2.11.0 (default: the "
                       "node's own)")
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if args.command == "check":
        from .check import run_check

        return run_check(args.json, args.min_speed_ratio)
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
                               args.shards, args.step) for i in indices]
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
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
        if args.rows_only:
            _, table = write(rows, args.out)
            print(f"aggregate: {len(rows)} rows ({counts}) -> {table}", file=sys.stderr)
            return 0
        from .study.frame import StudyError, write_rows_table
        from .study.tables import write_all

        try:
            write(rows, args.out, csv_table=False)  # rows.csv comes next, dictionary order
            table = write_rows_table(rows, args.out)["csv"]
            ladder = concat(args.ladder) if args.ladder else []
            paths = write_all(rows, os.path.join(args.out, "tables"),
                              tune_table=args.tune_table, ladder_rows=ladder)
        except StudyError as exc:
            print(f"tiledattn aggregate: {exc}", file=sys.stderr)
            return 1
        print(f"aggregate: {len(rows)} rows ({counts}) -> {table}; {len(paths)} table files "
              f"in {args.out}/tables", file=sys.stderr)
        return 0
    if args.command == "figures":
        import json
        import os

        from .bench.aggregate import concat
        from .bench.store import read_rows
        from .study.figures import write_all

        tune = []
        if args.tune_table and os.path.exists(args.tune_table):
            with open(args.tune_table) as f:
                tune = json.load(f)["entries"]
        paths = write_all(read_rows(args.rows), args.out,
                          ladder_rows=concat(args.ladder) if args.ladder else [],
                          tune_entries=tune)
        print(f"figures: {len(paths)} files in {args.out}", file=sys.stderr)
        return 0
    if args.command == "profile":
        from .launchers import LauncherError, get_launcher
        from .study.frame import StudyError
        from .study.profile import ProfileTask, Shape, run_profile

        try:
            shapes = [Shape.parse(s) for s in args.shape]
            if args.launcher:
                import json
                import os

                task = ProfileTask(tuple(args.shape), tuple(args.methods),
                                   os.path.abspath(args.out), args.clock_control, args.warmup,
                                   args.tokens, args.width)
                try:
                    get_launcher(args.launcher, os.path.join(args.out, "logs"),
                                 json.loads(args.launcher_options)).run([task])
                except (LauncherError, json.JSONDecodeError) as exc:  # the job failed
                    print(f"tiledattn profile: {exc}", file=sys.stderr)
                    return 1
                code = 0
            else:
                code = run_profile(shapes, args.methods, args.out,
                                   clock_control=args.clock_control, warmup=args.warmup,
                                   tokens=args.tokens, width=args.width)
        except (StudyError, LauncherError) as exc:
            print(f"tiledattn profile: {exc}", file=sys.stderr)
            return 2
        with open(f"{args.out}/summary.md") as f:
            print(f.read())
        return code
    if args.command == "manifest":
        import json
        import os

        import yaml

        from .study.frame import StudyError
        from .study.manifest import load_manifests, merge

        config = None
        if args.config:
            with open(args.config) as f:
                config = yaml.safe_load(f)
        try:
            merged = merge(load_manifests(args.runs), config=config, image=args.image,
                           base_dir=os.path.dirname(os.path.abspath(args.out)))
        except StudyError as exc:
            print(f"tiledattn manifest: {exc}", file=sys.stderr)
            return 1
        with open(args.out, "w") as f:
            json.dump(merged, f, indent=1)
        if not merged["consistent"]:
            print(f"manifest: MIXED study — runs differ in {sorted(merged['mismatches'])}",
                  file=sys.stderr)
        return 0
    if args.command == "bundle":
        return _bundle(args)
    if args.command == "tune":
        import os

        from .tune import PAPER_HEAD_DIMS, PAPER_SEQS, paper_grid, run_tune

        if args.launcher:
            return _tune_through_launcher(args)

        points = paper_grid(seqs=args.seqs or PAPER_SEQS, head_dims=args.head_dims or
                            PAPER_HEAD_DIMS, dtypes=args.dtypes or ("float16", "bfloat16"))
        for path in (args.state, args.out):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return run_tune(points, space=args.space, state_path=args.state, out_path=args.out,
                        reps=args.reps, compile_timeout=args.compile_timeout)
    if args.command == "offline":
        from .offline import OfflineError, PackOptions, pack

        try:
            out = pack(PackOptions(args.dest, args.python, args.platform, tuple(args.extras),
                                   args.torch))
        except OfflineError as exc:
            print(f"tiledattn offline pack: {exc}", file=sys.stderr)
            return 1
        print(f"offline pack: {out['wheels']} wheels for Python {out['python']} "
              f"{out['platform']} in {out['dest']}; install there with {out['dest']}/install.sh")
        return 0
    parser.print_help()
    return 2


def _tune_through_launcher(args) -> int:
    import json
    import os

    from .launchers import LauncherError, run_step
    from .tune import PAPER_HEAD_DIMS, PAPER_SEQS, TuneTask

    task = TuneTask(os.path.abspath(args.out), os.path.abspath(args.state), args.space,
                    tuple(args.seqs or PAPER_SEQS), tuple(args.head_dims or PAPER_HEAD_DIMS),
                    tuple(args.dtypes or ("float16", "bfloat16")), args.reps,
                    args.compile_timeout)
    folder = os.path.join(os.path.dirname(task.out_path), "logs")
    try:
        result = run_step(args.launcher, json.loads(args.launcher_options), folder, task)
    except (LauncherError, json.JSONDecodeError) as exc:
        print(f"tiledattn tune: {exc}", file=sys.stderr)
        return 1
    if result["status"] != "ok":
        print(f"tiledattn tune: not run: {result['reason']}", file=sys.stderr)
    return 0


def _bundle(args) -> int:
    import os

    from .study.bundle import create, verify
    from .study.frame import StudyError

    if args.bundle_command == "verify":
        problems = verify(args.path)
        for p in problems:
            print(f"bundle verify: {p}", file=sys.stderr)
        if problems:
            print(f"bundle verify: FAILED, {len(problems)} problem(s) in {args.path}",
                  file=sys.stderr)
            return 1
        print(f"bundle verify: OK, every checksum and the metadata of {args.path} check out")
        return 0
    import yaml

    from . import __version__
    from .study.metadata import Publication

    try:
        with open(args.config) as f:
            config = yaml.safe_load(f) or {}
        pub = Publication.from_dict(config.get("publication"), __version__)
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = create(args.study, args.out, config=config,
                     config_name=os.path.basename(args.config), repo_root=repo,
                     publication=pub, command="tiledattn bundle create")
    except (OSError, StudyError) as exc:
        print(f"tiledattn bundle: {exc}", file=sys.stderr)
        return 1
    print(f"bundle: {out['files']} files in {out['dir']} and {out['zip']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
