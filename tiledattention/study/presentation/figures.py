"""The study's figures (PNG for screens, PDF for print), from the rows alone.

Drawn as the field draws them (FlashAttention's README, the FA3 paper): one pass per figure
(forward, backward and forward+backward are never one series), decode on its own figure
(achieved GB/s against Skv, with the HBM line), the GPU named in every title and its
data-sheet peak as a dashed line (``hardware.py``), the fastest baseline named where it
wins, the variants and the model stage as labelled horizontal bars. A panel with nothing to
draw is left out; a figure with nothing at all (e.g. no GPU methods ran on a CPU smoke study)
is still written, with "no data" and the reason ("no GPU" where that is it), so the workflow
and the report never point at a file that is not there. Legends sit below the panels, never
over data; every measured S is a labelled tick.
"""

from __future__ import annotations

from ...bench.grid import head_label, head_labels, head_shape, pinned_label, row_head_label
from ...bench.methods import METHODS, SUBJECT
from .hardware import gpu_title, peak_of
from .plotting import color as _color
from .plotting import grid as _grid
from .plotting import legend as _legend
from .plotting import no_data as _no_data
from .plotting import no_pair as _no_pair
from .plotting import peak_at_clock_axis as _peak_at_clock_axis
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
    pass_of,
    passes_in,
    points_of,
    with_best,
)
from .shapes import shapes_figure
from .table import _fmt

PANELS = [(dt, c) for dt in ("float16", "bfloat16") for c in (False, True)]
PASS_NAME = {"fwd": "forward", "bwd": "backward", "fwd+bwd": "forward+backward"}


def slug(p: str) -> str:
    """A pass as a file-name part: fwd, bwd, fwdbwd."""
    return p.replace("+", "")


def head_slug(d: int, dv: int | None = None) -> str:
    """A head shape as a file-name part, as in point keys: 128, or 192v128 (D_v differs)."""
    return f"{d}" if dv in (None, d) else f"{d}v{dv}"


def _shape_order(shape):
    return shape[0], shape[1] or 0


def names(head_dims, passes=("fwd",), decode: bool = False, model: bool = False) -> list[str]:
    """The figures write_all writes for a study over ``head_dims`` (D, or [D, D_v]) and
    ``passes`` (with decode points, with the model stage), by file stem: the workflow lists
    its outputs from here."""
    shapes = sorted({head_shape(e) for e in head_dims}, key=_shape_order)
    out = []
    for p in passes:
        out += [f"throughput_{slug(p)}_d{head_slug(d, dv)}" for d, dv in shapes]
        out += [f"regime_map_{slug(p)}", f"ratios_vs_seq_{slug(p)}", f"baselines_d128_{slug(p)}"]
    return out + (["decode"] if decode else []) + [
        "utilisation", "tile_sensitivity", "shapes", "variants"] + (
        ["model_stage"] if model else [])


def names_for(bench, model: bool = False) -> list[str]:
    """``names`` of a validated bench config (its grid's head dims and passes, whether it has
    decode points) and whether the study runs the model stage: the workflow's list."""
    from ...bench.grid import decode_points
    from ...flops import PASSES

    passes = [p for p in PASSES if p in bench.grid.passes]
    return names(bench.grid.head_dims, passes, bool(decode_points(bench.decode)), model)


# One look per method in every figure. torch_sdpa (automatic dispatch) usually runs cuDNN
# and lands exactly on the cudnn line: a hollow square on a dashed line, drawn above it,
# keeps both visible (cudnn: crosses on a dotted line).
STYLE = {"tiledattention": {"marker": "o", "ls": "-", "lw": 1.6, "zorder": 6},
         "torch_sdpa": {"marker": "s", "ls": "--", "lw": 1.2, "mfc": "none", "ms": 5.5,
                        "zorder": 5},
         "cudnn": {"marker": "x", "ls": ":", "lw": 1.2, "ms": 5, "zorder": 4},
         "flash": {"marker": "^", "ls": "-.", "zorder": 3},
         "fa4": {"marker": "D", "ls": "-", "zorder": 4},
         "efficient": {"marker": "v", "ls": "-", "zorder": 3},
         "flash_attn": {"marker": "D", "ls": "--", "zorder": 3},
         "math": {"marker": "P", "ls": ":", "zorder": 3},
         "eager": {"marker": "*", "ls": "-.", "zorder": 3}}


