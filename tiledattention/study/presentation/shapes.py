"""The shapes study: throughput against launch geometry, and the measured cost of head dims
and sequence lengths that do not fit the tiles.

From the rows of the optional ``shapes`` grids (``config/shapes-*.yaml``): every
tiledattention row carries its launch geometry (``kernel/geometry.py``), and PyTorch's SDPA
(auto dispatch) is measured at the same points with the same inputs. Two tables
(``shapes``: every point with its geometry; ``shapes_cost``: each unaligned shape against
its aligned neighbour) and one figure (``shapes``).
"""

from __future__ import annotations

from ...bench.grid import row_head_label
from ...bench.methods import FUSED, SUBJECT
from .hardware import AT_CLOCK, at_clock_cell, at_clock_note, gpu_title
from .plotting import color, grid, no_data, plt, save
from .ratios import index_rows, pass_of, points_of
from .table import Table

NO_SHAPES = "no shapes grid in this study (config shapes.enabled: false)"
# A head dim is aligned at a multiple of 64 (the MMA-friendly width the co-design
# guidelines name); a sequence at a multiple of 128 (the largest tile our schedules use).
D_ALIGN, S_ALIGN = 64, 128


def _ok(row):
    return row is not None and row.get("status") == "ok"


def _pair(rows):
    """(point, our row, SDPA row) per point, in first-seen order."""
    idx = index_rows(rows)
    return [(p, idx.get((k, SUBJECT)), idx.get((k, FUSED))) for k, p in points_of(rows).items()]


def shapes_table(rows: list[dict], gpu: str | None = None):

    t = Table("shapes", "Shapes grid: throughput and launch geometry per point",
              ["dtype", "mask", "pass", "D", "S", "B", "H", "schedule", "programs", "per SM",
               "waves",
               "tail eff.", "D pad", "Sq pad", "Skv pad", f"{SUBJECT} TFLOP/s",
               f"{FUSED} TFLOP/s", "÷ SDPA", "SDPA backend", f"{SUBJECT} {AT_CLOCK}",
               f"{FUSED} {AT_CLOCK}"])
    if not rows:
        t.notes.append(NO_SHAPES + ".")
        return t
    for p, ours, sdpa in _pair(rows):
        fwd = pass_of(p) == "fwd"  # the geometry is the forward's launch: shown there only
        g = ((ours or {}).get("geometry") or {}) if fwd else {}
        a = ours["tflops"] if _ok(ours) else (ours or {}).get("status")
        b = sdpa["tflops"] if _ok(sdpa) else (sdpa or {}).get("status")
        t.rows.append([
            p["dtype"], "causal" if p["causal"] else "full", pass_of(p), row_head_label(p),
            p["seq_q"], p["batch"], p["heads"],
            ((ours or {}).get("details") or {}).get("schedule") if fwd else None,
            g.get("programs"), g.get("per_sm"), g.get("waves"), g.get("tail_efficiency"),
            g.get("head_dim_pad_fraction"), g.get("seq_q_pad_fraction"),
            g.get("seq_kv_pad_fraction"), a, b,
            a / b if isinstance(a, float) and isinstance(b, float) else None,
            ((sdpa or {}).get("details") or {}).get("backend"), at_clock_cell(ours, gpu),
            at_clock_cell(sdpa, gpu)])
    t.notes.append(at_clock_note(rows, gpu))
    if any(pass_of(p) != "fwd" for p in points_of(rows).values()):
        t.notes.append("pass: fwd, or fwd+bwd (forward and backward timed together); the "
                       "schedule and geometry are the forward's launch, shown on forward rows.")
    t.notes.append("waves: programs ÷ (SMs × programs per SM, the schedule's occupancy hint); "
                   "tail eff.: share of the last wave's slots in use; pads: fraction of the "
                   "computed head dim / query / key tiles that is padding. ÷ SDPA > 1: "
                   "TiledAttention faster.")
    return t


