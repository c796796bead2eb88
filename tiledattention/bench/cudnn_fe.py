"""cuDNN's fused attention through its Python frontend (``nvidia-cudnn-frontend``,
``import cudnn``): the study's ``cudnn_fe`` baseline (bench/methods.py registers it).

As cuDNN's own samples do (samples/python/50_sdpa_forward.ipynb, 51_sdpa_backward.ipynb,
test/python/sdpa/fp8.py), each shape's graph is built once (validate, operation graph,
heuristics A then FALLBACK, support check, plans) and cached with its workspace under a
``GraphKey``; a call only executes it. Graphs: the forward for inference, the forward that
also writes the softmax statistics (training), its backward, and the FP8 forward (e4m3
Q/K/V with per-tensor descale factors, a 16-bit output). Unlike torch's cudnn backend this
takes what the frontend takes: GQA natively, D_qk != D_v, head dims past 128.

The frontend loads libcudnn itself (LD_LIBRARY_PATH, then the interpreter's
``nvidia/cudnn/lib``: torch's own nvidia-cudnn wheel); ``unavailable`` says so when that is
not the cuDNN torch runs. Nothing here imports torch or cudnn at module level.
"""

from __future__ import annotations

import functools
import math
import re
from collections import OrderedDict
from dataclasses import dataclass

from .grid import FP8

FE_INSTALL = "pip install 'tiledattention[baselines]' (nvidia-cudnn-frontend)"
HALF_TYPES = ("float16", "bfloat16")
# The softmax probabilities P (in [0, 1]) go through e4m3 in the FP8 forward, scaled by this
# (descaled by its inverse): the largest power of two e4m3 holds (max 448), so the small
# probabilities stay normal numbers as long as they can and the descale is exact.
P_SCALE = 256.0
# Built graphs kept (least recently used dropped): a point needs at most three (forward,
# training forward, backward), and a backward's workspace can be hundreds of MB.
CACHE_SIZE = 6
HEURISTICS = ("A", "FALLBACK")  # cuDNN's samples' heuristic modes, in order


class GraphRefused(ValueError):
    """cuDNN will not build the graph for this shape (its validate/support/plan error)."""


class NeedsScales(ValueError):
    """An FP8 call without its descale factors, or with factors cuDNN cannot take."""


@functools.lru_cache(maxsize=1)
def import_error() -> str | None:
    """Why the frontend cannot run here (None: it can): not importable, or it found no
    libcudnn to load (it imports without one and fails on the first call)."""
    try:
        import cudnn
    except Exception as exc:  # not installed, a wheel for another Python
        return (f"the cuDNN frontend (import cudnn) cannot be imported: "
                f"{type(exc).__name__}: {exc}; {FE_INSTALL}")
    try:
        cudnn.backend_version()
    except Exception as exc:
        return (f"the cuDNN frontend {cudnn.__version__} loaded no libcudnn "
                f"({type(exc).__name__}: {exc})")
    try:  # its graphs reach cuDNN through cuda-bindings (the kit leaves it to the image)
        import cuda.bindings.driver  # noqa: F401
    except Exception as exc:
        return (f"the cuDNN frontend {cudnn.__version__} needs cuda-bindings (cuda.bindings) "
                f"to build a graph: {type(exc).__name__}: {exc}")
    return None


def loaded_libcudnn(maps: str | None = None) -> list[str]:
    """The libcudnn.so files (not its sub-libraries) mapped into this process, by real
    path, from ``maps`` (default: /proc/self/maps; Linux)."""
    import os

    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return []
    paths = {line.split()[-1] for line in maps.splitlines() if "libcudnn.so" in line}
    return sorted({os.path.realpath(p) for p in paths
                   if re.search(r"/libcudnn\.so(\.\d+)*$", p)})


def second_cudnn_error() -> str | None:
    """Why the frontend's cuDNN is not torch's (None: it is): two libraries mapped, or the
    frontend's backend version differs from ``torch.backends.cudnn.version()``."""
    import cudnn
    import torch

    ours = torch.backends.cudnn.version()  # loads torch's libcudnn first
    theirs = cudnn.backend_version()
    libs = loaded_libcudnn()
    if len(libs) > 1:
        return f"two cuDNN libraries are loaded ({', '.join(libs)}): the frontend's is not torch's"
    if ours is not None and theirs != ours:
        return f"the cuDNN frontend loaded cuDNN {theirs}, torch runs {ours}"
    return None


