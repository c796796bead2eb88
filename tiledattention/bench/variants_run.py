"""The variants stage: every variant of ``bench/variants.py`` against FlexAttention, SDPA with
a materialised mask and eager attention, through the one harness (``runner.measure``: L2
flushed before each timed call, methods interleaved over rounds, each row's output and
gradients checked against float64 on a slice of heads, kernel time and call latency).

Points: variant x S x D x dtype x pass, B = tokens // S and H = width // D as the paper's
grid. Rows go to ``rows.jsonl`` as they are measured (a killed job resumes; rows of another
config are set aside), next to ``manifest-variants.json``. Where no GPU is visible every row
is ``unavailable`` with the reason and the study goes on; where FlexAttention cannot run
(no Triton, an import error) its rows say why.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .config import VariantsConfig, stage_from_dict
from .grid import tokens_shape
from .variants import VariantPoint

ROWS = "rows.jsonl"
MANIFEST = "manifest-variants.json"


def points(cfg: VariantsConfig) -> list[VariantPoint]:
    """The stage's points, in the order they run: dtype, D, S, variant, pass (a variant's
    passes share its masks and compiled FlexAttention)."""
    from .variants import VARIANTS

    out = []
    for dtype in cfg.dtypes:
        for d in cfg.head_dims:
            for s in cfg.seqs:
                batch, heads = tokens_shape(s, d, tokens=cfg.tokens, width=cfg.width)
                for name in cfg.variants:
                    out += [VariantPoint(dtype, VARIANTS[name].causal, d, s, s, batch, heads,
                                         1, p, variant=name) for p in cfg.passes]
    return out


def _unavailable(plan, cfg: VariantsConfig, reason: str, store) -> None:
    from .manifest import now
    from .runner import FORMAT

    for p, methods in plan:
        for m in methods:
            if not store.done(p.key(), m):
                store.append({"format": FORMAT, "point_key": p.key(), **p.as_dict(),
                              "method": m, "seed": cfg.seed, "device": "cpu",
                              "status": "unavailable", "reason": reason, "recorded": now(),
                              "config_hash": cfg.measure_digest()})


def _forget_no_gpu_rows(store, log) -> None:
    """Rows recorded where no GPU was visible are measured now: the file goes aside
    (``stale-*``) with them, the measured rows are kept."""
    import time

    keep = [r for r in store.rows.values() if r.get("device") != "cpu"]
    if len(keep) == len(store.rows):
        return
    head, name = os.path.split(store.path)
    aside = os.path.join(head, f"stale-{name[:-len('.jsonl')]}-{time.time_ns()}.jsonl")
    os.replace(store.path, aside)
    open(store.path, "ab").close()
    store.rows, store._torn_tail = {}, False
    for r in keep:
        store.append(r)
    print(f"variants: rows recorded without a GPU moved to {aside}; measuring them",
          file=log, flush=True)


def run_variants(cfg: VariantsConfig, out_dir: str, log=None) -> dict:
    """Measure (or resume) the stage into ``out_dir``; returns its status."""
    log = log or sys.stderr
    from ..tune import no_gpu_reason
    from .manifest import capture, now
    from .runner import _resume, _write_json, measure, resolve_device
    from .store import Lock, ResultStore

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ROWS)
    plan = [(p, list(cfg.methods)) for p in points(cfg)]
    with Lock(path, log):
        store = ResultStore(path)
        open(path, "ab").close()  # the rule's output exists even if nothing is measured
        _resume(store, cfg.measure_digest(), True, log)  # rows of another config: aside
        started = now()
        manifest = os.path.join(out_dir, MANIFEST)
        _write_json(manifest, capture(cfg, started=started))
        reason = no_gpu_reason()
        print(f"variants: {len(plan)} points x {len(cfg.methods)} methods"
              + (f"; not run: {reason}" if reason else ""), file=log, flush=True)
        stopped = False
        try:
            if reason:
                _unavailable(plan, cfg, reason, store)
            else:
                _forget_no_gpu_rows(store, log)
                stopped = measure(plan, cfg.bench_config(), store, resolve_device("cuda"),
                                  log)
        finally:
            _write_json(manifest, capture(cfg, started=started, finished=now()))
        rows = list(store.rows.values())
        missing = missing_rows(plan, store)
    print(summary(rows), file=log, flush=True)
    if missing:  # never a silent gap: the status says which rows are not there, and why
        why = ("stopped by a signal (Ctrl-C or SIGTERM) before they were measured; run "
               "again to resume" if stopped else "the harness returned no row for them")
        msg = (f"{len(missing)} of {sum(len(m) for _, m in plan)} rows missing ({why}), "
               f"e.g. {', '.join(f'{k} {m}' for k, m in missing[:3])}")
        print(f"variants: {msg}", file=log, flush=True)
        return {"status": "incomplete", "reason": msg, "out": out_dir, "stopped": stopped}
    return {"status": "unavailable" if reason else "ok", "reason": reason, "out": out_dir}


def missing_rows(plan, store) -> list[tuple[str, str]]:
    """The (point key, method) pairs of ``plan`` that have no row in ``store``."""
    return [(p.key(), m) for p, methods in plan for m in methods if not store.done(p.key(), m)]


def load_rows(out_dir: str) -> list[dict]:
    """The stage's rows (bounded, regular file only); a line that is not a variants row is
    one StudyError naming the file and line. A resumed point keeps its last rows."""
    from ..safeio import read_row_objects

    rows = read_row_objects(os.path.join(out_dir, ROWS), "variants rows",
                            ("point_key", "method", "status", "variant", "pass"))
    return list({(r["point_key"], r["method"]): r for r in rows}.values())


def summary(rows: list[dict]) -> str:
    """Kernel time per row and the ratio to FlexAttention (> 1: tiledattention faster)."""
    from ..study.presentation.variants_report import ratio_rows

    lines = [f"{'variant':10s} {'dtype':9s} {'D':>4s} {'S':>6s} {'pass':8s} {'ours ms':>9s} "
             f"{'flex ms':>9s} {'x flex':>7s} {'x sdpa+mask':>11s}"]
    for r in ratio_rows(rows):
        lines.append(f"{r['variant']:10s} {r['dtype']:9s} {r['head_dim']:4d} {r['seq']:6d} "
                     f"{r['pass']:8s} {_cell(r['ours_ms'], 9)} {_cell(r['flex_ms'], 9)} "
                     f"{_cell(r['x_flex'], 7)} {_cell(r['x_sdpa_mask'], 11)}")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(lines)


def _cell(value, width: int) -> str:
    return f"{value:{width}.3f}" if isinstance(value, float) else f"{value or '—':>{width}s}"


@dataclass(frozen=True)
class VariantsTask:
    """``run_variants`` as a picklable job, so a launcher puts it on a GPU (a SLURM GPU
    node, a local GPU); the config travels as items and is validated again on the node."""

    out_dir: str
    config: tuple  # VariantsConfig.as_dict() items
    job_name: str = "tiledattn-variants"

    def __call__(self) -> dict:
        return run_variants(stage_from_dict("variants", dict(self.config)), self.out_dir)

