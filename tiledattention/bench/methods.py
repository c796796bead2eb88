"""The attention implementations a benchmark can compare, behind one registry.

Each method says whether it can run a point on this device (``unavailable`` when the
machine lacks what it needs, ``unsupported`` when the point is outside what it does),
runs it, and describes what it ran (the schedule, the backend actually dispatched).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from .grid import FP8, PINNED_PREFIX, Point, head_label, pinned_bwd_label, pinned_label
from .variant_cases import flex_block_mask, modified_scores, parts_for, sdpa_mask, variant_of


class Unavailable(Exception):
    """The method cannot run on this machine (status ``unavailable``)."""


class Unsupported(Exception):
    """The method does not handle this point (status ``unsupported``)."""


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    needs_cuda: bool
    run: Callable  # (q, k, v, point) -> out
    check: Callable = lambda point, device: None  # raises Unavailable / Unsupported
    describe: Callable = lambda q, k, v, point: {}
    # (q, k, v, point) -> the launch geometry columns (kernel.geometry), or None
    geometry: Callable = lambda q, k, v, point: None
    has_backward: bool = True  # differentiable in q, k, v (the bwd and fwd+bwd passes)
    # What the study needs, so a method added here reaches its tables, figures and profiles:
    color: str | None = None  # its colour in every figure (a matplotlib colour)
    kernel_filter: str | None = None  # Nsight Compute --kernel-name; None: not profiled
    headline: str | None = None  # its row label in the headline table; None: not there
    headline_by_head_dim: bool = False  # also one headline row per head dim
    display: str = ""  # its name in table and figure labels (default: ``name``)
    # A context the harness holds around the method's calls (correctness, timing, latency):
    # process-wide switches a method needs set while it runs and restored for the others.
    scope: Callable = contextlib.nullcontext
    variants: bool = False  # it runs the variants stage's points (bench/variant_cases.py)
    # A fused attention kernel: it competes for "the fastest fused baseline" at each point
    # (study/ratios.py). Unfused paths (math, eager) say fused=False; the subject never counts.
    fused: bool = True
    # The workloads stage's call (packed varlen batches, a paged KV cache):
    # (bench.workload_cases.Inputs, WorkloadPoint) -> Prepared, raising Unavailable /
    # Unsupported where it cannot run the point; None: not measured there.
    workload: Callable | None = None
    # The head shapes it runs, on any device: (D, D_v, pass) -> why not, or None (then its
    # check decides, per device). The runner makes the reason the row's (``unsupported``);
    # the config refuses a head shape no listed method runs. Default: any (torch's own).
    head_limits: Callable = lambda d, dv, pass_: None
    # It runs the FP8 (e4m3) forward points: ``run`` then takes ``descale=(dq, dk, dv)``
    # (one-element float32 tensors, real = stored x descale; the runner's ``fp8_inputs``).
    # Every other method's row at an FP8 point is ``unsupported`` with ``FP8_UNSUPPORTED``.
    fp8: bool = False

    @property
    def label(self) -> str:
        return self.display or self.name


def _gqa(point: Point) -> bool:
    return point.gqa > 1


def _tiled_heads(d: int, dv: int, pass_: str) -> str | None:
    """The kernel's head shapes (kernel/validate.py's limits): D and D_v multiples of 8 up
    to 256, any pair; forward only past 256 (q/k up to 576, v up to 512)."""
    from ..headdim import MAX_FWD_HEAD_DIM, MAX_FWD_VALUE_DIM, MAX_HEAD_DIM, supported_head_dim

    shape = f"D {head_label(d, dv)}"
    if not (supported_head_dim(d, MAX_FWD_HEAD_DIM)
            and supported_head_dim(dv, MAX_FWD_VALUE_DIM)):
        return (f"{shape}: the kernel takes multiples of 8 up to {MAX_HEAD_DIM} (forward "
                f"only: q/k up to {MAX_FWD_HEAD_DIM}, v up to {MAX_FWD_VALUE_DIM})")
    if pass_ != "fwd" and max(d, dv) > MAX_HEAD_DIM:
        return (f"{shape}: the kernel's backward takes head dims up to "
                f"{MAX_HEAD_DIM} (a gradient past it raises BackwardNotSupportedError); "
                "forward only here")
    return None


def _one_head_dim(name: str, limit: int = 256):
    """head_limits of a kernel with one head dim for q, k and v, a multiple of 8 up to
    ``limit`` (FlashAttention-2, torch's FLASH_ATTENTION backend)."""
    def limits(d, dv, pass_):
        if d != dv:
            return f"{name} takes one head dim for q, k and v, not {d}/{dv}"
        if d % 8 or not 8 <= d <= limit:
            return f"{name} takes head dims that are multiples of 8 up to {limit}, not {d}"
        return None
    return limits


# Why a method without ``fp8`` does not run an FP8 point (the runner's row reason).
FP8_UNSUPPORTED = ("{name} has no FP8 (e4m3) forward here; its bfloat16 row of the same "
                   "shape is the comparison")


def _tiled_check(point, device):
    from ..kernel.toolchain import tileiras_path

    if device.type != "cuda":
        raise Unavailable("needs a CUDA GPU")
    if importlib.util.find_spec("cuda.tile") is None or tileiras_path() is None:
        raise Unavailable("cuTile toolchain not installed (pip install 'cuda-tile[tileiras]')")
    if point.dtype not in ("float16", "bfloat16", FP8):
        raise Unsupported(f"dtype {point.dtype}: the kernel takes float16, bfloat16 and "
                          f"{FP8} (forward)")


def _tiled_run(q, k, v, point, schedule=None, descale=None):
    from ..api import sdpa

    if descale is not None:  # the FP8 forward, bf16 out (what cuDNN's FP8 graph writes)
        import torch

        dq, dk, dv = descale
        return sdpa(q, k, v, causal=point.causal, enable_gqa=_gqa(point), schedule=schedule,
                    q_descale=dq, k_descale=dk, v_descale=dv, out_dtype=torch.bfloat16)
    if variant_of(point) is not None:  # the built-in variant, through the public API
        return sdpa(q, k, v, enable_gqa=_gqa(point), schedule=schedule,
                    **parts_for(point, q.device).ours)
    return sdpa(q, k, v, causal=point.causal, enable_gqa=_gqa(point), schedule=schedule)


def _tiled_bwd_run(q, k, v, point, bwd_schedule):
    """The forward as the table picks it; its backward, whenever it runs, with
    ``bwd_schedule`` (the autograd context keeps the schedule in force at the forward)."""
    from ..kernel.plan import pinned_bwd_schedule

    with pinned_bwd_schedule(bwd_schedule):
        return _tiled_run(q, k, v, point)


def _tiled_describe(q, k, v, point):
    from ..headdim import MAX_HEAD_DIM
    from ..schedules.policy import choose_schedule

    if point.dtype == FP8:  # the FP8 forward takes no table: its default, or one pinned
        from ..schedules.schedule import default_fp8_schedule

        return {"schedule": default_fp8_schedule(point.head_dim, point.causal).label(),
                "schedule_source": "default"}
    # The table's bucket is q's head dim; a wider V or D past 256 has none, and the kernel
    # runs V's (or D's) default schedule (kernel/plan.py's choose_schedule, its backward's).
    wide = point.value_dim > point.head_dim or point.head_dim > MAX_HEAD_DIM
    if wide:
        from ..kernel.plan import plan_for

        plan = plan_for(q, k, v, None, point.causal, None, _gqa(point), False, None)
        schedule, how = plan.schedule, "default"
    else:
        schedule, how = choose_schedule(q, k, point.causal)
    out = {"schedule": schedule.label(), "schedule_source": how}
    if point.pass_ != "fwd":
        from ..schedules.backward import default_bwd_schedule
        from ..schedules.policy import choose_bwd_schedule

        if wide:
            bwd, bwd_how = default_bwd_schedule(point.value_dim, point.causal), "default"
        else:
            bwd, bwd_how = choose_bwd_schedule(q, k, point.causal,
                                               variant=variant_of(point) is not None)
        out.update(bwd_schedule=bwd.label(), bwd_schedule_source=bwd_how)
    return out


def _tiled_geometry(q, k, v, point, schedule=None):
    """The geometry of the plan the call above used (its grid, schedule and sizes)."""
    import torch

    from ..kernel.geometry import plan_geometry
    from ..kernel.plan import plan_for

    if variant_of(point) is not None or point.dtype == FP8:
        return None  # a variant's plan walks its block lists; the FP8 plan is its own
    plan = plan_for(q, k, v, None, point.causal, None, _gqa(point), False, schedule)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return plan_geometry(plan, point.seq_kv, sms).as_dict()


def _torch_run(backend):
    def run(q, k, v, point):
        from ..torch_backends import torch_sdpa

        return torch_sdpa(q, k, v, causal=point.causal, backend=backend)
    return run


def _cuda_only(point, device):
    if device.type != "cuda":
        raise Unavailable("needs a CUDA GPU")


def _auto_describe(q, k, v, point):
    from ..torch_backends import detect_auto_backend

    if q.device.type != "cuda":
        return {"backend": "math"}  # the CPU path of torch SDPA
    return {"backend": detect_auto_backend(q, k, v, causal=point.causal)}


def eager_attention(q, k, v, point):
    """matmul, fp32 softmax, matmul: what a framework without fused attention does."""
    import torch

    if point.gqa > 1:
        k = k.repeat_interleave(point.gqa, dim=1)
        v = v.repeat_interleave(point.gqa, dim=1)
    s = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if variant_of(point) is not None:  # the variant's torch mods over the whole score matrix
        s = modified_scores(s, parts_for(point, q.device))
    elif point.causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).to(q.dtype) @ v


