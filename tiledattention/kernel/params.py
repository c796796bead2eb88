"""The kernel's parameter list, read from its signature, so arguments are built by name.

``Variant.constants`` names the ``ct.Constant`` values, the export signature and the launch
place them by the kernel's own declaration order: adding, removing or reordering a
parameter of ``attention_fwd`` changes one place, the kernel.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from .toolchain import kernel_module

# Per-call arguments: the launch fills these; every other parameter is fixed per plan.
TENSORS = ("Q", "K", "V", "Out", "Lse", "Mask")


@dataclass(frozen=True)
class KernelParams:
    names: tuple[str, ...]  # every parameter, in declaration order
    constants: frozenset[str]  # those annotated ct.Constant[...]


def _is_constant(annotation) -> bool:
    import cuda.tile as ct

    return typing.get_origin(annotation) is typing.Annotated and any(
        isinstance(m, ct.ConstantAnnotation) for m in annotation.__metadata__)


@functools.cache
def kernel_params() -> KernelParams:
    fn = kernel_module().attention_fwd._pyfunc
    params = inspect.signature(fn, eval_str=True).parameters
    names = tuple(params)
    if names[:len(TENSORS)] != TENSORS:
        # The launch passes the per-call tensors first; say so if the kernel moved them.
        raise TypeError(f"attention_fwd must begin with the parameters {TENSORS}, got "
                        f"{names[:len(TENSORS)]}")
    return KernelParams(names, frozenset(n for n, p in params.items()
                                         if _is_constant(p.annotation)))


def ordered(values: Mapping[str, object], *, skip: tuple[str, ...] = ()) -> tuple:
    """``values`` as the kernel's positional arguments (leaving out ``skip``).

    A missing or unknown name is a programming error and raises TypeError naming it.
    """
    names, name_set = _names(skip)
    if len(values) != len(names) or not name_set.issuperset(values):
        missing = [n for n in names if n not in values]
        unknown = sorted(set(values) - name_set)
        raise TypeError(f"kernel arguments: missing {missing}, unknown {unknown}")
    return tuple(values[n] for n in names)


@functools.cache
def _names(skip: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    # Cached: a decode loop whose Skv grows builds a plan per call (NOTES §16).
    names = tuple(n for n in kernel_params().names if n not in skip)
    return names, frozenset(names)
