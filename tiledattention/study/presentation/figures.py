"""The study's figures (PNG for screens, PDF for print), from the rows alone.

A figure whose data is missing (e.g. no GPU methods ran on a CPU smoke study) is still
written, with "no data" and the reason in place of the plot ("no GPU" where that is it),
so the bundle and the report never point at a file that is not there. Legends sit below
the panels, never over data; every measured S is a labelled tick.
"""

from __future__ import annotations

from ...bench.grid import pinned_label
from ...bench.methods import FUSED, METHODS, SUBJECT
from .plotting import color as _color
from .plotting import grid as _grid
from .plotting import legend as _legend
from .plotting import no_data as _no_data
from .plotting import no_pair as _no_pair
from .plotting import plt as _plt
from .plotting import save as _save
from .plotting import seq_axis as _seq_axis
from .plotting import why_empty as _why_empty
from .ratios import (
    BEST,
    MEASURES,
    compare_by,
    fastest_counts,
    methods_in,
    points_of,
    with_best,
)
from .shapes import shapes_figure

PANELS = [(dt, c) for dt in ("float16", "bfloat16") for c in (False, True)]


def names(head_dims) -> list[str]:
    """The figures write_all writes for a study over ``head_dims``, by file stem (the
    workflow lists its outputs from here)."""
    return [f"throughput_vs_seq_d{d}" for d in sorted(set(head_dims))] + [
        "regime_map", "ratios_vs_seq", "baselines_d128", "bandwidth_vs_seq", "tile_sensitivity",
        "shapes", "variants"]


# One look per method in every figure. torch_sdpa (automatic dispatch) usually runs cuDNN
# and lands exactly on the cudnn line: a hollow square on a dashed line, drawn above it,
# keeps both visible (cudnn: crosses on a dotted line).
STYLE = {"tiledattention": {"marker": "o", "ls": "-", "lw": 1.6, "zorder": 6},
         "torch_sdpa": {"marker": "s", "ls": "--", "lw": 1.2, "mfc": "none", "ms": 5.5,
                        "zorder": 5},
         "cudnn": {"marker": "x", "ls": ":", "lw": 1.2, "ms": 5, "zorder": 4},
         "flash": {"marker": "^", "ls": "-.", "zorder": 3},
         "efficient": {"marker": "v", "ls": "-", "zorder": 3},
         "flash_attn": {"marker": "D", "ls": "--", "zorder": 3},
         "math": {"marker": "P", "ls": ":", "zorder": 3},
         "eager": {"marker": "*", "ls": "-.", "zorder": 3}}


def _style(method: str) -> dict:
    """Colour, marker, line style and drawing order of a method's line."""
    return {"ms": 3.5, "lw": 1.0, "marker": "o", "ls": "-", **STYLE.get(method, {}),
            "color": _color(method)}


def _panels(rows):
    present = {(p["dtype"], p["causal"]) for p in points_of(rows).values()}
    return [p for p in PANELS if p in present] or sorted(present) or [("float16", False)]


def _title(dtype, causal):
    return f"{dtype}, {'causal' if causal else 'no mask'}"


def _by_seq(rows, **match):
    """The ok rows matching ``match``, in order of S: one line of a throughput plot."""
    return sorted(_ok(rows, **match), key=lambda r: r["seq_q"])


def _ok(rows, **match):
    return [r for r in rows if r["status"] == "ok"
            and all(r[k] == v for k, v in match.items())]


def throughput_vs_seq(rows, out_dir) -> list[str]:
    """One figure per D: TFLOP/s at the median time vs S, whisker down to the p95 time."""
    plt = _plt()
    paths = []
    methods = [m for m in methods_in(rows) if pinned_label(m) is None]
    for d in sorted({p["head_dim"] for p in points_of(rows).values()}):
        panels = _panels(rows)
        fig, axes = _grid(plt, len(panels))
        for ax, (dtype, causal) in zip(axes, panels):
            seqs = []
            for m in methods:
                ok = _by_seq(rows, method=m, head_dim=d, dtype=dtype, causal=causal)
                if not ok:
                    continue
                s = [r["seq_q"] for r in ok]
                y = [r["tflops"] for r in ok]
                p95 = [r["flops"] / (r["time_ms"]["p95_ms"] * 1e-3) / 1e12 for r in ok]
                ax.errorbar(s, y, yerr=[[a - b for a, b in zip(y, p95)], [0] * len(y)],
                            capsize=2, label=m, **_style(m))
                seqs += s
            ax.set_title(_title(dtype, causal))
            if seqs:
                _seq_axis(ax, seqs)
                ax.set_ylabel("TFLOP/s")
            else:
                _no_data(ax, _why_empty(rows, lambda r, d=d, dt=dtype, c=causal: (
                    r.get("head_dim"), r.get("dtype"), r.get("causal")) == (d, dt, c)))
        _legend(fig, axes)
        fig.suptitle(f"Throughput vs S, D={d} (whisker: p95 time)")
        paths += _save(fig, out_dir, f"throughput_vs_seq_d{d}")
    return paths