def _contiguous(shape) -> tuple[int, ...]:
    strides, n = [], 1
    for size in reversed(shape):
        strides.append(n)
        n *= size
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @classmethod
    def of(cls, t) -> Layout:
        return cls(tuple(t.shape), tuple(t.stride()))

    @classmethod
    def dense(cls, shape) -> Layout:
        return cls(tuple(shape), _contiguous(shape))


@dataclass(frozen=True)
class GraphKey:
    """What a built graph depends on: one graph per distinct key."""
    kind: str  # "fwd" (inference), "fwd_stats" (training forward), "bwd", "fp8_fwd"
    dtype: str  # Q/K/V's element type (torch's name)
    out_dtype: str  # O's (and the gradients')
    q: Layout
    k: Layout
    v: Layout
    causal: bool
    device: int

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.q.shape[-1])  # torch SDPA's default: 1/sqrt(D_qk)

    @property
    def o_shape(self) -> tuple[int, ...]:
        return (*self.q.shape[:-1], self.v.shape[-1])

    def label(self) -> str:
        b, h, sq, dqk = self.q.shape
        _, hk, skv, dv = self.v.shape
        return (f"{self.kind} {self.dtype} B={b} H={h} Hkv={hk} Sq={sq} Skv={skv} "
                f"D_qk={dqk} D_v={dv}{' causal' if self.causal else ''}")


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def key_of(kind: str, q, k, v, causal: bool, out_dtype: str | None = None) -> GraphKey:
    """The key of ``kind``'s graph for these tensors (any device: shapes and strides)."""
    device = (q.device.index or 0) if q.device.type == "cuda" else -1  # -1: not a GPU
    return GraphKey(kind, _dtype_name(q), out_dtype or _dtype_name(q), Layout.of(q),
                    Layout.of(k), Layout.of(v), bool(causal), device)


def point_key(kind: str, point, device_index: int = 0) -> GraphKey:
    """The key the runner's inputs for ``point`` will have (contiguous [B, H, S, D]; D_v
    from ``point.head_dim_v`` where the point has one)."""
    dv = getattr(point, "head_dim_v", None) or point.head_dim
    q = Layout.dense((point.batch, point.heads, point.seq_q, point.head_dim))
    k = Layout.dense((point.batch, point.heads_kv, point.seq_kv, point.head_dim))
    v = Layout.dense((point.batch, point.heads_kv, point.seq_kv, dv))
    out = "bfloat16" if point.dtype == FP8 else point.dtype
    return GraphKey(kind, point.dtype, out, q, k, v, bool(point.causal), device_index)


@dataclass
class Built:
    graph: object
    tensors: dict  # role -> the graph's tensor
    workspace: object
    constants: dict  # role -> a device tensor bound on every call (FP8 scales, amax sinks)

    def execute(self, handle, **data) -> None:
        pack = {self.tensors[r]: t for r, t in {**self.constants, **data}.items()}
        self.graph.execute(pack, self.workspace, handle=handle)

    def plan_name(self) -> str | None:
        try:  # which engine the heuristics' walk kept (the frontend's own index)
            return self.graph.get_plan_name_at_index(getattr(self.graph, "_plan_index", 0))
        except Exception:
            return None


_CACHE: OrderedDict[GraphKey, Built | GraphRefused] = OrderedDict()


def cached_graph(key: GraphKey) -> Built:
    """The built graph of ``key`` (built on first use; a refusal is cached too and raised
    again as ``GraphRefused``)."""
    hit = _CACHE.get(key)
    if hit is None:
        try:
            hit = _build(key)
        except GraphRefused as exc:
            hit = exc
    _CACHE[key] = hit
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    if isinstance(hit, GraphRefused):
        raise hit
    return hit


@functools.cache
def handle_for(device: int):
    import cudnn
    import torch

    with torch.cuda.device(device):
        return cudnn.create_handle()


def _handle(t):
    """The device's handle, on torch's current stream (CUDA-graph capture included)."""
    import cudnn
    import torch

    h = handle_for(t.device.index or 0)
    cudnn.set_stream(h, torch.cuda.current_stream(t.device).cuda_stream)
    return h


