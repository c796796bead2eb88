"""The ``tiledattn`` command line.

One parser, one small handler per verb, and one place (``main``) that turns a refusal into
a single line on stderr and an exit code. Building the parser imports nothing heavy (no
torch), so ``tiledattn --help`` is quick; each handler imports what its verb needs.
"""

from __future__ import annotations

import argparse
import sys

from .bench.grid import PAPER_DTYPES
from .stages import STAGES
from .stages.base import count as _count
from .stages.base import positive as _positive

# Exit codes: 2 for bad input (a config, an option, a file the user named), 1 for a step
# that ran and failed (a job, a build); a bug still ends in a traceback.
BAD_INPUT, FAILED = 2, 1


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the verb, exit 2 (argparse prints usage + error).
    Subparsers inherit the class, so every verb's errors look alike."""

    def error(self, message: str):
        self.exit(BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


_ratio = _positive("number")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default; options without one say in their help what leaving
    them out means, and required options and flags have nothing to show."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def _verb(sub, name: str, handler, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help, formatter_class=_Formatter)
    p.set_defaults(handler=handler)
    return p


# What `tiledattn bundle create|verify --help` says above the options.
BUNDLE_CREATE = ("Gather a finished study (its aggregate rows, tables, figures, profiles and "
                 "manifest) with the exact config and a snapshot of the workflow into the "
                 "directory --out and the zip next to it: README, Zenodo and CFF metadata, an "
                 "RO-Crate and SHA256SUMS. Run it after the study's last step; it reads the "
                 "study and never changes it.")
BUNDLE_VERIFY = ("Check a bundle (directory or zip) as a reader would: every file against "
                 "SHA256SUMS (a changed, missing or unlisted file is named), and the Zenodo, "
                 "CFF and RO-Crate metadata against their schemas. Exit 0: OK; 1: a problem "
                 "found; 2: not a bundle.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tiledattn", description=__doc__.splitlines()[0],
                     formatter_class=_Formatter)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="what to do (tiledattn COMMAND --help: its options)")

    p = _verb(sub, "check", _check, "environment, correctness and speed check (CPU checks "
              "always; GPU checks when a CUDA GPU is visible)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON here "
                   "(default: print only)")
    p.add_argument("--min-speed-ratio", type=_ratio, default=0.80,
                   help="the GPU speed check fails below this share of torch SDPA's TFLOP/s "
                   "(fp16, D=128, S=4096, B=4, H=16)")

    for stage in STAGES.values():  # one verb per GPU stage, its options from its module
        if stage.cli:
            stage.cli.add_arguments(_verb(sub, stage.name, stage.cli.handler, stage.cli.help))

    from .stages import bench  # the bench stage's sweep: its shards through a launcher

    bench.add_sweep_arguments(_verb(sub, "sweep", bench.sweep, bench.SWEEP_HELP))

    p = _verb(sub, "precompile", _precompile, "compile the kernels of benchmark configs' points "
              "into cuTile's disk cache in parallel processes, before the study measures them "
              "(e.g. a study's plan/bench.yaml, plan/ladder.yaml, plan/shapes-g*.yaml)")
    p.add_argument("--config", nargs="+", required=True, metavar="YAML",
                   help="benchmark configs whose points to compile")
    p.add_argument("--workers", type=_count(1), help="processes, spread over the visible "
                   "GPUs (default: one per CPU core less one, at most 16)")

    p = _verb(sub, "aggregate", _aggregate, "all shard rows into one table (JSON lines, CSV, "
              "Parquet, column dictionary) and the summary tables (Markdown, CSV, LaTeX)")
    p.add_argument("--rows", required=True, help="directory holding rows-shard*.jsonl")
    p.add_argument("--out", required=True, help="directory for rows.* and tables/")
    p.add_argument("--expect-shards", type=_count(1), help="fail unless this many shard files "
                   "(default: any number)")
    p.add_argument("--tune-table", help="the study's tuning table for Table 5 (default: none)")
    p.add_argument("--manifest", help="the study's manifest.json: the GPU whose peak at each "
                   "row's SM clock the tables' %% peak @ clock columns use (default: none "
                   "named, those columns read —)")
    _stage_rows_options(p, "aggregate")
    p.add_argument("--rows-only", action="store_true",
                   help="only rows.jsonl and rows.csv (no pandas/pyarrow needed)")

    p = _verb(sub, "figures", _figures, "the study's figures (PNG and PDF) from aggregated rows")
    p.add_argument("--rows", required=True, help="aggregated rows.jsonl")
    p.add_argument("--out", required=True, help="directory for the figures")
    p.add_argument("--tune-table", help="the study's tuning table (default: none)")
    p.add_argument("--manifest", help="the study's manifest.json: the GPU every figure's "
                   "title names and whose data-sheet peaks it draws (default: none named)")
    _stage_rows_options(p, "figures")

    p = _verb(sub, "report-pages", _report_pages, "the HTML report's pages: what was and "
              "was not measured, the headline, the status and Table 4 as HTML")
    p.add_argument("--rows", required=True, help="aggregated rows.jsonl")
    p.add_argument("--tables", required=True, help="the aggregate's tables/ (Markdown)")
    p.add_argument("--manifest", help="the study's manifest.json: the GPU's name (default: "
                   "none named)")
    p.add_argument("--out", required=True, help="directory for landing.html and the pages")

    p = _verb(sub, "manifest", _manifest, "merge run manifests into the study manifest and "
              "flag mixed GPUs or software stacks")
    p.add_argument("--runs", nargs="+", required=True,
                   help="directories holding manifest-*.json")
    p.add_argument("--config", help="the study config (YAML or JSON) whose hash to record "
                   "(default: none recorded)")
    p.add_argument("--image", help="container image the jobs ran in (default: none)")
    p.add_argument("--out", required=True, help="manifest.json to write")

    p = _verb(sub, "bundle", _bundle, "build (create) or check (verify) the study's "
              "Zenodo-ready bundle")
    bsub = p.add_subparsers(dest="bundle_command", required=True, metavar="ACTION",
                            help="create or verify")
    b = bsub.add_parser("create", help="gather a finished study into DIR and DIR.zip",
                        formatter_class=_Formatter, description=BUNDLE_CREATE)
    b.add_argument("--study", required=True, help="the study's results directory")
    b.add_argument("--config", required=True, help="the study config (YAML)")
    b.add_argument("--out", required=True, help="bundle directory (DIR.zip next to it); "
                   "must be new, empty or a previous bundle")
    b.add_argument("--force", action="store_true", help="replace a previous bundle in --out "
                   "even when files were added to it; never a directory without the marker "
                   "file bundle create writes, a zip it did not make, the study or the source "
                   "checkout, nor anything inside them")
    b.add_argument("--compact", action="store_true", help="a bundle small enough to commit "
                   "(a reference): the rows gzipped (data/*.jsonl.gz, with the schedule "
                   "ladder's and the shapes grids' rows), no rows.csv/parquet, no figures, "
                   "tables as Markdown only (its README gives the commands that rebuild them, "
                   "CSV and LaTeX too, from the rows), a workflow snapshot without the "
                   "package source (the recorded revision holds it)")
    b = bsub.add_parser("verify", help="recompute checksums, validate the metadata",
                        formatter_class=_Formatter, description=BUNDLE_VERIFY)
    b.add_argument("path", help="bundle directory or zip")
    b.add_argument("--partial", action="store_true", help="the path is a committed summary "
                   "of a bundle (as results/reference/h100 was up to c17f956): check every file "
                   "present that "
                   "SHA256SUMS lists and the metadata present; list the withheld and the extra "
                   "files instead of failing on them")

    p = _verb(sub, "compare", _compare, "hold a study against a reference: per point and "
              "method, kernel time, call latency and the speed ratio to each baseline against "
              "the reference's (value, lower, upper); exit 1 on a regression")
    p.add_argument("new", help="the study: a bundle (directory or zip), a results directory "
                   "or a rows file")
    p.add_argument("reference", help="the reference: a shipped system (e.g. h100) or another "
                   "study (bundle, results directory, rows file)")
    p.add_argument("--tolerance", nargs="+", metavar="PCT", help="percent: one number for "
                   "both measures (15), or each measure named (kernel=10 call=25); two bare "
                   "numbers are refused (default: a shipped system's own bounds; for a study, "
                   "kernel 10, call 25)")
    p.add_argument("--out", help="directory for compare.md/.csv/.png/.pdf (default: compare/ "
                   "in the new study's directory)")

    p = _verb(sub, "systems", _systems, "one table across systems: per point, each study's "
              "TiledAttention kernel time and ratio to PyTorch SDPA, each system's time over "
              "the first's, geomeans (e.g. the H100 and the H200 reference studies)")
    p.add_argument("studies", nargs="+", metavar="STUDY", help="two or more studies: bundles "
                   "(directory or zip), results directories or rows files, the first the "
                   "reference system")
    p.add_argument("--names", nargs="+", help="a name per study, in order (default: the "
                   "paths' last parts)")
    p.add_argument("--out", required=True, help="directory for systems.md and systems.csv")

    p = _verb(sub, "scaling", _scaling, "study wall time against GPU count, and what stays "
              "serial, from the studies' run records (logs/runs.jsonl): table and figure")
    p.add_argument("studies", nargs="+", metavar="STUDY", help="results directories of the "
                   "same study run on different GPU counts (e.g. --config results_dir=... "
                   "per count)")
    p.add_argument("--out", required=True, help="directory for scaling.md/.csv/.png/.pdf")

    p = _verb(sub, "reproduce", _reproduce, "re-run the study a bundle records (its config, "
              "grid and workflow) through a Snakemake profile, then verify the new bundle and "
              "compare it against the original")
    p.add_argument("bundle", help="the bundle (directory or zip) whose study to re-run")
    p.add_argument("--out", help="new directory for the re-run, or one this command laid "
                   "out for the same bundle before (the re-run continues there; default: "
                   "reproduction-<bundle name> beside the bundle)")
    p.add_argument("--profile", default="local", help="Snakemake profile: local or slurm "
                   "(the workflow's), or the path of your own")
    p.add_argument("--source", choices=("snapshot", "checkout"), default="snapshot",
                   help="the workflow: the bundle's snapshot, or a checkout of the recorded "
                   "revision from the recorded repository (needs git and the repository)")
    p.add_argument("--reference", help="compare against this: a shipped system (e.g. h100) "
                   "or another study (default: the original bundle)")
    p.add_argument("--tolerance", nargs="+", metavar="PCT", help="as tiledattn compare's "
                   "(default: kernel 10, call 25 percent)")
    p.add_argument("--snakemake-args", nargs="+", default=[], metavar="ARG",
                   help="passed on to snakemake, e.g. --snakemake-args=-n")
    p.add_argument("--without-gpu", action="store_true", help="re-run a GPU bundle's study "
                   "with the local profile on a machine without a CUDA GPU (refused "
                   "otherwise: it would measure on the CPU for hours)")

    p = _verb(sub, "advise", _advise, "predict TiledAttention's and PyTorch SDPA's throughput "
              "for a model's attention shape from the nearest measured points, flag tile and "
              "wave quantization, and list same-hidden-size shapes that measured faster")
    p.add_argument("--heads", type=_count(1), required=True, help="query heads H")
    p.add_argument("--kv-heads", type=_count(1), help="key/value heads Hkv, dividing H (GQA, "
                   "e.g. 8 for Llama-3-8B's 32 query heads) (default: H, MHA)")
    p.add_argument("--head-dim", type=_count(1), required=True, help="head dim D")
    p.add_argument("--seq", type=_count(1), required=True, help="sequence length S: the "
                   "key/value length (the KV cache when decoding)")
    p.add_argument("--seq-q", type=_count(1), help="query length Sq, e.g. 1 for a decode step "
                   "against a cache of --seq tokens (default: S, self attention)")
    p.add_argument("--batch", type=_count(1), default=1, help="batch size B")
    p.add_argument("--gpu", choices=_advice_gpus(), default="h100",
                   help="whose measurements (shipped with the package)")
    p.add_argument("--dtype", choices=PAPER_DTYPES, default="float16", help="element type")
    p.add_argument("--causal", action="store_true", help="causal mask (default: none)")
    p.add_argument("--window", type=_count(1), help="a causal sliding window of W keys "
                   "(Mistral, Gemma 2's local layers; with --causal); answered only from "
                   "measured window points (default: no window)")

    p = _verb(sub, "offline", _offline, "wheelhouse for nodes without network")
    osub = p.add_subparsers(dest="offline_command", required=True, metavar="ACTION",
                            help="pack")
    o = osub.add_parser("pack", help="the project, its locked dependencies and the cuTile "
                        "toolchain as wheels for one Python version and platform",
                        formatter_class=_Formatter, description="Download the project, its "
                        "locked dependencies and the cuTile toolchain as wheels for one Python "
                        "version and platform into DEST, with SHA256SUMS and install.sh, which "
                        "installs them on a node without network (pip --no-index).")
    o.add_argument("dest", help="directory for the wheels, SHA256SUMS and install.sh")
    o.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                   help="target Python version (this interpreter's by default)")
    o.add_argument("--platform", default="manylinux_2_28_x86_64",
                   help="target platform tag (older compatible manylinux tags included)")
    o.add_argument("--extras", nargs="+", default=["gpu", "node"],
                   help="gpu: cuda-tile + tileiras/ptxas/libnvvm; node: submitit, pyyaml")
    o.add_argument("--torch", help="also pack this torch, e.g. torch==2.11.0 (default: the "
                   "node's own)")
    return parser


