"""Gradients of the tensors a ``score_mod`` captures: the dK/dV kernel adds, for each read
``T[idx]`` of a captured tensor that requires grad, ``sum ds * d score_mod / d T[idx]``
into an fp32 array G of T's shape (``with_captured_grads``), by the derivative's rules.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING

from .derivative import _ZERO, CLOSED_SET, _bin, _call_name, _d, _uses
from .lifting import Lifted, compile_raw
from .source import AUX, CT, MAX_TENSORS, VariantError

if TYPE_CHECKING:
    from .cache import Mods

GRADS = tuple(f"_ta_grad{i}" for i in range(MAX_TENSORS))  # the kernels' G0..G3
_DS = "_ta_ds"
_READ = "_ta_read"


def _gather_slot(node) -> int | None:
    """The A-slot of a lifted read ``_ta_ct.gather(_ta_auxI, index)``, else None."""
    if (isinstance(node, ast.Call) and _call_name(node) == "gather" and len(node.args) == 2
            and isinstance(node.args[0], ast.Name) and node.args[0].id in AUX):
        return AUX.index(node.args[0].id)
    return None


class _NameReads(ast.NodeTransformer):
    """Each read of a tensor that needs a gradient -> a fresh name (the variable the
    derivative is taken by); ``reads`` keeps (slot, original call, name)."""

    def __init__(self, needs: tuple[bool, ...]):
        self.needs, self.reads = needs, []

    def visit_Call(self, node):
        self.generic_visit(node)
        slot = _gather_slot(node)
        if slot is None or slot >= len(self.needs) or not self.needs[slot]:
            return node
        name = f"{_READ}{len(self.reads)}"
        self.reads.append((slot, node, name))
        return ast.Name(name, ast.Load())


class _Substitute(ast.NodeTransformer):
    def __init__(self, values: dict[str, ast.expr]):
        self.values = values

    def visit_Name(self, node):
        value = self.values.get(node.id)
        return node if value is None or not isinstance(node.ctx, ast.Load) else \
            ast.parse(ast.unparse(value), mode="eval").body


def _one_expression(body: list[ast.stmt]) -> ast.expr | None:
    """The returned expression of a body of single-name assignments and one final return
    (assignments substituted in), skipping a docstring; None for any other form."""
    bound: dict[str, ast.expr] = {}
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and i == 0:
            continue
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            bound[stmt.targets[0].id] = _Substitute(bound).visit(stmt.value)
        elif isinstance(stmt, ast.Return) and stmt.value is not None and i == len(body) - 1:
            return _Substitute(bound).visit(stmt.value)
        else:
            return None
    return None


def _other_axis(name: str) -> ast.expr:
    """The score tile's axis of the index ``name`` (the one summed away), read from its
    index tile's shape when the kernel is traced: [1, N] or [N, 1], as the dK/dV program
    puts queries or keys on the MMA rows (``KEY_ROWS``)."""
    return ast.parse(f"0 if {name}.shape[0] > 1 else 1", mode="eval").body


def _accumulate(slot: int, index: ast.expr, value: ast.expr, params: list[str]) -> ast.stmt:
    """``G<slot>[index] += value`` by a relaxed atomic, the tile summed first over the axes
    the index does not depend on: an index of b/h only adds one scalar per tile, of q_idx
    only one per row, of kv_idx only one per column, of both (or the score) one each."""
    score, _, _, q, kv = params
    elts = index.elts if isinstance(index, ast.Tuple) else [index]
    on_q = any(_uses(e, q) or _uses(e, score) for e in elts)
    on_kv = any(_uses(e, kv) or _uses(e, score) for e in elts)
    ct_ = ast.Name(CT, ast.Load())
    value = ast.Call(ast.Attribute(ct_, "astype", ast.Load()),
                     [value, ast.Attribute(ct_, "float32", ast.Load())], [])
    if not (on_q and on_kv):
        axis = [] if not (on_q or on_kv) else [ast.keyword("axis", _other_axis(
            kv if on_q else q)), ast.keyword("keepdims", ast.Constant(True))]
        value = ast.Call(ast.Attribute(ct_, "sum", ast.Load()), [value], axis)
    relaxed = ast.Attribute(ast.Attribute(ct_, "MemoryOrder", ast.Load()), "RELAXED",
                            ast.Load())
    return ast.Expr(ast.Call(ast.Attribute(ct_, "atomic_add", ast.Load()),
                             [ast.Name(GRADS[slot], ast.Load()), index, value],
                             [ast.keyword("memory_order", relaxed)]))


def captured_grad_body(lifted_fn: Callable, needs: tuple[bool, ...], names: list[str],
                       role: str) -> tuple[list[str], list[ast.stmt]]:
    """(parameters, body) of the function that adds d out / d T into each G of a captured
    tensor T that ``needs`` a gradient: for each read ``T[idx]`` of the (lifted)
    score_mod, ``G[idx] += sum ds * d score_mod / d T[idx]`` with ``ds`` = d out / d
    (modified score). VariantError (naming the tensor and the read) for a read the closed
    set cannot differentiate."""
    node = ast.parse(textwrap.dedent(inspect.getsource(lifted_fn))).body[0]
    params = [a.arg for a in node.args.args][:5]
    expr = _one_expression(node.body)
    if expr is None:
        raise VariantError(f"{role}: a captured tensor requires grad but the body is not "
                           "assignments and one return expression; detach the tensor or "
                           "write the score_mod as one expression")
    namer = _NameReads(needs)
    expr = namer.visit(expr)
    originals = {name: call for _, call, name in namer.reads}
    body = []
    for slot, call, name in namer.reads:
        d = _d(expr, name)
        if d is None:
            raise VariantError(
                f"{role}: captured tensor {names[slot]!r} requires grad, and "
                f"`{ast.unparse(expr)}` cannot be differentiated by its read "
                f"`{ast.unparse(call)}` ({CLOSED_SET}); detach it or compute the score in "
                "that closed set")
        if d is _ZERO:
            continue
        # copies: ``d`` shares subtrees with ``expr``, which later reads still differentiate
        d = _Substitute(originals).visit(copy.deepcopy(d))
        index = _Substitute(originals).visit(copy.deepcopy(call.args[1]))
        value = _bin(ast.Name(_DS, ast.Load()), ast.Mult(), d)
        body.append(_accumulate(slot, index, value, params))
    if not namer.reads:
        raise VariantError(f"{role}: captured tensors {[n for n, w in zip(names, needs) if w]} "
                           "require grad but are never read by subscript in it")
    body.append(ast.Return(ast.Name(_DS, ast.Load())))
    return params + list(AUX) + list(GRADS) + [_DS], body


def with_captured_grads(mods: Mods, needs: tuple[bool, ...]) -> Mods:
    """``mods`` whose backward also computes the gradients of the captured tensors that
    ``needs`` marks (A0.. order; only the score_mod's can have one: a mask_mod is piecewise
    constant, its tensors get None as in torch). Cached; VariantError before anything runs
    when a gradient cannot be derived."""
    n_score = len(mods.score_mod.cells) if mods.score_mod is not None else 0
    needs = tuple(needs[:n_score])
    if not any(needs):
        return mods
    key = (mods.key, needs)
    found = _captured_cache.get(key)
    if found is None:
        names = [n for n, _ in mods.score_mod.cells]
        role = "score_mod " + mods.score_mod.fn.__name__.removeprefix("score_mod_")
        params, body = captured_grad_body(mods.score_mod.fn, needs, names, role)
        import cuda.tile as ct

        env = dict(mods.score_mod.fn.__globals__)
        env[CT] = ct
        fn, source = compile_raw("score_capgrad", params, body, env)
        found = dataclasses.replace(mods, captured_grad=Lifted(fn, ("score_capgrad", source),
                                                               mods.score_mod.cells),
                                    key=(*mods.key, ("score_capgrad", source)))
        if len(_captured_cache) >= 256:
            _captured_cache.clear()
        _captured_cache[key] = found
    return found


_captured_cache: dict[tuple, Mods] = {}