def _style(method: str) -> dict:
    """Colour, marker, line style and drawing order of a method's line."""
    return {"ms": 3.5, "lw": 1.0, "marker": "o", "ls": "-", **STYLE.get(method, {}),
            "color": _color(method)}


def is_decode(p: dict) -> bool:
    """A decode point (Sq < Skv, a KV cache) rather than prefill (Sq = Skv)."""
    return p["seq_q"] != p["seq_kv"]


def _prefill(rows, p=None):
    return [r for r in rows if not is_decode(r) and (p is None or pass_of(r) == p)]


def _by_pass(rows):
    """Each prefill pass and its rows; fwd where none was measured, so that the workflow
    still gets its figure (saying why it is empty)."""
    for p in passes_in(_prefill(rows)) or ["fwd"]:
        yield p, _prefill(rows, p)


def _ratio_passes(rows, figure, what):
    """Per pass of a ratio figure: its rows, them with the fastest baseline, the figure's
    name and title (both ratio figures name and word theirs alike)."""
    for p, mine in _by_pass(rows):
        yield (mine, with_best(mine), f"{figure}_{slug(p)}",
               f"{PASS_NAME[p]}, {SUBJECT} ÷ the fastest fused baseline{what}")


def _panels(rows):
    present = {(p["dtype"], p["causal"]) for p in points_of(rows).values()}
    return [p for p in PANELS if p in present] or sorted(present) or [("float16", False)]


def _drawn_panels(rows, **match):
    """The dtype/mask panels with an ok row matching ``match``: a panel with nothing to
    draw is left out, not published empty."""
    return [pn for pn in _panels(rows) if _ok(rows, dtype=pn[0], causal=pn[1], **match)]


def _title(dtype, causal):
    return f"{dtype}, {'causal' if causal else 'no mask'}"


def _suptitle(fig, gpu, what):
    """Every figure's title names the GPU first."""
    fig.suptitle(f"{gpu_title(gpu)}: {what}")


def _by_seq(rows, **match):
    """The ok rows matching ``match``, in order of S: one line of a throughput plot."""
    return sorted(_ok(rows, **match), key=lambda r: r["seq_q"])


def _ok(rows, **match):
    # .get: head_dim_v is in a row only where V's head dim differs
    return [r for r in rows if r["status"] == "ok"
            and all(r.get(k) == v for k, v in match.items())]


def _peak_line(ax, gpu, what="tflops"):
    """The data sheet's peak as a dashed line (none for a GPU hardware.py does not list):
    nominal, at the data sheet's clock, not the clock the kernels ran at."""
    peak = peak_of(gpu)
    if peak is None:
        return
    if what == "tflops":
        ax.axhline(peak.dense_tflops, ls="--", color="0.25", lw=0.9, zorder=1,
                   label=f"nominal peak {peak.dense_tflops:g} TFLOP/s (data sheet, dense "
                   "bf16/fp16)")
    else:
        ax.axhline(peak.hbm_gbs, ls="--", color="0.25", lw=0.9, zorder=1,
                   label=f"HBM {peak.hbm_tbs:g} TB/s")


def _empty_figure(plt, gpu, why, name, what, out_dir):
    """A figure with nothing to draw: one panel saying why (the workflow needs the file)."""
    fig, axes = _grid(plt, 1)
    _no_data(axes[0], why)
    _suptitle(fig, gpu, what)
    return _save(fig, out_dir, name)