def _flash_attn_check(point, device):
    _cuda_only(point, device)
    if importlib.util.find_spec("flash_attn") is None:
        raise Unavailable("the flash_attn package is not installed")
    # flash-attn-4 installs flash_attn as a namespace holding only cute: FA2 is the
    # flash_attn_interface module beside it, which FA4 does not ship.
    if importlib.util.find_spec("flash_attn.flash_attn_interface") is None:
        raise Unavailable("flash_attn is FlashAttention-4's namespace here (flash_attn.cute); "
                          "FlashAttention-2 is not installed")


def _flash_attn_run(q, k, v, point):
    from flash_attn import flash_attn_func  # [B, S, H, D] layout

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          causal=point.causal)
    return out.transpose(1, 2)


def _variant_only(name: str, point):
    if variant_of(point) is None:
        raise Unsupported(f"{name} runs the variants stage's points (tiledattn variants)")


# Bytes per score element eager attention holds at once (fp32 scores, the modified copy,
# the softmax, its low-precision copy; twice that with the backward's saved tensors).
_EAGER_BYTES = {"fwd": 14, "bwd": 28, "fwd+bwd": 28}


def _eager_check(point, device):
    """Eager attention where the device's memory allows (variants stage): its B·H·S²
    score matrices must fit in the free memory, else the row says how much it needs."""
    if variant_of(point) is None or device.type != "cuda":
        return
    import torch

    need = point.batch * point.heads * point.seq_q * point.seq_kv * _EAGER_BYTES[point.pass_]
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.9 * free:
        raise Unsupported(f"eager needs ~{need / 2**30:.1f} GiB for its B·H·S² score "
                          f"matrices ({point.pass_}), {free / 2**30:.1f} GiB free")


def _flex_check(point, device, name="flex"):
    _variant_only(name, point)
    _flex_runtime(device)


def _flex_runtime(device):
    """What FlexAttention needs of the machine (any point)."""
    if device.type != "cuda":
        raise Unavailable("FlexAttention runs here on a CUDA GPU only (torch.compile's "
                          "Triton backend)")
    if importlib.util.find_spec("triton") is None:
        raise Unavailable("FlexAttention needs Triton (torch.compile's GPU backend), which "
                          "is not installed")
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception as exc:  # an old torch, a broken install
        raise Unavailable(f"torch.nn.attention.flex_attention cannot be imported: "
                          f"{type(exc).__name__}: {exc}") from None


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    # Every variant, shape and grad mode is a recompile of the one flex_attention: without
    # higher limits Dynamo falls back to eager after 8 and times the unfused math.
    for name, value in (("cache_size_limit", 1024), ("recompile_limit", 1024),
                        ("accumulated_cache_size_limit", 8192),
                        ("accumulated_recompile_limit", 8192)):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, value)
    return torch.compile(flex_attention, dynamic=False)


