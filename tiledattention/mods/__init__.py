"""The variant front end: lifting a user's ``score_mod`` / ``mask_mod`` into the kernels
and the derivative of a ``score_mod``. ``kernel`` reads only what this package exports;
``kernel.binding`` binds a variant's lifted functions into a kernel's copy.

Modules, by concern: ``source`` (a function's checked source, the names it reads, the
error every refusal raises), ``translate`` (torch functions and methods to ``ct``),
``lifting`` (resolving a body into one expression, compiling it: ``lift``), ``derivative``
(d / d score, symbolic), ``captures`` (the gradients of captured tensors), ``cache`` (a
call's variant, ``Mods``, keyed by value). Their rules' tests: tests/test_lifting.py,
tests/test_variants.py, tests/test_variant_numerics.py, tests/test_flex_conformance.py.

A ``score_mod(score, b, h, q_idx, kv_idx)`` returns a new fp32 score tile (``score`` is
``scale * q.k`` of a [TILE_M, TILE_N] tile, ``q_idx`` a [TILE_M, 1] and ``kv_idx`` a
[1, TILE_N] tile of absolute positions, ``b`` and ``h`` the batch and query head); a
``mask_mod(b, h, q_idx, kv_idx)`` returns a bool tile (True: attend). Both are cuTile tile
code (``import cuda.tile as ct``: ``ct.tanh``, ``ct.where``, ``ct.exp``, ...), compiled into
the forward and backward kernels, which cuTile inlines.

What a function may use (``lifting`` resolves it into one expression when it is lifted):

- torch ops or their ``ct`` equivalents (``translate``), assignments, a docstring,
  ``if``/``else`` and Python helpers returning one expression;
- numbers, bools and functions it captures (closure or module globals) are folded in as
  compile-time constants: a factory ``def window(n): return lambda b, h, q, k: q - k < n``
  compiles once per ``n``, and a changed global is a new variant (``_fn_key``);
- torch tensors it captures (per-head ALiBi slopes, per-token document ids) are passed to
  the kernels as arrays (up to ``MAX_TENSORS`` per call) and indexed on every axis, which
  becomes ``ct.gather`` (out-of-range indices read 0): ``slopes[h]``, ``doc[b, q_idx]``.

Anything else is refused at lift time with a ``VariantError`` naming the user's file and
line. The source lifted is checked against the function's code object (``source.function_node``).

The derivative (``score_mod`` only; ``mask_mod`` needs none): a ``ScoreMod(fn, grad=g)``
pairs the function with ``g(score, b, h, q_idx, kv_idx) = d fn / d score``; without one,
the lifted expression is differentiated symbolically (``derivative``). A ``score_mod``
with no derivative is refused before anything runs when an input requires grad. A captured
tensor of the score_mod that requires grad gets its gradient from the dK/dV kernel
(``with_captured_grads``: each read differentiated by the same rules), or a VariantError
before anything runs.

The compile identity of a variant (``Lifted.key``) is the generated source, which holds
the values of its captured constants, so a new variant compiles once, like any other
flag, and equal variants share kernels. The lifted variants are cached by ``_fn_key``
(code, closure and globals read, by value), bounded.
"""

from .cache import NONE, Mods, ScoreMod, mods_for
from .captures import with_captured_grads
from .lifting import Lifted, lift
from .source import MAX_TENSORS, VariantError

__all__ = ["MAX_TENSORS", "NONE", "Lifted", "Mods", "ScoreMod", "VariantError", "lift",
           "mods_for", "with_captured_grads"]