def throughput_vs_seq(rows, out_dir, gpu=None) -> list[str]:
    """One figure per pass and D: TFLOP/s at the median time vs S (prefill points), whisker
    down to the p95 time, the dense peak dashed."""
    plt = _plt()
    paths = []
    methods = [m for m in methods_in(rows) if pinned_label(m) is None]
    for p, mine in _by_pass(rows):
        shapes = {(q["head_dim"], q.get("head_dim_v")) for q in points_of(mine).values()}
        for d, dv in sorted(shapes, key=_shape_order):
            name = f"throughput_{slug(p)}_d{head_slug(d, dv)}"
            what = (f"{PASS_NAME[p]} throughput vs S, D={head_label(d, dv)} "
                    "(whisker: p95 time)")
            panels = _drawn_panels(mine, head_dim=d, head_dim_v=dv)
            if not panels:
                paths += _empty_figure(plt, gpu, _why_empty(mine, lambda r, d=d, dv=dv: (
                    r.get("head_dim") == d and r.get("head_dim_v") == dv)), name, what,
                    out_dir)
                continue
            fig, axes = _grid(plt, len(panels))
            for ax, (dtype, causal) in zip(axes, panels):
                seqs, drawn = [], []
                for m in methods:
                    ok = _by_seq(mine, method=m, head_dim=d, head_dim_v=dv, dtype=dtype,
                                 causal=causal)
                    if not ok:
                        continue
                    s = [r["seq_q"] for r in ok]
                    y = [r["tflops"] for r in ok]
                    p95 = [r["flops"] / (r["time_ms"]["p95_ms"] * 1e-3) / 1e12 for r in ok]
                    ax.errorbar(s, y, yerr=[[a - b for a, b in zip(y, p95)], [0] * len(y)],
                                capsize=2, label=m, **_style(m))
                    seqs += s
                    drawn += ok
                _peak_line(ax, gpu)
                _peak_at_clock_axis(ax, drawn, gpu)
                ax.set_title(_title(dtype, causal))
                _seq_axis(ax, seqs)
                ax.set_ylabel("TFLOP/s")
                ax.set_ylim(bottom=0)
            _legend(fig, axes)
            _suptitle(fig, gpu, what)
            paths += _save(fig, out_dir, name)
    return paths


def _cell_ratios(best, dtype, causal, measure="kernel"):
    """{(D, S): TiledAttention ÷ the fastest fused baseline} over one dtype/mask's points
    (D: the head shape's label, "192/128" where V's head dim differs)."""
    def cell(q):
        return (row_head_label(q), q["seq_q"]) if (q["dtype"], q["causal"]) == (dtype, causal) \
            else None

    per = compare_by(best, SUBJECT, BEST, cell, measure)
    per.pop(None, None)
    return cell, {k: s.geomean for k, s in per.items() if s.n}


def regime_map(rows, out_dir, gpu=None) -> list[str]:
    """Per pass: TiledAttention ÷ the fastest fused baseline at each prefill point over S × D,
    one panel per dtype/mask; a cell where a baseline wins names it."""
    plt = _plt()
    paths = []
    for mine, best, name, what in _ratio_passes(rows, "regime_map",
                                                " at each point (named where it wins)"):
        panels = [pn for pn in _panels(mine) if _cell_ratios(best, *pn)[1]]
        if not panels:
            paths += _empty_figure(plt, gpu, _no_pair(mine, lambda r: True), name, what,
                                   out_dir)
            continue
        fig, axes = _grid(plt, len(panels))
        for ax, (dtype, causal) in zip(axes, panels):
            cell, cells = _cell_ratios(best, dtype, causal)
            ds = [d for d in head_labels(points_of(mine).values()) if d in {k[0] for k in cells}]
            ss = sorted({k[1] for k in cells})
            grid = [[cells.get((d, s), float("nan")) for s in ss] for d in ds]
            im = ax.imshow(grid, cmap="RdYlGn", vmin=0.5, vmax=1.5, aspect="auto",
                           origin="lower")
            for i, row in enumerate(grid):
                for j, v in enumerate(row):
                    if v != v:  # NaN: not measured
                        continue
                    who = "" if v >= 1 else next(iter(fastest_counts(
                        mine, SUBJECT, lambda q, k=(ds[i], ss[j]), f=cell: f(q) == k)), "")
                    ax.text(j, i, f"{_fmt(v)}\n{who}".strip(), ha="center", va="center",
                            fontsize=6.5)
            ax.set_xticks(range(len(ss)), [str(s) for s in ss])
            ax.set_yticks(range(len(ds)), [str(d) for d in ds])
            ax.grid(False)
            ax.set_xlabel("S")
            ax.set_ylabel("D")
            ax.set_title(_title(dtype, causal))
            fig.colorbar(im, ax=ax, label="ratio (> 1: faster)")
        _suptitle(fig, gpu, what)
        paths += _save(fig, out_dir, name)
    return paths