def _flex_runner(kernel_options: dict | None):
    """The compiled flex_attention (one, shared by both backends) with the variant's
    score_mod and block mask; ``kernel_options`` picks the backend (None: Triton)."""
    def run(q, k, v, point):
        parts = parts_for(point, q.device)
        return _compiled_flex()(q, k, v, score_mod=parts.score,
                                block_mask=flex_block_mask(parts, point, q.device),
                                enable_gqa=_gqa(point), kernel_options=kernel_options)
    return run


def _flex_flash_check(point, device):
    """FlexAttention's FLASH backend: FA4's CuTe DSL kernels under Inductor (torch >= 2.11
    with flash-attn-4 importable). Inductor raises rather than fall back to Triton when
    BACKEND="FLASH" cannot be used, so an ok row is FA4's kernels."""
    _flex_check(point, device, "flex_flash")
    _flex_flash_runtime(point, device)


def _flex_flash_runtime(point, device):
    """What the FLASH backend needs beyond FlexAttention itself (any point)."""
    why = fa4_import_error()
    if why:
        raise Unavailable(f"FlexAttention's FLASH backend needs FA4: {why}")
    try:
        from torch._inductor.kernel.flex import flex_flash_attention  # noqa: F401
    except Exception as exc:
        raise Unavailable(f"this torch has no FlexAttention FLASH backend (PyTorch >= 2.11): "
                          f"{type(exc).__name__}: {exc}") from None
    _fa4_device_check(point, device, "FlexAttention's FLASH backend")


# --- FlashAttention-4 (flash-attn-4: flash_attn.cute, CuTe DSL kernels JIT-compiled per
# (D, causal, dtype, direction) on first use) ---------------------------------------------
FA4_INSTALL = "pip install 'tiledattention[baselines]' (flash-attn-4)"


@functools.lru_cache(maxsize=1)
def fa4_import_error() -> str | None:
    """Why ``flash_attn.cute`` cannot be imported here (None: it can). An import, not a
    spec lookup: the CuTe DSL's ``cutlass`` comes from a ``.pth`` that ``pip --target``
    skips, and only importing tells."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as exc:  # not installed, no cutlass, a broken CUDA 13 runtime
        return (f"flash_attn.cute (FlashAttention-4) cannot be imported: "
                f"{type(exc).__name__}: {exc}; {FA4_INSTALL}")
    return None


# The one D_v != D shape FA4 ships (DeepSeek's MLA training, both architectures).
FA4_HEAD_PAIRS = ((192, 128),)


def _fa4_heads(d: int, dv: int, pass_: str) -> str | None:
    """FA4's head shapes on any architecture it is measured on: D = D_v up to 256, or
    (192, 128); fa4_head_dim_error decides per architecture."""
    if d != dv and (d, dv) not in FA4_HEAD_PAIRS:
        return (f"FA4 takes D_v != D only as {', '.join(f'{a}/{b}' for a, b in FA4_HEAD_PAIRS)}"
                f", not {d}/{dv}")
    return fa4_head_dim_error(d, 9) if d == dv else None


def fa4_head_dim_error(head_dim: int, major: int, head_dim_v: int | None = None) -> str | None:
    """Why FA4 has no kernel for this head dim on compute capability ``major`` (its
    interface's _validate_head_dims: sm_90 takes 8..256, sm_100 8..128 and 256, multiples
    of 8 for 16-bit types; both take V's head dim differing only as (192, 128))."""
    if head_dim_v not in (None, head_dim):
        return _fa4_heads(head_dim, head_dim_v, "fwd")
    if head_dim % 8:
        return f"FA4 takes head dims that are multiples of 8, not {head_dim}"
    if major == 9 and not 8 <= head_dim <= 256:
        return f"FA4 on sm_90 takes head dims 8..256, not {head_dim}"
    if major in (10, 11) and not (8 <= head_dim <= 128 or head_dim == 256):
        return f"FA4 on sm_{major}0 takes head dims 8..128 and 256, not {head_dim}"
    return None


def _fa4_device_check(point, device, name: str = "FA4"):
    """What FA4's kernels need of the machine and the point's dtype and head dim."""
    import torch

    _cuda_only(point, device)
    why = fa4_import_error()
    if why:
        raise Unavailable(why)
    major, minor = torch.cuda.get_device_capability(device)
    if major not in (9, 10, 11):  # sm_80/sm_120 kernels lack the backward or score_mod
        raise Unavailable(f"{name} is measured on sm_90 and sm_100 (Hopper, Blackwell), "
                          f"not sm_{major}{minor}")
    if point.dtype not in ("float16", "bfloat16"):
        raise Unsupported(f"dtype {point.dtype}: {name} takes float16 and bfloat16")
    why = fa4_head_dim_error(point.head_dim, major, getattr(point, "head_dim_v", None))
    if why:
        raise Unsupported(why)


def _fa4_check(point, device):
    _fa4_device_check(point, device)
    if variant_of(point) is not None:
        parts = parts_for(point, device)
        if parts.fa4 is None:
            raise Unsupported(parts.no_fa4 or "FA4 cannot express this variant")


def _fa4_kwargs(point, device) -> dict:
    """flash_attn_func's arguments for the point: the variant's FA4 form, else the mask.
    num_splits and pack_gqa stay FA4's defaults (its own heuristics, decode included;
    its sm_90 forward has no split-KV)."""
    if variant_of(point) is not None:
        return parts_for(point, device).fa4
    return {"causal": point.causal}


def _fa4_run(q, k, v, point):
    from flash_attn.cute import flash_attn_func  # [B, S, H, D]; GQA from the head counts

    out, _ = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                             **_fa4_kwargs(point, q.device))
    return out.transpose(1, 2)


