"""The benchmark configuration: YAML in, validated frozen dataclasses inside.

Unknown keys are rejected with the list of valid ones; every error names the key. This is
the common config every GPU stage reads (grid, timing, correctness, the loader, validation
and the schema writer); each stage's own section lives in its module under
``tiledattention/stages/``, which imports this one and never the other way round.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from ..errors import ConfigError
from ..flops import PASSES
from ..tolerance import RTOL
from .grid import (
    FP8,
    HEADS_FALLBACK,
    PAPER_CAUSAL,
    PAPER_DTYPES,
    PAPER_HEAD_DIMS,
    PAPER_SEQS,
    TOKENS,
    WIDTH,
)

__all__ = ["BenchConfig", "ConfigError", "CorrectnessConfig", "DecodeConfig", "GridConfig",
           "TimingConfig", "from_dict", "load_config", "option", "section_from_dict",
           "section_schema", "stage_args", "validate"]

DTYPES = ("float16", "bfloat16", "float32", FP8)
SHAPE_POLICIES = ("tokens", "explicit")
DEVICES = ("auto", "cuda", "cpu")
INT32 = 2**31 - 1  # grid sizes reach int32 kernel arguments


def option(default, help: str, **limits):
    """A config key: its default, its help, and its limits (min, above, max, choices,
    unique), which both ``validate`` and the workflow's JSON schema read from here."""
    return field(default=default, metadata={"help": help, **limits})


@dataclass(frozen=True)
class GridConfig:
    seqs: tuple[int, ...] = option(PAPER_SEQS, "Sequence lengths S.", min=1, max=INT32)
    seqs_kv: tuple[int, ...] | None = option(None, "Key/value lengths (null: Skv = S).", min=1,
                                              max=INT32)
    head_dims: tuple[int | tuple[int, int], ...] = option(
        PAPER_HEAD_DIMS, "Head dims: D (q, k and v alike), or the pair [D, D_v] where V's "
        "head dim differs (MLA: [192, 128]; D_v at most 512).", min=1, max=INT32, pairs=True)
    dtypes: tuple[str, ...] = option(PAPER_DTYPES, "Element types.", choices=DTYPES)
    causal: tuple[bool, ...] = option(PAPER_CAUSAL, "Causal mask off/on.")
    shape_policy: str = option("tokens", "tokens - B = tokens // S, H = width // D (else "
                               "heads_fallback); explicit - batch and heads.",
                               choices=SHAPE_POLICIES)
    tokens: int = option(TOKENS, "B*S under the tokens policy.", min=1, max=INT32)
    width: int = option(WIDTH, "H*D under the tokens policy.", min=1, max=INT32)
    heads_fallback: int = option(HEADS_FALLBACK, "H where width is not a multiple of D.", min=1,
                                 max=INT32)
    batch: int = option(1, "B under the explicit policy.", min=1, max=INT32)
    heads: int = option(8, "H under the explicit policy.", min=1, max=INT32)
    gqa: tuple[int, ...] = option((1,), "Query heads per key/value head.", min=1, max=INT32)
    passes: tuple[str, ...] = option(("fwd",), "Passes timed per point - fwd; bwd, the backward "
                                     "alone (dO given); fwd+bwd, a training step's attention.",
                                     choices=PASSES, unique=True)