def ratios_vs_seq(rows, out_dir, gpu=None) -> list[str]:
    """Per pass: TiledAttention ÷ the fastest fused baseline at each prefill point over S,
    per D: kernel time (solid) and call latency (dashed), one panel per dtype/mask."""
    plt = _plt()
    paths = []
    for mine, best, name, what in _ratio_passes(
            rows, "ratios_vs_seq", ": kernel time (solid), call latency (dashed)"):
        ds = head_labels(points_of(mine).values())
        drawn = []
        for dtype, causal in _panels(mine):
            lines = []
            for i, d in enumerate(ds):
                for measure, style in (("kernel", "-"), ("call", "--")):
                    per = compare_by(best, SUBJECT, BEST,
                                     lambda q, d=d, dt=dtype, c=causal: q["seq_q"]
                                     if (row_head_label(q), q["dtype"], q["causal"]) == (d, dt, c)
                                     else None, measure)
                    per.pop(None, None)
                    pts = sorted((s, r.geomean) for s, r in per.items() if r.n)
                    if pts:
                        lines.append((pts, style, i, f"D={d} {MEASURES[measure][0]}"))
            if lines:
                drawn.append(((dtype, causal), lines))
        if not drawn:
            paths += _empty_figure(plt, gpu, _no_pair(mine, lambda r: True), name, what,
                                   out_dir)
            continue
        fig, axes = _grid(plt, len(drawn))
        for ax, ((dtype, causal), lines) in zip(axes, drawn):
            for pts, style, i, label in lines:
                ax.plot(*zip(*pts), style, marker="o", ms=3, color=f"C{i % 10}", label=label)
            ax.axhline(1.0, color="0.4", lw=0.8)
            ax.set_title(_title(dtype, causal))
            _seq_axis(ax, [s for pts, *_ in lines for s, _ in pts])
            ax.set_ylabel("ratio (> 1: faster)")
        _legend(fig, axes)
        _suptitle(fig, gpu, what)
        paths += _save(fig, out_dir, name)
    return paths


def baselines_at_d128(rows, out_dir, gpu=None) -> list[str]:
    """Per pass: every method at D=128 vs S (prefill), log scale, the dense peak dashed (a
    study without D=128 says so)."""
    plt = _plt()
    d = 128
    paths = []
    for p, mine in _by_pass(rows):
        name = f"baselines_d128_{slug(p)}"
        what = f"{PASS_NAME[p]}, every baseline at D={d}"
        ds = head_labels(points_of(mine).values())
        panels = _drawn_panels(mine, head_dim=d, head_dim_v=None)  # D_v = D only
        if not panels:
            why = (f"no D={d} points in this study (D measured: {ds})" if d not in ds else
                   _why_empty(mine, lambda r: r.get("head_dim") == d
                              and r.get("head_dim_v") is None))
            paths += _empty_figure(plt, gpu, why, name, what, out_dir)
            continue
        fig, axes = _grid(plt, len(panels))
        for ax, (dtype, causal) in zip(axes, panels):
            seqs, drawn = [], []
            for m in [m for m in METHODS if m in methods_in(mine)]:
                ok = _by_seq(mine, method=m, head_dim=d, head_dim_v=None, dtype=dtype,
                             causal=causal)
                if ok:
                    ax.plot([r["seq_q"] for r in ok], [r["tflops"] for r in ok], label=m,
                            **_style(m))
                    seqs += [r["seq_q"] for r in ok]
                    drawn += ok
            _peak_line(ax, gpu)
            ax.set_title(_title(dtype, causal))
            _seq_axis(ax, seqs, "S")
            ax.set_yscale("log")
            ax.set_ylabel("TFLOP/s")
            _peak_at_clock_axis(ax, drawn, gpu)  # after the log scale: it takes the parent's
        _legend(fig, axes)
        _suptitle(fig, gpu, what)
        paths += _save(fig, out_dir, name)
    return paths


