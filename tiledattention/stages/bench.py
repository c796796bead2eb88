"""The benchmark stage: the config's grid, sharded, through the one harness
(``bench/runner.py``). Its config section is the common one (``bench/config.py``'s
``BenchConfig``: grid, timing, correctness), which the other stages read too; the ladder and
the shapes grids are bench configs of this stage (rules in ``bench.smk``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..launchers.base import LauncherError
from .base import Stage


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


# `tiledattn bench --help`
HELP = ("benchmark tiledattention against PyTorch's SDPA backends and eager attention over a "
        "config's grid (resumable)")
STAGE = Stage("bench", None, "bench.smk", run_bench, help=HELP, add_arguments=add_arguments,
              handler=_bench, tables=("tiledattention.study.presentation.tables:write_all",))
