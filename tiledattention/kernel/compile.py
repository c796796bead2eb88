"""Ahead-of-time compiles: every kernel of a variant to a cubin for any target, no GPU needed.

cuTile compiles on first launch and caches per specialisation in memory; it also keeps
cubins on disk under ``$CUDA_TILE_CACHE_DIR`` (default ``~/.cache/cutile-python``, one per
user), so a new process reuses them. ``export_kernel`` runs the same compiler for any
target without a GPU, which is how CI proves every variant compiles for Hopper and
Blackwell. Signatures are built by parameter name through the kernels' specs, as launches
are.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

from .. import mods as _mods
from ..errors import CompileError
from .plan import combine_constants, fwd_hints
from .spec import CLASSIFY, COMBINE, DELTA, FWD_FP8, TRANSPOSE, KernelSpec, score_specs
from .variant import BwdVariant, Variant


@dataclass(frozen=True)
class CompiledCubin:
    variant: Variant
    gpu_code: str
    cubin: bytes
    seconds: float


def export_array(dtype, ndim: int, *, stride_divisible_by: int = 8):
    """The export constraint of a contiguous-last-axis, 16-byte aligned tensor argument
    (what a launch passes); ``stride_divisible_by`` applies to the outer axes."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    return ArrayConstraint(
        dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
        may_alias_internally=False, stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[stride_divisible_by] * (ndim - 1) + [1],
        base_addr_divisible_by=16,
    )


def _gathered(dtype, ndim: int):
    """An array only read by ``ct.gather`` (block lists, captured tensors): any strides."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False)


def _arrays(io_name: str, mask_name: str | None, aux: tuple = ()) -> dict:
    """Export constraints of every tensor parameter name the kernels use."""
    import cuda.tile as ct

    io_dtype, f32 = getattr(ct, io_name), ct.float32
    arrays = {n: export_array(io_dtype, 4) for n in
              ("Q", "K", "V", "Out", "dOut", "dQ", "dK", "dV")}
    arrays.update(dQacc=export_array(f32, 4), Lse=export_array(f32, 3),
                  Delta=export_array(f32, 3), Dlse=export_array(f32, 3),
                  Mask=export_array(getattr(ct, mask_name or "float32"), 4),
                  BlkCnt=_gathered(ct.int32, 4), BlkIdx=_gathered(ct.int32, 4),
                  # packed / paged sequences: offsets, block table, tile map (gathered)
                  CuQ=_gathered(ct.int32, 1), CuK=_gathered(ct.int32, 1),
                  SeqK=_gathered(ct.int32, 1), Cu=_gathered(ct.int32, 1),
                  Wt=_gathered(ct.int32, 1),
                  Pages=_gathered(ct.int32, 2), TileMap=_gathered(ct.int32, 2),
                  # the rows a backward's tile map zeroes (a placeholder in the forward's)
                  Zero0=_gathered(ct.int32, 2), Zero1=_gathered(ct.int32, 2))
    for i in range(_mods.MAX_TENSORS):
        dtype, ndim, *grad = aux[i] if i < len(aux) else (ct.int32, 4)
        arrays[f"A{i}"] = _gathered(dtype, ndim)
        # (dtype, ndim, True): the tensor's gradient is computed, into an fp32 array of its
        # rank; otherwise the launch passes a placeholder
        arrays[f"G{i}"] = _gathered(f32, ndim) if grad and grad[0] else _gathered(ct.int32, 4)
    return arrays


def _scalars() -> dict:
    import cuda.tile as ct
    from cuda.tile.compilation import ScalarConstraint

    f32, i32 = ScalarConstraint(ct.float32), ScalarConstraint(ct.int32)
    return dict(qk_scale_log2=f32, inv_scale=f32, scale=f32, GROUP=i32, SEQ_Q=i32,
                NUM_SPLITS=i32, SPLIT_TILES=i32, seq_q=i32, seq_k=i32, HEADS=i32,
                WIN_L=i32, WIN_R=i32, HEAD_BLOCK=i32, STEPS=i32, QD_HEADS=i32, KD_HEADS=i32,
                VD_HEADS=i32)


def signature(spec: KernelSpec, arrays: dict, constants: dict):
    """The export signature of ``spec`` with these tensor constraints and constants."""
    from cuda.tile.compilation import CallingConvention, KernelSignature

    pool = {**arrays, **_scalars(), **constants}
    return KernelSignature([pool[n] for n in spec.names()], CallingConvention.cutile_python_v1())


def _export(spec: KernelSpec, kernel, sig, gpu_code: str, what: str) -> bytes:
    from cuda.tile.compilation import export_kernel

    buf = io.BytesIO()
    try:
        export_kernel(kernel, [sig], buf, gpu_code=gpu_code, output_format="cubin")
    except Exception as exc:  # cuTile raises several types; name the variant
        raise CompileError(f"compiling {spec.name} of {what} for {gpu_code} failed: "
                           f"{exc}") from exc
    return buf.getvalue()


def fwd_spec(variant: Variant) -> KernelSpec:
    """The forward entry point a variant runs: FP8, plain or with the variant's arrays."""
    return FWD_FP8 if variant.fp8 else score_specs(variant.flags is None)[0]