def _fa4_describe(q, k, v, point):

    def plain(x):  # the row's JSON: CuTe DSL functions by name, aux tensors by shape
        if isinstance(x, (tuple, list)):
            return [plain(y) for y in x]
        if callable(x):
            return getattr(x, "__name__", type(x).__name__)
        return f"tensor{list(x.shape)}" if hasattr(x, "shape") else x

    kw = {key: plain(val) for key, val in _fa4_kwargs(point, q.device).items()}
    return {"version": fa4_version(), "kwargs": kw}


# --- torch SDPA with FA4 as its flash backend (torch.nn.attention's flash impl registry) --
def _sdpa_fa4_check(point, device):
    import torch.nn.attention as attn

    if variant_of(point) is not None:
        raise Unsupported("SDPA's flash backend takes only the causal flag: the variants "
                          "stage's SDPA form is sdpa_mask")
    if not hasattr(attn, "activate_flash_attention_impl"):
        raise Unavailable("this torch has no torch.nn.attention.activate_flash_attention_impl "
                          "(PyTorch >= 2.11)")
    if "FA4" not in attn.list_flash_attention_impls():
        raise Unavailable(f"torch lists no FA4 flash impl (it has "
                          f"{attn.list_flash_attention_impls()})")
    _fa4_device_check(point, device, "SDPA's FA4 impl")
    why = sdpa_fa4_error()
    if why:
        raise Unavailable(why)


def _fwd_arities(source: str, func: str) -> tuple[set[int], set[int]]:
    """In ``source``: the tuple lengths ``func`` returns (its own returns, not nested
    functions'), and those its callers unpack from ``<x>.func(...)`` or ``func(...)``."""
    import ast

    returns, unpacks = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            todo = list(node.body)
            while todo:
                n = todo.pop()
                if isinstance(n, ast.Return) and n.value is not None:
                    returns.add(len(n.value.elts) if isinstance(n.value, ast.Tuple) else 1)
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    todo += list(ast.iter_child_nodes(n))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                isinstance(node.targets[0], ast.Tuple):
            f = node.value.func
            if getattr(f, "attr", getattr(f, "id", None)) == func:
                unpacks.add(len(node.targets[0].elts))
    return returns, unpacks


@functools.lru_cache(maxsize=1)
def sdpa_fa4_error() -> str | None:
    """Why torch's FA4 flash impl cannot call the installed FA4 (None: it can, or it cannot
    be told from the sources). torch's impl unpacks ``out, lse`` from FA4's private
    ``flash_attn.cute.interface._flash_attn_fwd``; FA4 4.0.0b36 returns five values there
    (out, lse, p, row_max, o_lo), and SDPA fails with "too many values to unpack"."""
    import inspect

    try:
        import flash_attn.cute.interface as fa4_interface
        import torch.nn.attention._fa4 as torch_fa4

        returns, _ = _fwd_arities(inspect.getsource(fa4_interface), "_flash_attn_fwd")
        _, unpacks = _fwd_arities(inspect.getsource(torch_fa4), "_flash_attn_fwd")
    except Exception:  # no sources to read: the run says what happens
        return None
    if returns and unpacks and returns.isdisjoint(unpacks):
        version = fa4_version()
        return (f"torch's FA4 flash impl (torch.nn.attention._fa4) unpacks "
                f"{'/'.join(map(str, sorted(unpacks)))} values from "
                f"flash_attn.cute.interface._flash_attn_fwd, which FA4 {version} returns "
                f"{'/'.join(map(str, sorted(returns)))} of: SDPA on FA4 fails here "
                f"(\"too many values to unpack\")")
    return None


def fa4_version() -> str | None:
    """The installed flash-attn-4 release (its distribution's metadata: the package's own
    ``__version__`` says 0.0.0 in 4.0.0b36)."""
    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def fa4_sdpa_impl():
    """SDPA's flash backend on FA4 while inside, the previous impl (FA2 or another
    activated one) restored on leaving: the switch is process-wide, so the harness holds
    it around this method's calls only (Method.scope), never around the other methods'."""
    import torch.nn.attention as attn

    before = attn.current_flash_attention_impl()
    attn.activate_flash_attention_impl("FA4")
    try:
        yield
    finally:
        if before is None:
            attn.restore_flash_attention_impl()
        else:
            attn.activate_flash_attention_impl(before)


def _sdpa_fa4_run(q, k, v, point):
    from ..torch_backends import torch_sdpa

    return torch_sdpa(q, k, v, causal=point.causal, backend="flash")


def _sdpa_mask_check(point, device):
    _variant_only("sdpa_mask", point)
    parts = parts_for(point, device)
    if parts.sdpa is None:
        raise Unsupported(parts.no_sdpa or "SDPA cannot express this variant as a mask")


def _sdpa_mask_run(q, k, v, point):
    import torch.nn.functional as F

    mask = sdpa_mask(parts_for(point, q.device), point, q.dtype, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=_gqa(point))


def _sdpa_mask_describe(q, k, v, point):
    return {"mask": parts_for(point, q.device).sdpa}


# --- cuDNN through its Python frontend (bench/cudnn_fe.py: graphs built once per shape) ---
def _cudnn_fe_kinds(point) -> tuple[str, ...]:
    """The graphs a point's pass executes."""
    from .cudnn_fe import FP8

    if point.dtype == FP8:
        return ("fp8_fwd",)
    return ("fwd",) if point.pass_ == "fwd" else ("fwd_stats", "bwd")


