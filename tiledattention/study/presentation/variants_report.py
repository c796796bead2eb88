"""The variants stage in the study: its table (per variant, dtype, D, S and pass: our time,
FlexAttention's, the speedups over FlexAttention, over SDPA with a materialised mask, over
each other fused baseline measured, and over the fastest fused baseline at the point, named),
its summary against issue 23's targets, and its figure (speedup over the fastest fused
baseline vs S per variant, one panel per pass), from the stage's rows
(``stages/variants.py``). The headline's variants lines are ``presentation/headline.py``'s.
Speedup = their kernel time ÷ ours (> 1: faster).
"""

from __future__ import annotations

from ...bench.methods import METHODS, SUBJECT
from .hardware import AT_CLOCK, at_clock_cell, at_clock_note, gpu_title
from .ratios import (
    BEST,
    cells_by_point,
    fused_baselines,
    geomean,
    methods_in,
    not_ok_reasons,
    with_best,
)
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


def variant_order(name: str) -> int:
    from ...bench.variant_cases import VARIANT_NAMES

    return VARIANT_NAMES.index(name) if name in VARIANT_NAMES else len(VARIANT_NAMES)


def other_baselines(rows: list[dict]) -> list[str]:
    """The fused baselines of ``rows`` besides FlexAttention and SDPA + mask (registry order):
    each gets its own speedup column."""
    return [m for m in fused_baselines(methods_in(rows)) if m not in (FLEX, SDPA_MASK)]


def ratio_rows(rows: list[dict], gpu: str | None = None) -> list[dict]:
    """One record per point: our and FlexAttention's kernel time (ms), the speedups over
    FlexAttention, over SDPA + mask and over each other fused baseline (``x`` by name), the
    fastest fused baseline (``best``: its name, or why there is none) and the speedup over it
    (``x_best``), the status of a method that did not run, and our and FlexAttention's %
    of the peak at their rows' SM clocks (``ours_pct``, ``flex_pct``; ``gpu``'s peak)."""

    others = other_baselines(rows)
    out = []
    for cells in cells_by_point(with_best(rows)).values():
        p = next(iter(cells.values()))
        ours, flex, sdpa, best = (_ms(cells.get(m)) for m in (SUBJECT, FLEX, SDPA_MASK, BEST))
        b = cells.get(BEST)
        out.append({"variant": p["variant"], "dtype": p["dtype"], "head_dim": p["head_dim"],
                    "seq": p["seq_q"], "batch": p["batch"], "heads": p["heads"],
                    "pass": p.get("pass", "fwd"), "ours_ms": ours or _status(cells, SUBJECT),
                    "flex_ms": flex or _status(cells, FLEX),
                    "x_flex": flex / ours if ours and flex else None,
                    "x_sdpa_mask": sdpa / ours if ours and sdpa else None,
                    "x": {m: t / ours if ours and (t := _ms(cells.get(m))) else None
                          for m in others},
                    "best": None if b is None else (b["best_of"].get("kernel") or "none ok"),
                    "x_best": best / ours if ours and best else None,
                    "ours_pct": at_clock_cell(cells.get(SUBJECT), gpu),
                    "flex_pct": at_clock_cell(cells.get(FLEX), gpu)})
    return sorted(out, key=lambda r: (variant_order(r["variant"]), r["dtype"], r["head_dim"],
                                      r["pass"] != "fwd", r["seq"]))


def _status(cells: dict, method: str) -> str | None:
    r = cells.get(method)
    return None if r is None else r.get("status")


def variants_table(rows: list[dict], gpu: str | None = None) -> Table:

    others = other_baselines(rows)
    t = Table("variants", "Variants: tiledattention against FlexAttention and SDPA + mask "
              "(kernel time)", ["variant", "dtype", "D", "S", "B", "H", "pass", "ours ms",
                                "flex ms", f"ours {AT_CLOCK}", f"flex {AT_CLOCK}", "× flex",
                                "× sdpa+mask"]
              + [f"× {m}" for m in others] + (["fastest fused", "× fastest"] if rows else []))
    if not rows:
        t.notes.append("no variants stage in this study (config variants.enabled: false).")
        return t
    for r in ratio_rows(rows, gpu):
        t.rows.append([r["variant"], r["dtype"], r["head_dim"], r["seq"], r["batch"],
                       r["heads"], r["pass"], r["ours_ms"], r["flex_ms"], r["ours_pct"],
                       r["flex_pct"], r["x_flex"],
                       r["x_sdpa_mask"]] + [r["x"][m] for m in others]
                      + [r["best"], r["x_best"]])
    t.notes.append("× flex, × sdpa+mask: their median kernel time ÷ ours (> 1: tiledattention "
                   "faster); flex is torch.compile'd flex_attention with the same score_mod and "
                   "a block mask, sdpa+mask torch SDPA with the variant materialised as a mask. "
                   "Every row's output (and gradients) checked against float64; L2 flushed "
                   "before each timed call, methods interleaved.")
    t.notes.append(_BEST_NOTE)
    t.notes.append(at_clock_note(rows, gpu))
    t.notes += not_ok_reasons(rows)
    return t


