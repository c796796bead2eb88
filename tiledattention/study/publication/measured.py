"""What a bundle says it measured, from its rows and manifest: the abstract (the methods as
the rows name them), a title that tells the systems apart, the points by kind and pass, the
spread of the repeated calls and the cuDNN twin as a noise check, why the runs' stacks
differ, and how to cite it. The README (prose.py), CITATION.cff and .zenodo.json
(metadata.py) say the same."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics

from .metadata import PAPER, Publication

SUBJECT = "tiledattention"
DEFAULT_DESCRIPTION = Publication.__dataclass_fields__["description"].default


def _methods(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(the baselines with an ok row, those with none), registry order, as the rows name
    them."""
    from ...bench.methods import METHODS

    seen = {r.get("method") for r in rows}
    ok = {r.get("method") for r in rows if r.get("status") == "ok"}
    order = [m for m in METHODS if m in seen and m != SUBJECT]
    order += sorted(m for m in seen - set(METHODS) - {SUBJECT} if isinstance(m, str))
    return [m for m in order if m in ok], [m for m in order if m not in ok]


def _what(method: str) -> str:
    from ...bench.methods import METHODS

    m = METHODS.get(method)
    return f"`{method}` ({m.description})" if m else f"`{method}`"


def abstract(rows: list[dict], gpu: str | None) -> str:
    """The default abstract: the kernel against each baseline the rows measured, named as
    in the rows (no method the rows lack), and those that never ran."""
    ran, not_ran = _methods(rows)
    where = f" on {gpu}" if gpu else " on the CPU (no GPU)"
    text = ("Benchmark of the TiledAttention cuTile scaled-dot-product-attention kernel "
            f"(`{SUBJECT}`){where} against " + ("; ".join(_what(m) for m in ran) or
                                                 "no baseline that ran") + ".")
    if not_ran:
        text += (" Measured but never ok (see the README's What did not run): "
                 + "; ".join(_what(m) for m in not_ran) + ".")
    return text


def system_title(title: str, gpu: str | None) -> str:
    """The title with the system in it (two bundles of one study on two GPUs must differ on
    Zenodo): the GPU's name appended unless the title already names it."""
    name = gpu or "CPU (no GPU)"
    return title if name in title else f"{title} ({name})"


def for_study(pub: Publication, rows: list[dict], gpu: str | None) -> Publication:
    """The publication as this bundle states it: its title naming the system and, where the
    config gave no description, the abstract from the rows."""
    return dataclasses.replace(
        pub, title=system_title(pub.title, gpu),
        description=abstract(rows, gpu) if pub.description == DEFAULT_DESCRIPTION
        else pub.description)


def points_by_kind(rows: list[dict]) -> str:
    """"200 prefill (100 forward, 100 forward+backward), 63 decode (63 forward)": the
    points apart by kind (decode: Sq < Skv) and pass."""
    names = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward+backward"}
    kinds: dict[str, dict[str, set]] = {}
    for r in rows:
        kind = "decode" if r.get("seq_q") != r.get("seq_kv") else "prefill"
        kinds.setdefault(kind, {}).setdefault(r.get("pass", "fwd"), set()).add(
            r.get("point_key"))
    parts = []
    for kind in ("prefill", "decode"):
        if kind in kinds:
            by = kinds[kind]
            parts.append(f"{sum(len(v) for v in by.values())} {kind} (" + ", ".join(
                f"{len(by[p])} {names.get(p, p)}" for p in names if p in by) + ")")
    return ", ".join(parts)


def _q(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def spread(rows: list[dict]) -> str | None:
    """The spread of the repeated calls behind each row (std ÷ mean of its timed calls) and
    the cuDNN twin: cuDNN timed twice at a point, as ``cudnn`` and through ``torch_sdpa``'s
    dispatch where it picked cuDNN, whose time ratio is pure noise. None without ok rows."""
    ok = [r for r in rows if r.get("status") == "ok" and (r.get("time_ms") or {}).get("mean_ms")]
    if not ok:
        return None
    timing = ok[0].get("timing") or {}
    cv = sorted(r["time_ms"].get("std_ms", 0.0) / r["time_ms"]["mean_ms"] for r in ok)
    text = (f"Spread: each row's time is the median of {timing.get('reps', '?')} timed calls "
            f"per round × {timing.get('rounds', '?')} rounds; their standard deviation ÷ mean "
            f"is {100 * statistics.median(cv):.1f}% at the median row and "
            f"{100 * _q(cv, 0.95):.1f}% at the 95th percentile ({len(cv)} ok rows).")
    idx = {(r["point_key"], r["method"]): r for r in ok}
    twin = sorted(r["time_ms"]["median_ms"] / c["time_ms"]["median_ms"]
                  for (k, m), r in idx.items()
                  if m == "torch_sdpa" and (r.get("details") or {}).get("backend") == "cudnn"
                  and (c := idx.get((k, "cudnn"))) and c["time_ms"].get("median_ms"))
    if twin:
        off = sum(abs(x - 1) > 0.05 for x in twin)
        text += (f" Noise check: cuDNN timed twice at {len(twin)} points (as `cudnn`, and "
                 "through `torch_sdpa`, whose dispatch picked cuDNN): time ratio median "
                 f"{statistics.median(twin):.3f}, 5th–95th percentile {_q(twin, 0.05):.3f}–"
                 f"{_q(twin, 0.95):.3f}, min {twin[0]:.3f}, max {twin[-1]:.3f}; {off} "
                 "point(s) beyond ±5%.")
    return text


def stack_line(manifest: dict) -> str:
    """The README's "one software stack" bullet, with why not where the runs differ."""
    if manifest.get("consistent"):
        return "- One software stack and GPU across all runs: yes"
    diffs = manifest.get("mismatches") or {}
    why = "; ".join(f"{k}: {', '.join(str(v)[:12] for v in vals)}"
                    for k, vals in diffs.items() if isinstance(vals, list))
    return ("- One software stack and GPU across all runs: NO — the runs differ in "
            + (why or "what manifest.json's mismatches list") + " (manifest.json `mismatches`,"
            " and each run's manifest under `runs`)")


def how_to_cite(pub: Publication, today: str | None = None) -> list[str]:
    """## How to cite: this dataset as CITATION.cff gives it, and the paper it supports."""
    year = (today or _dt.date.today().isoformat())[:4]
    who = "; ".join(c.name for c in pub.creators)
    paper = "; ".join(f"{a['family-names']}, {a['given-names']}" for a in PAPER["authors"])
    return ["## How to cite", "",
            f"This dataset (`CITATION.cff`, which GitHub and Zenodo read): {who} ({year}). "
            f"*{pub.title}*, version {pub.version} [data set]"
            + (f". {pub.repository}" if pub.repository else "") + ".", "",
            f"The kernel it measures: {paper}. *{PAPER['title']}*. arXiv:{PAPER['arxiv']}, "
            f"doi:{PAPER['doi']}.", ""]