def _cudnn_fe_check(point, device):
    """The frontend imports and found torch's cuDNN, the GPU is sm_90+, and cuDNN builds the
    point's graphs (built here, untimed; the calls find them cached). A graph cuDNN refuses
    is ``unavailable`` with its error: what it lacks is this cuDNN build's."""
    import torch

    from . import cudnn_fe as fe

    _cuda_only(point, device)
    if variant_of(point) is not None:
        raise Unsupported("cudnn_fe runs the grid's and decode's dense points, not the "
                          "variants stage's")
    if point.dtype not in (*fe.HALF_TYPES, fe.FP8):
        raise Unsupported(f"dtype {point.dtype}: cuDNN's SDPA takes float16, bfloat16 and "
                          f"{fe.FP8} (forward)")
    if point.dtype == fe.FP8 and point.pass_ != "fwd":
        raise Unsupported("the FP8 points are inference only: no FP8 backward is measured")
    why = fe.import_error()
    if why:
        raise Unavailable(why)
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        raise Unavailable(f"cudnn_fe is measured on sm_90 and newer (Hopper, Blackwell), "
                          f"not sm_{major}{minor}")
    why = fe.second_cudnn_error()
    if why:
        raise Unavailable(why)
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        for kind in _cudnn_fe_kinds(point):
            fe.cached_graph(fe.point_key(kind, point, index))
    except fe.GraphRefused as exc:
        raise Unavailable(str(exc)) from None


def _cudnn_fe_run(q, k, v, point, descale=None):
    """cuDNN's SDPA; an FP8 point's q, k, v are e4m3 with ``descale`` = (dq, dk, dv), each a
    one-element float32 tensor (real = stored x descale)."""
    from ..errors import InputError
    from . import cudnn_fe as fe

    if str(q.dtype).endswith(fe.FP8):
        try:
            return fe.sdpa_fp8(q, k, v, *(descale or (None,) * 3), causal=point.causal)
        except fe.NeedsScales as exc:
            raise InputError(str(exc)) from None
    return fe.sdpa(q, k, v, causal=point.causal)


def _cudnn_fe_describe(q, k, v, point):
    from . import cudnn_fe as fe

    out = fe.versions()
    for kind in _cudnn_fe_kinds(point):
        key = fe.key_of(kind, q, k, v, point.causal,
                        "bfloat16" if kind == "fp8_fwd" else None)
        out[f"plan_{kind}"] = fe.plan_name(key)
    return out


# --- the workloads stage (bench/workload_cases.py): packed varlen batches and a paged KV
# cache. Each ``workload`` checks, then builds its call's tensors (masks, padding, layout
# copies) outside the timed region; the call itself is attention only. -----------------
def _backward(point) -> bool:
    return point.pass_ != "fwd"


def _first(result):
    """The output of a call that may also return the log-sum-exp."""
    return result[0] if isinstance(result, (tuple, list)) else result


def _ours_workload(inputs, point):
    import tiledattention as ta

    from .workload_cases import Prepared, leaves_of

    _tiled_check(point, inputs.q.device)
    q, k, v = leaves_of(inputs, _backward(point))
    if point.kind == "decode":  # [B, 1, Hq, D]: what a decode step passes
        q4 = q.view(point.batch, 1, point.heads, point.head_dim)
        return Prepared(lambda: ta.sdpa_paged(q4, k, v, inputs.page_table,
                                              inputs.cache_seqlens, causal=point.causal),
                        packed=lambda out: out.reshape(-1, *out.shape[2:]))
    if point.kind == "prefill":
        return Prepared(lambda: ta.sdpa_paged(q, k, v, inputs.page_table, inputs.cache_seqlens,
                                              cu_seqlens_q=inputs.cu_q,
                                              max_seqlen_q=max(point.seqs_q),
                                              causal=point.causal))
    return Prepared(lambda: ta.sdpa_varlen(q, k, v, inputs.cu_q, inputs.cu_k,
                                           max(point.seqs_q), max(point.seqs_kv),
                                           causal=point.causal),
                    leaves=(q, k, v), grads=lambda: (q.grad, k.grad, v.grad), dout=inputs.dout)


def _fa4_workload(inputs, point):
    """FA4's own varlen (cu_seqlens) and paged (page_table + seqused_k) entry point."""
    from .workload_cases import Prepared, leaves_of

    _fa4_device_check(point, inputs.q.device)
    from flash_attn.cute import flash_attn_varlen_func

    q, k, v = leaves_of(inputs, _backward(point))
    details = {"version": fa4_version(), "entry": "flash_attn.cute.flash_attn_varlen_func"}
    if point.kind == "decode":  # [B, 1, Hq, D] against the pages
        q4 = q.view(point.batch, 1, point.heads, point.head_dim)
        return Prepared(lambda: _first(flash_attn_varlen_func(
            q4, k, v, seqused_k=inputs.cache_seqlens, page_table=inputs.page_table,
            causal=point.causal)), packed=lambda out: out.reshape(-1, *out.shape[2:]),
            details=details)
    if point.kind == "prefill":
        return Prepared(lambda: _first(flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=inputs.cu_q, max_seqlen_q=max(point.seqs_q),
            seqused_k=inputs.cache_seqlens, page_table=inputs.page_table,
            causal=point.causal)), details=details)
    return Prepared(lambda: _first(flash_attn_varlen_func(
        q, k, v, cu_seqlens_q=inputs.cu_q, cu_seqlens_k=inputs.cu_k,
        max_seqlen_q=max(point.seqs_q), max_seqlen_k=max(point.seqs_kv), causal=point.causal)),
        leaves=(q, k, v), grads=lambda: (q.grad, k.grad, v.grad), dout=inputs.dout,
        details=details)


FLEX_PAGED = ("FlexAttention has no paged kernel here: on the gathered cache it would time a "
              "dense call, not a paged one, and its paged path "
              "(torch.nn.attention.experimental._paged_attention, private) keeps a cache "
              "layout of its own ([1, H, pages x page_size, D] with its own page table)")


def _stream(inputs, point):
    """q, k, v as one packed row [1, H, total, D] (contiguous copies, leaves of their own),
    dO likewise, and how an output or gradient maps back to [total, H, D]."""
    def row(t):
        return t.detach().transpose(0, 1)[None].contiguous()

    def back(t):
        return t[0].transpose(0, 1)

    leaves = tuple(row(t).requires_grad_(_backward(point))
                   for t in (inputs.q, inputs.k, inputs.v))
    return leaves, back, None if inputs.dout is None else row(inputs.dout)