def _fp8_arrays(variant: Variant) -> dict:
    """The FP8 forward's tensors: e4m3 Q, K, Vt with 16-element strides (16 bytes, what
    TMA needs and the host guarantees; with 8, a 1-byte array loses TMA and D 256 spilled:
    benchmarks/notes/head-shapes.md §40h), the output's dtype, the descales (gathered)."""
    import cuda.tile as ct

    arrays = _arrays(variant.out_dtype, None)
    arrays.update({n: export_array(ct.float8_e4m3fn, 4, stride_divisible_by=16)
                   for n in ("Q", "K", "Vt")})
    arrays.update({n: _gathered(ct.float32, 2) for n in ("QDescale", "KDescale", "VDescale")})
    return arrays


def signature_for(variant: Variant, aux: tuple = ()):
    """The forward's export signature for contiguous, 16-byte aligned tensors."""
    import cuda.tile as ct

    if variant.fp8:
        return signature(FWD_FP8, _fp8_arrays(variant), variant.constants())
    arrays = _arrays(variant.dtype, variant.mask_dtype, aux)
    if variant.split_k:
        arrays["Out"] = export_array(ct.float32, 4)
    return signature(score_specs(variant.flags is None)[0], arrays, variant.constants())


def kernel_for(schedule, mods=None, plain: bool = True, spec: KernelSpec | None = None):
    """The forward kernel object carrying this schedule's hints (and a variant's mods)."""
    return (spec or score_specs(plain)[0]).kernel(mods, **fwd_hints(schedule))


def export_cubin(variant: Variant, gpu_code: str, mods=None, aux: tuple = ()) -> CompiledCubin:
    """Compile one forward variant to a cubin for ``gpu_code`` (e.g. ``"sm_90"``).
    ``mods``/``aux``: a variant's functions and its captured tensors' (dtype, ndim)."""
    start = time.perf_counter()
    spec = fwd_spec(variant)
    cubin = _export(spec, kernel_for(variant.schedule, mods, spec=spec),
                    signature_for(variant, aux), gpu_code, variant.label())
    return CompiledCubin(variant, gpu_code, cubin, time.perf_counter() - start)


def export_bwd_cubins(variant: BwdVariant, gpu_code: str, mods=None,
                      aux: tuple = ()) -> dict[str, bytes]:
    """Compile the three backward kernels of ``variant`` for ``gpu_code``."""
    arrays = _arrays(variant.dtype, variant.mask_dtype, aux)
    out = {}
    _, dkdv, dq = score_specs(variant.flags is None)
    for spec in (DELTA, dkdv, dq):
        kernel = DELTA.kernel() if spec is DELTA else spec.kernel(
            mods, **variant.schedule.hints())
        out[spec.name] = _export(spec, kernel,
                                 signature(spec, arrays, variant.constants(spec.name)),
                                 gpu_code, variant.label())
    return out


