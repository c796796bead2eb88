"""Which schedule a call gets: the explicit one, else the tuning table, else a default;
the same for the backward's schedule (``choose_bwd_schedule``).

The active table is the one shipped for the GPUs we measured, or a user's own, set with
``set_schedule_table(path)`` or, once per process, ``$TILEDATTENTION_SCHEDULE_TABLE``.
Lookups are cached per bucket, so the call path pays one dict lookup.

The backward's choice also follows ``torch.use_deterministic_algorithms``: where the table's
winner adds dQ in fp32 in a varying order (``BwdSchedule.deterministic`` false), deterministic
mode gets the deterministic schedule measured beside it.
"""

from __future__ import annotations

import functools
import os
from importlib import resources

import torch

from .backward import BwdSchedule, bwd_rejection, default_bwd_schedule, key_rows_bwd_schedule
from .schedule import Schedule, default_schedule
from .space import rejection
from .table import Bucket, ScheduleTable, seq_bucket

ENV_VAR = "TILEDATTENTION_SCHEDULE_TABLE"
_state: dict = {"table": None, "generation": 0}


def shipped_table_paths() -> list[str]:
    root = resources.files(__package__) / "tables"
    return sorted(str(p) for p in root.iterdir() if p.name.endswith((".json", ".json.gz")))


def _load_active() -> ScheduleTable:
    path = os.environ.get(ENV_VAR)
    if path:
        return ScheduleTable.load(path)
    merged = ScheduleTable(source="shipped")
    for p in shipped_table_paths():
        table = ScheduleTable.load(p)
        for entry in (*table.entries.values(), *table.backward.values()):
            merged.add(entry)
    return merged


def active_table() -> ScheduleTable:
    if _state["table"] is None:
        _state["table"] = _load_active()
    return _state["table"]


def set_schedule_table(path: str | None) -> ScheduleTable:
    """Use the table at ``path`` from now on (None: back to the shipped tables)."""
    _state["table"] = ScheduleTable.load(path) if path else None
    _state["generation"] += 1
    _choose.cache_clear()
    _choose_bwd.cache_clear()
    return active_table()


def generation() -> int:
    """Counts ``set_schedule_table`` calls: part of every cached launch plan's key."""
    return _state["generation"]


@functools.cache
def _choose(bucket: Bucket) -> tuple[Schedule, str]:
    found = active_table().lookup(bucket)
    if found is not None and rejection(found[0], bucket.head_dim) is None:
        return found
    return default_schedule(bucket.head_dim, bucket.causal), "default"


@functools.cache
def _choose_bwd(bucket: Bucket, deterministic: bool) -> tuple[BwdSchedule, str]:
    found = active_table().lookup_bwd(
        bucket, deterministic, accept=lambda s: bwd_rejection(s, bucket.head_dim) is None)
    if found is not None and bwd_rejection(found[0], bucket.head_dim) is None:
        return found
    return default_bwd_schedule(bucket.head_dim, bucket.causal), "default"


@functools.cache
def _capability(index: int) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"{major}.{minor}"


def bucket_for(*, cc: str, dtype: torch.dtype, head_dim: int, causal: bool, seq_q: int,
               seq_kv: int, gqa: int) -> Bucket:
    return Bucket(cc, str(dtype).removeprefix("torch."), head_dim, causal,
                  seq_bucket(seq_q, seq_kv), gqa)


def _call_bucket(q: torch.Tensor, k: torch.Tensor, causal: bool) -> Bucket:
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return bucket_for(cc=_capability(index), dtype=q.dtype, head_dim=q.shape[3],
                      causal=causal, seq_q=q.shape[2], seq_kv=k.shape[2],
                      gqa=q.shape[1] // k.shape[1])


def choose_schedule(q: torch.Tensor, k: torch.Tensor, causal: bool) -> tuple[Schedule, str]:
    """(schedule, "exact" | "nearest" | "default") for a call on CUDA tensors."""
    return _choose(_call_bucket(q, k, causal))


def choose_bwd_schedule(q: torch.Tensor, k: torch.Tensor, causal: bool,
                        deterministic: bool | None = None, *,
                        variant: bool = False) -> tuple[BwdSchedule, str]:
    """The backward's (schedule, "exact" | "nearest" | "default"): the table's backward
    entry of the bucket, else the nearest one, else ``default_bwd_schedule`` (also where
    the table's pick does not fit the head dim, ``bwd_rejection``). ``deterministic``
    (None: ``torch.are_deterministic_algorithms_enabled()``) rules out schedules whose
    dQ differs from run to run (``ScheduleTable.lookup_bwd``). ``variant`` (a score_mod,
    mask_mod or block mask): ``key_rows_bwd_schedule``, measured on the variants
    (benchmarks/notes/variants.md §45a); the table's entries were tuned on plain attention,
    and its 128-key non-causal pick ran prefix-LM's backward 2x slower than the default
    (benchmarks/notes/study-pipeline.md §32)."""
    if variant:
        return key_rows_bwd_schedule(q.shape[3], causal), "default"
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return _choose_bwd(_call_bucket(q, k, causal), deterministic)
