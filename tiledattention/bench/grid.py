"""The one shape model and grid definition: benchmark points, the paper's grid, and how
a config's grid expands into points and splits into shards.

Every tool that times attention (``tiledattn bench``, ``tune``, ``profile``, the scripts in
benchmarks/) takes its shapes from here: under the ``tokens`` policy B = tokens // S and
H = width // D, or ``heads_fallback`` where width is not a multiple of D (D = 96, 160).

A head shape is D (q, k and v alike) or the pair (D, D_v) where V's head dim differs (MLA's
(192, 128) training, (576, 512) absorbed decode): a point's ``head_dim`` is q/k's, its
``head_dim_v`` V's, None when equal, so every row of a D_v = D point reads as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import ConfigError
from ..flops import PASSES, attention_flops
from ..headdim import value_dim

# The passes tuning knows: fwd tunes the forward's schedule, fwd+bwd the backward's.
TUNE_PASSES = ("fwd", "fwd+bwd")

# The paper's grid: S x D x dtype x causal = 80 points, B*S = 16384 tokens, H*D = 2048.
PAPER_SEQS = (512, 1024, 2048, 4096, 8192)
PAPER_HEAD_DIMS = (64, 96, 128, 160)
PAPER_DTYPES = ("float16", "bfloat16")
# float8_e4m3fn: the FP8 forward's points (forward only; inputs quantized per tensor from
# the bfloat16 point's, tolerance RTOL's; the runner's ``fp8_inputs``). Here, below config,
# methods and cudnn_fe, which all name it.
FP8 = "float8_e4m3fn"
PAPER_CAUSAL = (False, True)
TOKENS = 16384
WIDTH = 2048
HEADS_FALLBACK = 16

# tiledattention@<Schedule.label()>: the kernel with that schedule pinned (ladders, tuning).
PINNED_PREFIX = "tiledattention@"


def pinned(label: str) -> str:
    """The method name that pins the schedule ``label``."""
    return PINNED_PREFIX + label


def pinned_label(method: str) -> str | None:
    """The schedule label a pinned method names, or None for any other method (a pinned
    backward's is ``bwd:<label>``)."""
    return method[len(PINNED_PREFIX):] if method.startswith(PINNED_PREFIX) else None


# tiledattention@bwd:<BwdSchedule.label()>: the forward as the table picks it, the backward
# with that schedule pinned (backward tuning, timed with the fwd+bwd or bwd pass).
PINNED_BWD = "bwd:"


def pinned_bwd(label: str) -> str:
    """The method name that pins the backward schedule ``label``."""
    return PINNED_PREFIX + PINNED_BWD + label


def pinned_bwd_label(method: str) -> str | None:
    """The backward schedule label a pinned-backward method names, or None."""
    label = pinned_label(method)
    return label[len(PINNED_BWD):] if label and label.startswith(PINNED_BWD) else None


def tokens_shape(seq: int, head_dim: int, *, tokens: int = TOKENS, width: int = WIDTH,
                 heads_fallback: int = HEADS_FALLBACK) -> tuple[int, int]:
    """(batch, heads) of the tokens policy: B*S = tokens, H*D = width."""
    heads = width // head_dim if width % head_dim == 0 else heads_fallback
    return max(1, tokens // seq), heads


def head_shape(entry) -> tuple[int, int | None]:
    """(D, D_v) of a grid's ``head_dims`` entry: D, or the pair [D, D_v]; D_v is None
    where it equals D (one spelling per shape: its key and rows are D's)."""
    if isinstance(entry, (tuple, list)):
        d, dv = entry
        return d, (None if dv == d else dv)
    return entry, None


def head_label(head_dim: int, head_dim_v: int | None = None) -> int | str:
    """A head shape in tables and figures: D (an int, as every row before D_v), or
    "192/128" where V's head dim differs."""
    return head_dim if head_dim_v in (None, head_dim) else f"{head_dim}/{head_dim_v}"


def row_head_label(row: dict) -> int | str:
    """:func:`head_label` of a row (or a point's dict)."""
    return head_label(row["head_dim"], row.get("head_dim_v"))


def head_labels(rows) -> list[int | str]:
    """The head shapes of ``rows`` (dicts) as labels, by D, then V's head dim."""
    shapes = {(r["head_dim"], r.get("head_dim_v")) for r in rows}
    return [head_label(d, dv) for d, dv in sorted(shapes, key=lambda s: (s[0], s[1] or 0))]


@dataclass(frozen=True)
class Point:
    dtype: str
    causal: bool
    head_dim: int
    seq_q: int
    seq_kv: int
    batch: int
    heads: int
    gqa: int = 1
    pass_: str = "fwd"  # fwd, bwd (the backward alone) or fwd+bwd; "pass" in rows
    head_dim_v: int | None = None  # V's head dim where it differs from D (None: D)

    def __post_init__(self):
        if self.head_dim_v == self.head_dim:  # one spelling per shape: D's key and row
            object.__setattr__(self, "head_dim_v", None)

    @property
    def value_dim(self) -> int:
        """V's head dim (and the output's, and dO's)."""
        return value_dim(self.head_dim, self.head_dim_v)

    @classmethod
    def of_tokens(cls, dtype: str, causal: bool, head_dim: int, seq: int, *,
                  tokens: int = TOKENS, width: int = WIDTH,
                  heads_fallback: int = HEADS_FALLBACK, gqa: int = 1) -> Point:
        """A self-attention point with the tokens policy's batch and heads."""
        batch, heads = tokens_shape(seq, head_dim, tokens=tokens, width=width,
                                    heads_fallback=heads_fallback)
        return cls(dtype, causal, head_dim, seq, seq, batch, heads, gqa)

    @property
    def heads_kv(self) -> int:
        return self.heads // self.gqa

    @property
    def head_label(self) -> int | str:
        return head_label(self.head_dim, self.head_dim_v)

    def flops(self) -> float:
        """The point's nominal FLOPs (flops.attention_flops, V's head dim included)."""
        return attention_flops(self.batch, self.heads, self.seq_q, self.seq_kv, self.head_dim,
                               self.causal, self.pass_, head_dim_v=self.head_dim_v)

    def key(self) -> str:
        # Forward keys are unchanged from before the pass axis, so old rows still resume;
        # likewise D_v = D points' keys from before V's head dim.
        tail = "" if self.pass_ == "fwd" else "-" + self.pass_.replace("+", "")
        dv = "" if self.head_dim_v is None else f"v{self.head_dim_v}"
        return (f"{self.dtype}-{'causal' if self.causal else 'full'}-d{self.head_dim}{dv}"
                f"-sq{self.seq_q}-skv{self.seq_kv}-b{self.batch}-h{self.heads}-g{self.gqa}"
                f"{tail}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        if d["head_dim_v"] is None:  # rows of D_v = D points stay byte-identical
            del d["head_dim_v"]
        return d

    @classmethod
    def from_dict(cls, data: dict) -> Point:
        """Inverse of :meth:`as_dict` (a row's point fields; "pass" optional)."""
        data = dict(data)
        if "pass" in data:
            data["pass_"] = data.pop("pass")
        if data.get("pass_", "fwd") not in PASSES:
            raise ConfigError(f"pass {data['pass_']!r} is not one of {list(PASSES)}")
        return cls(**data)


def expand(cfg) -> list[Point]:
    """All points of a BenchConfig in a fixed order (dtype, causal, D, S, Skv, GQA, pass);
    heads not divisible by the GQA ratio are skipped (``left_out`` says which)."""
    g = cfg.grid
    points = []
    for dtype in g.dtypes:
        for causal in g.causal:
            for d, dv in map(head_shape, g.head_dims):
                for s in g.seqs:
                    for skv in (g.seqs_kv or (s,)):
                        for gqa in g.gqa:
                            if g.shape_policy == "tokens":
                                batch, heads = tokens_shape(s, d, tokens=g.tokens,
                                                            width=g.width,
                                                            heads_fallback=g.heads_fallback)
                            else:
                                batch, heads = g.batch, g.heads
                            if heads % gqa:
                                continue
                            points += [Point(dtype, causal, d, s, skv, batch, heads, gqa, p,
                                             dv) for p in g.passes]
    return points + decode_points(cfg.decode)


def decode_points(dec) -> list[Point]:
    """The optional decode section's points (dtype, D, Sq, Skv, B, GQA order), non-causal:
    a KV-cache step attends the whole cache. Points whose K and V exceed ``max_kv_gib`` are
    left out; so are GQA ratios that do not divide the heads."""
    if not dec.enabled:
        return []
    cap = dec.max_kv_gib * 2**30
    points = []
    for dtype in dec.dtypes:
        item = 4 if dtype == "float32" else 2
        for d, dv in map(head_shape, dec.head_dims):
            for sq in dec.seqs_q:
                for skv in dec.seqs_kv:
                    for b in dec.batches:
                        for gqa in dec.gqa:
                            kv_bytes = b * (dec.heads // gqa) * skv * (d + (dv or d)) * item
                            if dec.heads % gqa or kv_bytes > cap:
                                continue
                            points.append(Point(dtype, False, d, sq, skv, b, dec.heads, gqa,
                                                head_dim_v=dv))
    return points


def _grid_heads(g) -> dict[int, int]:
    """Query heads per head dim (q/k's: H·D = width) under the grid's shape policy."""
    dims = [head_shape(e)[0] for e in g.head_dims]
    return {d: (tokens_shape(1, d, tokens=g.tokens, width=g.width,
                             heads_fallback=g.heads_fallback)[1]
                if g.shape_policy == "tokens" else g.heads) for d in dims}


def impossible(cfg) -> str | None:
    """Why the config asks for a GQA ratio that no point can have (it would vanish from
    the grid entirely), or None."""
    heads = _grid_heads(cfg.grid)
    for gqa in cfg.grid.gqa:
        if all(h % gqa for h in heads.values()):
            return (f"grid.gqa: ratio {gqa} divides no query head count of the grid "
                    f"(H = {sorted(set(heads.values()))}); use a divisor of H")
    dec = cfg.decode
    if dec.enabled:
        bad = [g for g in dec.gqa if dec.heads % g]
        if bad:
            return (f"decode.gqa: {bad} do not divide decode.heads = {dec.heads}; use "
                    "divisors of it")
        if not decode_points(dec):
            return (f"decode: every point's K and V exceed decode.max_kv_gib = "
                    f"{dec.max_kv_gib}; raise it or shorten decode.seqs_kv")
    return None


def left_out(cfg) -> list[str]:
    """One line per class of point the config names but ``expand`` leaves out (a GQA ratio
    that does not divide a head dim's H; decode points over the K/V cap), with counts."""
    g, lines = cfg.grid, []
    per = len(g.dtypes) * len(g.causal) * len(g.seqs) * len(g.seqs_kv or (None,)) * \
        len(g.passes)
    shapes = [head_shape(e)[0] for e in g.head_dims]  # D with every V head dim it comes in
    for d, h in _grid_heads(g).items():
        bad = [gqa for gqa in g.gqa if h % gqa]
        if bad:
            n = per * len(bad) * shapes.count(d)
            lines.append(f"left out {n} grid point(s) at D={d}: GQA ratio(s) "
                         f"{bad} do not divide H={h}")
    dec = cfg.decode
    if dec.enabled:
        total = len(dec.dtypes) * len(dec.head_dims) * len(dec.seqs_q) * len(dec.seqs_kv) * \
            len(dec.batches) * len([g for g in dec.gqa if dec.heads % g == 0])
        over = total - len(decode_points(dec))
        if over:
            lines.append(f"left out {over} decode point(s) whose K and V exceed "
                         f"decode.max_kv_gib = {dec.max_kv_gib}")
    return lines


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise ConfigError(f"--shard {text!r}: expected i/n, e.g. 0/4") from exc
    if not (n >= 1 and 0 <= i < n):
        raise ConfigError(f"--shard {text!r}: need 0 <= i < n")
    return i, n


def shard(points: list[Point], index: int, count: int) -> list[Point]:
    """Round-robin: shard i takes points i, i+n, i+2n, … so the shards partition the grid
    and each gets a similar mix of small and large points."""
    return points[index::count]
