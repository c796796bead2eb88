"""A kernel bound to a variant: a copy of its Python function whose SCORE_MOD /
SCORE_GRAD / MASK_MOD / SCORE_CAPGRAD globals are the variant's lifted functions
(``tiledattention.mods``), the no-variant stubs of ``body`` where it has none.
"""

from __future__ import annotations

import types
from collections.abc import Callable

from ..mods import Mods


def with_mods(pyfunc: Callable, mods: Mods) -> Callable:
    """A copy of a kernel's Python function whose SCORE_MOD / SCORE_GRAD / MASK_MOD globals
    are this variant's (cuTile compiles a function against its globals)."""
    from .body import no_captured_grad, no_mask_mod, no_score_mod

    env = dict(pyfunc.__globals__)
    env["SCORE_MOD"] = mods.score_mod.fn if mods.score_mod else no_score_mod
    env["SCORE_GRAD"] = mods.score_grad.fn if mods.score_grad else no_score_mod
    env["MASK_MOD"] = mods.mask_mod.fn if mods.mask_mod else no_mask_mod
    env["SCORE_CAPGRAD"] = mods.captured_grad.fn if mods.captured_grad else no_captured_grad
    clone = types.FunctionType(pyfunc.__code__, env, pyfunc.__name__, pyfunc.__defaults__,
                               pyfunc.__closure__)
    clone.__kwdefaults__ = pyfunc.__kwdefaults__
    clone.__annotations__ = dict(pyfunc.__annotations__)
    clone.__qualname__ = pyfunc.__qualname__
    clone.__module__ = pyfunc.__module__
    clone.__doc__ = pyfunc.__doc__
    return clone
