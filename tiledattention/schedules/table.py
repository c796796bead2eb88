"""The persisted tuning table: the best schedule per shape bucket and GPU.

A JSON file (format ``tiledattention-schedule-table/1``) with one entry per bucket:
compute capability, dtype, head dim, causal, sequence bucket and GQA ratio, holding the
winning schedule, the runner-up and the sensitivity (how much slower the runner-up is).
An optional ``backward`` list holds the same per bucket for the backward's schedule
(``BwdSchedule`` labels, ranked by forward+backward TFLOP/s); tables without it load as
before, and readers that predate it ignore it. A backward winner that is not deterministic
(dQ reduce-added in fp32, whose addition order varies) carries the deterministic schedule
measured beside it as its runner-up: that one serves deterministic mode and nearest buckets.
A path ending in ``.gz`` is that JSON gzipped (the shipped tables: 20x smaller), written
without a timestamp, so the same table gives the same bytes.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from dataclasses import asdict, dataclass, field

from ..errors import TiledAttentionError
from ..safeio import UnsafeFileError, atomic_write, load_json, parse_json, read_bytes, write_json
from .backward import BwdSchedule
from .schedule import Schedule

FORMAT = "tiledattention-schedule-table/1"
S_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
TABLE_MAX = 16 << 20  # a full table of every GPU is well under 1 MiB


class TableError(TiledAttentionError, ValueError):
    """A schedule table file is missing, unreadable or malformed (the message names it)."""


def _read_gz(path: str):
    """A gzipped table's JSON: the file and what it unpacks to both capped at TABLE_MAX."""
    where = f"schedule table {path}"
    try:
        unpack = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
        text = unpack.decompress(read_bytes(path, cap=TABLE_MAX, what="schedule table"),
                                 TABLE_MAX + 1)
    except zlib.error as exc:
        raise TableError(f"{where}: not a gzip file ({exc})") from None
    if len(text) > TABLE_MAX:
        raise TableError(f"{where}: unpacks to more than the {TABLE_MAX} bytes allowed")
    if not unpack.eof:
        raise TableError(f"{where}: the gzip data is cut short")
    return parse_json(text, where)


def seq_bucket(seq_q: int, seq_kv: int) -> int:
    """Power-of-two bucket of the longer sequence, clamped to the tuned range."""
    s = max(seq_q, seq_kv, 1)
    b = 1 << (s - 1).bit_length()
    return min(max(b, S_BUCKETS[0]), S_BUCKETS[-1])


@dataclass(frozen=True)
class Bucket:
    cc: str  # compute capability, e.g. "9.0"
    dtype: str
    head_dim: int
    causal: bool
    s_bucket: int
    gqa: int = 1

    def distance(self, other: Bucket) -> float:
        """How far another bucket's schedule is expected to transfer (0 = same)."""
        if self.cc != other.cc:
            return math.inf
        return (4.0 * (self.causal != other.causal) + 1.0 * (self.dtype != other.dtype)
                + 2.0 * abs(math.log2(self.head_dim / other.head_dim))
                + 1.0 * abs(math.log2(self.s_bucket / other.s_bucket))
                + 0.5 * abs(math.log2(self.gqa / other.gqa)))


# What a table entry tunes, by its schedule's class: the table's list that holds it, how its
# schedules are written (the forward's as field mappings, the backward's as labels) and read.
_KINDS = {
    Schedule: ("entries", "entry", Schedule.as_dict, Schedule.from_dict),
    BwdSchedule: ("backward", "backward entry", BwdSchedule.label, BwdSchedule.from_label),
}


@dataclass(frozen=True)
class Entry:
    """The winner of one bucket, the runner-up and what was tried. It tunes the forward
    (``best`` a ``Schedule``, ranked by forward TFLOP/s) or the backward (a ``BwdSchedule``,
    by forward+backward TFLOP/s: the forward runs the table's own schedule in every
    candidate, so only the backward differs)."""

    bucket: Bucket
    best: Schedule | BwdSchedule
    best_tflops: float
    runner_up: Schedule | BwdSchedule | None = None
    runner_up_tflops: float | None = None
    gpu: str = ""
    candidates: int = 0
    failed: tuple[str, ...] = ()

    @property
    def backward(self) -> bool:
        return type(self.best) is BwdSchedule

    @property
    def sensitivity(self) -> float | None:
        """Fraction by which the runner-up is slower than the winner (Table 5 of the paper)."""
        if not self.runner_up_tflops:
            return None
        return 1.0 - self.runner_up_tflops / self.best_tflops

    @property
    def deterministic(self) -> BwdSchedule | None:
        """The best deterministic backward schedule measured for the bucket."""
        return self.best if self.best.deterministic else self.runner_up

    def to_json(self) -> dict:
        write = _KINDS[type(self.best)][2]
        d = {"bucket": asdict(self.bucket), "best": write(self.best),
             "best_tflops": round(self.best_tflops, 2), "gpu": self.gpu,
             "candidates": self.candidates, "failed": list(self.failed)}
        if self.runner_up is not None:
            d.update(runner_up=write(self.runner_up),
                     runner_up_tflops=round(self.runner_up_tflops, 2))
            if not self.backward:  # Table 5 publishes the forward's
                d.update(sensitivity=round(self.sensitivity, 4))
        return d

    @classmethod
    def from_json(cls, d: dict, kind: type = Schedule) -> Entry:
        """The entry of ``kind`` (its schedule's class) written by :meth:`to_json`."""
        _check_tflops(d)
        read = _KINDS[kind][3]
        entry = cls(bucket=Bucket(**d["bucket"]), best=read(d["best"]),
                    best_tflops=float(d["best_tflops"]),
                    runner_up=read(d["runner_up"]) if d.get("runner_up") else None,
                    runner_up_tflops=d.get("runner_up_tflops"), gpu=d.get("gpu", ""),
                    candidates=int(d.get("candidates", 0)), failed=tuple(d.get("failed", ())))
        if entry.backward and (entry.deterministic is None
                               or not entry.deterministic.deterministic):
            raise ValueError(f"best {d['best']!r} is not deterministic and its runner_up is "
                             "no deterministic schedule")
        return entry