def _types():
    import cudnn

    t = cudnn.data_type
    return {"float16": t.HALF, "bfloat16": t.BFLOAT16, FP8: t.FP8_E4M3, "float32": t.FLOAT}


def _build(key: GraphKey) -> Built:
    import cudnn
    import torch

    types = _types()
    if key.dtype not in types or key.out_dtype not in HALF_TYPES:
        raise GraphRefused(f"cuDNN's SDPA here takes float16, bfloat16 or {FP8} inputs and a "
                           f"16-bit output, not {key.dtype} -> {key.out_dtype}")
    g = cudnn.pygraph(io_data_type=types[key.dtype],
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT)
    tensors, constants = _declare(g, key, types)
    stage = "validate"
    try:
        g.validate()
        stage = "build_operation_graph"
        g.build_operation_graph()
        stage = "create_execution_plans"
        g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in HEURISTICS])
        stage = "check_support"
        g.check_support()
        stage = "build_plans"
        g.build_plans()
    except Exception as exc:  # cudnnGraphNotSupportedError, or a RuntimeError naming why
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise GraphRefused(f"cuDNN {cudnn.backend_version()} refuses {key.label()} at "
                           f"{stage}: {type(exc).__name__}: {first}") from None
    device = torch.device("cuda", key.device)
    workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=device)
    consts = {role: torch.tensor(value, dtype=torch.float32, device=device).view(1, 1, 1, 1)
              for role, value in constants.items()}
    return Built(g, tensors, workspace, consts)


def _declare(g, key: GraphKey, types) -> tuple[dict, dict]:
    """The graph's tensors by role, and the constant scalars it binds (role -> value)."""
    import cudnn

    io, f32 = types[key.dtype], cudnn.data_type.FLOAT
    out_t = types[key.out_dtype]

    def tensor(name, layout, dtype=io):
        return g.tensor(name=name, dim=list(layout.shape), stride=list(layout.stride),
                        data_type=dtype)

    def output(t, name, layout, dtype):
        t.set_output(True).set_name(name).set_dim(list(layout.shape)).set_stride(
            list(layout.stride)).set_data_type(dtype)
        return t

    o_layout = Layout.dense(key.o_shape)
    stats_layout = Layout.dense((*key.q.shape[:-1], 1))
    t = {"q": tensor("q", key.q), "k": tensor("k", key.k), "v": tensor("v", key.v)}
    common = dict(attn_scale=key.scale, use_causal_mask=key.causal)
    if key.kind in ("fwd", "fwd_stats"):
        o, stats = g.sdpa(name="sdpa", q=t["q"], k=t["k"], v=t["v"],
                          generate_stats=key.kind == "fwd_stats", **common)
        t["o"] = output(o, "o", o_layout, out_t)
        if key.kind == "fwd_stats":
            t["stats"] = output(stats, "stats", stats_layout, f32)
        return t, {}
    if key.kind == "bwd":
        t.update(o=tensor("o", o_layout), dO=tensor("dO", o_layout),
                 stats=tensor("stats", stats_layout, f32))
        dq, dk, dv = g.sdpa_backward(name="sdpa_backward", q=t["q"], k=t["k"], v=t["v"],
                                     o=t["o"], dO=t["dO"], stats=t["stats"], **common)
        for name, grad, like in (("dQ", dq, key.q), ("dK", dk, key.k), ("dV", dv, key.v)):
            t[name] = output(grad, name, Layout.dense(like.shape), out_t)
        return t, {}
    if key.kind != "fp8_fwd":
        raise ValueError(f"graph kind {key.kind!r} is not fwd, fwd_stats, bwd or fp8_fwd")
    scalar = Layout((1, 1, 1, 1), (1, 1, 1, 1))
    for role in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        t[role] = tensor(role, scalar, f32)
    o, _, amax_s, amax_o = g.sdpa_fp8(
        name="sdpa_fp8", q=t["q"], k=t["k"], v=t["v"], descale_q=t["descale_q"],
        descale_k=t["descale_k"], descale_v=t["descale_v"], descale_s=t["descale_s"],
        scale_s=t["scale_s"], scale_o=t["scale_o"], generate_stats=False, **common)
    t["o"] = output(o, "o", o_layout, out_t)
    t["amax_s"] = output(amax_s, "amax_s", scalar, f32)
    t["amax_o"] = output(amax_o, "amax_o", scalar, f32)
    # P through e4m3 at P_SCALE; a 16-bit O needs no scale; the amax outputs are discarded.
    return t, {"descale_s": 1 / P_SCALE, "scale_s": P_SCALE, "scale_o": 1.0,
               "amax_s": 0.0, "amax_o": 0.0}


