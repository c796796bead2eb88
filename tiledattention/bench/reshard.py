"""A changed shard count on an existing results directory: the rows already measured are
dealt out to the new shards (as ``grid.shard`` deals the points), so nothing measured is
measured again and no directory ever holds rows files of two counts.

The old files move whole to ``resharded-of<n>-<time>/`` (outside the ``rows-shard*``
glob that aggregate reads); their run manifests stay, since their runs measured the rows.
Done under one directory lock, holding every rows file's own lock, so concurrent sweeps
(one per Snakemake shard job) re-shard once and no running shard is pulled from under.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import time

from .grid import expand
from .store import Lock, ResultStore

_ROWS = re.compile(r"^rows-shard(\d+)of(\d+)\.jsonl$")


def counts(out_dir: str) -> set[int]:
    """The shard counts of the rows files in ``out_dir``."""
    found = (_ROWS.match(os.path.basename(p))
             for p in glob.glob(os.path.join(out_dir, "rows-shard*of*.jsonl")))
    return {int(m.group(2)) for m in found if m}


def reshard(cfg, out_dir: str, count: int, log) -> bool:
    """Deal the rows of other shard counts in ``out_dir`` into ``count`` shards; True if
    anything was moved. A rows file being written (its lock held) refuses the change."""
    if not os.path.isdir(out_dir) or counts(out_dir) <= {count}:
        return False
    with open(os.path.join(out_dir, ".reshard.lock"), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # the next sweep waits, then finds it done
        old = sorted(p for p in glob.glob(os.path.join(out_dir, "rows-shard*of*.jsonl"))
                     if int(_ROWS.match(os.path.basename(p)).group(2)) != count)
        if not old:
            return False
        with contextlib.ExitStack() as locks:
            for path in old:
                locks.enter_context(Lock(path, log))
            _deal(cfg, out_dir, count, old, log)
    return True


def _deal(cfg, out_dir: str, count: int, old: list[str], log) -> None:
    owner = {p.key(): i % count for i, p in enumerate(expand(cfg))}  # as grid.shard deals
    new = {j: ResultStore(os.path.join(out_dir, f"rows-shard{j}of{count}.jsonl"))
           for j in range(count)}
    moved = outside = 0
    for path in old:
        for (key, method), row in ResultStore(path).rows.items():
            j = owner.get(key)
            if j is None:
                outside += 1  # a point of another grid: kept with the old file only
            elif not new[j].done(key, method):
                new[j].rows[(key, method)] = row
                moved += 1
    for store in new.values():  # temp + rename: never a half-written rows file
        tmp = f"{store.path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in store.rows.values())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, store.path)
    was = sorted({int(_ROWS.match(os.path.basename(p)).group(2)) for p in old})
    aside = os.path.join(out_dir, f"resharded-of{'-'.join(map(str, was))}-{time.time_ns()}")
    os.makedirs(aside)
    for path in old:
        os.replace(path, os.path.join(aside, os.path.basename(path)))
    for n in was:  # a marker says "this shard of n is complete": no longer true
        for marker in glob.glob(os.path.join(out_dir, f"shard*of{n}.done")):
            os.remove(marker)
    kept = f"; {outside} rows of points outside this grid stay there" if outside else ""
    print(f"sweep: re-sharded {moved} measured rows of the {'/'.join(map(str, was))}-shard "
          f"run into {count} shards (nothing is measured again; the old files are in "
          f"{aside}{kept})", file=log, flush=True)