def _kv_axis(ax, skvs) -> None:
    """Log-2 Skv axis, each measured Skv a tick labelled in K (1K, 32K): short enough that
    an octave's ticks never overlap."""
    from matplotlib.ticker import NullLocator

    skvs = sorted(set(skvs))
    ax.set_xscale("log", base=2)
    ax.set_xticks(skvs, [f"{s // 1024}K" if s % 1024 == 0 else str(s) for s in skvs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("Skv (KV cache length)")


def decode(rows, out_dir, gpu=None) -> list[str]:
    """The decode points on their own figure: achieved GB/s (compulsory bytes ÷ kernel time)
    against Skv per method, one panel per Sq (row) and batch/GQA (column), HBM dashed."""
    dec = [r for r in rows if is_decode(r)]
    if not dec:
        return []
    plt = _plt()
    what = "decode, achieved bandwidth (q, k, v read and out written once) vs Skv"
    rows_k = sorted({(r["dtype"], r["head_dim"], r["seq_q"]) for r in dec})
    cols_k = sorted({(r["batch"], r["gqa"]) for r in dec})
    panels = [(rk, ck) for rk in rows_k for ck in cols_k
              if _ok(dec, dtype=rk[0], head_dim=rk[1], seq_q=rk[2], batch=ck[0], gqa=ck[1])]
    if not panels:
        return _empty_figure(plt, gpu, _why_empty(dec), "decode", what, out_dir)
    ncol = len(cols_k)
    nrow = -(-len(panels) // ncol)
    fig, grid = plt.subplots(nrow, ncol, figsize=(2.4 * ncol, 2.3 * nrow), squeeze=False,
                             layout="constrained", sharey=True)
    axes = [a for row in grid for a in row]
    for a in axes[len(panels):]:
        a.set_visible(False)
    methods = [m for m in METHODS if m in methods_in(dec)]
    for ax, ((dtype, d, sq), (b, g)) in zip(axes, panels):
        skvs = []
        for m in methods:
            ok = sorted(_ok(dec, method=m, dtype=dtype, head_dim=d, seq_q=sq, batch=b, gqa=g),
                        key=lambda r: r["seq_kv"])
            if ok:
                ax.plot([r["seq_kv"] for r in ok], [r["gbytes_per_s"] for r in ok], label=m,
                        **_style(m))
                skvs += [r["seq_kv"] for r in ok]
        _peak_line(ax, gpu, "hbm")
        _kv_axis(ax, skvs)
        ax.set_ylim(bottom=0)
        ax.set_title(f"Sq={sq}, B={b}, GQA {g}" + (f" ({dtype} D={d})" if len(rows_k) > 3
                                                     else ""), fontsize=8)
        ax.set_ylabel("GB/s")
    _legend(fig, axes, ncol=6)
    dt = sorted({k[0] for k in rows_k})
    ds = sorted({k[1] for k in rows_k})
    _suptitle(fig, gpu, f"{what}; {', '.join(dt)}, D={', '.join(map(str, ds))}")
    return _save(fig, out_dir, "decode")


def tile_sensitivity(ladder_rows, tune_entries, out_dir, tune_reason=None, gpu=None) -> list[str]:
    """Ladder steps' TFLOP/s per point, and the tuned buckets' runner-up sensitivity, each
    panel only where it has something to draw (a study that did not tune gets no tuning
    panel; why it did not is a note under the figure). ``tune_reason``: why the tuning table
    is empty (its ``meta.unavailable``)."""
    plt = _plt()
    steps = [m for m in methods_in(ladder_rows or []) if pinned_label(m) is not None
             or m == SUBJECT]
    ladder_ok = [r for r in ladder_rows or [] if r.get("method") in steps
                 and r.get("status") == "ok"]
    panels = (["ladder"] if ladder_ok or steps else []) + (["tune"] if tune_entries else [])
    no_tune = None if tune_entries else (
        f"tuning did not run: {' '.join(str(tune_reason).split())}" if tune_reason
        else "tuning did not run in this study")
    if not panels:
        return _empty_figure(plt, gpu, f"no schedule ladder in this study; {no_tune}",
                             "tile_sensitivity", "tile/schedule sensitivity", out_dir)
    fig, axes = _grid(plt, len(panels))
    n_points = len(points_of(ladder_rows or []))  # a bar group per point: tall enough
    fig.set_size_inches(max(fig.get_size_inches()[0], 5.5), max(2.8, 0.5 * n_points + 1.4))
    for ax, panel in zip(axes, panels):
        if panel == "tune":
            vals = sorted(100 * e["sensitivity"] for e in tune_entries
                          if e.get("sensitivity") is not None)
            ax.hist(vals, bins=20)
            ax.set_xlabel("runner-up slower by (%)")
            ax.set_ylabel("tuned buckets")
            ax.set_title("Tuning sensitivity")
            continue
        ax.set_title("Schedule ladder (forward)")
        if not ladder_ok:
            _no_data(ax, _why_empty(ladder_rows, need=set(steps)))
            continue
        keys = list(points_of(ladder_rows))
        height = 0.8 / len(steps)
        # Horizontal bars: each point's label reads level, never over its neighbour's.
        for i, m in enumerate(steps):
            idx = {r["point_key"]: r for r in _ok(ladder_rows, method=m)}
            ax.barh([k + i * height for k in range(len(keys))],
                    [idx[k]["tflops"] if k in idx else 0 for k in keys], height,
                    label=pinned_label(m) if m != SUBJECT else "tuned")
        ax.set_yticks([k + 0.4 - height / 2 for k in range(len(keys))],
                      [_point_label(points_of(ladder_rows)[k]) for k in keys], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("TFLOP/s")
        _peak_at_clock_axis(ax, ladder_ok, gpu, "x")
    _legend(fig, axes, ncol=3)
    # Why there is no tuning panel goes in the title, where the layout keeps room for it.
    _suptitle(fig, gpu, "tile/schedule sensitivity" + (f"\n({_wrap(no_tune)})" if no_tune
                                                       else ""))
    return _save(fig, out_dir, "tile_sensitivity")


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, 90)


def _point_label(p: dict) -> str:
    """A point as a short tick label: "fp16 causal D64 S1024"."""
    return (f"{p['dtype'].replace('float', 'fp').replace('bfloat', 'bf')} "
            f"{'causal' if p['causal'] else 'full'} D{row_head_label(p)} S{p['seq_q']}")


def utilisation(rows, out_dir, gpu=None) -> list[str]:
    """Per pass, each method's best prefill throughput as horizontal bars against the dense
    peak (dashed), each labelled with its TFLOP/s and share of the peak as the README
    states them: the training result (forward+backward) at a glance."""
    from .hardware import best_rows, share

    plt = _plt()
    what = ("best prefill throughput per method (any D, dtype, mask), share of the dense peak: "
            "nominal (data sheet's clock); at MHz: at the SM clock the row ran")
    best = {p: [(m, r["tflops"], r) for m, r in ms if pinned_label(m) is None]
            for p, ms in best_rows(rows).items()}
    if not best:
        return _empty_figure(plt, gpu, _why_empty(_prefill(rows)), "utilisation", what,
                             out_dir)
    fig, axes = _grid(plt, len(best))
    peak = peak_of(gpu)
    for ax, (p, ms) in zip(axes, best.items()):
        ys = list(range(len(ms)))
        ax.barh(ys, [t for _, t, _ in ms], color=[_color(m) or "C0" for m, _, _ in ms])
        for y, (_, t, r) in zip(ys, ms):
            ax.text(t, y, f" {share(t, gpu, r.get('sm_clock_mhz'), r.get('dtype'))}",
                    va="center", ha="left", fontsize=7)
        ax.set_yticks(ys, [m for m, _, _ in ms])
        ax.invert_yaxis()
        if peak:
            ax.axvline(peak.dense_tflops, ls="--", color="0.25", lw=0.9,
                       label=f"nominal peak {peak.dense_tflops:g} TFLOP/s (data sheet, "
                       "dense bf16/fp16)")
        top = max([t for _, t, _ in ms] + ([peak.dense_tflops] if peak else []))
        ax.set_xlim(0, top * 1.35)
        ax.set_xlabel("TFLOP/s")
        ax.set_title(PASS_NAME.get(p, p))
    _legend(fig, axes)
    _suptitle(fig, gpu, what)
    return _save(fig, out_dir, "utilisation")


def model_stage(model_rows, out_dir, gpu=None) -> list[str]:
    """The model stage (tiny Llama end to end) as horizontal bars: each implementation's
    tokens/s ÷ transformers' sdpa path's, per phase and batch, labelled with the value
    (the model_e2e table's ÷ sdpa)."""
    from .tables import MODEL_METHODS, model_e2e

    plt = _plt()
    what = "model stage, tiny Llama tokens/s ÷ transformers' sdpa (> 1: faster)"
    t = model_e2e(model_rows)
    recs = [(r[0], r[1], r[2], r[4]) for r in t.rows if r[4] is not None]
    if not recs:
        why = next((r[5] for r in t.rows if r[5] != "ok"), None) or (
            "no model stage in this study")
        return _empty_figure(plt, gpu, why, "model_stage", what, out_dir)
    groups = list(dict.fromkeys((b, ph) for b, ph, _, _ in recs))
    fig, axes = _grid(plt, len(groups))
    for ax, (b, ph) in zip(axes, groups):
        mine = [(m, v) for bb, pp, m, v in recs if (bb, pp) == (b, ph)]
        ys = range(len(mine))
        ax.barh(list(ys), [v for _, v in mine],
                color=[_color(MODEL_METHODS.get(m, m)) or "C0" for m, _ in mine])
        for y, (_, v) in zip(ys, mine):
            ax.text(v, y, f" {_fmt(v)}", va="center", ha="left", fontsize=7)
        ax.set_yticks(list(ys), [m for m, _ in mine])
        ax.invert_yaxis()
        ax.axvline(1.0, color="0.4", lw=0.8)
        ax.set_xlim(0, max(v for _, v in mine) * 1.3)
        ax.set_title(f"{ph}, B={b}")
        ax.set_xlabel("÷ sdpa")
    _suptitle(fig, gpu, what)
    return _save(fig, out_dir, "model_stage")


def _variants_figure(rows, out_dir, gpu=None, **_) -> list[str]:
    from .variants_report import variants_figure

    return variants_figure(rows, out_dir, gpu)


# The figures each stage's own rows become, by stage name (``stages.STAGES``' rows records;
# write_all takes their rows by it), drawn in this order after the benchmark's. Each takes
# (rows, out_dir, gpu) and the tuning table's entries and reason (the ladder's figure
# draws them beside its rows).
STAGE_FIGURES = {
    "ladder": lambda rows, out_dir, gpu, tune_entries=None, tune_reason=None:
        tile_sensitivity(rows, tune_entries or [], out_dir, tune_reason, gpu),
    "shapes": lambda rows, out_dir, gpu, **_: shapes_figure(rows, out_dir, gpu),
    "variants": _variants_figure,
    "model": lambda rows, out_dir, gpu, **_: model_stage(rows, out_dir, gpu) if rows else [],
}


def write_all(rows, out_dir, *, tune_entries=None, tune_reason=None, gpu=None,
              stage_rows=None) -> list[str]:
    """Every figure of the study (``names`` lists them); ``gpu``: the GPU's name as the
    manifest records it, for every title and the peak lines; ``stage_rows``: the stages'
    own rows by stage name (``STAGE_FIGURES``)."""
    stage_rows = stage_rows or {}
    return (throughput_vs_seq(rows, out_dir, gpu) + regime_map(rows, out_dir, gpu)
            + ratios_vs_seq(rows, out_dir, gpu) + baselines_at_d128(rows, out_dir, gpu)
            + decode(rows, out_dir, gpu) + utilisation(rows, out_dir, gpu)
            + [p for name, draw in STAGE_FIGURES.items()
               for p in draw(stage_rows.get(name) or [], out_dir, gpu,
                             tune_entries=tune_entries, tune_reason=tune_reason)])
