"""What every study figure shares: matplotlib set up headless, the panel grid, a panel's
"no data" note (and why a panel is empty), the legend below the panels, the measured-S axis,
saving as PNG and PDF, and each method's colour (from the method registry).
Its own module so that figures, shapes and compare draw alike without importing each
other."""

from __future__ import annotations

import os

from ...bench.methods import SUBJECT, color_of
from ...safeio import atomic_path
from .ratios import fused_baselines, methods_in


def color(method: str):
    """One colour per method in every figure (None: matplotlib's next)."""
    return color_of(method)


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    pyplot.rcParams.update({"font.size": 9, "axes.titlesize": 9, "legend.fontsize": 7,
                            "figure.dpi": 110, "savefig.dpi": 150, "axes.grid": True,
                            "grid.alpha": 0.3})
    return pyplot


def save(fig, out_dir, name) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"{name}.{ext}") for ext in ("png", "pdf")]
    for p in paths:
        with atomic_path(p) as tmp:  # never a truncated figure after a kill
            fig.savefig(tmp, bbox_inches="tight", format=p.rsplit(".", 1)[1])
    import matplotlib.pyplot as pyplot

    pyplot.close(fig)
    return paths


def no_data(ax, why):
    import textwrap

    head = "no data (no GPU)" if "gpu" in why.lower() else "no data"
    # Wrapped by hand: matplotlib's wrap=True wraps at the figure's edge, not the panel's.
    ax.text(0.5, 0.5, f"{head}:\n{textwrap.fill(why, 44)}", ha="center", va="center",
            transform=ax.transAxes, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def grid(pyplot, n):
    cols = 2 if n > 1 else 1
    nrows = (n + cols - 1) // cols
    fig, axes = pyplot.subplots(nrows, cols, figsize=(3.6 * cols, 2.8 * nrows), squeeze=False,
                                layout="constrained")
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat


def why_empty(rows, keep=lambda r: True, need=None) -> str:
    """Why nothing could be drawn from the rows a panel takes (``keep``), in words that hold
    for them: no rows at all; or how the rows of the methods it plots (``need``; default
    every method) ended, by status and method, each status with its first reason (e.g.
    "needs a CUDA GPU"), and which other methods were ok there but are not what the panel
    plots. A panel whose rows all ran on the CPU says so."""
    mine = [r for r in rows if keep(r)]
    if not mine:
        return "no rows for this panel"
    plotted = [r for r in mine if need is None or r.get("method") in need]
    if not plotted:
        return f"no {', '.join(sorted(need))} rows at these points"
    by: dict[str, dict[str, int]] = {}
    for r in plotted:
        counts = by.setdefault(r.get("status", "?"), {})
        counts[r.get("method", "?")] = counts.get(r.get("method", "?"), 0) + 1
    parts = []
    for status, counts in sorted(by.items(), key=lambda kv: (kv[0] == "ok", kv[0])):
        reason = next((" ".join(str(r["reason"]).split()) for r in plotted
                       if r.get("status", "?") == status and r.get("reason")), None)
        parts.append(f"{status}: " + ", ".join(f"{m} {n}" for m, n in counts.items())
                     + (f" ({reason})" if reason else ""))
    text = ("no ok rows; " if "ok" not in by else "") + "; ".join(parts)
    others = sorted({r["method"] for r in mine if r.get("status") == "ok"
                     and need is not None and r.get("method") not in need})
    if others:
        text += f"; ok but not plotted here: {', '.join(others)}"
    if all(r.get("device") == "cpu" for r in mine):
        text += " (a CPU run)"
    return text


def no_pair(rows, keep) -> str:
    """Why a panel of TiledAttention against the fastest fused baseline is empty: at none
    of its points were both ok."""
    sides = {SUBJECT, *fused_baselines(methods_in(rows))}
    return (f"no point where {SUBJECT} and a fused baseline were both ok; "
            + why_empty(rows, keep, need=sides))


def legend(fig, axes, ncol: int = 4) -> None:
    """One legend for the figure, below the panels (never over data): each label once."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center",
                   ncol=min(ncol, len(seen)), frameon=False)


def seq_axis(ax, seqs, label="sequence length S") -> None:
    """Log-2 S axis whose ticks are exactly the measured S, each labelled (S=200 too)."""
    from matplotlib.ticker import NullLocator

    seqs = sorted(set(seqs))
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [str(s) for s in seqs], rotation=45 if len(seqs) > 6 else 0)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)
