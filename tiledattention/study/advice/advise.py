"""``tiledattn advise``: what our measurements say about a model's attention shape.

Predictions are the TFLOP/s measured at the nearest measured points (no interpolation, no
model): the shipped ``advice/measured/<gpu>.json.gz`` holds the points of the committed
reference study (``results/reference/<gpu>/``: its ``throughput`` table and the shapes
grids' rows), built by ``python -m tiledattention.study.advice build``. A shape whose
nearest point is too far on any axis is refused, not guessed. Tile and wave quantization
come from the launch geometry (``kernel/geometry.py``) of the schedule the shipped table
picks for the shape; suggestions keep the hidden size H·D and list only alternatives whose
own nearest measured point is faster.

A shape is (H, Hkv, D, Sq, Skv, B, dtype, mask): GQA (Hkv < H) and decode (Sq < Skv, a
KV-cache step) are axes of their own, matched like S and B·H, so a GQA or decode shape
needs GQA or decode measurements near it (the shapes grids of config/shapes-models.yaml:
ViT, Llama/Mistral GQA prefill, decode) and an MHA prefill point never stands for it.
A causal sliding window (``--window W``) is one more axis: answered only from the variants
stage's window points (``data/variants-rows.jsonl.gz``: TiledAttention against
FlexAttention and SDPA with the window as a mask), never from a plain causal point.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
from dataclasses import dataclass
from importlib import resources

from ...bench.methods import FUSED, SUBJECT
from ...errors import TiledAttentionError

FORMAT = "tiledattention-measured/1"
SUFFIX = ".json.gz"  # shipped gzipped: the points are most of the package's data
# The variants stage's baselines at a window point (its rows have no torch_sdpa).
WINDOW_BASELINES = ("flex", "sdpa_mask")
# How near a measured point must be to stand for a shape: Sq, Skv, B·H and the GQA ratio
# H/Hkv within a factor 2, D within 25 % (a different D is a different chunking of the
# head dim).
MAX_LOG2 = {"head_dim": math.log2(1.25), "seq_q": 1.0, "seq_kv": 1.0, "batch_heads": 1.0,
            "gqa": 1.0, "window": 1.0}
# Distance weights: a different D is a different kernel variant, a different S a different
# key-loop length (Sq also the number of query tiles); B·H only changes how many programs
# run side by side, the GQA ratio how often K/V are re-read.
WEIGHTS = {"head_dim": 2.0, "seq_q": 1.0, "seq_kv": 1.0, "batch_heads": 1.0, "gqa": 1.0,
           "window": 1.0}
# Query lengths up to this against a longer cache take the decode path (split-K, packed
# GQA), whose programs are chosen per call: no static geometry flags for them.
DECODE_MAX_SQ = 16
# Tail effects matter while the launch has few waves.
FEW_WAVES = 8


class AdviceError(TiledAttentionError, ValueError):
    """The shape is outside what was measured, or the data file is unusable."""


@dataclass(frozen=True)
class Shape:
    """``seq`` is the key/value length S; ``seq_q`` the query length (None: S, self
    attention; 1: a decode step); ``kv_heads`` the K/V heads (None: H, MHA)."""

    heads: int
    head_dim: int
    seq: int
    batch: int
    dtype: str = "float16"
    causal: bool = False
    kv_heads: int | None = None
    seq_q: int | None = None
    window: int | None = None  # a causal sliding window of this many keys

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def sq(self) -> int:
        return self.seq if self.seq_q is None else self.seq_q

    @property
    def gqa(self) -> int:
        return self.heads // self.hkv

    def describe(self) -> str:
        heads = f"H={self.heads}" + (f" Hkv={self.hkv}" if self.hkv != self.heads else "")
        seqs = f"S={self.seq}" if self.sq == self.seq else f"Sq={self.sq} Skv={self.seq}"
        mask = "causal" if self.causal else "no mask"
        if self.window is not None:
            mask = f"causal window {self.window}"
        return f"{heads} D={self.head_dim} {seqs} B={self.batch} {self.dtype} {mask}"

    def check(self) -> None:
        """Refuse what is not one attention shape (one line each)."""
        from ...headdim import supported_head_dim

        if not supported_head_dim(self.head_dim):
            raise AdviceError(f"--head-dim {self.head_dim}: the kernel takes multiples of 8 "
                              "up to 256")
        if self.hkv > self.heads or self.heads % self.hkv:
            raise AdviceError(f"--kv-heads {self.hkv}: must divide --heads {self.heads} "
                              "(GQA: each K/V head serves H/Hkv query heads)")
        if self.sq > self.seq:
            raise AdviceError(f"--seq-q {self.sq}: longer than --seq {self.seq} (the K/V "
                              "length); for self attention leave --seq-q out")
        if self.causal and self.sq < self.seq:
            raise AdviceError(f"--causal with --seq-q {self.sq} < --seq {self.seq}: causal is "
                              "top-left aligned (query i sees keys <= i), a KV-cache step "
                              "attends the whole cache: leave --causal out")
        if self.window is not None and not self.causal:
            raise AdviceError(f"--window {self.window}: a sliding window is causal (query i "
                              "sees keys i-W+1..i), add --causal")


def gpus() -> list[str]:
    """GPU keys with shipped measurements (the names of measured/*.json.gz)."""
    root = resources.files(__package__) / "measured"
    return sorted(p.name[:-len(SUFFIX)] for p in root.iterdir() if p.name.endswith(SUFFIX))


def load(gpu: str) -> dict:
    path = resources.files(__package__) / "measured" / f"{gpu}{SUFFIX}"
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except FileNotFoundError:
        raise AdviceError(f"--gpu {gpu}: no measurements shipped; measured GPUs: "
                          f"{gpus()}") from None
    if data.get("format") != FORMAT:
        raise AdviceError(f"{path}: not a measurements file ({FORMAT})")
    return data


def _seq_kv(p: dict) -> int:
    """A point's K/V length (points of self attention may leave it out: Skv = S)."""
    return p.get("seq_kv") or p["seq"]


def _axes(p: dict) -> dict[str, float]:
    axes = {"head_dim": math.log2(p["head_dim"]), "seq_q": math.log2(p["seq"]),
            "seq_kv": math.log2(_seq_kv(p)),
            "batch_heads": math.log2(p["batch"] * p["heads"]),
            "gqa": math.log2(p.get("gqa") or 1)}
    if p.get("window"):
        axes["window"] = math.log2(p["window"])
    return axes


def _distance(a: dict, b: dict) -> tuple[float, dict[str, float]]:
    """Weighted sum of the axes' |log2| differences (WEIGHTS), and each axis' difference."""
    xa, xb = _axes(a), _axes(b)
    diff = {k: abs(xa[k] - xb[k]) for k in xa if k in xb}
    return sum(WEIGHTS[k] * v for k, v in diff.items()), diff


def _as_point(shape: Shape) -> dict:
    return {"head_dim": shape.head_dim, "seq": shape.sq, "seq_kv": shape.seq,
            "batch": shape.batch, "heads": shape.heads, "gqa": shape.gqa,
            "window": shape.window}


def nearest(points: list[dict], shape: Shape, *, exact_head_dim: bool = False,
            k: int = 3) -> list[tuple[float, dict, dict]]:
    """Up to ``k`` measured points of the shape's dtype and mask within MAX_LOG2 on every
    axis, nearest first, as (distance, axis differences, point)."""
    q = _as_point(shape)
    found = []
    for p in points:
        if p["dtype"] != shape.dtype or p["causal"] != shape.causal:
            continue
        if bool(p.get("window")) != (shape.window is not None):
            continue  # a window point stands only for a window, a plain one never for it
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
    axes = [("D", shape.head_dim, p["head_dim"])]
    if shape.sq == shape.seq and p["seq"] == _seq_kv(p):
        axes.append(("S", shape.seq, p["seq"]))
    else:
        axes += [("Sq", shape.sq, p["seq"]), ("Skv", shape.seq, _seq_kv(p))]
    axes.append(("B·H", shape.batch * shape.heads, p["batch"] * p["heads"]))
    if shape.gqa != 1 or (p.get("gqa") or 1) != 1:
        axes.append(("H/Hkv", shape.gqa, p.get("gqa") or 1))
    if shape.window is not None and p.get("window"):
        axes.append(("window", shape.window, p["window"]))
    return ", ".join(f"{name} same" if mine == theirs else
                     f"{name} {theirs} vs {mine} (x{theirs / mine:.2f})"
                     for name, mine, theirs in axes)


def _point_label(p: dict) -> str:
    seqs = (f"S={p['seq']}" if p["seq"] == _seq_kv(p) else f"Sq={p['seq']} Skv={_seq_kv(p)}")
    gqa = p.get("gqa") or 1
    heads = f"H={p['heads']}" + (f" Hkv={p['heads'] // gqa}" if gqa != 1 else "")
    window = f" window={p['window']}" if p.get("window") else ""
    return f"D={p['head_dim']} {seqs} B={p['batch']} {heads}{window} [{p['source']}]"


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.1f}"


def _geometry(shape: Shape, data: dict):
    from ...kernel.geometry import grid_for, launch_geometry
    from ...schedules import policy
    from ...schedules.table import Bucket, seq_bucket

    schedule, how = policy._choose(Bucket(data["compute_capability"], shape.dtype,
                                          shape.head_dim, shape.causal,
                                          seq_bucket(shape.sq, shape.seq), shape.gqa))
    grid = grid_for(batch=shape.batch, heads=shape.heads, seq_q=shape.sq,
                    tile_m=schedule.tile_m)
    geo = launch_geometry(grid, head_dim=shape.head_dim, seq_q=shape.sq, seq_kv=shape.seq,
                          tile_m=schedule.tile_m, tile_n=schedule.tile_n, sms=data["sms"],
                          per_sm=schedule.occupancy, num_ctas=schedule.num_ctas)
    return schedule, how, geo


def _flags(shape: Shape, schedule, geo) -> list[str]:
    from ...headdim import plan_head_dim

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
            n = shape.sq if name == "query" else shape.seq
            axis = "S" if shape.sq == shape.seq else ("Sq" if name == "query" else "Skv")
            flags.append(f"tile quantization: {axis}={n} is not a multiple of the {tile}-wide "
                         f"{name} tile; {padded} computed, {frac:.1%} padding")
    if geo.waves < FEW_WAVES and geo.tail_efficiency < 0.5:
        flags.append(f"wave quantization: {geo.programs} programs on {geo.slots} slots = "
                     f"{geo.waves:.2f} waves, the last one {geo.tail_efficiency:.0%} full "
                     f"({geo.wave_efficiency:.0%} of launched slot time does work)")
    return flags


def _measured_ranges(points: list[dict], shape: Shape) -> str:
    """What was measured for the shape's dtype and mask, per regime, for a refusal."""
    same = [p for p in points if p["dtype"] == shape.dtype and p["causal"] == shape.causal
            and not p.get("window")]
    parts = []
    for name, chosen in (("self attention", [p for p in same if p["seq"] == _seq_kv(p)]),
                         ("Sq < Skv", [p for p in same if p["seq"] < _seq_kv(p)])):
        if not chosen:
            continue

        def span(f, chosen=chosen):
            lo, hi = min(map(f, chosen)), max(map(f, chosen))
            return f"{lo}" if lo == hi else f"{lo}..{hi}"

        seqs = (f"S {span(lambda p: p['seq'])}" if name == "self attention" else
                f"Sq {span(lambda p: p['seq'])}, Skv {span(_seq_kv)}")
        parts.append(f"{name}: D {sorted({p['head_dim'] for p in chosen})}, {seqs}, B·H "
                     f"{span(lambda p: p['batch'] * p['heads'])}, H/Hkv "
                     f"{sorted({p.get('gqa') or 1 for p in chosen})}")
    return "; ".join(parts)


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}..{hi}"


def _head_dim_elsewhere(shape: Shape, points: list[dict]) -> str:
    """Where the shape's head dim (within 25 %) was measured under another dtype or mask,
    when never under the shape's own: the refusal says so ("D=256: only float16 ...")."""
    def near_d(p):
        return (not p.get("window") and abs(math.log2(p["head_dim"] / shape.head_dim))
                <= MAX_LOG2["head_dim"] + 1e-9)
    near = [p for p in points if near_d(p)]
    if any(p["dtype"] == shape.dtype and p["causal"] == shape.causal for p in near):
        return ""
    groups: dict[tuple, list[dict]] = {}
    for p in near:
        groups.setdefault((p["dtype"], p["causal"]), []).append(p)
    where = "; ".join(
        f"{dtype} {'causal' if causal else 'unmasked'} D {sorted({p['head_dim'] for p in ps})}"
        f" S {_span([p['seq'] for p in ps])} B·H {_span([p['batch'] * p['heads'] for p in ps])}"
        for (dtype, causal), ps in sorted(groups.items()))
    return (f"; D within 25% of {shape.head_dim} is measured only as {where}" if where else
            f"; D={shape.head_dim} is not measured at all") + \
        " (config/shapes-models.yaml's grids measure more: docs/STUDY.md 'Shape advice')"


def _refuse_window(shape: Shape, points: list[dict], gpu: str) -> AdviceError:
    measured = sorted({f"{p['dtype']} D={p['head_dim']} S={p['seq']} B·H="
                       f"{p['batch'] * p['heads']} window {p['window']}"
                       for p in points if p.get("window")})
    if not measured:
        return AdviceError(f"--window: no sliding-window point measured on {gpu} (the "
                           "reference's variants stage rows are not in its data); not "
                           "guessing")
    return AdviceError(f"{shape.describe()}: no sliding-window point on {gpu} within 25% on D "
                       "and a factor 2 on S, B·H, H/Hkv and the window (measured, by the "
                       f"variants stage: {', '.join(measured)}); not guessing")


def _refuse(shape: Shape, points: list[dict], gpu: str) -> AdviceError:
    if shape.window is not None:
        return _refuse_window(shape, points, gpu)
    mask = "causal" if shape.causal else "unmasked"
    measured = _measured_ranges(points, shape)
    if not measured:
        other = sorted({p["dtype"] for p in points if p["causal"] == shape.causal})
        return AdviceError(f"no {shape.dtype} {mask} points measured on {gpu} (measured "
                           f"dtypes: {other}); not guessing")
    return AdviceError(f"{shape.describe()}: no measured point on {gpu} within 25% on D and a "
                       f"factor 2 on Sq, Skv, B·H and H/Hkv (measured {shape.dtype} {mask}: "
                       f"{measured}{_head_dim_elsewhere(shape, points)}); not guessing")


def _baseline(p: dict) -> tuple[str, float | None]:
    """The baseline a point's ratio is against: PyTorch SDPA, or at a window point the
    variants stage's first measured one (FlexAttention, then SDPA with the mask)."""
    if not p.get("window"):
        return FUSED, p.get(FUSED)
    return next(((b, p[b]) for b in WINDOW_BASELINES if p.get(b)), (WINDOW_BASELINES[0], None))


def advise(shape: Shape, gpu: str = "h100", data: dict | None = None) -> str:
    """The advice as printed text; AdviceError when the data cannot stand for the shape.
    ``data``: a measurements dict (default: the shipped one for ``gpu``)."""
    data = data if data is not None else load(gpu)
    shape.check()
    notes = []
    if shape.window is not None and shape.window >= shape.seq:
        notes.append(f"window {shape.window} >= S={shape.seq}: it masks nothing causal "
                     "attention does not; answered as causal attention")
        shape = dataclasses.replace(shape, window=None)
    points = data["points"]
    near = nearest(points, shape)
    if not near:
        raise _refuse(shape, points, gpu)
    _, _, best = near[0]
    out = [f"tiledattn advise: {shape.describe()} on {data['gpu']} ({gpu}, {data['sms']} SMs)",
           *notes,
           f"numbers: TFLOP/s measured on that GPU, from {'; '.join(data['sources'].values())}",
           f"prediction = the nearest measured point, {_point_label(best)} "
           f"({_how_near(shape, best)}):"]
    base, value = _baseline(best)
    ratio = (best[SUBJECT] / value) if value else None
    out.append(f"  {SUBJECT} {_fmt(best[SUBJECT])} TFLOP/s, {base} {_fmt(value)} "
               f"TFLOP/s" + (f" (ours ÷ {'SDPA' if base == FUSED else base} {ratio:.3f})"
                            if ratio else ""))
    if best.get("window"):
        out.append("  (TFLOP/s on causal attention's FLOPs, as the variants table counts "
                   "them: key tiles the window skips count as work)")
    for _, _, p in near[1:]:
        base, value = _baseline(p)
        out.append(f"  also near: {_point_label(p)}: {SUBJECT} {_fmt(p[SUBJECT])}, {base} "
                   f"{_fmt(value)} ({_how_near(shape, p)})")
    if shape.sq <= DECODE_MAX_SQ < shape.seq:
        out.append(f"geometry: Sq={shape.sq} against Skv={shape.seq} takes the decode path "
                   "(keys split across programs, GQA heads packed), sized per call: no "
                   "static tile or wave flags")
    else:
        schedule, how, geo = _geometry(shape, data)
        out.append(f"geometry (schedule {schedule.label()}, {how} in the active table): "
                   f"{geo.programs} programs, {geo.sms} SMs x {geo.per_sm} per SM = "
                   f"{geo.slots} slots -> {geo.waves:.2f} waves, last wave "
                   f"{geo.tail_efficiency:.0%} full")
        flags = _flags(shape, schedule, geo)
        out += [f"  ! {f}" for f in flags] or ["  no tile or wave quantization flagged"]
    out += _suggestions(shape, points, best)
    return "\n".join(out)


def _suggestions(shape: Shape, points: list[dict], best: dict) -> list[str]:
    """Other (H', D') with H'·D' = H·D (and the same H/Hkv) whose own nearest point
    (measured at D' exactly) ran faster; FLOPs are equal, so the TFLOP/s ratio is the time
    ratio."""
    hidden = shape.heads * shape.head_dim
    lines = []
    for d in sorted({p["head_dim"] for p in points}):
        if d == shape.head_dim or hidden % d or (hidden // d) % shape.gqa:
            continue
        heads = hidden // d
        alt = Shape(heads, d, shape.seq, shape.batch, shape.dtype, shape.causal,
                    kv_heads=heads // shape.gqa, seq_q=shape.seq_q)
        near = nearest(points, alt, exact_head_dim=True, k=1)
        if not near:
            continue
        _, _, p = near[0]
        gain = p[SUBJECT] / best[SUBJECT] - 1
        if gain > 0:
            sdpa = (f"; {FUSED} there {_fmt(p.get(FUSED))} vs {_fmt(best.get(FUSED))}"
                    if p.get(FUSED) else "")
            kv = f" Hkv={alt.hkv}" if alt.hkv != alt.heads else ""
            lines.append(f"  H={alt.heads}{kv} D={d}: {SUBJECT} {p[SUBJECT]:.1f} vs "
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
                        "seq": int(r["S"]), "seq_kv": int(r["S"]), "batch": int(r["B"]),
                        "heads": int(r["H"]), "gqa": 1,
                        SUBJECT: num(r.get(SUBJECT)), FUSED: num(r.get(FUSED))})
    return out


def _from_rows(rows: list[dict]) -> list[dict]:
    """One point per forward point key: Sq as ``seq``, Skv and the GQA ratio with it. Only
    16-bit points with V's head dim Q's: a point holds one D, and the advice is the 16-bit
    kernel's against SDPA (a reference's FP8 and D_qk != D_v grids stay in its tables)."""
    by: dict[str, dict] = {}
    for r in rows:
        if (r.get("pass", "fwd") != "fwd" or r.get("head_dim_v") is not None
                or r["dtype"] not in ("float16", "bfloat16")):
            continue
        p = by.setdefault(r["point_key"], {
            "source": "shapes", "dtype": r["dtype"], "causal": r["causal"],
            "head_dim": r["head_dim"], "seq": r["seq_q"], "seq_kv": r["seq_kv"],
            "batch": r["batch"], "heads": r["heads"], "gqa": r.get("gqa", 1),
            SUBJECT: None, FUSED: None})
        if r["method"] in (SUBJECT, FUSED) and r.get("status") == "ok":
            p[r["method"]] = round(r["tflops"], 2)
    return list(by.values())


def _from_variants(rows: list[dict], window: int) -> list[dict]:
    """The variants stage's forward sliding-window points (TiledAttention, FlexAttention,
    SDPA with the window as a mask). Its rows do not record W: the stage measures
    ``bench.variant_cases.WINDOW`` keys (1024 in the committed references)."""
    by: dict[str, dict] = {}
    for r in rows:
        if r.get("variant") != "window" or r.get("pass", "fwd") != "fwd":
            continue
        p = by.setdefault(r["point_key"], {
            "source": "variants", "dtype": r["dtype"], "causal": True, "window": window,
            "head_dim": r["head_dim"], "seq": r["seq_q"], "seq_kv": r["seq_kv"],
            "batch": r["batch"], "heads": r["heads"], "gqa": r.get("gqa", 1),
            SUBJECT: None, **dict.fromkeys(WINDOW_BASELINES)})
        if r["method"] in p and r.get("status") == "ok":
            p[r["method"]] = round(r["tflops"], 2)
    return list(by.values())


def _model_rows(path: str, gpu_name: str) -> list[dict]:
    """Rows of one more shapes run (config/shapes-models.yaml): a directory of
    rows-*.jsonl with its run manifests (their GPU must be the reference's), or a
    rows-*.jsonl[.gz] file as committed under benchmarks/results/."""
    import glob
    import gzip
    import tempfile

    from ...bench.store import read_rows

    if not os.path.isdir(path):
        if not path.endswith(".gz"):
            return read_rows(path)
        with gzip.open(path, "rb") as src, tempfile.NamedTemporaryFile(suffix=".jsonl") as tmp:
            tmp.write(src.read())
            tmp.flush()
            return read_rows(tmp.name)
    for m in sorted(glob.glob(os.path.join(path, "manifest-*.json"))):
        with open(m) as f:
            name = (json.load(f).get("gpu") or {}).get("name")
        if name != gpu_name:
            raise AdviceError(f"{m}: measured on {name}, not on the reference's {gpu_name}")
    return [r for f in sorted(glob.glob(os.path.join(path, "rows-*.jsonl")))
            for r in read_rows(f)]


def build(reference_dir: str, out_path: str, models: list[str] = ()) -> dict:
    """advice/measured/<gpu>.json.gz (gzipped when ``out_path`` ends in .gz) from
    ``results/reference/<gpu>/``: its rows
    (data/rows.jsonl.gz; an older summary: tables/throughput.csv), manifest.json and the
    shapes grids' rows: a compact bundle's
    data/shapes-g*-rows.jsonl.gz, or shapes/g*/rows-*.jsonl (one directory per shapes grid,
    as the study writes them); ``models``: the rows of config/shapes-models.yaml's grids
    (directories shapes/g*/ of that study, or the rows file committed from them)."""
    import glob

    from ...bench.store import read_rows

    with open(os.path.join(reference_dir, "manifest.json")) as f:
        gpu = json.load(f)["gpu"]
    rows = os.path.join(reference_dir, "data", "rows.jsonl.gz")
    # The committed rows where the reference has them: the forward points with their Skv
    # and GQA ratio (tables/throughput.csv lists S alone, and forward+backward rows too).
    points = [dict(p, source="reference") for p in _from_rows(_model_rows(rows, gpu["name"]))] \
        if os.path.isfile(rows) else \
        _from_throughput(os.path.join(reference_dir, "tables", "throughput.csv"))
    compact = sorted(glob.glob(os.path.join(reference_dir, "data", "shapes-g*-rows.jsonl.gz")))
    shape_rows = [r for p in compact for r in _model_rows(p, gpu["name"])] if compact else \
        [r for p in sorted(glob.glob(os.path.join(reference_dir, "shapes", "g*",
                                                  "rows-*.jsonl")))
         for r in read_rows(p)]
    shapes = _from_rows(shape_rows)
    from ...bench.variant_cases import WINDOW

    variants_rows = os.path.join(reference_dir, "data", "variants-rows.jsonl.gz")
    windows = _from_variants(_model_rows(variants_rows, gpu["name"]), WINDOW) \
        if os.path.isfile(variants_rows) else []
    model = [dict(p, source="models") for p in
             _from_rows([r for m in models for r in _model_rows(m, gpu["name"])])]
    rel = os.path.relpath(reference_dir)
    table = "data/rows.jsonl.gz" if os.path.isfile(rows) else "tables/throughput.csv"
    sources = {"reference": f"{rel}/{table} (the reference study's forward points, "
                            f"{len(points)})",
               "shapes": f"{rel}/{'data/shapes-g*-rows.jsonl.gz' if compact else 'shapes/'} "
                         f"(the shapes grids, {len(shapes)} points)"}
    if windows:
        sources["variants"] = (f"{rel}/data/variants-rows.jsonl.gz (the variants stage's "
                               f"sliding window of {WINDOW} keys, {len(windows)} point"
                               f"{'s' if len(windows) != 1 else ''})")
    if model:
        sources["models"] = (f"{', '.join(os.path.relpath(m) for m in models)} "
                             f"(config/shapes-models.yaml: ViT, GQA, decode; {len(model)} "
                             "points)")
    data = {"format": FORMAT, "gpu": gpu["name"], "sms": gpu["sm_count"],
            "compute_capability": gpu["compute_capability"], "sources": sources,
            "points": points + shapes + windows + model}
    text = (json.dumps(data, indent=0, sort_keys=True) + "\n").encode()
    with open(out_path, "wb") as f:
        if out_path.endswith(".gz"):  # the same bytes each build: no name, no time
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0,
                               compresslevel=9) as g:
                g.write(text)
        else:
            f.write(text)
    return data

