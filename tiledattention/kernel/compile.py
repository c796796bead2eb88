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
from typing import NamedTuple

from .. import mods as _mods
from ..errors import CompileError
from .plan import combine_constants, fwd_hints
from .spec import CLASSIFY, COMBINE, DELTA, FWD_FP8, SEQMAP, TRANSPOSE, KernelSpec, score_specs
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
    sig = signature(COMBINE, _combine_arrays(dtype), combine_constants(head_dim, 4, return_lse))
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


# An H100's and an H200's SMs. The ahead-of-time plans' split count follows it; split
# counts are launch arguments, so it decides only whether a paged decode splits at all.
AOT_SMS = 132


def aot_target(gpu_code: str):
    """The plan target of a ``gpu_code`` ("sm_90" -> capability "9.0", ``AOT_SMS``)."""
    from .workload import Target

    digits = gpu_code.removeprefix("sm_")
    return Target(f"{digits[:-1]}.{digits[-1]}", AOT_SMS)


def _combine_arrays(io_name: str) -> dict:
    """The combine's tensors: fp32 partials, and the output the split-K plan views."""
    import cuda.tile as ct

    return dict(Part=export_array(ct.float32, 4, stride_divisible_by=1),
                PartLse=export_array(ct.float32, 3, stride_divisible_by=1),
                Out=export_array(getattr(ct, io_name), 4, stride_divisible_by=1),
                Lse=export_array(ct.float32, 3, stride_divisible_by=1))


class Launch(NamedTuple):
    """One kernel a plan launches, as the compile needs it: the kernel object (hints,
    variant functions), its tensors' constraints and its constants by name."""

    spec: KernelSpec
    kernel: object
    arrays: dict
    constants: dict
    what: str

    def export(self, gpu_code: str) -> bytes:
        return _export(self.spec, self.kernel, signature(self.spec, self.arrays,
                                                         self.constants), gpu_code, self.what)


def _step_launch(spec: KernelSpec, step, arrays: dict, what: str) -> Launch:
    """A plan's step: its arguments after the tensors read back by name."""
    values = dict(zip(spec.names()[len(spec.tensors):], step.tail))
    return Launch(spec, step.kernel, arrays,
                  {k: v for k, v in values.items() if k in spec.constants()}, what)


def _map_launch(arrays: dict, values: dict, what: str) -> Launch:
    return Launch(SEQMAP, SEQMAP.kernel(), arrays,
                  {k: v for k, v in values.items() if k in SEQMAP.constants()}, what)


def workload_launches(work, gpu_code: str, *, paged: bool = False,
                      backward: tuple[str, ...] | None = None, schedule=None,
                      return_lse: bool = True) -> dict[str, Launch]:
    """Every kernel a packed (or, ``paged``, a paged decode; with ``work.packed_q`` a paged
    chunked prefill) call of ``work`` (``workload_check.Workload``) launches on a
    ``gpu_code`` GPU: its plans' launches (``workload.varlen_plan`` / ``paged_plan`` and,
    packed, ``varlen_bwd_plan``), built for that target, so with the schedule table's pick
    unless ``schedule`` pins one, and the tile maps they launch. ``backward``: the
    backward's roles (None: the plan's; "delta" named compiles it either way; (): no
    backward, an inference call's);
    ``return_lse``: the forward's (a training call's, or an inference call's). Keys: the
    kernels' names; the tile maps "sequence_map" (forward), "sequence_map_dq" and
    "sequence_map_zero_tail" (dK/dV's, which zeroes dK's and dV's rows past the last
    sequence)."""
    import cuda.tile as ct

    from . import workload as W
    from .spec import DKDV_SEQS, DQ_SEQS, FWD_SEQS

    io_name = str(work.dtype).removeprefix("torch.")
    arrays = _arrays(io_name, None)
    planner = W.paged_plan if paged else W.varlen_plan
    target = aot_target(gpu_code)
    plan = planner(work, None, schedule, _mods.NONE, return_lse, target=target)
    out = {}
    for step in plan.launches:
        spec, tensors = (COMBINE, _combine_arrays(io_name)) if step.role == "combine" else (
            FWD_SEQS, arrays)
        out[spec.name] = _step_launch(spec, step, tensors, "a packed call")
    if work.packed_q:  # the query rows' map (``run_varlen``, ``run_paged``)
        out["sequence_map"] = _map_launch(arrays, W.seqmap_values(
            plan.schedule.tile_m, plan.bpad, False, 0, 1, plan.heavy_map, not paged),
            "a packed call")
    if paged or backward == ():
        return out
    bplan = W.varlen_bwd_plan(work, None, _mods.NONE, False, roles=backward, target=target)
    specs = {"delta": DELTA, "dq": DQ_SEQS, "dkdv": DKDV_SEQS}
    for step in bplan.launches:
        out[specs[step.role].name] = _step_launch(specs[step.role], step, arrays,
                                                  "a packed call's backward")
    # ``run_varlen_backward``'s maps: dQ's, then dK/dV's, each zeroing its gradients' rows
    # past the last sequence (``PACKED_ZERO_TAIL``)
    io_dtype = getattr(ct, io_name)
    zeroed = dict(arrays, Zero0=export_array(io_dtype, 2), Zero1=export_array(io_dtype, 2))
    zeros = (1, 2) if W.PACKED_ZERO_TAIL else (0, 0)
    for name, tile, heavy_first, n in (("sequence_map_dq", bplan.schedule.dq_m, False,
                                        zeros[0]),
                                       ("sequence_map_zero_tail", bplan.schedule.dkdv_n,
                                        work.causal, zeros[1])):
        out[name] = _map_launch(zeroed if n else arrays, W.seqmap_values(
            tile, bplan.bpad, heavy_first, n, 1, bplan.heavy_map), "a packed call's backward")
    return out


def export_workload_cubins(work, gpu_code: str, **how) -> dict[str, bytes]:
    """``workload_launches(work, gpu_code, **how)`` compiled, by the same keys."""
    return {name: launch.export(gpu_code)
            for name, launch in workload_launches(work, gpu_code, **how).items()}