def _check_tflops(d: dict) -> None:
    """A tuned TFLOP/s is a finite number > 0 (Table 5 publishes it)."""
    for key in ("best_tflops", "runner_up_tflops", "sensitivity"):
        value = d.get(key)
        if value is None and key != "best_tflops":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value) or value < 0 or (value == 0 and key != "sensitivity"):
            raise ValueError(f"{key} is {value!r}, not a finite number > 0")


def _nearest(entries: dict, bucket: Bucket):
    """(entry's best, how) for the exact bucket, else the nearest one on the same GPU."""
    if bucket in entries:
        return entries[bucket].best, "exact"
    best = min(entries, key=bucket.distance, default=None)
    if best is None or math.isinf(bucket.distance(best)):
        return None
    return entries[best].best, "nearest"


def _ordered(entries: dict) -> list:
    return sorted(entries.values(), key=lambda e: tuple(str(v) for v in
                                                        asdict(e.bucket).values()))


@dataclass
class ScheduleTable:
    entries: dict[Bucket, Entry] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    source: str = "<memory>"
    backward: dict[Bucket, Entry] = field(default_factory=dict)

    def lookup(self, bucket: Bucket) -> tuple[Schedule, str] | None:
        """(schedule, how) for the exact bucket, else the nearest one on the same GPU."""
        return _nearest(self.entries, bucket)

    def lookup_bwd(self, bucket: Bucket, deterministic: bool = False, accept=None
                   ) -> tuple[BwdSchedule, str] | None:
        """The backward's (schedule, how), found as :meth:`lookup` finds the forward's. A
        winner that is not deterministic serves its own bucket only (where it was measured
        faster) and not under ``deterministic``; elsewhere its entry's deterministic
        schedule stands in, or, where ``accept(schedule)`` says that one cannot run this
        bucket's head dim, the entry's deterministic runner-up."""
        if bucket in self.backward:
            entry = self.backward[bucket]
            return (entry.deterministic if deterministic else entry.best), "exact"
        near = min(self.backward, key=bucket.distance, default=None)
        if near is None or math.isinf(bucket.distance(near)):
            return None
        entry = self.backward[near]
        spare = entry.runner_up
        if (accept is not None and not accept(entry.deterministic) and spare is not None
                and spare.deterministic and accept(spare)):
            return spare, "nearest"
        return entry.deterministic, "nearest"

    def add(self, entry: Entry) -> None:
        (self.backward if entry.backward else self.entries)[entry.bucket] = entry

    def to_json(self) -> dict:
        d = {"format": FORMAT, "meta": self.meta,
             "entries": [e.to_json() for e in _ordered(self.entries)]}
        if self.backward:
            d["backward"] = [e.to_json() for e in _ordered(self.backward)]
        return d

    def save(self, path: str) -> None:
        if not path.endswith(".gz"):
            write_json(path, self.to_json(), indent=1)  # readers never see a half table
            return
        text = json.dumps(self.to_json(), indent=1).encode()
        with atomic_write(path, "wb") as f:
            f.write(gzip.compress(text, compresslevel=9, mtime=0))

    @classmethod
    def load(cls, path: str) -> ScheduleTable:
        try:  # a FIFO, /dev/zero or JSON nested a million deep: one TableError
            data = _read_gz(path) if path.endswith(".gz") else load_json(
                path, cap=TABLE_MAX, what="schedule table")
        except UnsafeFileError as exc:
            raise TableError(str(exc)) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise TableError(f"schedule table {path}: 'format' must be {FORMAT!r}")
        if not isinstance(data.get("meta", {}), dict):
            raise TableError(f"schedule table {path}: 'meta' must be a mapping")
        table = cls(meta=data.get("meta", {}), source=path)
        for kind, (key, what, _, _) in _KINDS.items():
            if not isinstance(data.get(key, []), list):
                raise TableError(f"schedule table {path}: {key!r} must be a list")
            for i, raw in enumerate(data.get(key, [])):
                try:
                    table.add(Entry.from_json(raw, kind))
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise TableError(f"schedule table {path}: {what} {i} is malformed "
                                     f"({exc})") from exc
        return table
