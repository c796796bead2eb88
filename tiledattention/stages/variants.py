"""The variants stage: every variant of ``bench/variant_cases.py`` against FlexAttention, SDPA with
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

from ..bench.config import INT32, option
from ..bench.grid import PAPER_DTYPES, TOKENS, WIDTH, tokens_shape
from ..bench.methods import methods_help, variant_methods
from ..bench.variant_cases import VARIANT_NAMES, VariantPoint
from .base import TimedSection, measured_rows, measured_run, measured_stage
from .summary import by_point, cell, median_ms, status_counts, time_or_status

VARIANT_METHODS = tuple(variant_methods())  # bench/methods.py: those with variants=True
VARIANT_PASSES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class VariantsConfig(TimedSection):
    """Variants against FlexAttention and SDPA, one launcher job (`tiledattn variants`)."""

    stage = "variants"

    enabled: bool = option(False, "Time each variant (tiledattention's built-in, through the "
                           "public API) against FlexAttention, SDPA with the variant as a "
                           "materialised mask and eager attention, as one launcher job; where "
                           "the job finds no GPU its rows say why.")
    variants: tuple[str, ...] = option(VARIANT_NAMES, "Variants measured (bench/variant_cases.py's "
                                       "registry).", choices=VARIANT_NAMES, unique=True,
                                       flag="--variants")
    methods: tuple[str, ...] = option(VARIANT_METHODS, f"Methods compared - "
                                      f"{methods_help(VARIANT_METHODS)}. A baseline that "
                                      "cannot run a variant has a row saying why.",
                                      choices=VARIANT_METHODS, unique=True, flag="--methods")
    seqs: tuple[int, ...] = option((1024, 2048, 4096, 8192, 16384), "Sequence lengths S.",
                                   min=1, max=INT32, unique=True, flag="--seqs")
    head_dims: tuple[int, ...] = option((64, 128), "Head dims D.", min=8, max=256, unique=True,
                                        flag="--head-dims")
    dtypes: tuple[str, ...] = option(PAPER_DTYPES, "Element types.", choices=PAPER_DTYPES,
                                     unique=True, flag="--dtypes")
    passes: tuple[str, ...] = option(VARIANT_PASSES, "fwd, the forward; fwd+bwd, forward and "
                                     "backward (a training step's attention).",
                                     choices=VARIANT_PASSES, unique=True, flag="--passes")
    tokens: int = option(TOKENS, "B*S (B = tokens // S, as the paper's grid).", min=1,
                         max=INT32, flag="--tokens")
    width: int = option(WIDTH, "H*D (H = width // D).", min=8, max=INT32, flag="--width")
    warmup: int = option(5, "Untimed calls before the first round (FlexAttention compiles "
                         "in the point's correctness call, before them).", min=0, max=10**6,
                         flag="--warmup")
    reps: int = option(20, "Timed calls per method, over all rounds.", min=1, max=10**6,
                       flag="--reps")
    rounds: int = option(2, "Rounds, methods interleaved, order alternating.", min=1,
                         max=10**4, flag="--rounds")
    max_ref_heads: int = option(1, "Heads of batch 0 checked against the float64 reference "
                                "(forward and gradients), every row (its S x S float64 "
                                "scores: 2 GiB a head at S 16k).", min=1, max=INT32,
                                flag="--max-ref-heads")
    seed: int = option(0, "Seed of the inputs.", min=0, max=2**63 - 1, flag="--seed")


def points(cfg: VariantsConfig) -> list[VariantPoint]:
    """The stage's points, in the order they run: dtype, D, S, variant, pass (a variant's
    passes share its masks and compiled FlexAttention)."""
    from ..bench.variant_cases import VARIANTS

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
    from ..bench.manifest import now
    from ..bench.runner import FORMAT

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
    from ..bench.runner import measure, no_gpu_reason, resolve_device

    log = log or sys.stderr
    plan = [(p, list(cfg.methods)) for p in points(cfg)]
    reason = no_gpu_reason()

    def measure_rows(store) -> bool:
        if reason:
            _unavailable(plan, cfg, reason, store)
            return False
        _forget_no_gpu_rows(store, log)
        return measure(plan, cfg.bench_config(), store, resolve_device("cuda"), log)

    header = (f"{len(plan)} points x {len(cfg.methods)} methods"
              + (f"; not run: {reason}" if reason else ""))
    return measured_run(cfg, out_dir, plan, cfg.measure_digest(), header, measure_rows,
                        summary, reason, log)


def load_rows(out_dir: str) -> list[dict]:
    """The stage's rows (``measured_rows``: its variant and pass named in each)."""
    return measured_rows(out_dir, "variants", ("variant", "pass"))


def summary(rows: list[dict]) -> str:
    """Kernel time per point and the ratio to FlexAttention and to SDPA + mask (> 1:
    tiledattention faster); a method that did not run shows its status."""
    lines = [f"{'variant':10s} {'dtype':9s} {'D':>4s} {'S':>6s} {'pass':8s} {'ours ms':>9s} "
             f"{'flex ms':>9s} {'x flex':>7s} {'x sdpa+mask':>11s}"]
    for cells in sorted(by_point(rows).values(), key=_order):
        p = next(iter(cells.values()))
        ours, flex, sdpa = (median_ms(cells.get(m)) for m in ("tiledattention", "flex",
                                                              "sdpa_mask"))
        lines.append(f"{p['variant']:10s} {p['dtype']:9s} {p['head_dim']:4d} {p['seq_q']:6d} "
                     f"{p.get('pass', 'fwd'):8s} "
                     f"{cell(time_or_status(cells, 'tiledattention'), 9)} "
                     f"{cell(time_or_status(cells, 'flex'), 9)} "
                     f"{cell(flex / ours if ours and flex else None, 7)} "
                     f"{cell(sdpa / ours if ours and sdpa else None, 11)}")
    return "\n".join([*lines, status_counts(rows)])


def _order(cells: dict) -> tuple:
    """The summary's order: variant (the registry's), dtype, D, forward first, S."""
    p = next(iter(cells.values()))
    v = p["variant"]
    return (VARIANT_NAMES.index(v) if v in VARIANT_NAMES else len(VARIANT_NAMES), p["dtype"],
            p["head_dim"], p.get("pass", "fwd") != "fwd", p["seq_q"])


# `tiledattn variants --help`
HELP = ("each attention variant (sliding window, softcap, ALiBi, documents, prefix-LM) "
        "against FlexAttention, SDPA with a materialised mask and eager attention, forward "
        "and forward+backward; records why when it cannot run (resumable)")


STAGE = measured_stage(VariantsConfig, run_variants, load_rows, summary, HELP,
                       verbs=(("aggregate", "the variants table"),
                              ("figures", "the variants figure")),
                       key="variant", compared=True)
