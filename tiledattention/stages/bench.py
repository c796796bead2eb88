"""The benchmark stage: the config's grid, sharded, through the one harness
(``bench/runner.py``). Its config section is the common one (``bench/config.py``'s
``BenchConfig``: grid, timing, correctness), which the other stages read too; the ladder and
the shapes grids are bench configs of this stage (rules in ``bench.smk``), registry entries
of their own (``LADDER``, ``SHAPES``: their rows feed their own tables and figures), measured
by this stage's sweep (``tiledattn sweep``: shards through a launcher)."""

from __future__ import annotations

from dataclasses import dataclass

from ..launchers.base import LauncherError
from .base import Cli, Rows, Stage, count, launcher_options


def run_bench(cfg, out_dir: str, **kwargs) -> int:
    """The stage's run entry (the harness imports torch: loaded on call)."""
    from ..bench.runner import run_bench as run

    return run(cfg, out_dir, **kwargs)


# `tiledattn bench`: its options and its handler.
def add_arguments(p) -> None:
    p.add_argument("--config", help="YAML benchmark config (default: the paper's grid, every "
                   "method)")
    p.add_argument("--out", default="results/bench", help="directory for rows + manifest")
    p.add_argument("--shard", default="0/1", help="i/n: run the i-th of n grid shards")
    p.add_argument("--remeasure", action="store_true", help="rows in --out measured under "
                   "another config (seed, timing, tolerances, device) are set aside to "
                   "stale-*.jsonl and measured again (default: refuse to mix them)")


def _bench(args) -> int:
    from ..bench.config import BenchConfig, load_config, validate
    from ..bench.grid import parse_shard
    from ..bench.runner import run_bench as run

    cfg = load_config(args.config) if args.config else validate(BenchConfig())
    index, shards = parse_shard(args.shard)
    return run(cfg, args.out, shard_index=index, shard_count=shards,
               remeasure=args.remeasure)



@dataclass(frozen=True)
class ShardTask:
    """One benchmark shard, picklable for submitit. Rerunning resumes from finished rows,
    so a requeued (preempted, timed-out) job continues where it stopped."""

    config_path: str
    out_dir: str
    shard_index: int
    shard_count: int
    step: str = "bench"  # the study step (bench, ladder): names the job in sacct

    def __call__(self) -> dict:
        from ..bench.config import load_config
        from ..bench.runner import run_bench

        code = run_bench(load_config(self.config_path), self.out_dir,
                         shard_index=self.shard_index, shard_count=self.shard_count)
        if code != 0:
            raise LauncherError(f"shard {self.shard_index}/{self.shard_count} stopped with "
                                f"exit code {code}")
        return {"shard": self.shard_index, "of": self.shard_count, "out_dir": self.out_dir}

    def checkpoint(self, *args, **kwargs):
        # submitit calls this on preemption / time limit: requeue the same task.
        from ..launchers import jobenv

        return jobenv.requeue(self)

    @property
    def tag(self) -> str:
        return f"shard{self.shard_index}of{self.shard_count}"

    @property
    def job_name(self) -> str:
        return f"tiledattn-{self.step}-{self.tag}"


# `tiledattn sweep`: a bench config's shards through a launcher, as the workflow's bench,
# ladder and shapes steps run them.
SWEEP_HELP = ("run a benchmark config's shards through a launcher and wait for them; no "
              "Snakemake needed")


def add_sweep_arguments(p) -> None:
    from ..launchers.base import LAUNCHERS

    p.add_argument("--config", required=True, help="YAML benchmark config")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local", help="where shards run")
    launcher_options(p)
    p.add_argument("--shards", type=count(1), default=1, help="split the grid into N shards")
    p.add_argument("--only", type=count(0), nargs="+", help="run only these shard indices "
                   "(default: all)")
    p.add_argument("--out", default="results/bench", help="directory for rows + manifests")
    p.add_argument("--step", default="bench", help="the study step the shards belong to "
                   "(names the jobs, e.g. tiledattn-ladder-shard0of1)")


