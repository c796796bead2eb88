"""What every study figure shares: matplotlib set up headless, the panel grid, a panel's
"no data" note, saving as PNG and PDF, and each method's colour (from the method registry).
Its own module so that figures, shapes and compare draw alike without importing each
other."""

from __future__ import annotations

import os

from ..bench.methods import color_of


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
        fig.savefig(p, bbox_inches="tight")
    import matplotlib.pyplot as pyplot

    pyplot.close(fig)
    return paths


def no_data(ax, why):
    ax.text(0.5, 0.5, f"no data:\n{why}", ha="center", va="center", transform=ax.transAxes,
            fontsize=8, wrap=True)
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