_BEST_NOTE = ("fastest fused: the fused baseline with the lowest median kernel time at the point "
              "(" + ", ".join(m.name for m in METHODS.values() if m.fused and m.name != SUBJECT)
              + ", those measured), × fastest: its time ÷ ours; none ok: no fused baseline "
              "had an ok row there (no ratio).")


def variants_summary(rows: list[dict]) -> Table:
    """Per variant and pass: the speedup over FlexAttention (geometric mean, min) and over
    SDPA + mask (min at S >= 2048), each against the issue's target: met or not."""
    t = Table("variants_summary", "Variants against their targets: speedup over "
              "FlexAttention and SDPA + mask (kernel time)",
              ["variant", "pass", "points", "× flex geomean", "× flex min", "flex target",
               f"× sdpa+mask min (S ≥ {SDPA_FROM_S})", "met"]
              + (["× fastest geomean", "× fastest min", "fastest fused (points)"]
                 if rows else []))
    if not rows:
        t.notes.append("no variants stage in this study (config variants.enabled: false).")
        return t
    recs = ratio_rows(rows)
    for name in sorted({r["variant"] for r in recs}, key=variant_order):
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
            best = [r["x_best"] for r in mine if r["x_best"]]
            t.rows.append([name, p, f"{len(flex)}/{len(mine)}", geo,
                           min(flex) if flex else None, f"≥ {TARGET[p]}x, min ≥ 1x",
                           min(sdpa) if sdpa else None, met or "not measured", geomean(best),
                           min(best) if best else None, _fastest_at(mine)])
    t.notes.append(f"points: compared with FlexAttention / in the grid. met: geometric mean "
                   f"≥ the target, no point below 1x, and faster than SDPA + mask at every "
                   f"S ≥ {SDPA_FROM_S} where a mask expresses the variant (issue 23's targets).")
    t.notes.append("× fastest: over the fastest fused baseline at each point; fastest fused "
                   "(points): how often each was the fastest.")
    return t


def _fastest_at(recs: list[dict]) -> str:
    """"flex 3, flex_flash 1": how often each fused baseline was the fastest, where we are
    compared with it."""
    counts: dict[str, int] = {}
    for r in recs:
        if r["x_best"]:
            counts[r["best"]] = counts.get(r["best"], 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1],
                                                                                   kv[0]))) \
        or "—"


def _bar_label(r: dict, groups: int) -> str:
    """A variant bar's tick: the variant, with its dtype, D and S where the stage has more
    than one such group."""
    return r["variant"] + (f" {r['dtype']} D{r['head_dim']} S{r['seq']}" if groups > 1 else "")


def variants_figure(rows: list[dict], out_dir: str, gpu: str | None = None) -> list[str]:
    """The variants as horizontal bars, one panel per pass: TiledAttention's speedup over the
    fastest fused baseline at each point, each bar labelled with the ratio (as the variants
    table prints it) and the winner; written with the reason where nothing was measured."""
    from .plotting import grid, no_data, no_pair, plt, save
    from .table import _fmt

    pyplot = plt()
    recs = ratio_rows(rows)
    passes = [p for p in PASSES if any(r["pass"] == p and r["x_best"] for r in recs)]
    fig, axes = grid(pyplot, len(passes) or 1)
    title = (f"{gpu_title(gpu)}: variants, {SUBJECT}'s speedup over the fastest fused "
             "baseline at each point, by kernel time (> 1: faster)")
    if not passes:
        no_data(axes[0], "no variants stage in this study" if not rows else
                no_pair(rows, lambda r: True))
        fig.suptitle(title)
        return save(fig, out_dir, "variants")
    n_groups = len({(r["dtype"], r["head_dim"], r["seq"]) for r in recs})
    for ax, p in zip(axes, passes):
        mine = [r for r in recs if r["pass"] == p and r["x_best"]]
        ys = list(range(len(mine)))
        xs = [r["x_best"] for r in mine]
        ax.barh(ys, xs, color=["C2" if x > 1 else "C3" for x in xs])
        for y, r in zip(ys, mine):
            winner = SUBJECT if r["x_best"] > 1 else r["best"]
            ax.text(r["x_best"], y, f" {_fmt(r['x_best'])} {winner}", va="center",
                    ha="left", fontsize=7)
        ax.set_yticks(ys, [_bar_label(r, n_groups) for r in mine])
        ax.invert_yaxis()
        ax.axvline(1.0, color="0.4", lw=0.8)
        ax.set_xlim(0, max(xs) * 1.6)
        ax.set_xlabel("speedup")
        ax.set_title({"fwd": "forward", "fwd+bwd": "forward+backward"}.get(p, p))
    fig.suptitle(title)
    return save(fig, out_dir, "variants")
