"""The variants stage in the study: its table (per variant, dtype, D, S and pass: our time,
FlexAttention's, the speedups over FlexAttention and over SDPA with a materialised mask),
its figure (speedup over FlexAttention vs S per variant, one panel per pass) and the
bundle's headline sentence (geometric-mean speedup over FlexAttention per pass), from the
stage's rows (``bench/variants_run.py``). Speedup = their kernel time ÷ ours (> 1: faster).
"""

from __future__ import annotations

import math

from ..bench.methods import SUBJECT
from .table import Table

FLEX, SDPA_MASK = "flex", "sdpa_mask"
PASSES = ("fwd", "fwd+bwd")
# Issue 23's targets: geometric mean over the stage's grid per variant, no point below 1x;
# faster than SDPA with the materialised mask at every S >= 2048.
TARGET = {"fwd": 1.5, "fwd+bwd": 1.2}
SDPA_FROM_S = 2048


def _ms(row: dict | None) -> float | None:
    if not row or row.get("status") != "ok":
        return None
    t = (row.get("time_ms") or {}).get("median_ms")
    return t if isinstance(t, (int, float)) and t > 0 else None


def _order(name: str) -> int:
    from ..bench.variants import VARIANT_NAMES

    return VARIANT_NAMES.index(name) if name in VARIANT_NAMES else len(VARIANT_NAMES)


def ratio_rows(rows: list[dict]) -> list[dict]:
    """One record per point: our and FlexAttention's kernel time (ms), the speedups over
    FlexAttention and over SDPA + mask, and the status of a method that did not run."""
    by_point: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_point.setdefault(r["point_key"], {})[r["method"]] = r
    out = []
    for cells in by_point.values():
        p = next(iter(cells.values()))
        ours, flex, sdpa = (_ms(cells.get(m)) for m in (SUBJECT, FLEX, SDPA_MASK))
        out.append({"variant": p["variant"], "dtype": p["dtype"], "head_dim": p["head_dim"],
                    "seq": p["seq_q"], "batch": p["batch"], "heads": p["heads"],
                    "pass": p.get("pass", "fwd"), "ours_ms": ours or _status(cells, SUBJECT),
                    "flex_ms": flex or _status(cells, FLEX),
                    "x_flex": flex / ours if ours and flex else None,
                    "x_sdpa_mask": sdpa / ours if ours and sdpa else None})
    return sorted(out, key=lambda r: (_order(r["variant"]), r["dtype"], r["head_dim"],
                                      r["pass"] != "fwd", r["seq"]))


def _status(cells: dict, method: str) -> str | None:
    r = cells.get(method)
    return None if r is None else r.get("status")


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _reasons(rows: list[dict]) -> list[str]:
    """One note per (method, status) that did not run, with its first reason."""
    seen: dict[tuple[str, str], str] = {}
    for r in rows:
        if r.get("status") != "ok":
            seen.setdefault((r["method"], r["status"]), " ".join(str(r.get("reason")).split()))
    return [f"{m} {st}: {why}" for (m, st), why in sorted(seen.items())]


def variants_table(rows: list[dict]) -> Table:
    t = Table("variants", "Variants: tiledattention against FlexAttention and SDPA + mask "
              "(kernel time)", ["variant", "dtype", "D", "S", "B", "H", "pass", "ours ms",
                                "flex ms", "× flex", "× sdpa+mask"])
    if not rows:
        t.notes.append("no variants stage in this study (config variants.enabled: false).")
        return t
    for r in ratio_rows(rows):
        t.rows.append([r["variant"], r["dtype"], r["head_dim"], r["seq"], r["batch"],
                       r["heads"], r["pass"], r["ours_ms"], r["flex_ms"], r["x_flex"],
                       r["x_sdpa_mask"]])
    t.notes.append("× flex, × sdpa+mask: their median kernel time ÷ ours (> 1: tiledattention "
                   "faster); flex is torch.compile'd flex_attention with the same score_mod and "
                   "a block mask, sdpa+mask torch SDPA with the variant materialised as a mask. "
                   "Every row's output (and gradients) checked against float64; L2 flushed "
                   "before each timed call, methods interleaved.")
    t.notes += _reasons(rows)
    return t