# --- the calls ---------------------------------------------------------------------------
def forward(q, k, v, causal: bool, stats: bool = False):
    """O (and the softmax statistics [B, H, Sq, 1] fp32 when ``stats``) of one execute."""
    import torch

    built = cached_graph(key_of("fwd_stats" if stats else "fwd", q, k, v, causal))
    o = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    data = dict(q=q, k=k, v=v, o=o)
    if stats:
        data["stats"] = torch.empty((*q.shape[:-1], 1), dtype=torch.float32, device=q.device)
    built.execute(_handle(q), **data)
    return (o, data["stats"]) if stats else (o, None)


def backward(q, k, v, o, do, stats, causal: bool):
    import torch

    built = cached_graph(key_of("bwd", q, k, v, causal))
    grads = {n: torch.empty(t.shape, dtype=t.dtype, device=t.device)
             for n, t in (("dQ", q), ("dK", k), ("dV", v))}
    built.execute(_handle(q), q=q, k=k, v=v, o=o.contiguous(), dO=do.contiguous(),
                  stats=stats, **grads)
    return grads["dQ"], grads["dK"], grads["dV"]


@functools.lru_cache(maxsize=1)
def _autograd():
    import torch

    class CudnnSdpa(torch.autograd.Function):
        """The training forward (with statistics) and cuDNN's backward graph."""

        @staticmethod
        def forward(ctx, q, k, v, causal):
            o, stats = forward(q, k, v, causal, stats=True)
            ctx.save_for_backward(q, k, v, o, stats)
            ctx.causal = causal
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, stats = ctx.saved_tensors
            return (*backward(q, k, v, o, do, stats, ctx.causal), None)

    return CudnnSdpa


def sdpa(q, k, v, causal: bool = False):
    """Attention of 16-bit [B, H, S, D] tensors (K/V heads dividing Q's), differentiable
    when autograd wants gradients of q, k or v."""
    import torch

    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _autograd().apply(q, k, v, causal)
    return forward(q, k, v, causal)[0]


def sdpa_fp8(q, k, v, descale_q, descale_k, descale_v, causal: bool = False,
             out_dtype: str = "bfloat16"):
    """The FP8 forward: e4m3 [B, H, S, D] inputs, each with a per-tensor float32 descale
    factor (one element: real = stored x descale), O in ``out_dtype``. Inference only."""
    import torch

    scales = {"descale_q": descale_q, "descale_k": descale_k, "descale_v": descale_v}
    for name, s in scales.items():
        if s is None or not isinstance(s, torch.Tensor):
            raise NeedsScales(f"FP8 attention needs {name}: a float32 tensor of one element "
                              "(real = stored x descale)")
        if s.numel() != 1:
            raise NeedsScales(f"{name} has {s.numel()} elements: cuDNN's FP8 SDPA takes one "
                              "per-tensor factor ([1, 1, 1, 1]), not per-head ones")
    built = cached_graph(key_of("fp8_fwd", q, k, v, causal, out_dtype))
    o = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=getattr(torch, out_dtype),
                    device=q.device)
    scales = {n: s.reshape(1, 1, 1, 1).to(device=q.device, dtype=torch.float32)
              for n, s in scales.items()}
    built.execute(_handle(q), q=q, k=k, v=v, o=o, **scales)
    return o


def versions() -> dict:
    """What ran: the frontend, the cuDNN it loaded (and torch's), its library file."""
    import cudnn
    import torch

    return {"frontend": cudnn.__version__, "cudnn": cudnn.backend_version(),
            "torch_cudnn": torch.backends.cudnn.version(), "libcudnn": loaded_libcudnn()}


def plan_name(key: GraphKey) -> str | None:
    """The engine the cached graph of ``key`` runs (None: not built)."""
    hit = _CACHE.get(key)
    return hit.plan_name() if isinstance(hit, Built) else None
