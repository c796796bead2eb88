"""The benchmark configuration: YAML in, validated frozen dataclasses inside.

Unknown keys are rejected with the list of valid ones; every error names the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from ..errors import ConfigError
from ..flops import PASSES
from ..tolerance import RTOL
from .grid import (
    HEADS_FALLBACK,
    PAPER_CAUSAL,
    PAPER_DTYPES,
    PAPER_HEAD_DIMS,
    PAPER_SEQS,
    TOKENS,
    TUNE_PASSES,
    WIDTH,
)
from .methods import profilable, variant_methods
from .variants import VARIANT_NAMES

__all__ = ["BenchConfig", "ConfigError", "CorrectnessConfig", "DecodeConfig", "GridConfig",
           "ModelConfig", "ProfileConfig", "TimingConfig", "TuneConfig", "VariantsConfig",
           "from_dict", "load_config", "model_from_dict", "validate"]

DTYPES = ("float16", "bfloat16", "float32")
SHAPE_POLICIES = ("tokens", "explicit")
DEVICES = ("auto", "cuda", "cpu")
MODEL_PHASES = ("prefill", "decode", "train", "prefill_compiled", "train_compiled")
INT32 = 2**31 - 1  # grid sizes reach int32 kernel arguments


def _opt(default, help: str, **limits):
    """A config key: its default, its help, and its limits (min, above, max, choices,
    unique), which both ``validate`` and the workflow's JSON schema read from here."""
    return field(default=default, metadata={"help": help, **limits})


@dataclass(frozen=True)
class GridConfig:
    seqs: tuple[int, ...] = _opt(PAPER_SEQS, "Sequence lengths S.", min=1, max=INT32)
    seqs_kv: tuple[int, ...] | None = _opt(None, "Key/value lengths (null: Skv = S).", min=1,
                                            max=INT32)
    head_dims: tuple[int, ...] = _opt(PAPER_HEAD_DIMS, "Head dims D.", min=1, max=INT32)
    dtypes: tuple[str, ...] = _opt(PAPER_DTYPES, "Element types.", choices=DTYPES)
    causal: tuple[bool, ...] = _opt(PAPER_CAUSAL, "Causal mask off/on.")
    shape_policy: str = _opt("tokens", "tokens - B = tokens // S, H = width // D (else "
                             "heads_fallback); explicit - batch and heads.",
                             choices=SHAPE_POLICIES)
    tokens: int = _opt(TOKENS, "B*S under the tokens policy.", min=1, max=INT32)
    width: int = _opt(WIDTH, "H*D under the tokens policy.", min=1, max=INT32)
    heads_fallback: int = _opt(HEADS_FALLBACK, "H where width is not a multiple of D.", min=1,
                               max=INT32)
    batch: int = _opt(1, "B under the explicit policy.", min=1, max=INT32)
    heads: int = _opt(8, "H under the explicit policy.", min=1, max=INT32)
    gqa: tuple[int, ...] = _opt((1,), "Query heads per key/value head.", min=1, max=INT32)
    passes: tuple[str, ...] = _opt(("fwd",), "Passes timed per point - fwd; bwd, the backward "
                                   "alone (dO given); fwd+bwd, a training step's attention.",
                                   choices=PASSES, unique=True)


@dataclass(frozen=True)
class DecodeConfig:
    enabled: bool = _opt(False, "Add the decode points (B x H x Sq x Skv x GQA, non-causal: "
                         "a KV-cache step sees the whole cache) to the grid.")
    seqs_q: tuple[int, ...] = _opt((1, 4, 8, 16), "Query lengths (1: decode; 4..16: "
                                   "speculative decoding).", min=1, max=INT32)
    seqs_kv: tuple[int, ...] = _opt((1024, 4096, 8192, 16384, 32768), "Cache lengths Skv.",
                                    min=1, max=INT32)
    batches: tuple[int, ...] = _opt((1, 4, 16, 64), "Batch sizes B.", min=1, max=INT32)
    heads: int = _opt(32, "Query heads H.", min=1, max=INT32)
    gqa: tuple[int, ...] = _opt((1, 4), "Query heads per key/value head (1: MHA).", min=1,
                                max=INT32)
    head_dims: tuple[int, ...] = _opt((128,), "Head dims D.", min=1, max=INT32)
    dtypes: tuple[str, ...] = _opt(("bfloat16",), "Element types.", choices=DTYPES)
    max_kv_gib: float = _opt(8.0, "Points whose K and V together exceed this many GiB are "
                             "left out.", above=0, max=1024)


