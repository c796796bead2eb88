"""What every study figure shares: matplotlib set up headless, the panel grid, a panel's
"no data" note, saving as PNG and PDF, and each method's colour (from the method registry).
Its own module so that figures, shapes and compare draw alike without importing each
other."""

from __future__ import annotations

import os

from ...bench.methods import color_of
from ...safeio import atomic_path


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