def _doc_mask(point, device):
    """A token attends the tokens of its own document (causally when the point is)."""
    import torch

    ids = torch.repeat_interleave(torch.arange(point.batch, device=device),
                                  torch.tensor(point.seqs_q, device=device))
    if point.causal:
        return lambda b, h, q, k: (ids[q] == ids[k]) & (q >= k)
    return lambda b, h, q, k: ids[q] == ids[k]


def _flex_workload(kernel_options: dict | None):
    """FlexAttention with a document block mask over the packed stream (the block mask is
    made once per point, not timed)."""
    def prepare(inputs, point):
        from .workload_cases import Prepared

        device = inputs.q.device
        _flex_runtime(device)
        if kernel_options:
            _flex_flash_runtime(point, device)
        if point.paged:
            raise Unsupported(FLEX_PAGED)
        from torch.nn.attention.flex_attention import create_block_mask

        total = sum(point.seqs_q)
        block = create_block_mask(_doc_mask(point, device), None, None, total, total,
                                  device=device)
        (q, k, v), back, dout = _stream(inputs, point)
        return Prepared(lambda: _compiled_flex()(q, k, v, block_mask=block,
                                                 enable_gqa=point.gqa > 1,
                                                 kernel_options=kernel_options),
                        packed=back, leaves=(q, k, v),
                        grads=lambda: (back(q.grad), back(k.grad), back(v.grad)), dout=dout)
    return prepare


def _blockmask_workload(inputs, point):
    """Our own block-mask packing: ``ta.sdpa`` over the packed stream with a block mask of
    ``ta.variants.document`` (what the library offered before varlen)."""
    import tiledattention as ta

    from .workload_cases import Prepared

    device = inputs.q.device
    _tiled_check(point, device)
    if point.paged:
        raise Unsupported("a block mask packs sequences into one stream where each query "
                          "sees its own document's keys; a paged cache's new tokens against "
                          "their contexts (Sq != Skv per sequence) have no such form")
    total = sum(point.seqs_q)
    ids = ta.variants.segments_from_lengths(list(point.seqs_q), device)
    block = ta.block_mask(ta.variants.document(ids), None, None, total, total, device)
    (q, k, v), back, dout = _stream(inputs, point)
    return Prepared(lambda: ta.sdpa(q, k, v, is_causal=point.causal, block_mask=block,
                                    enable_gqa=point.gqa > 1),
                    packed=back, leaves=(q, k, v),
                    grads=lambda: (back(q.grad), back(k.grad), back(v.grad)), dout=dout)


def _padded_workload(inputs, point):
    """torch SDPA on the padded [B, H, max_len, D] batch with a key-padding (and causal)
    mask: what a caller without varlen does. The padding copies and the mask are made
    before the timed call (so the time is attention alone, padding included)."""
    import torch.nn.functional as F

    from .workload_cases import Prepared, gathered, padded, padding_mask, unpadded

    lq, lk = max(point.seqs_q), max(point.seqs_kv)
    k, v = inputs.k.detach(), inputs.v.detach()
    if point.paged:
        k, v = (gathered(t, inputs.page_table, point.seqs_kv) for t in (k, v))
    back = _backward(point)
    q, k, v = (padded(t, lens, n).contiguous().requires_grad_(back)
               for t, lens, n in ((inputs.q.detach(), point.seqs_q, lq),
                                  (k, point.seqs_kv, lk), (v, point.seqs_kv, lk)))
    mask = padding_mask(point, q.device, lq, lk)
    dout = None if inputs.dout is None else padded(inputs.dout, point.seqs_q, lq).contiguous()
    useful = sum(a * b for a, b in zip(point.seqs_q, point.seqs_kv))
    return Prepared(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           enable_gqa=point.gqa > 1),
                    packed=lambda out: unpadded(out, point.seqs_q), leaves=(q, k, v),
                    grads=lambda: (unpadded(q.grad, point.seqs_q),
                                   unpadded(k.grad, point.seqs_kv),
                                   unpadded(v.grad, point.seqs_kv)), dout=dout,
                    details={"padded_to": [lq, lk],
                             "padding_share": 1 - useful / (point.batch * lq * lk)})


def _torch_varlen_workload(inputs, point):
    """PyTorch's own varlen entry point, ``torch.nn.attention.varlen.varlen_attn`` (its
    FlashAttention-2 kernels), with the arguments this torch's signature takes."""
    import inspect

    import torch

    from .workload_cases import Prepared, leaves_of

    _cuda_only(point, inputs.q.device)
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as exc:
        raise Unavailable(f"torch {torch.__version__} has no torch.nn.attention.varlen."
                          f"varlen_attn ({type(exc).__name__}: {exc})") from None
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    if point.causal:  # is_causal until the window_size form replaced it
        if "is_causal" in params:
            kw["is_causal"] = True
        elif "window_size" in params:
            kw["window_size"] = (-1, 0)
        else:
            raise Unsupported(f"torch {torch.__version__}'s varlen_attn takes neither "
                              "is_causal nor window_size")
    if point.gqa > 1 and "enable_gqa" in params:
        kw["enable_gqa"] = True
    q, k, v = leaves_of(inputs, _backward(point))
    max_q, max_k = max(point.seqs_q), max(point.seqs_kv)
    details = {"torch": torch.__version__, "kwargs": sorted(kw)}
    if point.paged:
        if "block_table" not in params:  # the installed torch lacks it (2.12's docs list it)
            raise Unavailable(f"torch {torch.__version__}'s varlen_attn takes no block_table "
                              f"(a paged KV cache); its parameters: {', '.join(params)}")
        cu_k = torch.zeros(point.batch + 1, dtype=torch.int32, device=q.device)
        cu_k[1:] = inputs.cache_seqlens.cumsum(0)
        return Prepared(lambda: varlen_attn(q, k, v, inputs.cu_q, cu_k, max_q, max_k,
                                            seqused_k=inputs.cache_seqlens,
                                            block_table=inputs.page_table, **kw),
                        details=details)
    return Prepared(lambda: varlen_attn(q, k, v, inputs.cu_q, inputs.cu_k, max_q, max_k, **kw),
                    leaves=(q, k, v), grads=lambda: (q.grad, k.grad, v.grad), dout=inputs.dout,
                    details=details)