@dataclass(frozen=True)
class TimingConfig:
    warmup: int = _opt(10, "Untimed calls before the first round.", min=0, max=10**6)
    reps: int = _opt(30, "Timed calls per method, over all rounds.", min=1,
                    max=10**6)
    rounds: int = _opt(3, "Rounds, methods interleaved, order alternating.",
                      min=1, max=10**4)
    flush_l2: bool = _opt(True, "Flush L2 before each timed call.")
    cuda_graph: bool = _opt(False, "Replay the calls from a CUDA graph.")


@dataclass(frozen=True)
class CorrectnessConfig:
    max_ref_heads: int = _opt(4, "Heads of batch 0 checked against the float64 reference.",
                              min=1)
    rtol_float16: float = _opt(RTOL["float16"], "Relative error allowed, float16.", above=0,
                               max=1)
    rtol_bfloat16: float = _opt(RTOL["bfloat16"], "Relative error allowed, bfloat16.",
                                above=0, max=1)
    rtol_float32: float = _opt(RTOL["float32"], "Relative error allowed, float32.", above=0,
                               max=1)


@dataclass(frozen=True)
class ModelConfig:
    """Optional end-to-end model benchmark (the `model_e2e` table), one launcher job."""

    enabled: bool = _opt(False, "Time prefill, decode and training-step tokens/s of the tiny "
                         "Llama (4 layers, hidden 2048, 16/4 heads, D 128, random weights) per "
                         "attention implementation (tiledattention, sdpa, eager), as one "
                         "launcher job.")
    phases: tuple[str, ...] = _opt(MODEL_PHASES, "What is timed - prefill, decode (eager); "
                                   "train, a training step (forward, loss, backward, SGD step) "
                                   "on B x prompt tokens; prefill_compiled, train_compiled: the "
                                   "same under torch.compile (tiledattention and sdpa).",
                                   choices=MODEL_PHASES, unique=True, flag="--phases")
    batches: tuple[int, ...] = _opt((1, 8), "Batch sizes B.", min=1, max=4096, unique=True,
                                    flag="--batches")
    prompt: int = _opt(2048, "Prompt tokens per sequence (prefill length; the decode "
                       "steps start after it).", min=1, max=8192 - 1024, flag="--prompt")
    steps: int = _opt(64, "Greedy decode steps timed per rep.", min=1, max=1024,
                      flag="--steps")
    reps: int = _opt(5, "Timed reps per implementation, interleaved, order alternating.",
                     min=1, max=1000, flag="--reps")
    seed: int = _opt(0, "Seed of the weights and the prompt.", min=0, max=2**63 - 1,
                     flag="--seed")

    def as_dict(self) -> dict:
        return asdict(self)

    def task(self, out_dir: str):
        """The stage's launcher job (the config travels as items, validated on the node)."""
        from .model import ModelTask

        return ModelTask(out_dir, tuple(self.as_dict().items()))

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()
                              ).hexdigest()[:16]


# The GPU stages besides the benchmark (tune, profile, model): each one frozen dataclass,
# from which the workflow schema's section is generated, the workflow validates the
# config's section once (``stage_from_dict``) and the rule's command line is written
# (``stage_args``); the ``tiledattn`` verbs take their defaults from here.
TUNE_SPACES = ("quick", "full")  # schedules.space.SPACES (tests/test_schema.py)
CLOCK_CONTROL = ("base", "none")


