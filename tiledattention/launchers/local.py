"""Shards as local processes through submitit's LocalExecutor: in parallel, one GPU each
where GPUs are visible (shard i gets GPU i mod #GPUs), sequentially on a CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import submitit

from .base import ShardTask, check_options, wait


@dataclass(frozen=True)
class LocalOptions:
    timeout_s: float | None = None
    timeout_min: int = 600  # per job, as submitit counts it
    python: str | None = None  # e.g. "apptainer exec --nv IMAGE python3"


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch CUDA: CPU only
        return []


class Launcher:
    name = "local"

    def __init__(self, folder: str, options: dict):
        self.options = check_options(LocalOptions, options, self.name)
        self.folder = folder

    def run(self, tasks: list[ShardTask]) -> list[dict]:
        gpus = visible_gpus()
        jobs = []
        if gpus:
            for t in tasks:
                ex = submitit.LocalExecutor(folder=self.folder, python=self.options.python)
                ex.update_parameters(timeout_min=self.options.timeout_min, gpus_per_node=1,
                                     visible_gpus=(int(gpus[t.shard_index % len(gpus)]),))
                jobs.append(ex.submit(t))
            return wait(jobs, self._describe, self.options.timeout_s)
        # CPU: one shard at a time, so shards do not fight over two cores.
        results = []
        for t in tasks:
            ex = submitit.LocalExecutor(folder=self.folder, python=self.options.python)
            ex.update_parameters(timeout_min=self.options.timeout_min)
            results += wait([ex.submit(t)], self._describe, self.options.timeout_s)
        return results

    @staticmethod
    def _describe(job) -> str:
        return f"local job {job.job_id} (log {job.paths.stderr})"