def regime_map(rows, out_dir) -> list[str]:
    """TiledAttention as % of the fastest fused baseline at each point over S × D, one panel
    per dtype/mask; each cell names the baseline that was the fastest there."""
    plt = _plt()
    panels = _panels(rows)
    best = with_best(rows)
    fig, axes = _grid(plt, len(panels))
    for ax, (dtype, causal) in zip(axes, panels):
        def cell(p, dt=dtype, c=causal):
            return (p["head_dim"], p["seq_q"]) if (p["dtype"], p["causal"]) == (dt, c) else None

        per = compare_by(best, SUBJECT, BEST, cell)
        per.pop(None, None)
        cells = {k: s.geomean for k, s in per.items() if s.n}
        if not cells:
            _no_data(ax, _no_pair(rows, lambda r, dt=dtype, c=causal: (
                r.get("dtype"), r.get("causal")) == (dt, c)))
            ax.set_title(_title(dtype, causal))
            continue
        ds = sorted({k[0] for k in cells})
        ss = sorted({k[1] for k in cells})
        grid = [[100 * cells[(d, s)] if (d, s) in cells else float("nan") for s in ss]
                for d in ds]
        im = ax.imshow(grid, cmap="RdYlGn", vmin=50, vmax=150, aspect="auto", origin="lower")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if v == v:  # not NaN
                    key = (ds[i], ss[j])
                    who = next(iter(fastest_counts(rows, SUBJECT, lambda p, k=key, f=cell:
                                                   f(p) == k)), "")
                    ax.text(j, i, f"{v:.0f}\n{who}", ha="center", va="center", fontsize=5)
        ax.set_xticks(range(len(ss)), [str(s) for s in ss])
        ax.set_yticks(range(len(ds)), [str(d) for d in ds])
        ax.set_xlabel("S")
        ax.set_ylabel("D")
        ax.set_title(_title(dtype, causal))
        fig.colorbar(im, ax=ax, label="% of the fastest fused baseline")
    fig.suptitle(f"Regime map: {SUBJECT} throughput as % of the fastest fused baseline at "
                 "each point (named in each cell)")
    return _save(fig, out_dir, "regime_map")


def ratios_vs_seq(rows, out_dir) -> list[str]:
    """TiledAttention ÷ the fastest fused baseline at each point over S, per D: kernel time
    (solid) and call latency (dashed), one panel per dtype/mask."""
    plt = _plt()
    best = with_best(rows)
    panels = _panels(rows)
    fig, axes = _grid(plt, len(panels))
    ds = sorted({p["head_dim"] for p in points_of(rows).values()})
    for ax, (dtype, causal) in zip(axes, panels):
        seqs = []
        for i, d in enumerate(ds):
            for measure, style in (("kernel", "-"), ("call", "--")):
                per = compare_by(best, SUBJECT, BEST,
                                 lambda p, d=d, dt=dtype, c=causal: p["seq_q"]
                                 if (p["head_dim"], p["dtype"], p["causal"]) == (d, dt, c)
                                 else None, measure)
                per.pop(None, None)
                pts = sorted((s, r.geomean) for s, r in per.items() if r.n)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", ms=3, color=f"C{i % 10}",
                            label=f"D={d} {MEASURES[measure][0]}")
                    seqs += [s for s, _ in pts]
        ax.set_title(_title(dtype, causal))
        if seqs:
            ax.axhline(1.0, color="0.4", lw=0.8)
            _seq_axis(ax, seqs)
            ax.set_ylabel("÷ fastest fused baseline (> 1: faster)")
        else:
            _no_data(ax, _no_pair(rows, lambda r, dt=dtype, c=causal: (
                r.get("dtype"), r.get("causal")) == (dt, c)))
    _legend(fig, axes)
    fig.suptitle(f"{SUBJECT} ÷ the fastest fused baseline at each point: kernel time (solid) "
                 "and call latency (dashed)")
    return _save(fig, out_dir, "ratios_vs_seq")


def baselines_at_d128(rows, out_dir) -> list[str]:
    """Every method at D=128 vs S, log scale (a study without D=128 says so per panel)."""
    plt = _plt()
    d = 128
    ds = sorted({p["head_dim"] for p in points_of(rows).values()})
    panels = _panels(rows)
    fig, axes = _grid(plt, len(panels))
    for ax, (dtype, causal) in zip(axes, panels):
        seqs = []
        for m in [m for m in METHODS if m in methods_in(rows)]:
            ok = _by_seq(rows, method=m, head_dim=d, dtype=dtype, causal=causal)
            if ok:
                ax.plot([r["seq_q"] for r in ok], [r["tflops"] for r in ok], label=m,
                        **_style(m))
                seqs += [r["seq_q"] for r in ok]
        ax.set_title(_title(dtype, causal))
        if seqs:
            _seq_axis(ax, seqs, "S")
            ax.set_yscale("log")
            ax.set_ylabel("TFLOP/s")
        elif d not in ds:
            _no_data(ax, f"no D={d} points in this study (D measured: {ds})")
        else:
            _no_data(ax, _why_empty(rows, lambda r, dt=dtype, c=causal: (
                r.get("head_dim"), r.get("dtype"), r.get("causal")) == (d, dt, c)))
    _legend(fig, axes)
    fig.suptitle(f"All baselines at D={d}")
    return _save(fig, out_dir, "baselines_d128")


