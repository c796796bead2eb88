"""One host path for every kernel: a spec per kernel, arguments placed by parameter name,
one cache of compiled kernel objects (hints x variant functions).

Each ``@ct.kernel`` declares its per-call tensors first, then scalars, then ``ct.Constant``
parameters. A ``KernelSpec`` reads the declaration once; a plan builds a dict of values by
name and ``spec.ordered`` places them, so adding, removing or reordering a parameter changes
one place, the kernel. ``spec.kernel(mods, **hints)`` is the kernel object carrying the
schedule's compiler hints, compiled against the variant's ``score_mod`` / ``mask_mod``
(``binding.with_mods``); cuTile then caches the specialisations per constants in memory and on
disk (``$CUDA_TILE_CACHE_DIR``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import CompileError


@dataclass(frozen=True)
class KernelSpec:
    module: str  # module of tiledattention.kernel holding the kernel
    name: str
    tensors: tuple[str, ...]  # the per-call array parameters, first in the declaration

    def pyfunc(self):
        from .toolchain import kernel_module

        kernel_module()  # cuTile importable, or the install line
        return getattr(importlib.import_module(f"{__package__}.{self.module}"),
                       self.name)._pyfunc

    def names(self) -> tuple[str, ...]:
        return _params(self)[0]

    def constants(self) -> frozenset[str]:
        return _params(self)[1]

    def ordered(self, values: Mapping[str, object], *, skip_tensors: bool = False) -> tuple:
        """``values`` as the kernel's positional arguments (without the tensors when
        ``skip_tensors``). A missing or unknown name raises TypeError naming it."""
        names = self.names()[len(self.tensors):] if skip_tensors else self.names()
        if len(values) != len(names) or not set(names).issuperset(values):
            missing = [n for n in names if n not in values]
            unknown = sorted(set(values) - set(names))
            raise TypeError(f"{self.name} arguments: missing {missing}, unknown {unknown}")
        return tuple(values[n] for n in names)

    def kernel(self, mods=None, **hints):
        """The kernel object for a variant's functions and compiler hints (cached)."""
        from ..mods import NONE

        mods = mods or NONE
        return _kernel(self, mods.key, mods, tuple(sorted(hints.items())))


@functools.cache
def _params(spec: KernelSpec) -> tuple[tuple[str, ...], frozenset[str]]:
    import cuda.tile as ct

    params = inspect.signature(spec.pyfunc(), eval_str=True).parameters
    names = tuple(params)
    if names[:len(spec.tensors)] != spec.tensors:
        raise TypeError(f"{spec.name} must begin with the parameters {spec.tensors}, got "
                        f"{names[:len(spec.tensors)]}")

    def constant(annotation) -> bool:
        return typing.get_origin(annotation) is typing.Annotated and any(
            isinstance(m, ct.ConstantAnnotation) for m in annotation.__metadata__)

    return names, frozenset(n for n, p in params.items() if constant(p.annotation))


_kernels: dict[tuple, object] = {}


def _kernel(spec: KernelSpec, key: tuple, mods, hints: tuple):
    found = _kernels.get((spec, key, hints))
    if found is None:
        import cuda.tile as ct

        from .binding import with_mods

        pyfunc = spec.pyfunc()
        if key:
            pyfunc = with_mods(pyfunc, mods)
        try:
            found = ct.kernel(pyfunc)
            if hints:
                found = found.replace_hints(**dict(hints))
        except Exception as exc:  # cuTile raises several types; name the kernel
            raise CompileError(f"building {spec.name} failed: {exc}") from exc
        _kernels[(spec, key, hints)] = found
    return found


# Each score kernel has a plain entry point (only the arrays a plain call reads: fewer
# arguments for the launch to pack) and a variant one (block lists and captured tensors);
# both run one program (``attention.fwd_program``, ``backward.dkdv_program``, ...).
_ATT = ("Q", "K", "V")
_EXTRA = ("BlkCnt", "BlkIdx", "A0", "A1", "A2", "A3")
GRADS = ("G0", "G1", "G2", "G3")  # fp32 gradients of the captured tensors (dK/dV only)
_BWD = (*_ATT, "dOut", "Lse", "Delta", "Mask")
FWD = KernelSpec("attention", "attention_fwd", (*_ATT, "Out", "Lse", "Mask"))
FWD_VARIANT = KernelSpec("attention", "attention_fwd_variant",
                         (*_ATT, "Out", "Lse", "Mask", *_EXTRA))
COMBINE = KernelSpec("combine", "attention_combine", ("Part", "PartLse", "Out", "Lse"))
DELTA = KernelSpec("backward", "attention_bwd_delta",
                   ("Out", "dOut", "Delta", "Dlse", "dQacc"))
DKDV = KernelSpec("backward", "attention_bwd_dkdv", (*_BWD, "dK", "dV", "dQacc"))
DKDV_VARIANT = KernelSpec("backward", "attention_bwd_dkdv_variant",
                          (*_BWD, *_EXTRA, *GRADS, "dK", "dV", "dQacc"))
# dQ computes delta for the dK/dV kernel (run after it): it also reads O and dlse.
DQ = KernelSpec("backward", "attention_bwd_dq", (*_BWD, "Out", "Dlse", "dQ"))
DQ_VARIANT = KernelSpec("backward", "attention_bwd_dq_variant",
                        (*_BWD, *_EXTRA, "Out", "Dlse", "dQ"))
# The FP8 forward: V transposed (Vt [B, Hkv, D, Skv]) and the q, k, v descales [B, Hkv].
FWD_FP8 = KernelSpec("attention", "attention_fwd_fp8",
                     ("Q", "K", "Vt", "Out", "Lse", "QDescale", "KDescale", "VDescale"))
CLASSIFY = KernelSpec("blockmask", "classify_tiles", ("Cls", *_EXTRA[2:]))
# V^T for the FP8 forward where the caller's V is not a transposed view (``transpose``).
TRANSPOSE = KernelSpec("transpose", "keys_last", ("V", "Vt"))
# Packed (varlen) and paged sequences: the variant entry points' tensors, then the offsets,
# the block table and the tile map (``seqmap``).
_SEQS = ("CuQ", "CuK", "SeqK")
FWD_SEQS = KernelSpec("attention", "attention_fwd_seqs",
                      (*_ATT, "Out", "Lse", "Mask", *_EXTRA, *_SEQS, "Pages", "TileMap"))
DKDV_SEQS = KernelSpec("backward", "attention_bwd_dkdv_seqs",
                       (*_BWD, *_EXTRA, *GRADS, "dK", "dV", "dQacc", *_SEQS, "TileMap"))
DQ_SEQS = KernelSpec("backward", "attention_bwd_dq_seqs",
                     (*_BWD, *_EXTRA, "Out", "Dlse", "dQ", *_SEQS, "TileMap"))
SEQMAP = KernelSpec("seqmap", "sequence_map", ("Cu", "Wt", "TileMap", "Zero0", "Zero1"))


def score_specs(plain: bool) -> tuple[KernelSpec, KernelSpec, KernelSpec]:
    """(forward, dK/dV, dQ) entry points of a plain call or a variant call."""
    return (FWD, DKDV, DQ) if plain else (FWD_VARIANT, DKDV_VARIANT, DQ_VARIANT)
