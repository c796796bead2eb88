"""Where benchmark shards run: one submitit backend per module (slurm, local, debug)."""

from .base import LAUNCHERS, LauncherError, ShardTask, get_launcher, job_name, run_step

__all__ = ["LAUNCHERS", "LauncherError", "ShardTask", "get_launcher", "job_name", "run_step"]
