"""Result rows on disk: one JSON line per (point, method), appended whole and fsynced.

A process killed at any moment leaves at most a torn last line, which is skipped on
read (and its measurement redone); every complete line is a complete row.
"""

from __future__ import annotations

import json
import os


class ResultStore:
    def __init__(self, path: str):
        self.path = path
        self.rows: dict[tuple[str, str], dict] = {}
        self.torn_lines = 0
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            for line in data.split(b"\n"):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    self.rows[(row["point_key"], row["method"])] = row
                except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
                    self.torn_lines += 1
            if data and not data.endswith(b"\n"):
                # Terminate a torn tail so the next record starts on its own line.
                with open(path, "ab") as f:
                    f.write(b"\n")

    def done(self, point_key: str, method: str) -> bool:
        return (point_key, method) in self.rows

    def append(self, row: dict) -> None:
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        with open(self.path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.rows[(row["point_key"], row["method"])] = row


def read_rows(path: str) -> list[dict]:
    """The complete rows of a results file, in file order, later duplicates winning."""
    return list(ResultStore(path).rows.values())
