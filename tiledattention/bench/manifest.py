"""The run manifest: what ran, where, with which software — and no secrets.

Only named facts are recorded; the environment is never dumped wholesale (a few
non-secret variables are listed by name).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess

import torch

_ENV_ALLOWLIST = ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID",
                  "SLURM_ARRAY_TASK_ID", "SLURM_JOB_PARTITION", "SLURM_CLUSTER_NAME",
                  "SLURM_NODELIST", "CUDA_TILE_CACHE_DIR", "TILEDATTENTION_SCHEDULE_TABLE",
                  "TILEDATTENTION_SOURCE_REVISION")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # not installed under that distribution name
        return None


def _gpu() -> dict | None:
    if not torch.cuda.is_available():
        return None
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    info = {"name": p.name, "compute_capability": f"{p.major}.{p.minor}",
            "sm_count": p.multi_processor_count, "memory_bytes": p.total_memory,
            "uuid": str(getattr(p, "uuid", "")) or None}
    try:
        q = subprocess.run(["nvidia-smi", f"--id={i}", "--query-gpu=driver_version,"
                            "clocks.max.sm,clocks.max.mem,power.limit", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if q.returncode == 0:
            drv, sm, mem, power = (x.strip() for x in q.stdout.strip().split(","))
            info.update(driver=drv, max_sm_clock=sm, max_mem_clock=mem, power_limit=power)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    return info


def capture(config, *, started: str, finished: str | None = None) -> dict:
    from .. import __version__
    from ..kernel.toolchain import tileiras_path, tileiras_version

    # A tree shipped to a node may carry a stale .git (or none): an explicitly named
    # revision wins, and then the tree's dirtiness is unknown rather than guessed.
    revision = os.environ.get("TILEDATTENTION_SOURCE_REVISION")
    status = None if revision else _git("status", "--porcelain")
    return {
        "tiledattention": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_tile": _version("cuda-tile"),
        "tileiras": tileiras_version() if tileiras_path() else None,
        "triton": _version("triton"),
        "gpu": _gpu(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git_commit": revision or _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "config": config.as_dict(),
        "config_hash": config.digest(),
        # The rows' config_hash: bundle verify checks published rows against it.
        "measure_hash": config.measure_digest() if hasattr(config, "measure_digest") else None,
        "seed": config.seed,
        "started": started,
        "finished": finished,
        "environment": {k: os.environ[k] for k in _ENV_ALLOWLIST if k in os.environ},
    }


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