def export_combine_cubin(dtype: str, head_dim: int, return_lse: bool,
                         gpu_code: str) -> bytes:
    """Compile the combine kernel for one dtype and head dim (rows: a decode tile)."""
    import cuda.tile as ct

    arrays = dict(Part=export_array(ct.float32, 4, stride_divisible_by=1),
                  PartLse=export_array(ct.float32, 3, stride_divisible_by=1),
                  Out=export_array(getattr(ct, dtype), 4, stride_divisible_by=1),
                  Lse=export_array(ct.float32, 3, stride_divisible_by=1))
    sig = signature(COMBINE, arrays, combine_constants(head_dim, 4, return_lse))
    return _export(COMBINE, COMBINE.kernel(), sig, gpu_code, f"{dtype} D={head_dim}")


def export_transpose_cubin(head_dim: int, seq_kv: int, gpu_code: str) -> bytes:
    """Compile the FP8 forward's V transpose (``transpose.keys_last``) for one head dim and
    key count, as ``plan.transpose_step`` launches it (1-byte arrays, 16-element strides)."""
    import cuda.tile as ct

    from .plan import transpose_step
    from .validate import Problem

    step = transpose_step(Problem(1, 1, 1, 1, seq_kv, head_dim, False, 1.0), build_kernel=False)
    arrays = {n: export_array(ct.float8_e4m3fn, 4, stride_divisible_by=16) for n in ("V", "Vt")}
    sig = signature(TRANSPOSE, arrays, dict(zip(TRANSPOSE.names()[2:], step.tail)))
    return _export(TRANSPOSE, TRANSPOSE.kernel(), sig, gpu_code, f"e4m3 D={head_dim}")


def export_classify_cubin(mods, gpu_code: str, tile_m: int = 64, tile_n: int = 64,
                          causal: bool = False, aux: tuple = ()) -> bytes:
    """Compile a block mask's classification kernel for a ``mask_mod``."""
    import cuda.tile as ct

    arrays = _arrays("float16", None, aux)
    arrays["Cls"] = _gathered(ct.int32, 4)
    sig = signature(CLASSIFY, arrays, dict(TILE_M=tile_m, TILE_N=tile_n, CAUSAL=causal))
    return _export(CLASSIFY, CLASSIFY.kernel(mods), sig, gpu_code, "a block mask")