def bandwidth_vs_seq(rows, out_dir) -> list[str]:
    """Bandwidth proxy (compulsory bytes / time) of TiledAttention and fused SDPA per D."""
    plt = _plt()
    ds = sorted({p["head_dim"] for p in points_of(rows).values()}) or [0]
    fig, axes = _grid(plt, len(ds))
    for ax, d in zip(axes, ds):
        seqs = []
        for m in (SUBJECT, FUSED):
            for dtype, causal in _panels(rows):
                ok = _by_seq(rows, method=m, head_dim=d, dtype=dtype, causal=causal)
                if ok:
                    ax.plot([r["seq_q"] for r in ok], [r["gbytes_per_s"] for r in ok],
                            marker="o" if m == SUBJECT else "s", ms=3.5,
                            mfc=None if m == SUBJECT else "none",
                            ls="-" if m == SUBJECT else "--",
                            label=f"{m} {_title(dtype, causal)}")
                    seqs += [r["seq_q"] for r in ok]
        ax.set_title(f"D={d}")
        if seqs:
            _seq_axis(ax, seqs, "S")
            ax.set_ylabel("GB/s (q, k, v, out once)")
        else:
            _no_data(ax, _why_empty(rows, lambda r, d=d: r.get("head_dim") == d,
                                    need={SUBJECT, FUSED}))
    _legend(fig, axes, ncol=2)
    fig.suptitle("Bandwidth proxy vs S")
    return _save(fig, out_dir, "bandwidth_vs_seq")


def tile_sensitivity(ladder_rows, tune_entries, out_dir, tune_reason=None) -> list[str]:
    """Ladder steps' TFLOP/s per point, and the tuned buckets' runner-up sensitivity.
    ``tune_reason``: why the tuning table is empty (its ``meta.unavailable``)."""
    plt = _plt()
    fig, axes = _grid(plt, 2)
    ax = axes[0]
    steps = [m for m in methods_in(ladder_rows or []) if pinned_label(m) is not None
             or m == SUBJECT]
    ladder_ok = [r for r in ladder_rows or [] if r.get("method") in steps
                 and r.get("status") == "ok"]
    if ladder_ok:
        keys = list(points_of(ladder_rows))
        width = 0.8 / len(steps)
        for i, m in enumerate(steps):
            idx = {r["point_key"]: r for r in _ok(ladder_rows, method=m)}
            ax.bar([k + i * width for k in range(len(keys))],
                   [idx[k]["tflops"] if k in idx else 0 for k in keys], width,
                   label=pinned_label(m) if m != SUBJECT else "tuned")
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(keys))],
                      [k.split("-b")[0] for k in keys], rotation=30, ha="right", fontsize=6)
        ax.set_ylabel("TFLOP/s")
        _legend(fig, [ax])
    elif steps:
        _no_data(ax, _why_empty(ladder_rows, need=set(steps)))
    else:
        _no_data(ax, "no schedule ladder in this study")
    ax.set_title("Schedule ladder")
    ax = axes[1]
    if tune_entries:
        vals = sorted(100 * e["sensitivity"] for e in tune_entries
                      if e.get("sensitivity") is not None)
        ax.hist(vals, bins=20)
        ax.set_xlabel("runner-up slower by (%)")
        ax.set_ylabel("tuned buckets")
    elif tune_reason:
        _no_data(ax, f"tuning did not run: {' '.join(str(tune_reason).split())}")
    else:
        _no_data(ax, "tuning did not run in this study")
    ax.set_title("Tuning sensitivity")
    fig.suptitle("Tile/schedule sensitivity")
    return _save(fig, out_dir, "tile_sensitivity")


def write_all(rows, out_dir, *, ladder_rows=None, tune_entries=None, shape_rows=None,
              tune_reason=None, variant_rows=None) -> list[str]:
    from .variants_report import variants_figure

    return (throughput_vs_seq(rows, out_dir) + regime_map(rows, out_dir)
            + ratios_vs_seq(rows, out_dir) + baselines_at_d128(rows, out_dir)
            + bandwidth_vs_seq(rows, out_dir)
            + tile_sensitivity(ladder_rows or [], tune_entries or [], out_dir, tune_reason)
            + shapes_figure(shape_rows or [], out_dir)
            + variants_figure(variant_rows or [], out_dir))
