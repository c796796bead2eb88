"""Result rows on disk: one JSON line per (point, method), appended whole and fsynced.

A process killed at any moment leaves at most a torn last line, which is skipped on
read (and its measurement redone); every complete line is a complete row. Lines that are
not a row (torn, not JSON, JSON but not an object) are counted in ``skipped_lines``.
Every row carries ``config_hash`` (``BenchConfig.measure_digest``): rows of one file must
share it, so a resume under a changed seed, timing or tolerance is refused, not mixed.
"""

from __future__ import annotations

import fcntl
import json
import os
import time

from ..errors import TiledAttentionError


class RowsError(TiledAttentionError, ValueError):
    """A results file cannot be used as asked: locked, mixed configs, or no rows."""


class ResultStore:
    def __init__(self, path: str):
        self.path = path
        self.rows: dict[tuple[str, str], dict] = {}
        self.skipped_lines = 0
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            for line in data.split(b"\n"):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.rows[(str(row["point_key"]), str(row["method"]))] = row
                except (ValueError, KeyError, TypeError):  # torn, not JSON, not an object
                    self.skipped_lines += 1
            if data and not data.endswith(b"\n"):
                # Terminate a torn tail so the next record starts on its own line.
                with open(path, "ab") as f:
                    f.write(b"\n")

    @property
    def torn_lines(self) -> int:  # the older name
        return self.skipped_lines

    def done(self, point_key: str, method: str) -> bool:
        return (point_key, method) in self.rows

    def append(self, row: dict) -> None:
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.rows[(row["point_key"], row["method"])] = row

    def other_configs(self, digest: str) -> dict[str, int]:
        """Rows per config hash other than ``digest`` (None: a row from before hashes)."""
        out: dict[str, int] = {}
        for r in self.rows.values():
            h = r.get("config_hash")
            if h != digest:
                out[str(h)] = out.get(str(h), 0) + 1
        return out

    def set_aside(self, digest: str) -> str:
        """Move this file to ``stale-<name>-<time>.jsonl`` (outside the ``rows-*`` glob) and
        keep only the rows measured under ``digest``; returns where the old file went."""
        head, name = os.path.split(self.path)
        aside = os.path.join(head, f"stale-{name[:-len('.jsonl')]}-{time.time_ns()}.jsonl")
        os.replace(self.path, aside)
        keep = [r for r in self.rows.values() if r.get("config_hash") == digest]
        self.rows = {}
        for r in keep:
            self.append(r)
        return aside


class Lock:
    """An exclusive flock on ``<dir>/.<name>.lock`` for as long as the ``with`` block runs;
    the file names its holder (host, pid, SLURM job). A second holder is refused at once,
    naming the holder and, for a SLURM job, its real state; a lock still held by a SLURM
    job that is no longer running (cancelled, ending) is waited for and reclaimed."""

    RECLAIM_S = 180.0  # a cancelled job's process may take SLURM's KillWait and more to end

    def __init__(self, path: str, log=None):
        head, name = os.path.split(path)
        self.target, self.path = path, os.path.join(head, f".{name}.lock")
        self.fd: int | None = None
        self.log = log

    def __enter__(self) -> Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not self._try():
            self._reclaim(_holder(self.fd))
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(_me()).encode(), 0)
        return self

    def _try(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _reclaim(self, holder: dict) -> None:
        job = holder.get("slurm_job")
        state = _job_state(job) if job else None
        if state is not None and state.state not in ("RUNNING", "PENDING", "SUSPENDED",
                                                     "REQUEUED", "CONFIGURING"):
            # The holder's job has ended (or is ending): its process lets go shortly.
            deadline = time.monotonic() + self.RECLAIM_S
            while time.monotonic() < deadline:
                time.sleep(1.0)
                if self._try():
                    if self.log is not None:
                        print(f"bench: reclaimed {self.path} from SLURM job {job} "
                              f"({state.state})", file=self.log, flush=True)
                    return
        os.close(self.fd)
        who = (f"SLURM job {job}, which is {state.state if state else 'of unknown state'}"
               if job else f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}")
        raise RowsError(f"another tiledattn bench is writing {self.target} ({who}; lock "
                        f"{self.path}); wait for it, scancel it, or use another --out")

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _me() -> dict:
    env = os.environ
    job = env.get("SLURM_JOB_ID")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"  # as squeue names it
    return {"host": os.uname().nodename, "pid": os.getpid(), "slurm_job": job}


def _holder(fd: int) -> dict:
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _job_state(job_id: str):
    from ..launchers.slurm_jobs import state_of

    return state_of(str(job_id))


def read_rows(path: str) -> list[dict]:
    """The complete rows of a results file, in file order, later duplicates winning."""
    return list(ResultStore(path).rows.values())


def check_one_config(rows: list[dict], where: str) -> None:
    """Refuse rows measured under different configs (``config_hash``), naming the hashes."""
    hashes: dict[str, int] = {}
    for r in rows:
        hashes[str(r.get("config_hash"))] = hashes.get(str(r.get("config_hash")), 0) + 1
    if len(hashes) > 1:
        listing = ", ".join(f"{h}: {n} rows" for h, n in sorted(hashes.items()))
        raise RowsError(f"{where}: rows measured under {len(hashes)} different configs "
                        f"({listing}); re-run the stale shards with one config "
                        "(tiledattn bench --remeasure) before publishing")
