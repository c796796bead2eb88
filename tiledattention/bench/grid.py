"""Expanding a config into benchmark points, and sharding them deterministically."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import BenchConfig


@dataclass(frozen=True)
class Point:
    dtype: str
    causal: bool
    head_dim: int
    seq_q: int
    seq_kv: int
    batch: int
    heads: int
    gqa: int

    @property
    def heads_kv(self) -> int:
        return self.heads // self.gqa

    def key(self) -> str:
        return (f"{self.dtype}-{'causal' if self.causal else 'full'}-d{self.head_dim}"
                f"-sq{self.seq_q}-skv{self.seq_kv}-b{self.batch}-h{self.heads}-g{self.gqa}")

    def as_dict(self) -> dict:
        return asdict(self)


def expand(cfg: BenchConfig) -> list[Point]:
    """All points in a fixed order (dtype, causal, D, S, Skv, GQA); heads not divisible by
    the GQA ratio are skipped."""
    g = cfg.grid
    points = []
    for dtype in g.dtypes:
        for causal in g.causal:
            for d in g.head_dims:
                for s in g.seqs:
                    for skv in (g.seqs_kv or (s,)):
                        for gqa in g.gqa:
                            if g.shape_policy == "tokens":
                                batch = max(1, g.tokens // s)
                                heads = g.width // d if g.width % d == 0 else g.heads_fallback
                            else:
                                batch, heads = g.batch, g.heads
                            if heads % gqa:
                                continue
                            points.append(Point(dtype, causal, d, s, skv, batch, heads, gqa))
    return points


def parse_shard(text: str) -> tuple[int, int]:
    """'i/n' with 0 <= i < n."""
    from .config import ConfigError

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