@dataclass(frozen=True)
class TuneConfig:
    """Optional schedule tuning (Table 5), as one launcher job (`tiledattn tune`)."""

    enabled: bool = _opt(False, "Run `tiledattn tune` and write a schedule table (one launcher "
                         "job: a GPU node under SLURM, a free local GPU; where it finds no GPU "
                         "the table records why).")
    space: str = _opt("quick", "Candidate schedules to time per shape (quick: 8 that won in "
                      "sweeps; full: every one).", choices=TUNE_SPACES, flag="--space")
    seqs: tuple[int, ...] | None = _opt(None, "Restrict tuning to these S values (null: the "
                                        "paper's 512..8192).", min=1, max=INT32,
                                        flag="--seqs")
    head_dims: tuple[int, ...] | None = _opt(None, "Restrict tuning to these head dims (null: "
                                             "64, 96, 128, 160).", min=8, max=INT32,
                                             flag="--head-dims")
    dtypes: tuple[str, ...] | None = _opt(None, "Restrict tuning to these dtypes (null: "
                                          "both).", choices=PAPER_DTYPES, flag="--dtypes")
    passes: tuple[str, ...] = _opt(("fwd",), "What is tuned, in order, into one table - fwd, "
                                   "the forward's schedules (Table 5); fwd+bwd, the backward's, "
                                   "timed with forward and backward (the table's backward "
                                   "entries).", choices=TUNE_PASSES, unique=True, flag="--pass")

    def as_dict(self) -> dict:
        return asdict(self)

    def task(self, out_path: str, state_path: str, reps: int = 20,
             compile_timeout: float = 120.0):
        """The stage's launcher job (a GPU node under SLURM, a free local GPU)."""
        from ..tune import TuneTask

        return TuneTask(out_path, state_path, self.space, self.seqs or PAPER_SEQS,
                        self.head_dims or PAPER_HEAD_DIMS, self.dtypes or PAPER_DTYPES, reps,
                        compile_timeout, passes=self.passes)


@dataclass(frozen=True)
class ProfileConfig:
    """Nsight Compute on representative shapes, one launcher job (`tiledattn profile`)."""

    enabled: bool = _opt(True, "Run the profile rule (without ncu, a GPU or counter "
                         "permission the job records why).")
    shapes: tuple[str, ...] = _opt(("float16:full:128:4096", "float16:causal:128:4096"),
                                   "dtype:mask:D:S, with B*S = tokens and H*D = width (checked "
                                   "by tiledattention).", flag="--shape", repeat=True)
    methods: tuple[str, ...] = _opt(("tiledattention", "torch_sdpa"), "Methods whose attention "
                                    "kernel is captured (those with a kernel filter in the "
                                    "method registry).", choices=tuple(profilable()),
                                    unique=True, flag="--methods")
    clock_control: str = _opt("base", "ncu clock control (base - locked base clocks; none - "
                              "boost, as the benchmark runs).", choices=CLOCK_CONTROL,
                              flag="--clock-control")
    warmup: int = _opt(5, "Launches skipped before the captured one.", min=0, max=10**6,
                       flag="--warmup")
    tokens: int = _opt(TOKENS, "B*S of the profiled points.", min=1, max=INT32,
                       flag="--tokens")
    width: int = _opt(WIDTH, "H*D of the profiled points.", min=1, max=INT32, flag="--width")

    def as_dict(self) -> dict:
        return asdict(self)

    def task(self, out_dir: str):
        """The stage's launcher job."""
        from ..study.profile import ProfileTask

        return ProfileTask(self.shapes, self.methods, out_dir, self.clock_control, self.warmup,
                           self.tokens, self.width)


