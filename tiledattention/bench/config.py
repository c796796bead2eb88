"""The benchmark configuration: YAML in, validated frozen dataclasses inside.

Unknown keys are rejected with the list of valid ones; every error names the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from ..errors import ConfigError
from ..tolerance import RTOL
from .grid import (
    HEADS_FALLBACK,
    PAPER_CAUSAL,
    PAPER_DTYPES,
    PAPER_HEAD_DIMS,
    PAPER_SEQS,
    TOKENS,
    WIDTH,
)

__all__ = ["BenchConfig", "ConfigError", "CorrectnessConfig", "GridConfig", "TimingConfig",
           "from_dict", "load_config", "validate"]

DTYPES = ("float16", "bfloat16", "float32")
SHAPE_POLICIES = ("tokens", "explicit")
DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class GridConfig:
    seqs: tuple[int, ...] = PAPER_SEQS
    seqs_kv: tuple[int, ...] | None = None  # None: Skv = S (self-attention)
    head_dims: tuple[int, ...] = PAPER_HEAD_DIMS
    dtypes: tuple[str, ...] = PAPER_DTYPES
    causal: tuple[bool, ...] = PAPER_CAUSAL
    shape_policy: str = "tokens"  # tokens: grid.tokens_shape; explicit: batch, heads
    tokens: int = TOKENS
    width: int = WIDTH
    heads_fallback: int = HEADS_FALLBACK  # H when width is not a multiple of D
    batch: int = 1  # explicit policy
    heads: int = 8  # explicit policy
    gqa: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = 10
    reps: int = 30
    rounds: int = 3  # methods interleaved round by round
    flush_l2: bool = True
    cuda_graph: bool = False


@dataclass(frozen=True)
class CorrectnessConfig:
    max_ref_heads: int = 4  # reference computed on at most this many (batch, head) pairs
    rtol_float16: float = RTOL["float16"]
    rtol_bfloat16: float = RTOL["bfloat16"]
    rtol_float32: float = RTOL["float32"]


@dataclass(frozen=True)
class BenchConfig:
    grid: GridConfig = field(default_factory=GridConfig)
    methods: tuple[str, ...] = ("tiledattention", "torch_sdpa", "flash", "cudnn", "efficient",
                                "math", "eager")
    timing: TimingConfig = field(default_factory=TimingConfig)
    correctness: CorrectnessConfig = field(default_factory=CorrectnessConfig)
    seed: int = 0
    device: str = "auto"

    def as_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_SECTIONS = {"grid": GridConfig, "timing": TimingConfig, "correctness": CorrectnessConfig}


def _check_keys(data: dict, cls, where: str) -> None:
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys are {valid}")


def _coerce(value, f, where):
    name = f"{where}.{f.name}"
    typ = str(f.type)
    if typ.startswith("tuple"):
        if value is None and "None" in typ:
            return None
        items = value if isinstance(value, (list, tuple)) else [value]
        elem = bool if "bool" in typ else int if "int" in typ else str
        out = []
        for item in items:
            if elem is int and (isinstance(item, bool) or not isinstance(item, int)):
                raise ConfigError(f"{name}: {item!r} is not an integer")
            if elem is bool and not isinstance(item, bool):
                raise ConfigError(f"{name}: {item!r} is not true/false")
            if elem is str and not isinstance(item, str):
                raise ConfigError(f"{name}: {item!r} is not a string")
            out.append(item)
        if not out:
            raise ConfigError(f"{name}: must not be empty")
        return tuple(out)
    if typ == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: {value!r} is not true/false")
    elif typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: {value!r} is not an integer")
    elif typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: {value!r} is not a number")
        value = float(value)
    elif typ == "str" and not isinstance(value, str):
        raise ConfigError(f"{name}: {value!r} is not a string")
    return value


def _build(cls, data, where):
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    _check_keys(data, cls, where)
    kwargs = {}
    for f in fields(cls):
        if f.name in data:
            if f.name in _SECTIONS and where == "config":
                kwargs[f.name] = _build(_SECTIONS[f.name], data[f.name], f.name)
            else:
                kwargs[f.name] = _coerce(data[f.name], f, where)
    return cls(**kwargs)


def validate(cfg: BenchConfig) -> BenchConfig:
    from ..errors import ScheduleError
    from .methods import get_method

    g, t = cfg.grid, cfg.timing
    for name in ("seqs", "head_dims", "gqa") + (("seqs_kv",) if g.seqs_kv else ()):
        for v in getattr(g, name):
            if v < 1:
                raise ConfigError(f"grid.{name}: {v} must be >= 1")
    for dt in g.dtypes:
        if dt not in DTYPES:
            raise ConfigError(f"grid.dtypes: {dt!r} is not one of {list(DTYPES)}")
    if g.shape_policy not in SHAPE_POLICIES:
        raise ConfigError(f"grid.shape_policy: {g.shape_policy!r} is not one of "
                          f"{list(SHAPE_POLICIES)}")
    for name in ("tokens", "width", "heads_fallback", "batch", "heads"):
        if getattr(g, name) < 1:
            raise ConfigError(f"grid.{name}: must be >= 1")
    for m in cfg.methods:
        try:
            get_method(m)
        except (KeyError, ScheduleError) as exc:
            raise ConfigError(f"methods: {exc.args[0]}") from exc
    if len(set(cfg.methods)) != len(cfg.methods):
        raise ConfigError("methods: listed more than once")
    if t.reps < 1 or t.rounds < 1 or t.warmup < 0:
        raise ConfigError("timing: reps and rounds must be >= 1, warmup >= 0")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device: {cfg.device!r} is not one of {list(DEVICES)}")
    return cfg


def from_dict(data: dict) -> BenchConfig:
    return validate(_build(BenchConfig, data or {}, "config"))


def load_config(path: str) -> BenchConfig:
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    try:
        return from_dict(data or {})
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
