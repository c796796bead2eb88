"""Where TiledAttention stands, per stage and pass (``standings``): the points where it is
the only method that ran (every other method unsupported, unavailable or failed there,
named), and where it leads or trails the fastest fused baseline (``ratios.BEST``) by kernel
time — geomean and range of each side, the worst points named. Forward and
forward+backward are never mixed in one number. The bundle README's block (``block``)
renders these; docs/RESULTS.md quotes it (tests/test_headline_standing.py recomputes it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...bench.methods import METHODS, SUBJECT
from .ratios import (
    BEST,
    baselines,
    geomean,
    index_rows,
    pass_of,
    passes_in,
    points_of,
    ratios,
    with_best,
)

WORST = 3  # trailing points named per stage and pass
STAGES = {"bench": "benchmark", "variants": "variants"}
PASS_NAMES = {"fwd": "forward", "fwd+bwd": "forward+backward", "bwd": "backward"}


@dataclass(frozen=True)
class Side:
    """The points on one side of 1 (ratio = the fastest fused baseline's time ÷ ours)."""
    n: int
    geomean: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, values: list[float]) -> Side:
        return cls(len(values), geomean(values), min(values, default=None),
                   max(values, default=None))


@dataclass(frozen=True)
class Standing:
    stage: str  # "bench" or "variants"
    pass_: str
    compared: int  # points where ours and a fused baseline are both ok
    leads: Side  # ratio > 1
    trails: Side  # ratio < 1
    ties: int  # ratio == 1
    worst: list[tuple[str, float, str]]  # (point_key, ratio, fastest fused baseline)
    alone: list[tuple[str, dict[str, str]]]  # (point_key, {other method: its refusal})


GIST = 80  # characters of a reason kept in a refusal ("…" where cut)


def refusal(row: dict | None) -> str:
    """Why a method's row is not ok, in a few words: its status and the first clause of its
    reason, the method's own name at its start left out ("unsupported (has no FP8 (e4m3)
    forward here)": the same words for every method refused so group them); "no row"
    where it had none."""
    if row is None:
        return "no row"
    why = " ".join(str(row.get("reason") or row.get("error") or "").split())
    why = re.split(r"; |: ", why, maxsplit=1)[0]
    method = METHODS.get(row.get("method"))
    for name in (row.get("method"), method and method.label):
        if name and why.lower().startswith(name.lower() + " "):
            why = why[len(name) + 1:]
            break
    if len(why) > GIST:
        why = why[:GIST].rsplit(" ", 1)[0] + "…"
    return f"{row.get('status')} ({why})" if why else str(row.get("status"))


def alone(rows: list[dict]) -> list[tuple[str, dict[str, str]]]:
    """The points (of one pass) where ours is ok and no other method measured in ``rows``
    is: each with every other method's ``refusal`` there."""
    others = baselines(rows)
    if not others:
        return []  # nothing else was measured: alone by design, not by support
    idx = index_rows(rows)
    out = []
    for key in points_of(rows):
        if (idx.get((key, SUBJECT)) or {}).get("status") != "ok":
            continue
        rows_here = {m: idx.get((key, m)) for m in others}
        if all((r or {}).get("status") != "ok" for r in rows_here.values()):
            out.append((key, {m: refusal(r) for m, r in rows_here.items()}))
    return out


def standing(rows: list[dict], stage: str, pass_: str) -> Standing:
    """One stage's ``rows`` of one pass, against the fastest fused baseline by kernel time."""
    rows = with_best([r for r in rows if pass_of(r) == pass_])
    values = ratios(rows, SUBJECT, BEST)[0]
    best = {r["point_key"]: r["best_of"].get("kernel", "") for r in rows
            if r["method"] == BEST}
    trailing = sorted((v, k) for k, v in values.items() if v < 1)
    return Standing(stage, pass_, len(values), Side.of([v for v in values.values() if v > 1]),
                    Side.of([v for v, _ in trailing]), sum(v == 1 for v in values.values()),
                    [(k, v, best[k]) for v, k in trailing[:WORST]],
                    alone([r for r in rows if r["method"] != BEST]))


def standings(rows: list[dict], variant_rows: list[dict] | None = None) -> list[Standing]:
    """Per stage (the benchmark, then the variants stage) and pass, where anything ran."""
    out = []
    for stage, stage_rows in (("bench", rows), ("variants", variant_rows or [])):
        for p in passes_in(stage_rows):
            s = standing(stage_rows, stage, p)
            if s.compared or s.alone:
                out.append(s)
    return out


def _side(word: str, s: Side) -> str:
    if not s.n:
        return f"{word} at no point"
    spread = f"{s.low:.3f}x" if s.n == 1 else f"{s.low:.3f}x to {s.high:.3f}x"
    return f"{word} at {s.n} (geomean {s.geomean:.3f}x, {spread})"


def _alone_text(points: list[tuple[str, dict[str, str]]]) -> str:
    """"none", or per set of the others' statuses: how many points, which (all named)."""
    if not points:
        return "none"
    groups: dict[str, list[str]] = {}
    for key, status in points:
        why = ", ".join(f"{m} {s}" for m, s in status.items())
        groups.setdefault(why, []).append(key)
    return "; ".join(f"{len(keys)} where {why} ({', '.join(keys)})"
                     for why, keys in groups.items())


def line(s: Standing) -> str:
    """One stage and pass as the README's bullet."""
    worst = "; ".join(f"{k} {v:.3f}x against {b}" for k, v, b in s.worst)
    ties = f"; tied at {s.ties}" if s.ties else ""
    return (f"- {STAGES[s.stage]}, {PASS_NAMES.get(s.pass_, s.pass_)} ({s.compared} points "
            f"compared): {_side('leads', s.leads)}; {_side('trails', s.trails)}{ties}"
            + (f"; worst: {worst}" if worst else "")
            + f". Only {SUBJECT} ran: {_alone_text(s.alone)}.")


HEADING = f"### Where {SUBJECT} leads, trails, or alone runs a shape"
INTRO = (f"Against the fastest fused baseline at each point, by kernel time (ratio > 1: "
         f"{SUBJECT} faster; geomean and range of each side), forward and forward+backward "
         "apart. 'Only ... ran': the points where every other method measured there was "
         "unsupported, unavailable or failed (each named with its status).")


def block(rows: list[dict], variant_rows: list[dict] | None = None) -> list[str]:
    """The bundle README's block (its lines; empty where nothing ran)."""
    found = standings(rows, variant_rows)
    return [HEADING, "", INTRO, "", *map(line, found), ""] if found else []