VARIANT_METHODS = tuple(variant_methods())  # bench/methods.py: those with variants=True
VARIANT_PASSES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class VariantsConfig:
    """Variants against FlexAttention and SDPA, one launcher job (`tiledattn variants`)."""

    enabled: bool = _opt(False, "Time each variant (tiledattention's built-in, through the "
                         "public API) against FlexAttention, SDPA with the variant as a "
                         "materialised mask and eager attention, as one launcher job; where "
                         "the job finds no GPU its rows say why.")
    variants: tuple[str, ...] = _opt(VARIANT_NAMES, "Variants measured (bench/variants.py's "
                                     "registry).", choices=VARIANT_NAMES, unique=True,
                                     flag="--variants")
    methods: tuple[str, ...] = _opt(VARIANT_METHODS, "tiledattention; fa4, FlashAttention-4 "
                                    "(causal, window, softcap natively, ALiBi as a CuTe DSL "
                                    "score_mod); flex, torch.compile'd flex_attention with the "
                                    "same score_mod and a block mask (Triton backend); "
                                    "flex_flash, the same on its FLASH backend (FA4's kernels); "
                                    "sdpa_mask, torch SDPA with an explicit mask (where one "
                                    "expresses the variant); eager, matmul + softmax + matmul "
                                    "(where the device's memory holds its scores). A baseline "
                                    "that cannot run a variant has a row saying why.",
                                    choices=VARIANT_METHODS, unique=True, flag="--methods")
    seqs: tuple[int, ...] = _opt((1024, 2048, 4096, 8192, 16384), "Sequence lengths S.",
                                 min=1, max=INT32, unique=True, flag="--seqs")
    head_dims: tuple[int, ...] = _opt((64, 128), "Head dims D.", min=8, max=256, unique=True,
                                      flag="--head-dims")
    dtypes: tuple[str, ...] = _opt(PAPER_DTYPES, "Element types.", choices=PAPER_DTYPES,
                                   unique=True, flag="--dtypes")
    passes: tuple[str, ...] = _opt(VARIANT_PASSES, "fwd, the forward; fwd+bwd, forward and "
                                   "backward (a training step's attention).",
                                   choices=VARIANT_PASSES, unique=True, flag="--passes")
    tokens: int = _opt(TOKENS, "B*S (B = tokens // S, as the paper's grid).", min=1,
                       max=INT32, flag="--tokens")
    width: int = _opt(WIDTH, "H*D (H = width // D).", min=8, max=INT32, flag="--width")
    warmup: int = _opt(5, "Untimed calls before the first round (FlexAttention compiles "
                       "in the point's correctness call, before them).", min=0, max=10**6,
                       flag="--warmup")
    reps: int = _opt(20, "Timed calls per method, over all rounds.", min=1, max=10**6,
                     flag="--reps")
    rounds: int = _opt(2, "Rounds, methods interleaved, order alternating.", min=1,
                       max=10**4, flag="--rounds")
    max_ref_heads: int = _opt(1, "Heads of batch 0 checked against the float64 reference "
                              "(forward and gradients), every row (its S x S float64 "
                              "scores: 2 GiB a head at S 16k).", min=1, max=INT32,
                              flag="--max-ref-heads")
    seed: int = _opt(0, "Seed of the inputs.", min=0, max=2**63 - 1, flag="--seed")

    def as_dict(self) -> dict:
        return asdict(self)

    def bench_config(self) -> BenchConfig:
        """The harness' config of the stage's rows: its timing and correctness (the L2
        flushed before each timed call, as every benchmark row)."""
        return BenchConfig(timing=TimingConfig(self.warmup, self.reps, self.rounds),
                           correctness=CorrectnessConfig(self.max_ref_heads),
                           seed=self.seed, methods=self.methods)

    def measure_digest(self) -> str:
        return self.bench_config().measure_digest()

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()
                              ).hexdigest()[:16]

    def task(self, out_dir: str):
        """The stage's launcher job (the config travels as items, validated on the node)."""
        from .variants_run import VariantsTask

        return VariantsTask(out_dir, tuple(self.as_dict().items()))


