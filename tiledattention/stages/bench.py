"""The benchmark stage: the config's grid, sharded, through the one harness
(``bench/runner.py``). Its config section is the common one (``bench/config.py``'s
``BenchConfig``: grid, timing, correctness), which the other stages read too; the ladder and
the shapes grids are bench configs of this stage (rules in ``bench.smk``)."""

from __future__ import annotations

from .base import Stage


def run_bench(cfg, out_dir: str, **kwargs) -> int:
    """The stage's run entry (the harness imports torch: loaded on call)."""
    from ..bench.runner import run_bench as run

    return run(cfg, out_dir, **kwargs)


STAGE = Stage("bench", None, "bench.smk", run_bench,
              tables=("tiledattention.study.tables:write_all",),
              doc="the grid's points, sharded, every method side by side (Tables 4, 6, shapes)")