def sweep(args) -> int:
    import os
    import sys

    from ..bench.config import load_config
    from ..bench.reshard import reshard
    from ..bench.store import ensure_unlocked
    from ..errors import ConfigError
    from ..launchers import get_launcher
    from .base import json_object

    cfg = load_config(args.config)  # fail before anything is submitted
    indices = args.only if args.only is not None else list(range(args.shards))
    bad = sorted({i for i in indices if not 0 <= i < args.shards})
    if bad or len(set(indices)) != len(indices):
        raise ConfigError(f"--only {args.only}: each index once, from 0 to "
                          f"{args.shards - 1} (--shards {args.shards})")
    options = json_object(args.launcher_options, "--launcher-options")
    launcher = get_launcher(args.launcher, os.path.join(args.out, "logs"), options)
    os.makedirs(args.out, exist_ok=True)
    tasks = [ShardTask(os.path.abspath(args.config), os.path.abspath(args.out), i,
                       args.shards, args.step) for i in indices]
    if hasattr(launcher, "end_leftovers"):  # jobs a killed run of these shards left running
        launcher.end_leftovers(tasks)
    for i in indices:  # another sweep or bench writing a shard: one line, nothing submitted
        ensure_unlocked(os.path.join(args.out, f"rows-shard{i}of{args.shards}.jsonl"))
    reshard(cfg, args.out, args.shards, sys.stderr)  # a changed count keeps measured rows
    for r in launcher.run(tasks):
        print(f"sweep: shard {r['shard']}/{r['of']} done", file=sys.stderr)
    return 0


# A shapes grid without a `methods` key: the kernel next to PyTorch SDPA's automatic dispatch.
SHAPES_METHODS = ("tiledattention", "torch_sdpa")


def study_timing(study: dict) -> dict:
    """A study config's bench section less its grids: a stage with its own grid (ladder,
    shapes) takes the study's timing, seed and checks, not the main grid's decode points."""
    return {k: v for k, v in (study.get("bench") or {}).items() if k not in ("grid", "decode")}


def shapes_config(study: dict, i: int) -> dict:
    """Shapes grid ``i`` of a study config as the bench config its sweep runs (the workflow's
    plan/shapes-g<i>.yaml; ``rebundle --add`` checks a run's digest against it): the study's
    timing, the grid, and the grid's own ``methods`` where it names them."""
    grid = dict(study["shapes"]["grids"][i])
    methods = grid.pop("methods", list(SHAPES_METHODS))
    return {**study_timing(study), "grid": grid, "methods": methods}


def shapes_bench_config(study: dict, i: int):
    """Shapes grid ``i`` validated as its sweep's bench config; a bad key or method is one
    ``ConfigError`` naming the grid (``shapes.grids[i]``), not the bench section."""
    from ..bench.config import from_dict
    from ..errors import ConfigError

    try:
        return from_dict(shapes_config(study, i))
    except ConfigError as exc:
        raise ConfigError(f"shapes.grids[{i}]: {exc}") from None


def sweep_rows(rows_dir: str) -> list[dict]:
    """A sweep's rows (every shard's), checked as the tables read them (the ladder's, a
    shapes grid's)."""
    from ..bench.aggregate import load_checked

    return load_checked(rows_dir, point=True)


# `tiledattn bench --help`
HELP = ("benchmark tiledattention against PyTorch's SDPA backends and eager attention over a "
        "config's grid (resumable)")
STAGE = Stage("bench", None, run_bench, ShardTask, cli=Cli(HELP, add_arguments, _bench))
# The ladder (Table 6, the tile_sensitivity figure) and the shapes grids (the shapes tables
# and figure): bench configs of this stage, swept in bench.smk's rules, with rows of their
# own (a bundle's data/ holds them as ladder-rows and shapes-<grid>-rows).
LADDER = Stage("ladder", None, None, ShardTask,
               rows=Rows(sweep_rows, what="the schedule-ladder rows",
                         verbs=(("aggregate", "Table 6"),
                                ("figures", "the tile_sensitivity figure"))))
SHAPES = Stage("shapes", None, None, ShardTask,
               rows=Rows(sweep_rows, many=True, what="the shapes grids' rows",
                         verbs=(("aggregate", "the shapes tables"),
                                ("figures", "the shapes figure"))))