def _flashinfer_workload(inputs, point):
    """FlashInfer's batch wrappers, planned once per point (not timed; a serving engine
    plans once per step and reuses it across layers): paged decode, paged prefill (causal
    bottom-right, as its append attention), ragged prefill for varlen. Inference only."""
    _cuda_only(point, inputs.q.device)
    if importlib.util.find_spec("flashinfer") is None:
        raise Unavailable("the flashinfer wheel (flashinfer-python, with flashinfer-cubin's "
                          "prebuilt kernels) is not installed here: its wheels are built per "
                          "CUDA and torch version and were not carried to this machine")
    if _backward(point):
        raise Unsupported("FlashInfer's kernels are inference only (no backward)")
    import flashinfer
    import torch

    from .workload_cases import Prepared

    device, dtype = inputs.q.device, inputs.q.dtype
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)
    heads = (point.heads, point.heads_kv, point.head_dim)
    details = {"version": getattr(flashinfer, "__version__", None)}
    if not point.paged:
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
        w.plan(inputs.cu_q, inputs.cu_k, *heads, causal=point.causal, q_data_type=dtype)
        return Prepared(lambda: w.run(inputs.q, inputs.k, inputs.v),
                        details={**details, "wrapper": "BatchPrefillWithRaggedKVCacheWrapper"})
    page = point.page_size
    counts = [-(-n // page) for n in point.seqs_kv]
    indptr = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int32,
                          device=device)
    indices = torch.cat([inputs.page_table[b, :c] for b, c in enumerate(counts)])
    last = torch.tensor([(n - 1) % page + 1 for n in point.seqs_kv], dtype=torch.int32,
                        device=device)
    cache = (inputs.k, inputs.v)  # NHD: [num_pages, page_size, Hkv, D], as ours
    if point.kind == "decode":
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        w.plan(indptr, indices, last, *heads[:2], point.head_dim, page, q_data_type=dtype,
               kv_data_type=dtype)
        return Prepared(lambda: w.run(inputs.q, cache),
                        details={**details, "wrapper": "BatchDecodeWithPagedKVCacheWrapper"})
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    w.plan(inputs.cu_q, indptr, indices, last, *heads, page, causal=point.causal,
           q_data_type=dtype, kv_data_type=dtype)
    return Prepared(lambda: w.run(inputs.q, cache),
                    details={**details, "wrapper": "BatchPrefillWithPagedKVCacheWrapper"})


def _workload_only_check(point, device):
    raise Unsupported("runs the workloads stage's points only (tiledattn workloads)")


def _workload_only_run(q, k, v, point):
    raise Unsupported("runs the workloads stage's points only (tiledattn workloads)")


def workload_methods() -> list[str]:
    """The methods the workloads stage can compare (registry order): those with a
    ``workload`` call."""
    return [m.name for m in METHODS.values() if m.workload is not None]


# The study's subject, and the baseline its headline ratio is taken against (PyTorch's
# automatic dispatch: "fused SDPA" in the paper).
SUBJECT = "tiledattention"
FUSED = "torch_sdpa"

# Registry order is the order of the headline's rows and of the figures' legends.
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("tiledattention", "this project's cuTile kernel", True, _tiled_run, _tiled_check,
           _tiled_describe, _tiled_geometry, color="C0", kernel_filter="regex:attention_fwd",
           variants=True, workload=_ours_workload, head_limits=_tiled_heads, fp8=True),
    Method("torch_sdpa", "torch SDPA, automatic backend dispatch", False, _torch_run(None),
           describe=_auto_describe, color="C1", kernel_filter="regex:sdpa|flash|fmha|attention",
           headline="torch_sdpa (fused SDPA), all points", headline_by_head_dim=True),
    Method("flash", "torch SDPA forced to FLASH_ATTENTION", True, _torch_run("flash"),
           _cuda_only, color="C2", kernel_filter="regex:flash",
           headline="flash (forced FlashAttention-2)",
           head_limits=_one_head_dim("torch's FLASH_ATTENTION backend")),
    Method("cudnn", "torch SDPA forced to CUDNN_ATTENTION", True, _torch_run("cudnn"),
           _cuda_only, color="C3", kernel_filter="regex:sdpa", headline="cudnn (forced)"),
    Method("efficient", "torch SDPA forced to EFFICIENT_ATTENTION", True,
           _torch_run("efficient"), _cuda_only, color="C4", kernel_filter="regex:fmha"),
    Method("flash_attn", "the flash_attn package (FlashAttention-2)", True, _flash_attn_run,
           _flash_attn_check, color="C5", head_limits=_one_head_dim("FlashAttention-2")),
    # FlashAttention-4: the grid, decode and the variants it expresses natively.
    Method("fa4", "FlashAttention-4 (flash-attn-4, flash_attn.cute.flash_attn_func)", True,
           _fa4_run, _fa4_check, _fa4_describe, color="indigo",
           headline="fa4 (FlashAttention-4)", display="FA4", variants=True,
           workload=_fa4_workload, head_limits=_fa4_heads),
    Method("sdpa_fa4", "torch SDPA forced to FLASH_ATTENTION with FA4 as the flash impl",
           True, _sdpa_fa4_run, _sdpa_fa4_check, color="sienna", display="SDPA (FA4)",
           scope=fa4_sdpa_impl, head_limits=_one_head_dim("torch's flash backend (FA4 impl)")),
    # cuDNN's own frontend: its graphs as NVIDIA's samples build them (GQA, D_qk != D_v,
    # large head dims, FP8 forward), not torch's cudnn backend's subset.
    Method("cudnn_fe", "cuDNN's SDPA through its Python frontend (nvidia-cudnn-frontend), "
           "one graph per shape built and cached before timing", True, _cudnn_fe_run,
           _cudnn_fe_check, _cudnn_fe_describe, color="darkgreen",
           kernel_filter="regex:sdpa|fmha|cudnn", headline="cudnn_fe (cuDNN frontend)",
           display="cuDNN (frontend)", fp8=True),
    Method("math", "torch SDPA forced to MATH", False, _torch_run("math"), color="C6",
           headline="math SDPA", fused=False),
    # The variants stage's baselines (their points only).
    Method("flex", "torch.compile'd FlexAttention with the variant's score_mod and block "
           "mask", True, _flex_runner(None), _flex_check, color="C8", display="FlexAttention",
           variants=True, workload=_flex_workload(None)),
    Method("flex_flash", "torch.compile'd FlexAttention on its FLASH backend (FA4's "
           "kernels) with the variant's score_mod and block mask", True,
           _flex_runner({"BACKEND": "FLASH"}), _flex_flash_check, color="teal",
           display="FlexAttention (FLASH)", variants=True,
           workload=_flex_workload({"BACKEND": "FLASH"})),
    Method("sdpa_mask", "torch SDPA with the variant as an explicit materialised mask",
           False, _sdpa_mask_run, _sdpa_mask_check, _sdpa_mask_describe, color="C9",
           display="SDPA + mask", variants=True),
    # The workloads stage's own baselines (its points only). Not ``fused``: they never meet
    # the dense grid, and the workloads tables take the fastest of every baseline at a
    # point themselves (presentation/workloads_report.py).
    Method("sdpa_padded", "torch SDPA on the padded [B, H, max_len, D] batch with a "
           "key-padding mask (what a caller without varlen does; the padding copy not timed)",
           False, _workload_only_run, _workload_only_check, color="olive",
           display="SDPA (padded)", fused=False, workload=_padded_workload),
    Method("tiledattention_blockmask", "this project's ta.sdpa over the packed stream with a "
           "block mask of ta.variants.document (block-mask packing)", True, _workload_only_run,
           _workload_only_check, color="lightskyblue", display="tiledattention (block mask)",
           fused=False, workload=_blockmask_workload),
    Method("torch_varlen", "PyTorch's torch.nn.attention.varlen.varlen_attn", True,
           _workload_only_run, _workload_only_check, color="darkorange",
           display="torch varlen_attn", fused=False, workload=_torch_varlen_workload),
    Method("flashinfer", "FlashInfer's paged and ragged attention (flashinfer-python)", True,
           _workload_only_run, _workload_only_check, color="crimson", display="FlashInfer",
           fused=False, workload=_flashinfer_workload),
    # Last: the variants stage's baselines list it last too.
    Method("eager", "explicit matmul + fp32 softmax + matmul", False, eager_attention,
           _eager_check, color="C7", headline="eager attention", variants=True, fused=False),
)}