def _advice_gpus() -> list[str]:
    from .study.advice.advise import gpus

    return gpus()


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand's parser, nested ones included (for help checks)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                found += [p, *_subparsers(p)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if args.command is None:
        parser.print_help()
        return BAD_INPUT
    verb = " ".join(v for v in (args.command, getattr(args, "bundle_command", None),
                                getattr(args, "offline_command", None)) if v)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print(f"tiledattn {verb}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - refusals become one line, bugs re-raise
        if user_error(exc) is None:
            raise
        return report(verb, exc)


def report(command: str, exc: BaseException) -> int:
    """The one error report: a line naming the verb and what was wrong; the exit code."""
    from .launchers.base import LauncherError
    from .offline import OfflineError

    print(f"tiledattn {command}: {user_error(exc)}", file=sys.stderr)
    ran_and_failed = isinstance(exc, (LauncherError, OfflineError)) and not isinstance(
        exc, ValueError)  # OfflineOptionError: a bad option, not a failed pack
    return FAILED if ran_and_failed else BAD_INPUT


def user_error(exc: BaseException) -> str | None:
    """The one line to show for a refusal (a bad value, path or file, a failed job), or
    None for a bug (which keeps its traceback)."""
    import json

    from .errors import TiledAttentionError

    if isinstance(exc, TiledAttentionError):
        return " ".join(str(exc).split())
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and exc.filename:
        return f"{exc.filename}: exists and is not a directory (or a parent is a file)"
    if isinstance(exc, OSError):
        where = exc.filename or ""
        return f"{where}: {exc.strerror or exc}" if where else f"{exc.strerror or exc}"
    if type(exc).__module__.startswith("yaml"):
        return f"not valid YAML ({type(exc).__name__})"
    return None


def _check(args) -> int:
    from .check import run_check

    return run_check(args.json, args.min_speed_ratio)


def _aggregate(args) -> int:
    import glob
    import os

    from .bench.aggregate import load_checked, write
    from .bench.store import RowsError, check_one_config

    if not os.path.isdir(args.rows):
        raise RowsError(f"--rows {args.rows}: not a directory")
    found = glob.glob(os.path.join(args.rows, "rows-shard*.jsonl"))
    if args.expect_shards is not None and len(found) != args.expect_shards:
        raise RowsError(f"expected {args.expect_shards} shard files in {args.rows}, found "
                        f"{len(found)}")
    skipped: list[int] = []
    rows = load_checked(args.rows, skipped=skipped)
    if not rows:
        raise RowsError(f"no rows in {args.rows} ({len(found)} rows-shard*.jsonl files, "
                        f"{sum(skipped)} unreadable lines)")
    if sum(skipped):
        print(f"aggregate: skipped {sum(skipped)} unreadable line(s) (torn, not JSON or not "
              f"a row) in {args.rows}", file=sys.stderr)
    check_one_config(rows, args.rows)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    if args.rows_only:
        _, table = write(rows, args.out)
        print(f"aggregate: {len(rows)} rows ({counts}) -> {table}", file=sys.stderr)
        return 0
    from .study.presentation.report import write_report

    done = write_report(rows, args.out, where=args.rows, tune_table=args.tune_table,
                        stage_rows=_stage_rows_of(args, "aggregate"),
                        gpu=_manifest_gpu(args.manifest))
    print(f"aggregate: {len(rows)} rows ({counts}) -> {done['csv']}; {len(done['tables'])} "
          f"table files in {args.out}/tables", file=sys.stderr)
    return 0


def _stage_rows_options(p, verb: str) -> None:
    """--<stage> DIR for each stage whose rows ``verb`` reads (the registry's)."""
    for stage in STAGES.values():
        rows = stage.rows
        for what in (w for v, w in (rows.verbs if rows else ()) if v == verb):
            p.add_argument(f"--{stage.name}", metavar="DIR", nargs="+" if rows.many else None,
                           help=f"{'directories' if rows.many else 'directory'} of "
                           f"{rows.what} for {what} (default: none)")


def _stage_rows_of(args, verb: str) -> dict[str, list[dict]]:
    """The rows of each stage ``verb`` reads, by stage name (as the writers take them):
    ``--model DIR`` (its rows file must be there), ``--shapes DIR...`` (each a directory)."""
    found = {}
    for s in STAGES.values():
        if s.rows and any(v == verb for v, _ in s.rows.verbs):
            paths = getattr(args, s.name)
            found[s.name] = s.rows.from_dirs([paths] if isinstance(paths, str)
                                             else paths or [], f"--{s.name}")
    return found


def _figures(args) -> int:
    import os

    from .bench.store import ResultStore, RowsError, check_rows
    from .safeio import load_json
    from .study.presentation.figures import write_all

    if not os.path.isfile(args.rows):
        raise RowsError(f"--rows {args.rows}: no such file")
    tune = []
    if args.tune_table and os.path.exists(args.tune_table):
        from .schedules.table import ScheduleTable

        ScheduleTable.load(args.tune_table)  # bounded and validated: finite TFLOP/s
        table = load_json(args.tune_table, what="--tune-table")
        tune = table.get("entries") if isinstance(table, dict) else None
        if not isinstance(tune, list):
            raise RowsError(f"--tune-table {args.tune_table}: not a tuning table (no "
                            "\"entries\" list)")
    # An empty table, written where tuning could not run, says why (meta.unavailable).
    read = tune == [] and args.tune_table and os.path.exists(args.tune_table)
    meta = table.get("meta") if read else None
    why = meta.get("unavailable") if isinstance(meta, dict) else None
    store = ResultStore(args.rows)
    rows = list(store.rows.values())
    if not rows:
        raise RowsError(f"--rows {args.rows}: no rows (empty, or no line is a row)")
    check_rows(rows, args.rows, store.conflicts, point=True)  # nothing impossible is plotted
    paths = write_all(rows, args.out, gpu=_manifest_gpu(args.manifest), tune_entries=tune,
                      tune_reason=why if isinstance(why, str) else None,
                      stage_rows=_stage_rows_of(args, "figures"))
    print(f"figures: {len(paths)} files in {args.out}", file=sys.stderr)
    return 0


def _report_pages(args) -> int:
    import os

    from .bench.store import ResultStore, RowsError
    from .study.presentation.report_pages import write_pages

    if not os.path.isfile(args.rows):
        raise RowsError(f"--rows {args.rows}: no such file")
    if not os.path.isdir(args.tables):
        raise RowsError(f"--tables {args.tables}: not a directory")
    rows = list(ResultStore(args.rows).rows.values())
    paths = write_pages(rows, args.tables, args.out, _manifest_gpu(args.manifest))
    print(f"report-pages: {len(paths)} files in {args.out}", file=sys.stderr)
    return 0


def _manifest_gpu(path: str | None) -> str | None:
    """The GPU name a study manifest records (None: no manifest given, or a CPU study)."""
    import os

    from .bench.store import RowsError
    from .safeio import load_json

    if not path:
        return None
    if not os.path.isfile(path):
        raise RowsError(f"--manifest {path}: no such file")
    manifest = load_json(path, what="--manifest")
    gpu = manifest.get("gpu") if isinstance(manifest, dict) else None
    name = gpu.get("name") if isinstance(gpu, dict) else None
    return name if isinstance(name, str) else None


def _manifest(args) -> int:
    import os

    from .study.publication.manifest import load_manifests, merge
    from .yamlio import load_yaml

    config = load_yaml(args.config) if args.config else None
    merged = merge(load_manifests(args.runs), config=config, image=args.image,
                   base_dir=os.path.dirname(os.path.abspath(args.out)))
    from .safeio import write_json

    write_json(args.out, merged, indent=1)  # atomic: bundle create trusts it
    if not merged["consistent"]:
        print(f"manifest: MIXED study — runs differ in {sorted(merged['mismatches'])}",
              file=sys.stderr)
    return 0


def _bundle(args) -> int:
    import os

    from .study.publication.create import create
    from .study.publication.verify import verify

    if args.bundle_command == "verify":
        import zipfile

        from .errors import StudyError

        if not os.path.isdir(args.path) and not os.path.isfile(args.path):
            raise StudyError(f"{args.path}: no such bundle directory or zip")
        if os.path.isfile(args.path) and not zipfile.is_zipfile(args.path):
            raise StudyError(f"{args.path}: not a zip file (nor a bundle directory)")
        partial = {} if args.partial else None
        problems = verify(args.path, partial)
        if partial is not None:
            for key, what in (("withheld", "listed in SHA256SUMS, not here"),
                              ("extra", "here, not in SHA256SUMS (not part of the bundle)")):
                names = partial.get(key, [])
                print(f"bundle verify: {len(names)} {what}" + (f": {', '.join(names)}"
                                                             if names else ""))
        for p in problems:
            print(f"bundle verify: {p}", file=sys.stderr)
        if problems:
            print(f"bundle verify: FAILED, {len(problems)} problem(s) in {args.path}",
                  file=sys.stderr)
            return FAILED
        print(f"bundle verify: OK, every checksum and the metadata of {args.path} check out"
              + (" (partial: only the files present)" if args.partial else ""))
        return 0
    from . import __version__
    from .study.publication.metadata import Publication
    from .yamlio import load_yaml

    config = load_yaml(args.config)
    pub = Publication.from_dict(config.get("publication"), __version__)
    # The workflow snapshot comes from the workflow that ran (Snakemake's working directory,
    # holding the Snakefile), else from the checkout this package is installed from.
    repo = os.getcwd() if os.path.isfile("Snakefile") else \
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = create(args.study, args.out, config=config, config_name=os.path.basename(args.config),
                 repo_root=repo, publication=pub, command="tiledattn bundle create",
                 force=args.force, compact=args.compact)
    print(f"bundle: {out['files']} files in {out['dir']} and {out['zip']}", file=sys.stderr)
    return 0


def _compare(args) -> int:
    from .study.references.compare import failed, run, verdict_line

    checks, paths = run(args.new, args.reference, tolerance=args.tolerance, out=args.out)
    print(f"compare: {verdict_line(checks)}; {paths[1]}")
    bad = failed(checks)
    for c in bad[:10]:
        print(f"compare: {c.verdict}: {c.point} {c.method} {c.measure} "
              f"{'—' if c.diff_pct is None else f'{c.diff_pct:+.1f} %'} {c.why}".rstrip(),
              file=sys.stderr)
    if len(bad) > 10:
        print(f"compare: … and {len(bad) - 10} more failed checks (all in {paths[0]})",
              file=sys.stderr)
    return FAILED if bad else 0


def _precompile(args) -> int:
    from .bench.precompile import default_workers, precompile

    precompile(args.config, args.workers or default_workers())
    return 0  # a point that failed here is measured, and its failure recorded, by the study


def _systems(args) -> int:
    from .study.references.systems import write

    print(f"systems: {write(args.studies, args.names, args.out)[1]}")
    return 0


def _scaling(args) -> int:
    from .study.references.scaling import write

    runs, paths = write(args.studies, args.out)
    print(f"scaling: {len(runs)} run(s), GPUs {sorted({r.count for r in runs})}; {paths[1]}")
    return 0


def _reproduce(args) -> int:
    import os

    from .study.references.reproduce import reproduce

    # Default: beside the bundle, never inside it (its files are checksummed).
    path = os.path.abspath(args.bundle)
    out = args.out or os.path.join(os.path.dirname(path),
                                   "reproduction-" + os.path.basename(path).removesuffix(".zip"))
    return reproduce(args.bundle, out, source=args.source,
                     profile=args.profile, reference=args.reference,
                     tolerance=args.tolerance, snakemake_args=tuple(args.snakemake_args),
                     without_gpu=args.without_gpu)


def _advise(args) -> int:
    from .study.advice.advise import Shape, advise

    print(advise(Shape(args.heads, args.head_dim, args.seq, args.batch, args.dtype,
                       args.causal, kv_heads=args.kv_heads, seq_q=args.seq_q,
                       window=args.window), args.gpu))
    return 0


def _offline(args) -> int:
    from .offline import PackOptions, pack

    out = pack(PackOptions(args.dest, args.python, args.platform, tuple(args.extras),
                           args.torch))
    print(f"offline pack: {out['wheels']} wheels for Python {out['python']} "
          f"{out['platform']} in {out['dest']}; install there with {out['dest']}/install.sh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