@dataclass(frozen=True)
class BenchConfig:
    grid: GridConfig = field(default_factory=GridConfig, metadata={"help": "The points."})
    methods: tuple[str, ...] = _opt(("tiledattention", "torch_sdpa", "flash", "cudnn",
                                     "efficient", "math", "eager"),
                                    "Methods to compare (tiledattention@<schedule label>: a "
                                    "pinned schedule).", unique=True)
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={
        "help": "Optional decode section (small Sq against a long KV cache)."})
    timing: TimingConfig = field(default_factory=TimingConfig,
                                 metadata={"help": "Timing policy."})
    correctness: CorrectnessConfig = field(default_factory=CorrectnessConfig, metadata={
        "help": "Reference subsample and tolerances."})
    seed: int = _opt(0, "Seed of the inputs.", min=0, max=2**63 - 1)
    device: str = _opt("auto", "Where to run.", choices=DEVICES)

    def as_dict(self) -> dict:
        return asdict(self)

    def task(self, out_dir: str):
        """The stage's launcher job (the config travels as items, validated on the node)."""
        from .model import ModelTask

        return ModelTask(out_dir, tuple(self.as_dict().items()))

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
            _check_limits(name, item, f.metadata)
        if f.metadata.get("unique") and len(set(items)) != len(items):
            raise ConfigError(f"{name}: listed more than once")


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
    return cfg


_JSON_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
_JSON_LIMITS = {"min": "minimum", "above": "exclusiveMinimum", "max": "maximum",
                "choices": "enum"}


def _field_schema(f) -> dict:
    typ = str(f.type)
    if f.name in _SECTIONS:
        return _section_schema(_SECTIONS[f.name], f.metadata["help"])
    elem = next(v for k, v in _JSON_TYPES.items() if k in typ.removeprefix("tuple"))
    item = {"type": elem, **{_JSON_LIMITS[k]: list(v) if k == "choices" else v
                             for k, v in f.metadata.items() if k in _JSON_LIMITS}}
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


def _section_schema(cls, help: str) -> dict:
    return {"type": "object", "description": help, "additionalProperties": False,
            "properties": {f.name: _field_schema(f) for f in fields(cls)}}


def json_schema() -> dict:
    """The JSON schema of a bench config, from the dataclasses above: the workflow's
    config schema holds it verbatim under ``bench`` (tests/test_schema.py checks that;
    ``python -m tiledattention.bench.config`` prints it)."""
    return _section_schema(BenchConfig, "The benchmark (a `tiledattn bench` config): "
                           "generated by `python -m tiledattention.bench.config`.")


def from_dict(data: dict) -> BenchConfig:
    return validate(_build(BenchConfig, data or {}, "config"))


def model_json_schema() -> dict:
    """The study config's ``model`` section, from ``ModelConfig`` (like ``bench``)."""
    return stage_json_schema("model")


def model_from_dict(data: dict | None) -> ModelConfig:
    """The ``model`` section, validated; errors name ``model.<key>``."""
    return stage_from_dict("model", data)


STAGES = {"tune": TuneConfig, "profile": ProfileConfig, "model": ModelConfig,
          "variants": VariantsConfig}


def stage_json_schema(name: str) -> dict:
    """The study config's ``name`` section (tune, profile, model, variants), from its
    dataclass."""
    cls = STAGES[name]
    return _section_schema(cls, f"{cls.__doc__.split(chr(10))[0].rstrip('.')}: generated by "
                           "`python -m tiledattention.bench.config`.")


def stage_from_dict(name: str, data: dict | None):
    """The config's ``name`` section, validated once; errors name ``<name>.<key>``."""
    cfg = _build(STAGES[name], data or {}, name)
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


if __name__ == "__main__":
    import yaml

    print(yaml.safe_dump({"bench": json_schema(),
                          **{name: stage_json_schema(name) for name in STAGES}},
                         sort_keys=False, width=90,
                         default_flow_style=None), end="")