@dataclass(frozen=True)
class DecodeConfig:
    enabled: bool = option(False, "Add the decode points (B x H x Sq x Skv x GQA, non-causal: "
                           "a KV-cache step sees the whole cache) to the grid.")
    seqs_q: tuple[int, ...] = option((1, 4, 8, 16), "Query lengths (1: decode; 4..16: "
                                     "speculative decoding).", min=1, max=INT32)
    seqs_kv: tuple[int, ...] = option((1024, 4096, 8192, 16384, 32768), "Cache lengths Skv.",
                                      min=1, max=INT32)
    batches: tuple[int, ...] = option((1, 4, 16, 64), "Batch sizes B.", min=1, max=INT32)
    heads: int = option(32, "Query heads H.", min=1, max=INT32)
    gqa: tuple[int, ...] = option((1, 4), "Query heads per key/value head (1: MHA).", min=1,
                                  max=INT32)
    head_dims: tuple[int | tuple[int, int], ...] = option(
        (128,), "Head dims: D, or [D, D_v] (MLA's absorbed decode: [576, 512]).", min=1,
        max=INT32, pairs=True)
    dtypes: tuple[str, ...] = option(("bfloat16",), "Element types.", choices=DTYPES)
    max_kv_gib: float = option(8.0, "Points whose K and V together exceed this many GiB are "
                               "left out.", above=0, max=1024)


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = option(10, "Untimed calls before the first round.", min=0, max=10**6)
    reps: int = option(30, "Timed calls per method, over all rounds.", min=1,
                      max=10**6)
    rounds: int = option(3, "Rounds, methods interleaved, order alternating.",
                        min=1, max=10**4)
    flush_l2: bool = option(True, "Flush L2 before each timed call.")
    cuda_graph: bool = option(False, "Replay the calls from a CUDA graph.")


@dataclass(frozen=True)
class CorrectnessConfig:
    max_ref_heads: int = option(4, "Heads of batch 0 checked against the float64 reference.",
                                min=1)
    rtol_float16: float = option(RTOL["float16"], "Relative error allowed, float16.", above=0,
                                 max=1)
    rtol_bfloat16: float = option(RTOL["bfloat16"], "Relative error allowed, bfloat16.",
                                  above=0, max=1)
    rtol_float32: float = option(RTOL["float32"], "Relative error allowed, float32.", above=0,
                                 max=1)


# CLOCK_CONTROL and TUNE_SPACES live with their stages (tiledattention/stages/).


