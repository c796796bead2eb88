"""Machine-wide GPU reservations for local shards: one lock file per GPU.

Shards of one sweep, and of concurrent Snakemake jobs, each hold an exclusive ``flock`` on
the GPU they run on, so two shards never share a GPU whatever order they start in. A
lock dies with its process, so a crashed sweep frees its GPU.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time

LOCK_DIR = os.path.join(tempfile.gettempdir(), f"tiledattn-gpu-locks-{os.getuid()}")


class GPUReservation:
    def __init__(self, gpu: str, handle):
        self.gpu, self._handle = gpu, handle

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


def reserve(gpus: list[str], *, timeout_s: float | None = None, poll_s: float = 0.5,
            lock_dir: str | None = None) -> GPUReservation:
    """Block until one of ``gpus`` is free, and hold it."""
    from .base import LauncherError

    lock_dir = lock_dir or LOCK_DIR
    os.makedirs(lock_dir, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        for gpu in gpus:
            handle = open(os.path.join(lock_dir, f"gpu{gpu}.lock"), "a")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return GPUReservation(gpu, handle)
        if deadline is not None and time.monotonic() > deadline:
            raise LauncherError(f"no free GPU among {gpus} within {timeout_s:.0f}s")
        time.sleep(poll_s)
