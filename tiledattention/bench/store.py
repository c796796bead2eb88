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
    a second holder is refused at once, not queued."""

    def __init__(self, path: str):
        head, name = os.path.split(path)
        self.target, self.path = path, os.path.join(head, f".{name}.lock")
        self.fd: int | None = None

    def __enter__(self) -> Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise RowsError(f"another tiledattn bench is writing {self.target} (lock "
                            f"{self.path}); wait for it or use another --out") from None
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


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
