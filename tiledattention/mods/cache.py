"""A call's variant (``Mods``): its lifted functions, derivative and captured tensors,
cached by what the lifting reads, by value (``_fn_key``), and bounded.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .lifting import Lifted, lift
from .source import EMPTY, VariantError, global_names


@dataclass(frozen=True)
class ScoreMod:
    """A ``score_mod`` with its derivative ``grad(score, b, h, q_idx, kv_idx)`` (d/d score)."""

    fn: Callable
    grad: Callable | None = None




@dataclass(frozen=True, eq=False)
class Mods:
    """The variant of one call: lifted functions, their derivative and captured tensors."""

    score_mod: Lifted | None
    score_grad: Lifted | None
    mask_mod: Lifted | None
    key: tuple  # compile identity of the three together
    grad_error: str | None = None  # why a score_mod has no derivative (None: it has one)
    # the backward's captured-tensor gradients (``with_captured_grads``; None: none)
    captured_grad: Lifted | None = None

    @property
    def has_score_mod(self) -> bool:
        return self.score_mod is not None

    @property
    def has_mask_mod(self) -> bool:
        return self.mask_mod is not None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The captured tensors in A0.. order: the score_mod's (its derivative's are the
        same), then the mask_mod's."""
        return tuple(t for part in (self.score_mod, self.mask_mod) if part is not None
                     for t in part.tensors())


NONE = Mods(None, None, None, ())


def _fn_key(fn: Callable, _seen: tuple = ()) -> tuple:
    """What the lifting of ``fn`` reads, by value: its code, its closure cells and the
    module globals it reads (helper functions by their own key, tensors by their rank:
    their values are read at every launch), and its defaults. A changed global is a new
    variant. On every call with a variant: kept to list comprehensions over what the
    code names."""
    if fn in _seen:
        return ("recursive", fn.__code__)
    seen = (*_seen, fn)
    code, closure, defaults = fn.__code__, fn.__closure__, fn.__defaults__
    cells = ()
    if closure:
        try:
            cells = tuple([_value_key(c.cell_contents, seen) for c in closure])
        except ValueError:  # an empty cell: the lifting refuses it, naming the variable
            cells = tuple(_cell_key(c, seen) for c in closure)
    names = global_names(code)
    if names:
        get = fn.__globals__.get
        names = tuple([_value_key(get(n, EMPTY), seen) for n in names])
    if defaults:
        defaults = tuple([_value_key(d, seen) for d in defaults])
    return (code, cells, names, defaults)


def _cell_key(cell, seen: tuple) -> object:
    try:
        return _value_key(cell.cell_contents, seen)
    except ValueError:
        return "empty"


_PLAIN = frozenset({bool, int, float, str, type(None)})


def _value_key(value, seen: tuple) -> object:
    kind = type(value)
    if kind in _PLAIN:
        return (kind, value)
    if kind is types.ModuleType:
        return value  # modules are hashable and compared by identity
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dim())
    if kind is types.FunctionType:
        return ("function",) + _fn_key(value, seen)
    return _constant_key(value)


def mods_for(score_mod, mask_mod) -> Mods:
    """The lifted variant of a call (cached per function code and captured constants)."""
    if score_mod is None and mask_mod is None:
        return NONE
    grad = None
    if isinstance(score_mod, ScoreMod):
        score_mod, grad = score_mod.fn, score_mod.grad
    for role, f in (("score_mod", score_mod), ("mask_mod", mask_mod), ("grad", grad)):
        if f is not None and not isinstance(f, types.FunctionType):
            raise VariantError(f"{role} must be a Python function (def or lambda), got "
                               f"{type(f).__name__}; bind extra arguments in a closure "
                               "(def mod(b, h, q_idx, kv_idx): return f(..., x=x))")
    key = tuple(None if f is None else _fn_key(f) for f in (score_mod, grad, mask_mod))
    return _mods_cached(key, score_mod, grad, mask_mod)


def _storage(t: torch.Tensor) -> tuple:
    # a 0-d capture is read through a fresh 1-element view: compare what it views
    return (t.data_ptr(), tuple(t.shape), t.dtype)


@functools.lru_cache(maxsize=256)  # keyed by value (_fn_key) and bounded
def _mods_cached(key, score_mod, grad, mask_mod) -> Mods:
    s = None if score_mod is None else lift(score_mod, 5, "score_mod")
    g, error = None, None
    if score_mod is not None and grad is not None:
        g = lift(grad, 5, "score_grad")
        if [_storage(t) for t in g.tensors()] != [_storage(t) for t in s.tensors()]:
            raise VariantError("a score_mod's grad must capture the same tensors as the "
                               "score_mod, in the same order (they share the kernel's arrays)")
    elif score_mod is not None:
        try:
            g = lift(score_mod, 5, "score_grad", derivative=True)
        except VariantError as exc:
            error = str(exc)
    m = None if mask_mod is None else lift(mask_mod, 4, "mask_mod",
                                           offset=0 if s is None else len(s.cells))
    return Mods(s, g, m, tuple(None if x is None else x.key for x in (s, g, m)), error)


def _constant_key(value, _seen: tuple = ()) -> object:
    if isinstance(value, (bool, int, float, str, type(None))):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        if any(value is s for s in _seen):
            return ("cyclic", id(value))
        return (type(value), tuple(_constant_key(v, (*_seen, value)) for v in value))
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, torch.dtype):
        return ("dtype", str(value))
    return ("object", id(value))  # other objects: by identity (the lifter refuses most)
