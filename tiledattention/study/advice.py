"""``tiledattn advise``: what our measurements say about a model's attention shape.

Predictions are the TFLOP/s measured at the nearest measured points (no interpolation, no
model): the shipped ``study/measured/<gpu>.json`` holds the points of the committed
reference study (``results/reference/<gpu>/``: its ``throughput`` table and the shapes
grids' rows), built by ``python -m tiledattention.study.advice build``. A shape whose
nearest point is too far on any axis is refused, not guessed. Tile and wave quantization
come from the launch geometry (``kernel/geometry.py``) of the schedule the shipped table
picks for the shape; suggestions keep the hidden size H·D and list only alternatives whose
own nearest measured point is faster.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from importlib import resources

from ..errors import TiledAttentionError

FORMAT = "tiledattention-measured/1"
SUBJECT, FUSED = "tiledattention", "torch_sdpa"
# How near a measured point must be to stand for a shape: S and B·H within a factor 2,
# D within 25 % (a different D is a different chunking of the head dim).
MAX_LOG2 = {"head_dim": math.log2(1.25), "seq": 1.0, "batch_heads": 1.0}
# Distance weights: a different D is a different kernel variant, a different S a different
# key-loop length; B·H only changes how many programs run side by side.
WEIGHTS = {"head_dim": 2.0, "seq": 1.5, "batch_heads": 1.0}
# Tail effects matter while the launch has few waves.
FEW_WAVES = 8


class AdviceError(TiledAttentionError, ValueError):
    """The shape is outside what was measured, or the data file is unusable."""


@dataclass(frozen=True)
class Shape:
    heads: int
    head_dim: int
    seq: int
    batch: int
    dtype: str = "float16"
    causal: bool = False

    def describe(self) -> str:
        return (f"H={self.heads} D={self.head_dim} S={self.seq} B={self.batch} {self.dtype} "
                f"{'causal' if self.causal else 'no mask'}")


def gpus() -> list[str]:
    """GPU keys with shipped measurements (file stems of study/measured/*.json)."""
    root = resources.files(__package__) / "measured"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


def load(gpu: str) -> dict:
    path = resources.files(__package__) / "measured" / f"{gpu}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdviceError(f"--gpu {gpu}: no measurements shipped; measured GPUs: "
                          f"{gpus()}") from None
    if data.get("format") != FORMAT:
        raise AdviceError(f"{path}: not a measurements file ({FORMAT})")
    return data


def _axes(p: dict) -> dict[str, float]:
    return {"head_dim": math.log2(p["head_dim"]), "seq": math.log2(p["seq"]),
            "batch_heads": math.log2(p["batch"] * p["heads"])}


def _distance(a: dict, b: dict) -> tuple[float, dict[str, float]]:
    """Weighted sum of the axes' |log2| differences (WEIGHTS), and each axis' difference."""
    xa, xb = _axes(a), _axes(b)
    diff = {k: abs(xa[k] - xb[k]) for k in xa}
    return sum(WEIGHTS[k] * v for k, v in diff.items()), diff


def _as_point(shape: Shape) -> dict:
    return {"head_dim": shape.head_dim, "seq": shape.seq, "batch": shape.batch,
            "heads": shape.heads}


def nearest(points: list[dict], shape: Shape, *, exact_head_dim: bool = False,
            k: int = 3) -> list[tuple[float, dict, dict]]:
    """Up to ``k`` measured points of the shape's dtype and mask within MAX_LOG2 on every
    axis, nearest first, as (distance, axis differences, point)."""
    q = _as_point(shape)
    found = []
    for p in points:
        if p["dtype"] != shape.dtype or p["causal"] != shape.causal:
            continue
        if exact_head_dim and p["head_dim"] != shape.head_dim:
            continue
        if p.get(SUBJECT) is None:
            continue
        dist, diff = _distance(q, p)
        if all(diff[a] <= MAX_LOG2[a] + 1e-9 for a in diff):
            found.append((dist, diff, p))
    found.sort(key=lambda t: (t[0], t[2]["source"] != "shapes"))
    return found[:k]


def _how_near(shape: Shape, p: dict) -> str:
    parts = []
    for name, mine, theirs in (("D", shape.head_dim, p["head_dim"]), ("S", shape.seq, p["seq"]),
                               ("B·H", shape.batch * shape.heads, p["batch"] * p["heads"])):
        parts.append(f"{name} same" if mine == theirs else f"{name} {theirs} vs {mine} "
                     f"(x{theirs / mine:.2f})")
    return ", ".join(parts)


def _point_label(p: dict) -> str:
    return f"D={p['head_dim']} S={p['seq']} B={p['batch']} H={p['heads']} [{p['source']}]"


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.1f}"


def _geometry(shape: Shape, data: dict):
    from ..kernel.geometry import grid_for, launch_geometry
    from ..schedules import policy
    from ..schedules.table import Bucket, seq_bucket

    schedule, how = policy._choose(Bucket(data["compute_capability"], shape.dtype,
                                          shape.head_dim, shape.causal,
                                          seq_bucket(shape.seq, shape.seq), 1))
    grid = grid_for(batch=shape.batch, heads=shape.heads, seq_q=shape.seq,
                    tile_m=schedule.tile_m)
    geo = launch_geometry(grid, head_dim=shape.head_dim, seq_q=shape.seq, seq_kv=shape.seq,
                          tile_m=schedule.tile_m, tile_n=schedule.tile_n, sms=data["sms"],
                          per_sm=schedule.occupancy, num_ctas=schedule.num_ctas)
    return schedule, how, geo


def _flags(shape: Shape, schedule, geo) -> list[str]:
    from ..kernel.headdim import plan_head_dim

    flags = []
    hd = plan_head_dim(shape.head_dim)
    chunks = "+".join(map(str, hd.widths))
    if shape.head_dim % 64:
        pad = (f", {geo.head_dim_pad_fraction:.1%} of it zero padding (computed as "
               f"{geo.head_dim_padded})" if geo.head_dim_pad_fraction else ", no padding")
        flags.append(f"head dim {shape.head_dim} is not a multiple of 64: split {chunks}{pad}")
    for name, frac, padded, tile in (
            ("query", geo.seq_q_pad_fraction, geo.seq_q_padded, schedule.tile_m),
            ("key", geo.seq_kv_pad_fraction, geo.seq_kv_padded, schedule.tile_n)):
        if frac:
            flags.append(f"tile quantization: S={shape.seq} is not a multiple of the {tile}-wide "
                         f"{name} tile; {padded} computed, {frac:.1%} padding")
    if geo.waves < FEW_WAVES and geo.tail_efficiency < 0.5:
        flags.append(f"wave quantization: {geo.programs} programs on {geo.slots} slots = "
                     f"{geo.waves:.2f} waves, the last one {geo.tail_efficiency:.0%} full "
                     f"({geo.wave_efficiency:.0%} of launched slot time does work)")
    return flags


def advise(shape: Shape, gpu: str = "h100", data: dict | None = None) -> str:
    """The advice as printed text; AdviceError when the data cannot stand for the shape.
    ``data``: a measurements dict (default: the shipped one for ``gpu``)."""
    from ..kernel.headdim import supported_head_dim

    data = data if data is not None else load(gpu)
    if not supported_head_dim(shape.head_dim):
        raise AdviceError(f"--head-dim {shape.head_dim}: the kernel takes multiples of 8 up to "
                          "256")
    points = data["points"]
    near = nearest(points, shape)
    if not near:
        same = [p for p in points if p["dtype"] == shape.dtype and p["causal"] == shape.causal]
        if not same:
            raise AdviceError(f"no {shape.dtype} {'causal' if shape.causal else 'unmasked'} "
                              f"points measured on {gpu}; not guessing")
        rng = {k: (min(p[k] for p in same), max(p[k] for p in same))
               for k in ("head_dim", "seq")}
        bh = (min(p["batch"] * p["heads"] for p in same),
              max(p["batch"] * p["heads"] for p in same))
        raise AdviceError(f"{shape.describe()}: no measured point on {gpu} within 25% on D and "
                          f"a factor 2 on S and B·H (measured D {rng['head_dim']}, S "
                          f"{rng['seq']}, B·H {bh}); not guessing")
    _, _, best = near[0]
    out = [f"tiledattn advise: {shape.describe()} on {data['gpu']} ({gpu}, {data['sms']} SMs)",
           f"numbers: TFLOP/s measured on that GPU, from {'; '.join(data['sources'].values())}",
           f"prediction = the nearest measured point, {_point_label(best)} "
           f"({_how_near(shape, best)}):"]
    ratio = (best[SUBJECT] / best[FUSED]) if best.get(FUSED) else None
    out.append(f"  {SUBJECT} {_fmt(best[SUBJECT])} TFLOP/s, {FUSED} {_fmt(best.get(FUSED))} "
               f"TFLOP/s" + (f" (ours ÷ SDPA {ratio:.3f})" if ratio else ""))
    for _, _, p in near[1:]:
        out.append(f"  also near: {_point_label(p)}: {SUBJECT} {_fmt(p[SUBJECT])}, {FUSED} "
                   f"{_fmt(p.get(FUSED))} ({_how_near(shape, p)})")
    schedule, how, geo = _geometry(shape, data)
    out.append(f"geometry (schedule {schedule.label()}, {how} in the active table): "
               f"{geo.programs} programs, {geo.sms} SMs x {geo.per_sm} per SM = {geo.slots} "
               f"slots -> {geo.waves:.2f} waves, last wave {geo.tail_efficiency:.0%} full")
    flags = _flags(shape, schedule, geo)
    out += [f"  ! {f}" for f in flags] or ["  no tile or wave quantization flagged"]
    out += _suggestions(shape, points, best)
    return "\n".join(out)


def _suggestions(shape: Shape, points: list[dict], best: dict) -> list[str]:
    """Other (H', D') with H'·D' = H·D whose own nearest point (measured at D' exactly)
    ran faster; FLOPs are equal, so the TFLOP/s ratio is the time ratio."""
    hidden = shape.heads * shape.head_dim
    lines = []
    for d in sorted({p["head_dim"] for p in points}):
        if d == shape.head_dim or hidden % d:
            continue
        alt = Shape(hidden // d, d, shape.seq, shape.batch, shape.dtype, shape.causal)
        near = nearest(points, alt, exact_head_dim=True, k=1)
        if not near:
            continue
        _, _, p = near[0]
        gain = p[SUBJECT] / best[SUBJECT] - 1
        if gain > 0:
            sdpa = (f"; {FUSED} there {_fmt(p.get(FUSED))} vs {_fmt(best.get(FUSED))}"
                    if p.get(FUSED) else "")
            lines.append(f"  H={alt.heads} D={d}: {SUBJECT} {p[SUBJECT]:.1f} vs "
                         f"{best[SUBJECT]:.1f} TFLOP/s, {gain:+.1%} (measured at "
                         f"{_point_label(p)}){sdpa}")
    head = f"same hidden size H·D = {hidden}, measured faster for {SUBJECT}:"
    return [head] + (lines or ["  none among the measured head dims"])


# -- building the shipped data from the committed reference study ----------------------

def _from_throughput(path: str) -> list[dict]:
    import csv

    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            def num(v):
                try:
                    return float(v)
                except (TypeError, ValueError):
                    return None  # a status (not ok) or empty
            out.append({"source": "reference", "dtype": r["dtype"],
                        "causal": r["mask"] == "causal", "head_dim": int(r["D"]),
                        "seq": int(r["S"]), "batch": int(r["B"]), "heads": int(r["H"]),
                        SUBJECT: num(r.get(SUBJECT)), FUSED: num(r.get(FUSED))})
    return out


def _from_rows(rows: list[dict]) -> list[dict]:
    by: dict[str, dict] = {}
    for r in rows:
        if r["seq_q"] != r["seq_kv"] or r.get("gqa", 1) != 1:
            continue
        p = by.setdefault(r["point_key"], {
            "source": "shapes", "dtype": r["dtype"], "causal": r["causal"],
            "head_dim": r["head_dim"], "seq": r["seq_q"], "batch": r["batch"],
            "heads": r["heads"], SUBJECT: None, FUSED: None})
        if r["method"] in (SUBJECT, FUSED) and r.get("status") == "ok":
            p[r["method"]] = round(r["tflops"], 2)
    return list(by.values())


def build(reference_dir: str, out_path: str) -> dict:
    """study/measured/<gpu>.json from ``results/reference/<gpu>/``: tables/throughput.csv,
    manifest.json and shapes/g*/rows-*.jsonl (one directory per shapes grid, as the study
    writes them)."""
    import glob

    from ..bench.store import read_rows

    with open(os.path.join(reference_dir, "manifest.json")) as f:
        gpu = json.load(f)["gpu"]
    points = _from_throughput(os.path.join(reference_dir, "tables", "throughput.csv"))
    shape_rows = [r for p in sorted(glob.glob(os.path.join(reference_dir, "shapes", "g*",
                                                           "rows-*.jsonl")))
                  for r in read_rows(p)]
    shapes = _from_rows(shape_rows)
    rel = os.path.relpath(reference_dir)
    data = {"format": FORMAT, "gpu": gpu["name"], "sms": gpu["sm_count"],
            "compute_capability": gpu["compute_capability"],
            "sources": {"reference": f"{rel}/tables/throughput.csv (the reference study, "
                                     f"{len(points)} points)",
                        "shapes": f"{rel}/shapes/ (the shapes grids, {len(shapes)} points)"},
            "points": points + shapes}
    with open(out_path, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.write("\n")
    return data


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 4 or sys.argv[1] != "build":
        sys.exit("usage: python -m tiledattention.study.advice build REFERENCE_DIR OUT.json")
    d = build(sys.argv[2], sys.argv[3])
    print(f"{len(d['points'])} points -> {sys.argv[3]}")
