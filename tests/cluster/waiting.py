"""What the cluster tests share: polling for a condition with a deadline, and reading the
rows a job has written so far."""

from __future__ import annotations

import json
import time
from pathlib import Path


def wait_for(found, what: str, limit_s: float, poll_s: float = 0.5):
    """``found()``'s first truthy value, polled until ``limit_s`` (then the test fails)."""
    deadline = time.monotonic() + limit_s
    while not (value := found()):
        assert time.monotonic() < deadline, f"no {what} within {limit_s:.0f}s"
        time.sleep(poll_s)
    return value


def rows(path: Path) -> list[dict]:
    """The rows of a rows file (none while it does not exist yet)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(ln) for ln in text.split("\n") if ln.strip()]
