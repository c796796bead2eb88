"""Where benchmark shards run: one submitit backend per module (slurm, local, debug)."""

from .base import (
    LAUNCHERS,
    LauncherError,
    LauncherOptionError,
    check_launcher,
    get_launcher,
    job_name,
    preflight_launcher,
    run_step,
)

__all__ = ["LAUNCHERS", "LauncherError", "LauncherOptionError", "check_launcher",
           "get_launcher", "job_name", "preflight_launcher",
           "run_step"]