def export_workload_cubins(work, gpu_code: str, *, paged: bool = False,
                           backward: tuple[str, ...] | None = None) -> dict[str, bytes]:
    """Every kernel a packed (or, ``paged``, a paged decode; with ``work.packed_q`` a paged
    chunked prefill) call of ``work`` (``workload_check.Workload``) launches, with the
    constants its plans pass: the tile map, the forward and, packed, the backward's
    launches (``backward``: their roles; None, the plan's: dQ and dK/dV, and the delta
    unless dQ computes it, ``workload.PACKED_DQ_DELTA``). The dQ's constants follow the
    switch (no dlse gradient); "delta" named explicitly compiles that kernel either way."""
    import cuda.tile as ct

    from ..schedules.schedule import default_schedule
    from . import workload as W
    from .spec import DKDV_SEQS, DQ_SEQS, FWD_SEQS, SEQMAP

    io_name = str(work.dtype).removeprefix("torch.")
    arrays = _arrays(io_name, None)
    mods = _mods.NONE
    s = default_schedule(work.head_dim, work.causal)
    if paged and not work.packed_q:
        s = W.decode_schedule(s)
    s, tiles, span, gather = W._paged_tiles(s, work.page_size, work.max_q) if paged else (
        s, 1, 1, False)
    if paged and work.packed_q:
        fwd = W._fwd_values(work, s, mods, return_lse=True, varlen_q=True, varlen_k=False,
                            paged=True, page_tiles=tiles, page_span=span,
                            page_gather=gather, group=work.heads_q // work.heads_kv,
                            block=W.paged_head_block(work))
    elif paged:
        fwd = W._fwd_values(work, s, mods, return_lse=True, varlen_q=False, varlen_k=False,
                            paged=True, page_tiles=tiles, page_span=span,
                            page_gather=gather, split=4, split_tiles=8, packed=True, seq_q=1)
    else:
        fwd = W._fwd_values(work, s, mods, return_lse=True, varlen_q=True, varlen_k=True,
                            paged=False, group=work.heads_q // work.heads_kv,
                            block=0)
    out = {}
    # the map's order as the plan's (``workload.heavy_map``): by context, or by keys
    by_keys = W.PAGED_HEAVY_FIRST if paged else W.VARLEN_HEAVY_MAP and not work.causal
    seqmap = W.seqmap_values(s.tile_m, 16, False, 0, 1, W.heavy_map(16, by_keys), not paged)
    for spec, values, hints in ((FWD_SEQS, fwd, fwd_hints(s)), (SEQMAP, seqmap, {})):
        consts = {k: v for k, v in values.items() if k in spec.constants()}
        out[spec.name] = _export(spec, spec.kernel(mods, **hints), signature(
            spec, arrays, consts), gpu_code, "a packed call")
    if not paged:
        b = W.varlen_bwd_schedule(work)
        common = dict(GROUP=work.heads_q // work.heads_kv, **W.head_dim_constants(
            work.head_dim), CAUSAL=work.causal, HAS_SCORE_MOD=False, HAS_MASK_MOD=False,
            SEQUSED=work.seqused, WINDOW=work.window != (-1, -1),
            **W.packed_bwd_rows(work.head_dim), HEAD_BLOCK=0)
        steps = {"dkdv": (DKDV_SEQS, dict(common, TILE_M=b.dkdv_m, TILE_N=b.dkdv_n,
                                          KEY_ROWS=b.key_rows, ONE_HEAD=False,
                                          TAIL_TILE=W.packed_tail_tile(
                                              work.causal, work.head_dim))),
                 "dq": (DQ_SEQS, dict(common, TILE_M=b.dq_m, TILE_N=b.dq_n,
                                      **W.packed_dq_delta(False)))}
        # the dK/dV map, which also zeroes dK's and dV's rows past the last sequence
        io_dtype = getattr(ct, io_name)
        zeroed = dict(arrays, Zero0=export_array(io_dtype, 2), Zero1=export_array(io_dtype, 2))
        heavy = W.heavy_map(16, W.VARLEN_HEAVY_MAP and not work.causal)
        consts = {k: v for k, v in W.seqmap_values(b.dkdv_n, 16, work.causal, 2, 1,
                                                   heavy).items()
                  if k in SEQMAP.constants()}
        out["sequence_map_zero_tail"] = _export(SEQMAP, SEQMAP.kernel(), signature(
            SEQMAP, zeroed, consts), gpu_code, "a packed call's backward")
        if backward is None:
            backward = W.packed_bwd_roles()
        for spec, values in (steps[name] for name in backward if name != "delta"):
            consts = {k: v for k, v in values.items() if k in spec.constants()}
            out[spec.name] = _export(spec, spec.kernel(mods, **b.hints()), signature(
                spec, arrays, consts), gpu_code, "a packed call's backward")
        if "delta" in backward:
            consts = W.packed_delta_values(work.head_dim, False)
            out[DELTA.name] = _export(DELTA, DELTA.kernel(**W.delta_hints()), signature(
                DELTA, arrays, consts), gpu_code, "a packed call's delta")
    return out