def _neighbour(p, points, axis: str):
    """The aligned point next to ``p`` along ``axis`` (all else equal), or None: for D the
    next multiple of 64 up; for S the nearest multiple of 128 (up first)."""
    if axis == "head_dim":
        want = [-(-p["head_dim"] // D_ALIGN) * D_ALIGN]
    else:
        s = p["seq_q"]
        want = [-(-s // S_ALIGN) * S_ALIGN, s // S_ALIGN * S_ALIGN]
    same = ("dtype", "causal", "batch", "heads", "gqa") + (
        ("seq_q", "seq_kv") if axis == "head_dim" else ("head_dim",))
    for w in want:
        for q in points:
            if (q[axis] == w != p[axis] and all(q[k] == p[k] for k in same)
                    and (axis == "head_dim" or q["seq_kv"] == w)):
                return q
    return None


def _aligned(p, axis: str) -> bool:
    return p[axis] % (D_ALIGN if axis == "head_dim" else S_ALIGN) == 0


def shapes_cost_table(rows: list[dict]):
    """Each unaligned shape's throughput as a share of its aligned neighbour's (same
    everything else): < 1 means the unaligned shape computes less efficiently."""
    t = Table("shapes_cost", "Measured cost of unaligned shapes: TFLOP/s ÷ the aligned "
              "neighbour's", ["dtype", "mask", "D", "S", "B", "H", "axis", "aligned",
                              "FLOP ratio", f"{SUBJECT} TFLOP/s ratio", f"{FUSED} TFLOP/s ratio",
                              f"{SUBJECT} time ratio", f"{FUSED} time ratio"])
    if not rows:
        t.notes.append(NO_SHAPES + ".")
        return t
    idx = index_rows(rows)
    points = list(points_of(rows).values())
    for axis, label in (("head_dim", "D"), ("seq_q", "S")):
        for p in points:
            if _aligned(p, axis) or (axis == "seq_q" and p["seq_q"] != p["seq_kv"]):
                continue
            q = _neighbour(p, points, axis)
            if q is None:
                continue
            cells = []
            for m in (SUBJECT, FUSED):
                a, b = idx.get((p["point_key"], m)), idx.get((q["point_key"], m))
                cells.append(a["tflops"] / b["tflops"] if _ok(a) and _ok(b) else None)
            times = []
            for m in (SUBJECT, FUSED):
                a, b = idx.get((p["point_key"], m)), idx.get((q["point_key"], m))
                times.append(a["time_ms"]["median_ms"] / b["time_ms"]["median_ms"]
                             if _ok(a) and _ok(b) else None)
            flop = (p["flops"] / q["flops"]) if p.get("flops") and q.get("flops") else None
            t.rows.append([p["dtype"], "causal" if p["causal"] else "full", p["head_dim"],
                           p["seq_q"], p["batch"], p["heads"], label, q[axis], flop, *cells,
                           *times])
    t.notes.append("axis: what differs from the aligned neighbour; aligned: D a multiple of "
                   f"{D_ALIGN} (the next one up), S a multiple of "
                   f"{S_ALIGN} (the nearest measured); everything else equal. TFLOP/s ratio "
                   "< 1: the unaligned shape computes less efficiently; time ratio near the "
                   "FLOP ratio: no cost beyond the work, near 1: as slow as the aligned "
                   "shape (padded).")
    return t


def _groups(rows, vary: str, fixed: tuple[str, ...]):
    """Point groups that differ only in ``vary`` (at least three values: a sweep, not a
    pair), sorted along it."""
    out: dict[tuple, list[dict]] = {}
    for p in points_of(rows).values():
        out.setdefault(tuple(p[k] for k in fixed), []).append(p)
    return {k: sorted(v, key=lambda p: p[vary]) for k, v in out.items()
            if len({p[vary] for p in v}) >= 3}


def _runs(xy):
    """Split a sorted sweep where it jumps (a step over three times the median step): no
    line is drawn across S values that were not measured."""
    steps = sorted(b[0] - a[0] for a, b in zip(xy, xy[1:]))
    if not steps:
        return [xy]
    cut = 3 * steps[len(steps) // 2]
    runs, cur = [], [xy[0]]
    for a, b in zip(xy, xy[1:]):
        if b[0] - a[0] > cut:
            runs.append(cur)
            cur = []
        cur.append(b)
    return runs + [cur]


def _quantization_rows(rows: list[dict]) -> list[dict]:
    """The rows the figure draws: the forward in 16 bits with V's head dim Q's (what tile
    and wave quantization is read from; a grid's FP8, D_qk != D_v and forward+backward
    points are in the tables: shapes, fp8, headline_shapes)."""
    return [r for r in rows if pass_of(r) == "fwd" and r.get("head_dim_v") is None
            and r.get("dtype") in ("float16", "bfloat16")]


def shapes_figure(rows: list[dict], out_dir: str, gpu: str | None = None) -> list[str]:
    """TFLOP/s vs D and vs S (ours solid, SDPA dashed), and ours against waves coloured by
    the last wave's fill; one legend below the panels."""
    from .plotting import legend, peak_at_clock_axis

    rows = _quantization_rows(rows)
    fig, axes = grid(plt(), 3)
    idx = index_rows(rows)
    n = 0  # one colour per group across both panels: their legend is one
    for ax, vary, fixed, xlabel, align in (
            (axes[0], "head_dim", ("dtype", "causal", "seq_q", "seq_kv", "batch", "heads"),
             "head dim D", D_ALIGN),
            (axes[1], "seq_q", ("dtype", "causal", "head_dim", "batch", "heads"),
             "sequence length S", S_ALIGN)):
        groups = _groups(rows, vary, fixed)
        drawn, plotted = 0, []
        for key, pts in groups.items():
            i, n = n, n + 1
            tag = (f"S={key[2]}" if vary == "head_dim" else f"D={key[2]}")
            for m, style in ((SUBJECT, "-"), (FUSED, "--")):
                ok = [(p[vary], idx[(p["point_key"], m)]["tflops"]) for p in pts
                      if _ok(idx.get((p["point_key"], m)))]
                plotted += [idx[(p["point_key"], m)] for p in pts
                            if _ok(idx.get((p["point_key"], m)))]
                for j, run in enumerate(_runs(ok) if ok else []):
                    ax.plot(*zip(*run), style, marker="o", ms=3, color=f"C{i % 10}",
                            label=f"{m} {tag}" if j == 0 else None)
                    drawn += 1
        if drawn:
            lo, hi = ax.get_xlim()
            for x in range(-(-int(lo) // align) * align, int(hi) + 1, align):
                ax.axvline(x, color="0.7", lw=0.6, zorder=0)
            ax.set_xlabel(f"{xlabel} (grey: multiples of {align})")
            ax.set_ylabel("TFLOP/s")
            peak_at_clock_axis(ax, plotted, gpu)
        else:
            no_data(ax, NO_SHAPES if not rows else f"no points differing only in {xlabel}")
        ax.set_title(f"Throughput vs {xlabel}")
    ax = axes[2]
    ours = [r for r in rows if r.get("method") == SUBJECT and _ok(r) and r.get("geometry")]
    if ours:
        sc = ax.scatter([r["geometry"]["waves"] for r in ours], [r["tflops"] for r in ours],
                        c=[r["geometry"]["tail_efficiency"] for r in ours], cmap="viridis",
                        vmin=0, vmax=1, s=14, edgecolors=color(SUBJECT), linewidths=0.4)
        fig.colorbar(sc, ax=ax, label="tail efficiency (last wave's fill)")
        for w in range(1, int(max(r["geometry"]["waves"] for r in ours)) + 2):
            ax.axvline(w, color="0.7", lw=0.6, zorder=0)
        ax.set_xlabel("waves = programs ÷ (SMs × per SM)")
        ax.set_ylabel(f"{SUBJECT} TFLOP/s")
    else:
        no_data(ax, NO_SHAPES if not rows else f"no ok {SUBJECT} rows with geometry")
    ax.set_title("Throughput vs waves")
    legend(fig, axes, ncol=3)
    fig.suptitle(f"{gpu_title(gpu)}: shapes, forward, tile and wave quantization "
                 "(TiledAttention solid, PyTorch SDPA dashed)")
    return save(fig, out_dir, "shapes")