@dataclass(frozen=True)
class BenchConfig:
    grid: GridConfig = field(default_factory=GridConfig, metadata={"help": "The points."})
    methods: tuple[str, ...] = option(("tiledattention", "torch_sdpa", "flash", "cudnn",
                                       "efficient", "math", "eager"),
                                      "Methods to compare (tiledattention@<schedule label>: a "
                                      "pinned schedule).", unique=True)
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={
        "help": "Optional decode section (small Sq against a long KV cache)."})
    timing: TimingConfig = field(default_factory=TimingConfig,
                                 metadata={"help": "Timing policy."})
    correctness: CorrectnessConfig = field(default_factory=CorrectnessConfig, metadata={
        "help": "Reference subsample and tolerances."})
    seed: int = option(0, "Seed of the inputs.", min=0, max=2**63 - 1)
    device: str = option("auto", "Where to run.", choices=DEVICES)

    def as_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        blob = json.dumps(self.as_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def measure_digest(self) -> str:
        """Hash of what changes a row's numbers beyond its point and method (inputs' seed,
        timing, tolerances, device): rows of one results file must share it. The grid and
        the method list are left out, so growing either resumes the rows already measured."""
        d = self.as_dict()
        blob = json.dumps({k: d[k] for k in ("seed", "timing", "correctness", "device")},
                          sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_SECTIONS = {"grid": GridConfig, "decode": DecodeConfig, "timing": TimingConfig,
             "correctness": CorrectnessConfig}


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
            if f.metadata.get("pairs") and isinstance(item, (list, tuple)):
                out.append(_pair(item, name))
                continue
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


def _pair(item, name: str):
    """[D, D_v] as a tuple, or D where the two agree (one spelling per shape)."""
    if len(item) != 2 or any(isinstance(x, bool) or not isinstance(x, int) for x in item):
        raise ConfigError(f"{name}: {list(item)!r} is not a head dim nor a pair [D, D_v] of "
                          "integers")
    return item[0] if item[0] == item[1] else tuple(item)


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


def _check_limits(name: str, value, meta) -> None:
    if "choices" in meta and value not in meta["choices"]:
        raise ConfigError(f"{name}: {value!r} is not one of {list(meta['choices'])}")
    if "min" in meta and not value >= meta["min"]:
        raise ConfigError(f"{name}: {value} must be >= {meta['min']}")
    if "above" in meta and not value > meta["above"]:  # also refuses NaN
        raise ConfigError(f"{name}: {value} must be > {meta['above']}")
    if "max" in meta and not value <= meta["max"]:
        raise ConfigError(f"{name}: {value} must be <= {meta['max']}")


def _validate_section(obj, where: str) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        name = f"{where}{f.name}"
        if f.name in _SECTIONS:
            _validate_section(value, f"{name}.")
            continue
        items = value if isinstance(value, tuple) else () if value is None else (value,)
        for item in items:
            for number in item if isinstance(item, tuple) else (item,):  # a [D, D_v] pair
                _check_limits(name, number, f.metadata)
            if isinstance(item, tuple):
                _check_value_dim(name, item)
        if f.metadata.get("unique") and len(set(items)) != len(items):
            raise ConfigError(f"{name}: listed more than once")


def _check_value_dim(name: str, pair: tuple[int, int]) -> None:
    """V's head dim of a [D, D_v] pair within the largest any kernel here runs."""
    from ..headdim import MAX_FWD_VALUE_DIM

    if pair[1] > MAX_FWD_VALUE_DIM:
        raise ConfigError(f"{name}: {list(pair)}: V's head dim {pair[1]} is over "
                          f"{MAX_FWD_VALUE_DIM}, the largest the study measures")


def _check_head_shapes(cfg: BenchConfig) -> None:
    """Every head shape and pass of the grid and the decode section run by at least one
    listed method (each method's ``head_limits``); else one line with each one's reason
    and the methods that run it."""
    from .grid import head_label, head_shape
    from .methods import get_method, head_shape_methods

    g, dec = cfg.grid, cfg.decode
    wanted = [("grid", head_shape(e), p) for e in g.head_dims for p in g.passes]
    if dec.enabled:  # decode points are forward only
        wanted += [("decode", head_shape(e), "fwd") for e in dec.head_dims]
    for where, (d, dv), p in dict.fromkeys(wanted):
        dv = d if dv is None else dv
        why = {m: get_method(m).head_limits(d, dv, p) for m in cfg.methods}
        if all(why.values()):
            runs = head_shape_methods(d, dv, p)
            raise ConfigError(
                f"{where}.head_dims: {head_label(d, dv)} ({p}): no listed method runs it ("
                + "; ".join(f"{m}: {r}" for m, r in why.items())
                + f"); methods that do: {', '.join(runs)}")


# A grid larger than this is refused before it is planned (it would run for days): the
# paper's study has a few hundred points. TILEDATTN_MAX_POINTS raises it.
MAX_POINTS = 20_000


def _check_size(cfg: BenchConfig) -> None:
    """The grid's point count (its axes multiplied, before points that cannot exist are
    left out) within MAX_POINTS, counted without expanding it."""
    import math
    import os

    g, d = cfg.grid, cfg.decode
    axes = [len(g.dtypes), len(g.causal), len(g.head_dims), len(g.seqs),
            len(g.seqs_kv or (0,)), len(g.gqa), len(g.passes)]
    count = math.prod(axes)
    if d.enabled:
        count += math.prod([len(d.dtypes), len(d.head_dims), len(d.seqs_q), len(d.seqs_kv),
                            len(d.batches), len(d.gqa)])
    raw = os.environ.get("TILEDATTN_MAX_POINTS", "")
    limit = int(raw) if raw.isdigit() else MAX_POINTS
    if count > limit:
        raise ConfigError(f"grid: up to {count} points (dtypes × causal × head_dims × seqs × "
                          f"seqs_kv × gqa × passes = {' × '.join(map(str, axes))}"
                          f"{', plus decode' if d.enabled else ''}), over the limit of "
                          f"{limit}; a smaller grid, or TILEDATTN_MAX_POINTS={count} to run "
                          "it anyway")


def validate(cfg: BenchConfig) -> BenchConfig:
    from ..errors import ScheduleError
    from .grid import impossible
    from .methods import get_method

    _validate_section(cfg, "")
    _check_size(cfg)
    why = impossible(cfg)
    if why:
        raise ConfigError(why)
    for m in cfg.methods:
        try:
            get_method(m)
        except (KeyError, ScheduleError) as exc:
            raise ConfigError(f"methods: {exc.args[0]}") from exc
    _check_head_shapes(cfg)
    _check_fp8(cfg)
    return cfg


def _check_fp8(cfg: BenchConfig) -> None:
    """An FP8 point is a forward (no method here has an FP8 backward), and some listed
    method runs FP8 (the ``fp8`` of its registry entry); else one line naming what runs."""
    from .methods import fp8_methods, get_method

    g, dec = cfg.grid, cfg.decode
    if FP8 not in g.dtypes and not (dec.enabled and FP8 in dec.dtypes):
        return
    backward = [p for p in g.passes if p != "fwd"] if FP8 in g.dtypes else []
    if backward:
        raise ConfigError(f"grid.dtypes: {FP8} is forward only (no FP8 backward), but "
                          f"grid.passes lists {backward}; run {FP8} in a config with passes "
                          "[fwd] (the 16-bit dtypes run every pass)")
    if not any(get_method(m).fp8 for m in cfg.methods):
        raise ConfigError(f"methods: none of {list(cfg.methods)} runs {FP8}; methods that "
                          f"do: {', '.join(fp8_methods())}")


_JSON_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
_JSON_LIMITS = {"min": "minimum", "above": "exclusiveMinimum", "max": "maximum",
                "choices": "enum"}


def _field_schema(f) -> dict:
    typ = str(f.type)
    if f.name in _SECTIONS:
        return section_schema(_SECTIONS[f.name], f.metadata["help"])
    elem = next(v for k, v in _JSON_TYPES.items() if k in typ.removeprefix("tuple"))
    item = {"type": elem, **{_JSON_LIMITS[k]: list(v) if k == "choices" else v
                             for k, v in f.metadata.items() if k in _JSON_LIMITS}}
    if f.metadata.get("pairs"):  # D, or [D, D_v]
        item = {"anyOf": [item, {"type": "array", "items": item, "minItems": 2,
                                 "maxItems": 2}]}
    if typ.startswith("tuple"):
        schema = {"type": ["array", "null"] if "None" in typ else "array", "items": item,
                  "minItems": 1}
        if f.metadata.get("unique"):
            schema["uniqueItems"] = True
    else:
        schema = item
    # The default is told, not filled in: the dataclasses apply it, and the study config
    # the bundle records stays the one the user wrote.
    default = list(f.default) if isinstance(f.default, tuple) else f.default
    schema["description"] = f"{f.metadata['help']} Default: {json.dumps(default)}."
    return schema


def section_schema(cls, help: str) -> dict:
    return {"type": "object", "description": help, "additionalProperties": False,
            "properties": {f.name: _field_schema(f) for f in fields(cls)}}


def json_schema() -> dict:
    """The JSON schema of a bench config, from the dataclasses above: the workflow adds it
    to its config schema under ``bench`` as it starts (``stages.study_schema``; ``python -m
    tiledattention.stages`` prints it)."""
    return section_schema(BenchConfig, "The benchmark (a `tiledattn bench` config): "
                           "generated by `python -m tiledattention.stages`.")


def from_dict(data: dict) -> BenchConfig:
    return validate(_build(BenchConfig, data or {}, "config"))


def section_from_dict(cls, name: str, data: dict | None):
    """A GPU stage's config section (``cls``, one of tiledattention/stages/), validated once;
    errors name ``<name>.<key>``."""
    cfg = _build(cls, data or {}, name)
    _validate_section(cfg, f"{name}.")
    return cfg


def stage_args(cfg) -> str:
    """The stage's ``tiledattn`` options for its config, quoted for the shell (a field with
    a ``flag``; lists space-separated, or the flag repeated; null fields left out)."""
    import shlex

    out = []
    for f in fields(cfg):
        value, flag = getattr(cfg, f.name), f.metadata.get("flag")
        if flag is None or value is None:
            continue
        items = [str(v) for v in (value if isinstance(value, tuple) else (value,))]
        if f.metadata.get("repeat"):
            out += [f"{flag} {shlex.quote(v)}" for v in items]
        else:
            out.append(f"{flag} " + " ".join(shlex.quote(v) for v in items))
    return " ".join(out)


def load_config(path: str) -> BenchConfig:
    from ..yamlio import YAMLInputError, load_yaml

    try:
        data = load_yaml(path)
    except YAMLInputError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc

