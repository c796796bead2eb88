"""One table across systems: the same study's points on several GPUs side by side.

``tiledattn systems STUDY STUDY... [--names h100 h200] --out DIR``: per point (and pass),
each system's TiledAttention kernel time and its speed ratio to PyTorch SDPA (auto
dispatch) there, the time ratio of each system to the first, and the geometric means over
the points every system measured ok. Rows come from each study's own measurements (a
bundle, its zip, a results directory or a rows file, as ``tiledattn compare`` reads them).
Written as systems.md and systems.csv.
"""

from __future__ import annotations

import csv
import io
import os

from ...bench.methods import FUSED, SUBJECT
from ...errors import StudyError
from ..presentation.hardware import AT_CLOCK, at_clock_note, pct_at_clock
from ..presentation.ratios import geomean, index_rows, pass_of, points_of
from .compare import load_study, stage_of

BASELINE = FUSED


def _kernel_ms(row: dict | None) -> float | None:
    if not row or row.get("status") != "ok":
        return None
    t = (row.get("time_ms") or {}).get("median_ms")
    return t if t and t > 0 else None




# A median kernel time outside these bounds (ms) is no measurement (an edited or corrupted
# row): refused, so that every ratio and geomean of the table stays a finite number.
LIMITS_MS = (1e-4, 86_400_000.0)  # 0.1 us to a day


def _check_times(rows: list[dict], where: str) -> None:
    for n, r in enumerate(rows, 1):
        t = _kernel_ms(r) if r.get("method") in (SUBJECT, BASELINE) else None
        if t is not None and not LIMITS_MS[0] <= t <= LIMITS_MS[1]:
            raise StudyError(f"{where}: row {n} ({r.get('point_key')}, {r.get('method')}): "
                             f"median_ms {t!r} is not a kernel time (0.0001 ms to a day)")


def _round(x: float, digits: int) -> float:
    """``round(x, digits)``, or ``digits`` significant digits where that would give 0 (a
    ratio far below 1 stays positive: its geomean needs a logarithm)."""
    return round(x, digits) or float(f"{x:.{digits}g}")


def _label(point: dict) -> str:
    shape = (f"S{point['seq_q']}" if point["seq_q"] == point["seq_kv"]
             else f"Sq{point['seq_q']} Skv{point['seq_kv']}")
    gqa = f" GQA{point['gqa']}" if point.get("gqa", 1) != 1 else ""
    return (f"{point['dtype']} {'causal' if point['causal'] else 'full'} D{point['head_dim']} "
            f"{shape} B{point['batch']} H{point['heads']}{gqa}")


POINT = {"dtype": str, "causal": bool, "head_dim": int, "seq_q": int, "seq_kv": int,
         "batch": int, "heads": int}


def _check_points(rows: list[dict], where: str) -> None:
    """Every row's point fields (the table labels each point by them), or one StudyError."""
    for n, r in enumerate(rows, 1):
        for field, kind in POINT.items():
            v = r.get(field)
            if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
                raise StudyError(f"{where}: row {n} ({r.get('point_key')}, {r.get('method')}):"
                                 f" {field} is {'missing' if v is None else repr(v)}, not "
                                 f"{'an' if kind is int else 'a'} {kind.__name__}")


def side_by_side(studies: list[tuple[str, list[dict]]],
                 gpus: list[str | None] | None = None) -> tuple[list[str], list[list]]:
    """(columns, rows): per point of the first study, in its order, each system's kernel
    time (ms), its % of the peak at the SM clock its row recorded (``gpus``: each study's
    GPU; None where there is no clock or peak) and ratio (SDPA time / ours, > 1: ours
    faster), and each later system's time over the first's."""
    names = [n for n, _ in studies]
    gpus = gpus or [None] * len(studies)
    idx = [index_rows(rows) for _, rows in studies]
    columns = ["pass", "point"]
    for n in names:
        columns += [f"{n} ms", f"{n} {AT_CLOCK}", f"{n} ratio to SDPA"]
    columns += [f"{n} ÷ {names[0]} time" for n in names[1:]]
    out = []
    for key, point in points_of(studies[0][1]).items():
        times = [_kernel_ms(i.get((key, SUBJECT))) for i in idx]
        if all(t is None for t in times):
            continue
        base = [_kernel_ms(i.get((key, BASELINE))) for i in idx]
        row = [pass_of(point), _label(point)]
        for t, b, i, gpu in zip(times, base, idx, gpus):
            pct = pct_at_clock(i.get((key, SUBJECT)), gpu)
            row += [None if t is None else _round(t, 4),
                    None if pct is None else round(pct, 1),
                    None if t is None or b is None else _round(b / t, 3)]
        row += [None if t is None or times[0] is None else _round(t / times[0], 3)
                for t in times[1:]]
        out.append(row)
    return columns, out


def _at_clock(column: str) -> bool:
    return column.endswith(AT_CLOCK)


def geomeans(columns: list[str], rows: list[list]) -> list[list]:
    """Per pass: the geometric mean of every numeric column over the points where every
    column of the table has a value (the same points for each system). The % peak @ clock
    columns are not in that rule (rows from before the clock sampler have none, and must
    not blank the times' geomeans): theirs is over the same points where each of them has
    a value, — where one lacks it."""
    timed = [i for i, c in enumerate(columns) if i >= 2 and not _at_clock(c)]
    out = []
    for pass_ in sorted({r[0] for r in rows}, key=lambda p: (p != "fwd", p)):
        full = [r for r in rows if r[0] == pass_ and all(r[i] is not None for i in timed)]
        means = [None if _at_clock(columns[i]) and any(r[i] is None for r in full)
                 else geomean([r[i] for r in full]) for i in range(2, len(columns))]
        out.append([pass_, f"geomean over {len(full)} points"]
                   + [None if m is None else round(m, 1) if _at_clock(c)
                      else _round(m, 4 if "ms" in c else 3)
                      for m, c in zip(means, columns[2:])])
    return out


def _fmt(v) -> str:
    return "—" if v is None else str(v)


def clock_notes(names: list[str], studies: list[tuple[list[dict], str | None]]) -> list[str]:
    """The % peak @ clock footnote per system (``hardware.at_clock_note`` of its subject's
    rows: what the number is and why a cell reads —), one line for systems that share it."""
    by_note: dict[str, list[str]] = {}
    for name, (rows, gpu) in zip(names, studies):
        note = at_clock_note([r for r in rows if r.get("method") == SUBJECT], gpu)
        by_note.setdefault(note, []).append(name)
    return [f"{', '.join(who)}: {note}" for note, who in by_note.items()]


def markdown(names: list[str], gpus: list[str], columns: list[str], rows: list[list],
             means: list[list], notes: list[str] = ()) -> str:
    lines = ["# " + " and ".join(names) + ": TiledAttention side by side", "",
             "Systems: " + "; ".join(f"{n} ({g})" for n, g in zip(names, gpus)) + ".", "",
             "Kernel time: TiledAttention's median CUDA-event time (ms). Ratio to SDPA: "
             "PyTorch SDPA's (automatic dispatch) kernel time over ours on the same system "
             "(> 1: ours faster). Last columns: each system's time over the first's. "
             "Geomeans are over the points every system measured ok (a % peak @ clock "
             "column's, where each of them recorded a clock).", "",
             *[line for note in notes for line in (note, "")],
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(v) for v in r) + " |" for r in means]
    lines += ["", "## Per point", "", "| " + " | ".join(columns) + " |",
              "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(paths: list[str], names: list[str] | None, out_dir: str) -> list[str]:
    if len(paths) < 2:
        raise StudyError("systems: name two or more studies (e.g. the H100 and H200 ones)")
    if names and len(names) != len(paths):
        raise StudyError(f"--names: {len(names)} name(s) for {len(paths)} studies")
    # The benchmark's rows: load_study also returns the variants and model stages' (for
    # compare), which are not points of the benchmark grid this table sets side by side.
    loaded = [([r for r in rows_ if stage_of(r) == "bench"], gpu)
              for rows_, gpu in (load_study(p) for p in paths)]
    names = names or [os.path.basename(os.path.normpath(p)) for p in paths]
    if len(set(names)) != len(names):
        raise StudyError(f"--names: each system needs its own name, got {names}")
    for path, (rows_, _) in zip(paths, loaded):
        _check_points(rows_, path)
        _check_times(rows_, path)
    columns, rows = side_by_side([(n, r) for n, (r, _) in zip(names, loaded)],
                                 [g for _, g in loaded])
    if not rows:
        raise StudyError(f"{paths[0]}: no {SUBJECT} row measured ok: nothing to set side by "
                         "side")
    means = geomeans(columns, rows)
    os.makedirs(out_dir, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns)
    w.writerows([["" if v is None else v for v in r] for r in means + rows])
    out = [os.path.join(out_dir, "systems.csv"), os.path.join(out_dir, "systems.md")]
    with open(out[0], "w") as f:
        f.write(buf.getvalue())
    with open(out[1], "w") as f:
        f.write(markdown(names, [g for _, g in loaded], columns, rows, means,
                         clock_notes(names, loaded)))
    return out + figure(names, [g for _, g in loaded], columns, rows, means, out_dir)


def figure(names: list[str], gpus: list[str], columns: list[str], rows: list[list],
           means: list[list], out_dir: str) -> list[str]:
    """systems.png/.pdf: one panel per pass, each system's TiledAttention time over the
    first system's per point (sorted, so the spread shows) with the geomean dashed and
    labelled as the table prints it. Nothing is drawn that systems.md does not state."""
    try:
        from ..presentation.plotting import grid, legend, plt, save
    except ImportError:  # no matplotlib: the table alone (figures are the [figures] extra)
        return []
    pyplot = plt()
    passes = [m[0] for m in means]
    fig, axes = grid(pyplot, len(passes))
    ratio_cols = [i for i, c in enumerate(columns) if c.endswith(f"÷ {names[0]} time")]
    for ax, p, mean in zip(axes, passes, means):
        for k, i in enumerate(ratio_cols):
            ys = sorted(r[i] for r in rows if r[0] == p and r[i] is not None)
            ax.plot(range(len(ys)), ys, ".", ms=3, color=f"C{k}",
                    label=f"{columns[i].split(' ÷ ')[0]} ÷ {names[0]}, per point")
            if mean[i] is not None:
                ax.axhline(mean[i], ls="--", color=f"C{k}", lw=1)
                ax.text(0, mean[i], f"geomean {mean[i]}", va="bottom", fontsize=7)
        ax.axhline(1.0, color="0.4", lw=0.8)
        ax.set_title({"fwd": "forward", "fwd+bwd": "forward+backward"}.get(p, p))
        ax.set_xlabel("points, sorted")
        ax.set_ylabel(f"time ÷ {names[0]}'s")
    legend(fig, axes)
    fig.suptitle(" vs ".join(f"{n} ({g})" for n, g in zip(names, gpus))
                 + ": TiledAttention's kernel time ÷ the first system's at the same points "
                 "(< 1: faster)")
    return save(fig, out_dir, "systems", record=False)
