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
import math
import os
import time

from ..errors import TiledAttentionError
from ..safeio import ROWS_MAX, read_bytes


class RowsError(TiledAttentionError, ValueError):
    """A results file cannot be used as asked: locked, mixed configs, or no rows."""


class ResultStore:
    def __init__(self, path: str):
        self.path = path
        self.rows: dict[tuple[str, str], dict] = {}
        self.skipped_lines = 0
        # (point_key, method) given twice with different values: the later line is kept
        # here (as before), and publishing refuses the file (``check_rows``).
        self.conflicts: list[tuple[str, str]] = []
        if os.path.lexists(path):
            data = read_bytes(path, cap=ROWS_MAX, what="rows file")
            for line in data.split(b"\n"):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    key = (str(row["point_key"]), str(row["method"]))
                except (ValueError, KeyError, TypeError, RecursionError):
                    self.skipped_lines += 1  # torn, not JSON, too deep, not an object
                    continue
                if key in self.rows and self.rows[key] != row:
                    self.conflicts.append(key)
                self.rows[key] = row
            # A torn tail is terminated before the next record (reading never writes).
            self._torn_tail = bool(data) and not data.endswith(b"\n")

    @property
    def torn_lines(self) -> int:  # the older name
        return self.skipped_lines

    def done(self, point_key: str, method: str) -> bool:
        return (point_key, method) in self.rows

    _torn_tail = False

    def append(self, row: dict) -> None:
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        if self._torn_tail:  # so this record starts on its own line
            line, self._torn_tail = b"\n" + line, False
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
        self.rows, self._torn_tail = {}, False
        for r in keep:
            self.append(r)
        return aside


def ensure_unlocked(path: str) -> None:
    """Refuse at once (RowsError, one line) when a bench holds ``path``'s lock: a check
    before jobs are submitted; each job still takes the lock itself."""
    with Lock(path):
        pass


class Lock:
    """An exclusive flock on ``<dir>/.<name>.lock`` for as long as the ``with`` block runs;
    the file names its holder (host, pid, SLURM job). A second holder is refused at once,
    naming the holder and, for a SLURM job, its real state; a lock still held by a SLURM
    job that is no longer running (cancelled, ending) is waited for and reclaimed."""

    RECLAIM_S = 180.0  # a cancelled job's process may take SLURM's KillWait and more to end

    def __init__(self, path: str, log=None, what: str = "tiledattn bench"):
        head, name = os.path.split(path)
        self.target, self.path = path, os.path.join(head, f".{name}.lock")
        self.what = what
        self.fd: int | None = None
        self.log = log

    def __enter__(self) -> Lock:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RowsError(f"{self.path}: cannot create the lock ({exc.strerror})") from None
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
        raise RowsError(f"another {self.what} is writing {self.target} ({who}; lock "
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


# Row fields that hold a number when present (flattened names), and which of them must be
# above zero: a timing of 0 is an infinite throughput, a shape of 0 no point at all.
SHAPE_FIELDS = ("head_dim", "seq_q", "seq_kv", "batch", "heads", "gqa")
TIME_FIELDS = ("time_ms.median_ms", "time_ms.mean_ms", "time_ms.min_ms", "time_ms.p95_ms",
               "call_us")
# A non-finite output makes these errors NaN or infinite: in a row that is not ok that is the
# measurement (why the row is wrong), not a fault of the file.
ERROR_FIELDS = ("rel_err", "max_abs_err", "grad_rel_err.dq", "grad_rel_err.dk",
                "grad_rel_err.dv")
NUMBER_FIELDS = SHAPE_FIELDS + TIME_FIELDS + ERROR_FIELDS + (
    "tflops", "tokens_per_s", "gbytes_per_s", "flops", "bytes_moved", "rtol",
    "time_ms.std_ms", "time_ms.reps", "call_calls", "seed", "sm_clock_mhz")


def _leaves(row: dict, prefix: str = ""):
    for key, value in row.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def row_problem(row: dict, point: bool = False) -> str | None:
    """Why ``row`` cannot be published (a missing or mistyped field, a number that is not
    finite or not physical), or None. Every number in a row is a count, a size, a time, a
    rate or an error: finite and >= 0; shapes and an ok row's times and TFLOP/s are > 0.
    With ``point`` (the tables and figures group rows by them) the point's fields must be
    there too."""
    for need in ("point_key", "method", "status") + (("dtype",) if point else ()):
        if not isinstance(row.get(need), str) or not row[need]:
            return f"{need!r} is missing or not a non-empty string"
    if point:
        if not isinstance(row.get("causal"), bool):
            return "'causal' is missing or not true/false"
        missing = [f for f in SHAPE_FIELDS if f not in row]
        if missing:
            return f"point field(s) {missing} missing"  # None is refused below
    for name, value in _leaves(row):
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            measured_wrong = name in ERROR_FIELDS and row["status"] != "ok" and (
                math.isnan(value) or value == math.inf)
            if not measured_wrong and (not math.isfinite(value) or value < 0):
                return f"{name} is {value!r} (must be finite and >= 0)"
        elif name in NUMBER_FIELDS:
            return f"{name} is {value!r}, not a number"
    for name in SHAPE_FIELDS:
        value = row.get(name)
        if (value is not None or point) and (isinstance(value, bool)
                                             or not isinstance(value, int) or value < 1):
            return f"{name} is {value!r} (must be an integer >= 1)"
    if row["status"] == "ok":
        flat = dict(_leaves(row))
        for name in TIME_FIELDS + ("tflops",):
            if flat.get(name) is not None and flat[name] <= 0:
                return f"{name} is {flat[name]!r} in an ok row (must be > 0)"
    return None


def check_rows(rows: list[dict], where: str, conflicts: list[tuple[str, str]] = (),
               point: bool = False) -> None:
    """Refuse rows that cannot be published, in one line naming the first few and why:
    unphysical or mistyped values (``row_problem``) and (point, method) pairs given twice
    with different values. Nothing is dropped or picked silently."""
    bad = [(r.get("point_key"), r.get("method"), why) for r in rows
           if (why := row_problem(r, point)) is not None]
    bad += [(k, m, "given more than once with different values") for k, m in conflicts]
    if bad:
        listing = "; ".join(f"{k} {m}: {why}" for k, m, why in bad[:3])
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise RowsError(f"{where}: {len(bad)} row(s) cannot be published: {listing}{more}; "
                        "delete those lines from the shard's rows file and run the shard "
                        "again to measure them anew")
