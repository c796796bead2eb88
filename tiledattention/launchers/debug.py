"""In-process execution through submitit's DebugExecutor: for debugging a shard."""

from __future__ import annotations

from dataclasses import dataclass

import submitit

from .base import check_options, wait


@dataclass(frozen=True)
class DebugOptions:
    timeout_s: float | None = None


def check(options: dict) -> DebugOptions:
    """The typed options, or LauncherOptionError naming the option and the valid ones."""
    return check_options(DebugOptions, options, "debug")


class Launcher:
    name = "debug"

    def __init__(self, folder: str, options: dict):
        self.options = check(options)
        self.executor = submitit.DebugExecutor(folder=folder)

    def run(self, tasks: list) -> list[dict]:
        jobs = [self.executor.submit(t) for t in tasks]
        return wait(jobs, lambda j: f"debug job {j.job_id}", self.options.timeout_s, poll_s=0)
