"""In-process execution through submitit's DebugExecutor: for debugging a shard."""

from __future__ import annotations

from dataclasses import dataclass

import submitit

from . import base
from .base import wait


@dataclass(frozen=True)
class DebugOptions:
    timeout_s: float | None = None


class Launcher(base.Launcher):
    name = "debug"
    Options = DebugOptions

    def __init__(self, folder: str, options: dict):
        super().__init__(folder, options)
        self.executor = submitit.DebugExecutor(folder=folder)

    def run(self, tasks: list) -> list[dict]:
        jobs = [self.executor.submit(t) for t in tasks]
        return wait(jobs, lambda j: f"debug job {j.job_id}", self.options.timeout_s, poll_s=0)