def head_shape_methods(d: int, dv: int, pass_: str) -> list[str]:
    """The registry's methods for the dense grid (not the variants' or the workloads' own)
    whose ``head_limits`` allow (D, D_v) in ``pass_``: what a config may name to run it."""
    own = (_workload_only_check, _flex_check, _flex_flash_check, _sdpa_mask_check)
    return [m.name for m in METHODS.values()
            if m.check not in own and not m.head_limits(d, dv, pass_)]


def fp8_methods() -> list[str]:
    """The registry's methods that run the FP8 forward points (``Method.fp8``)."""
    return [m.name for m in METHODS.values() if m.fp8]


def fp8_unsupported(method: Method, point: Point) -> str | None:
    """Why ``method`` does not run ``point`` for its dtype (an FP8 point, a method without
    ``fp8``), or None: the one place the runner asks."""
    if point.dtype == FP8 and not method.fp8:
        return FP8_UNSUPPORTED.format(name=method.name)
    return None


def methods_help(names) -> str:
    """``names`` as help prose (a config key's, its schema's, its option's): each with the
    registry's description, so a method is named and described once, in its entry."""
    return "; ".join(f"{n}, {METHODS[n].description}" for n in names)


def variant_methods() -> list[str]:
    """The methods the variants stage can compare (registry order): ours and those that
    run its points (bench/variant_cases.py)."""
    return [m.name for m in METHODS.values() if m.variants]


def profilable() -> list[str]:
    """The methods whose kernels ``tiledattn profile`` can capture (a kernel filter)."""
    return [m.name for m in METHODS.values() if m.kernel_filter]


def color_of(name: str) -> str | None:
    """A method's colour (a pinned tiledattention schedule has none: the ladder's own)."""
    m = METHODS.get(name)
    return m.color if m else None


def get_method(name: str) -> Method:
    """A registered method, or ``tiledattention@<label>``: the kernel with the schedule
    ``Schedule.from_label(label)`` instead of the table's (schedule ladders, Table 6)."""
    if name in METHODS:
        return METHODS[name]
    bwd_label = pinned_bwd_label(name)
    if bwd_label is not None:
        from ..schedules.backward import BwdSchedule

        bwd = BwdSchedule.from_label(bwd_label)
        return Method(name, f"this project's cuTile kernel, backward schedule {bwd.label()}",
                      True, lambda q, k, v, point: _tiled_bwd_run(q, k, v, point, bwd),
                      _tiled_check, lambda q, k, v, point: {
                          **_tiled_describe(q, k, v, point), "bwd_schedule": bwd.label(),
                          "bwd_schedule_source": "pinned"}, _tiled_geometry,
                      head_limits=_tiled_heads)
    label = pinned_label(name)
    if label is not None:
        from ..schedules.schedule import Schedule

        schedule = Schedule.from_label(label)
        return Method(name, f"this project's cuTile kernel with schedule {schedule.label()}",
                      True, lambda q, k, v, point, descale=None: _tiled_run(
                          q, k, v, point, schedule, descale),
                      _tiled_check, lambda q, k, v, point: {"schedule": schedule.label(),
                                                            "schedule_source": "pinned"},
                      lambda q, k, v, point: _tiled_geometry(q, k, v, point, schedule),
                      head_limits=_tiled_heads, fp8=True)
    raise KeyError(f"{name!r} is not one of {sorted(METHODS)} nor {PINNED_PREFIX}<schedule "
                   "label>, e.g. tiledattention@64x128_o2_c1_lk2_lv4, nor "
                   f"{PINNED_PREFIX}bwd:<backward schedule label>, e.g. "
                   "tiledattention@bwd:kv64x64_q64x64_o1")
