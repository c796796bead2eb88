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


def peak_at_clock_axis(ax, rows: list[dict], gpu: str | None, axis: str = "y"):
    """A second TFLOP/s axis (right, or top for ``axis="x"``) in % of the dense peak at the
    median SM clock of ``rows`` (the ok rows the panel draws), its clock in the label;
    None, drawing nothing, where a row recorded no clock (never the data sheet's clock
    instead), the GPU has no listed peak, or fp8 and 16-bit rows share the panel. Each
    row's exact share at its own clock is in the tables."""
    from .hardware import peak_of

    peak = peak_of(gpu)
    ok = [r for r in rows if r.get("status") == "ok"]
    clocks = sorted(r.get("sm_clock_mhz") or 0 for r in ok)
    fp8 = {"float8" in str(r.get("dtype")) for r in ok}
    if peak is None or not ok or not clocks[0] or len(fp8) > 1:
        return None
    mid = clocks[len(clocks) // 2]
    top = peak.at_clock(mid, "float8" if fp8 == {True} else "bfloat16")

    def pct(t):
        return 100 * t / top

    def tflops(p):
        return p * top / 100

    if axis == "y":
        sec = ax.secondary_yaxis("right", functions=(pct, tflops))
        sec.set_ylabel(f"% of peak at {mid:.0f} MHz")
    else:
        sec = ax.secondary_xaxis("top", functions=(pct, tflops))
        sec.set_xlabel(f"% of peak at {mid:.0f} MHz")
    return sec


# Beside the figures: {figure: why} for each figure with nothing drawn (every panel "no
# data"). The workflow needs every file; the bundle leaves these out and says why.
NOT_DRAWN = "not-drawn.json"
NO_DATA = "no-data"  # the gid of a panel no_data wrote


def save(fig, out_dir, name, record: bool = True) -> list[str]:
    """``name``.png and .pdf in ``out_dir``; ``record``: a study figure, whose having
    nothing drawn NOT_DRAWN keeps (compare, scaling and systems draw their own)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"{name}.{ext}") for ext in ("png", "pdf")]
    for p in paths:
        with atomic_path(p) as tmp:  # never a truncated figure after a kill
            fig.savefig(tmp, bbox_inches="tight", format=p.rsplit(".", 1)[1])
    if record:
        _record_not_drawn(fig, out_dir, name)
    import matplotlib.pyplot as pyplot

    pyplot.close(fig)
    return paths


def _record_not_drawn(fig, out_dir, name) -> None:
    """Keep ``out_dir``/NOT_DRAWN current for ``name``: listed, with the first panel's
    reason, when every panel says "no data"; dropped when it is drawn."""
    import json

    from ...safeio import write_text

    panels = [a for a in fig.axes if a.get_visible() and a.get_label() != "<colorbar>"]
    path = os.path.join(out_dir, NOT_DRAWN)
    try:
        with open(path, encoding="utf-8") as f:
            listed = json.load(f)
    except (OSError, ValueError):
        listed = {}
    listed = listed if isinstance(listed, dict) else {}
    if panels and all(a.get_gid() == NO_DATA for a in panels):
        listed[name] = " ".join(panels[0].texts[0].get_text().split()) if panels[0].texts \
            else "no data"
    elif name not in listed:
        return
    else:
        del listed[name]
    write_text(path, json.dumps(listed, indent=1, sort_keys=True) + "\n")


def not_drawn(figures_dir: str) -> dict[str, str]:
    """{figure: why} of the figures in ``figures_dir`` that have nothing drawn."""
    import json

    try:
        with open(os.path.join(figures_dir, NOT_DRAWN), encoding="utf-8") as f:
            listed = json.load(f)
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in listed.items()} if isinstance(listed, dict) else {}


def no_data(ax, why):
    import textwrap

    ax.set_gid(NO_DATA)

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