def variants_summary(rows: list[dict]) -> Table:
    """Per variant and pass: the speedup over FlexAttention (geometric mean, min) and over
    SDPA + mask (min at S >= 2048), each against the issue's target: met or not."""
    t = Table("variants_summary", "Variants against their targets: speedup over "
              "FlexAttention and SDPA + mask (kernel time)",
              ["variant", "pass", "points", "× flex geomean", "× flex min", "flex target",
               f"× sdpa+mask min (S ≥ {SDPA_FROM_S})", "met"])
    if not rows:
        t.notes.append("no variants stage in this study (config variants.enabled: false).")
        return t
    recs = ratio_rows(rows)
    for name in sorted({r["variant"] for r in recs}, key=_order):
        for p in PASSES:
            mine = [r for r in recs if (r["variant"], r["pass"]) == (name, p)]
            if not mine:
                continue
            flex = [r["x_flex"] for r in mine if r["x_flex"]]
            sdpa = [r["x_sdpa_mask"] for r in mine if r["x_sdpa_mask"]
                    and r["seq"] >= SDPA_FROM_S]
            geo = geomean(flex)
            met = None if not flex else "yes" if (
                geo >= TARGET[p] and min(flex) >= 1.0 and all(x > 1.0 for x in sdpa)) else "no"
            t.rows.append([name, p, f"{len(flex)}/{len(mine)}", geo,
                           min(flex) if flex else None, f"≥ {TARGET[p]}x, min ≥ 1x",
                           min(sdpa) if sdpa else None, met or "not measured"])
    t.notes.append(f"points: compared with FlexAttention / in the grid. met: geometric mean "
                   f"≥ the target, no point below 1x, and faster than SDPA + mask at every "
                   f"S ≥ {SDPA_FROM_S} where a mask expresses the variant (issue 23's targets).")
    return t


def speedups(rows: list[dict], pass_: str, baseline: str = "x_flex") -> list[float]:
    return [r[baseline] for r in ratio_rows(rows) if r["pass"] == pass_ and r[baseline]]


def headline(rows: list[dict]) -> str:
    """The bundle's headline sentence on the variants (empty without the stage)."""
    if not rows:
        return ""
    parts = []
    for p in PASSES:
        v = speedups(rows, p)
        if v:
            parts.append(f"{p} {geomean(v):.3f}x (min {min(v):.3f}x, faster at "
                         f"{sum(x > 1 for x in v)}/{len(v)} points)")
    names = sorted({r["variant"] for r in rows}, key=_order)
    if not parts:  # why: ours' or FlexAttention's reason first (the ratio's two sides)
        why = [w for w in _reasons(rows) if w.startswith((FLEX + " ", SUBJECT + " "))] \
            or _reasons(rows)
        return (f" Variants ({', '.join(names)}): no speedup over FlexAttention measured"
                + (f" ({why[0]})." if why else "."))
    return (f" Variants ({', '.join(names)}) against FlexAttention (torch.compile'd, same "
            "score_mod and block mask), geometric-mean speedup by kernel time: "
            + "; ".join(parts) + ".")


def headline_rows(rows: list[dict]) -> list[list]:
    """The headline table's rows for the variants stage: ours against FlexAttention and SDPA
    + mask per pass, by kernel time and call latency (the headline's columns)."""
    from .ratios import compare

    out = []
    for baseline, label in ((FLEX, "FlexAttention"), (SDPA_MASK, "SDPA + mask")):
        for p in PASSES:
            def where(point, p=p):
                return point.get("pass", "fwd") == p

            k = compare(rows, SUBJECT, baseline, where)
            if not k.n:
                continue
            c = compare(rows, SUBJECT, baseline, where, "call")
            out.append([f"{label} (variants), {p}", k.n, k.mean, k.geomean, k.min,
                        f"{k.wins}/{k.n}", c.geomean, c.min, f"{c.wins}/{c.n}"])
    return out


def variants_figure(rows: list[dict], out_dir: str) -> list[str]:
    """Speedup over FlexAttention vs S, one line per variant (and D, dtype), one panel per
    pass; written with the reason where nothing was measured."""
    from .figures import _legend, _seq_axis, _why_empty
    from .plotting import grid, no_data, plt, save

    pyplot = plt()
    fig, axes = grid(pyplot, len(PASSES))
    recs = ratio_rows(rows)
    names = sorted({r["variant"] for r in recs}, key=_order)
    groups = sorted({(r["dtype"], r["head_dim"]) for r in recs})
    styles = ["-", "--", ":", "-."]
    for ax, p in zip(axes, PASSES):
        seqs = []
        for i, name in enumerate(names):
            for j, (dtype, d) in enumerate(groups):
                pts = sorted((r["seq"], r["x_flex"]) for r in recs if r["x_flex"]
                             and (r["variant"], r["pass"], r["dtype"], r["head_dim"]) ==
                             (name, p, dtype, d))
                if pts:
                    ax.plot(*zip(*pts), styles[j % len(styles)], marker="o", ms=3,
                            color=f"C{i % 10}", label=f"{name}, {dtype} D={d}")
                    seqs += [s for s, _ in pts]
        ax.set_title(f"{p}: FlexAttention ÷ tiledattention")
        if seqs:
            ax.axhline(1.0, color="0.4", lw=0.8)
            _seq_axis(ax, seqs)
            ax.set_ylabel("speedup over FlexAttention (> 1: faster)")
        else:
            no_data(ax, "no variants stage in this study" if not rows else
                    _why_empty(rows, lambda r, p=p: r.get("pass", "fwd") == p
                               and r.get("method") in (SUBJECT, FLEX)))
    _legend(fig, axes, ncol=3)
    fig.suptitle("Variants: speedup over FlexAttention by kernel time")
    return save(fig, out_dir, "variants")
