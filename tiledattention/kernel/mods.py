"""Attention variants as tile functions: lifting a user's ``score_mod`` / ``mask_mod`` into
the kernels, the derivative of a ``score_mod``, and the per-variant kernel copies.

A ``score_mod(score, b, h, q_idx, kv_idx)`` returns a new fp32 score tile (``score`` is
``scale * q.k`` of a [TILE_M, TILE_N] tile, ``q_idx`` a [TILE_M, 1] and ``kv_idx`` a
[1, TILE_N] tile of absolute positions, ``b`` and ``h`` the batch and query head); a
``mask_mod(b, h, q_idx, kv_idx)`` returns a bool tile (True: attend). Both are cuTile tile
code (``import cuda.tile as ct``: ``ct.tanh``, ``ct.where``, ``ct.exp``, ...), compiled into
the forward and backward kernels, which cuTile inlines.

What a function may use (``lifting`` resolves it into one expression when it is lifted):

- torch ops or their ``ct`` equivalents (``lifting.translate``), assignments, a docstring,
  ``if``/``else`` and Python helpers returning one expression;
- numbers, bools and functions it captures (closure or module globals) are folded in as
  compile-time constants: a factory ``def window(n): return lambda b, h, q, k: q - k < n``
  compiles once per ``n``, and a changed global is a new variant (``_fn_key``);
- torch tensors it captures (per-head ALiBi slopes, per-token document ids) are passed to
  the kernels as arrays (up to ``MAX_TENSORS`` per call) and indexed on every axis, which
  becomes ``ct.gather`` (out-of-range indices read 0): ``slopes[h]``, ``doc[b, q_idx]``.

Anything else is refused at lift time with a ``VariantError`` naming the user's file and
line. The source lifted is checked against the function's code object (``function_node``).

The derivative (``score_mod`` only; ``mask_mod`` needs none): a ``ScoreMod(fn, grad=g)``
pairs the function with ``g(score, b, h, q_idx, kv_idx) = d fn / d score``; without one,
the lifted expression is differentiated symbolically (``_d``, ``_d_more``). A ``score_mod``
with no derivative is refused before anything runs when an input requires grad. A captured
tensor of the score_mod that requires grad gets its gradient from the dK/dV kernel
(``with_captured_grads``: each read differentiated by the same rules), or a VariantError
before anything runs.

The compile identity of a variant (``Lifted.key``) is the generated source, which holds
the values of its captured constants, so a new variant compiles once, like any other
flag, and equal variants share kernels. The lifted variants are cached by ``_fn_key``
(code, closure and globals read, by value), bounded.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import inspect
import itertools
import linecache
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .source import (
    AUX,
    CT,
    EMPTY,
    MAX_TENSORS,
    VariantError,
    function_node,
    global_names,
    location,
    name_of,
)

_counter = itertools.count()


@dataclass(frozen=True)
class ScoreMod:
    """A ``score_mod`` with its derivative ``grad(score, b, h, q_idx, kv_idx)`` (d/d score)."""

    fn: Callable
    grad: Callable | None = None


@dataclass(frozen=True, eq=False)
class Lifted:
    """A user's function rewritten to take its captured tensors as the arrays A0..A3."""

    fn: Callable  # the generated function: the user's parameters, then A0..A3
    key: tuple  # compile identity: generated source and captured constants
    cells: tuple  # (name, getter) of each captured tensor, in A0.. order

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(get() for _, get in self.cells)


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


class _Lift(ast.NodeTransformer):
    """Captured tensors -> the A0.. parameters; ``t[i, j]`` on them -> ``ct.gather``."""

    def __init__(self, tensors: dict[str, str]):
        self.tensors = tensors

    def visit_Subscript(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.tensors:
            index = self.visit(node.slice)
            elts = index.elts if isinstance(index, ast.Tuple) else [index]
            return ast.copy_location(ast.Call(
                func=ast.Attribute(ast.Name(CT, ast.Load()), "gather", ast.Load()),
                args=[ast.Name(self.tensors[node.value.id], ast.Load()),
                      ast.Tuple(elts, ast.Load())], keywords=[]), node)
        return self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.tensors:
            return ast.copy_location(ast.Name(self.tensors[node.id], node.ctx), node)
        return node


def _compile(name: str, params: list[str], body: list[ast.stmt], env: dict) -> Callable:
    """Exec the generated function, the user's parameters then A0..A3."""
    return _compile_raw(name, params + list(AUX), body, env)


def _compile_raw(name: str, params: list[str], body: list[ast.stmt], env: dict):
    """Exec a generated function with exactly ``params`` under a fake filename cuTile can
    read back."""
    fdef = ast.FunctionDef(name=name, args=ast.arguments(
        posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[], kw_defaults=[],
        defaults=[]), body=body, decorator_list=[], returns=None, type_params=[])
    module = ast.fix_missing_locations(ast.Module([fdef], type_ignores=[]))
    source = ast.unparse(module) + "\n"
    filename = f"<tiledattention variant {next(_counter)}: {name}>"
    # mtime None: linecache.checkcache keeps the entry, so inspect.findsource finds it.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope: dict = {}
    exec(compile(source, filename, "exec"), env, scope)  # noqa: S102 - our own generated code
    return scope[name], source


def lift(fn: Callable, nargs: int, role: str, derivative: bool = False,
         offset: int = 0) -> Lifted:
    """``fn`` as a kernel-callable function whose captured tensors are the arrays
    ``A<offset>...``: its body inlined into one expression (assignments, helpers,
    constant branches), captured constants folded in, torch ops translated to ``ct``
    (``lifting``); ``derivative``: its d/d(first parameter), differentiated symbolically
    (VariantError when its form is outside the closed set). Everything the kernels
    cannot compile is refused here, naming the user's file and line."""
    from .lifting import Inliner

    node = function_node(fn, nargs)
    params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    inliner = Inliner(role, offset)
    expr = inliner.top(fn, node, params)
    if derivative:
        try:
            expr = _derivative_of([ast.Return(expr)], params[0], fn)
        except VariantError as exc:  # at the user's definition, as every refusal
            raise VariantError(f"{location(fn)}: {exc}") from None
    import cuda.tile as ct

    out, source = _compile(f"{role}_{fn.__name__.strip('<>')}", params,
                           [ast.Return(expr)], {CT: ct})
    return Lifted(out, (role, source), inliner.cells())


# ----------------------------------------------------------------------------- derivative
_ONE = ast.Constant(1.0)
CLOSED_SET = ("closed set: + - * /, ** with a constant exponent, unary -, comparisons, "
              "ct.tanh, ct.exp, ct.exp2, ct.log, ct.log2, ct.sqrt, ct.sin, ct.cos, ct.abs, "
              "ct.maximum, ct.minimum, ct.where")


def _derivative_of(body: list[ast.stmt], wrt: str, fn) -> ast.expr:
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        raise VariantError(
            f"score_mod {name_of(fn)}: no derivative given and its body is not one return "
            "expression; pass ScoreMod(fn, grad=dfn) with dfn(score, b, h, q_idx, kv_idx) "
            "= d fn / d score")
    d = _d(body[0].value, wrt)
    if d is None:
        raise VariantError(
            f"score_mod {name_of(fn)}: cannot differentiate `{ast.unparse(body[0].value)}` "
            f"({CLOSED_SET}); pass "
            "ScoreMod(fn, grad=dfn) with dfn(score, b, h, q_idx, kv_idx) = d fn / d score")
    return d if d is not _ZERO else ast.Constant(0.0)


class _Zero:
    pass


_ZERO = _Zero()


def _uses(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f.attr
    return None


def _bin(left, op, right):
    return ast.BinOp(left, op, right)


def _times(a, b):
    if a is _ONE:
        return b
    if b is _ONE:
        return a
    return _bin(a, ast.Mult(), b)


# Keywords that change a call's precision, not its value: the derivative keeps them.
_PRECISION_KWARGS = frozenset({"rounding_mode", "flush_to_zero"})
_LN2 = 0.6931471805599453


def _neg(a):
    return ast.UnaryOp(ast.USub(), a)


def _d(e: ast.expr, x: str):
    """d e / d x as an expression, _ZERO, or None (outside the closed set).

    Comparisons (and so ``where`` conditions, ``abs``/``maximum`` branches) are piecewise
    constant: their own derivative is 0 almost everywhere, as torch's autograd takes it."""
    if not _uses(e, x):
        return _ZERO
    if isinstance(e, ast.Name):
        return _ONE
    if isinstance(e, ast.Compare):
        return _ZERO
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        da = _d(e.operand, x)
        if da is None or da is _ZERO or isinstance(e.op, ast.UAdd):
            return da
        return _neg(da)
    if isinstance(e, ast.BinOp):
        return _d_binop(e, x)
    if isinstance(e, ast.Call) and all(kw.arg in _PRECISION_KWARGS for kw in e.keywords):
        return _d_call(e, x)
    return None


def _d_binop(e: ast.BinOp, x: str):
    da, db = _d(e.left, x), _d(e.right, x)
    if da is None or db is None:
        return None
    if isinstance(e.op, (ast.Add, ast.Sub)):
        if db is _ZERO:
            return da
        neg = _neg(db) if isinstance(e.op, ast.Sub) else db
        return neg if da is _ZERO else _bin(da, e.op, db)
    if isinstance(e.op, ast.Mult):
        terms = [t for t in (None if da is _ZERO else _times(da, e.right),
                             None if db is _ZERO else _times(e.left, db)) if t is not None]
        return terms[0] if len(terms) == 1 else _bin(terms[0], ast.Add(), terms[1])
    if isinstance(e.op, ast.Div):
        if db is _ZERO:
            return _bin(da, ast.Div(), e.right)
        # quotient rule: (a' b - a b') / b^2
        num = _neg(_times(e.left, db)) if da is _ZERO else _bin(
            _times(da, e.right), ast.Sub(), _times(e.left, db))
        return _bin(num, ast.Div(), _bin(e.right, ast.Mult(), e.right))
    if (isinstance(e.op, ast.Pow) and db is _ZERO and isinstance(e.right, ast.Constant)
            and isinstance(e.right.value, (int, float))):
        n = e.right.value
        return _times(_bin(ast.Constant(float(n)), ast.Mult(),
                           _bin(e.left, ast.Pow(), ast.Constant(n - 1))), da)
    return None


def _d_call(e: ast.Call, x: str):
    name = _call_name(e)
    args = e.args
    if name in ("tanh", "exp", "exp2", "log", "log2", "sqrt", "sin", "cos", "abs") \
            and len(args) == 1:
        da = _d(args[0], x)
        if da is None or da is _ZERO:
            return da
        a = args[0]
        if name == "abs":  # sign(a) a' (0 at a = 0, as torch)
            return _ct_where(e, ast.Compare(a, [ast.Gt()], [ast.Constant(0.0)]), da,
                          _ct_where(e, ast.Compare(a, [ast.Lt()], [ast.Constant(0.0)]),
                                 _neg(da), ast.Constant(0.0)))
        if name == "tanh":
            outer = _bin(ast.Constant(1.0), ast.Sub(), _bin(e, ast.Mult(), e))
        elif name == "exp":
            outer = e
        elif name == "exp2":
            outer = _bin(e, ast.Mult(), ast.Constant(_LN2))
        elif name == "log":
            return _bin(da, ast.Div(), a)
        elif name == "log2":
            return _bin(da, ast.Div(), _bin(a, ast.Mult(), ast.Constant(_LN2)))
        elif name == "sqrt":
            return _bin(da, ast.Div(), _bin(ast.Constant(2.0), ast.Mult(), e))
        elif name == "sin":
            outer = _sibling(e, "cos", a)
        else:
            outer = _neg(_sibling(e, "sin", a))
        return _times(outer, da)
    if name in ("where", "maximum", "minimum") and len(args) == 3 - (name != "where"):
        if name == "where":
            cond, a, b = args
        else:
            a, b = args
            cond = ast.Compare(a, [ast.GtE() if name == "maximum" else ast.LtE()], [b])
        da, db = _d(a, x), _d(b, x)
        if da is None or db is None:
            return None
        if da is _ZERO and db is _ZERO:
            return _ZERO
        zero = ast.Constant(0.0)
        return _ct_where(e, cond, zero if da is _ZERO else da, zero if db is _ZERO else db)
    return _d_more(e, x)


# Derivative rules of the ops the lifter translates torch code into (``lifting``): sin,
# cos, tan, log, log2, sqrt, rsqrt, abs, minimum / maximum, pow by a score-free exponent,
# a quotient, and ct.where whose condition reads the score (piecewise, as autograd).
def _d_more(e: ast.expr, x: str):
    def both(a, b):
        return None if a is None or b is None else (a, b)

    def chain(outer, u):
        du = _d(u, x)
        return du if du is None or du is _ZERO else _times(outer, du)

    def ct(name, *args):
        return ast.Call(ast.Attribute(ast.Name(CT, ast.Load()), name, ast.Load()),
                        list(args), [])

    def zero_or(d):
        return ast.Constant(0.0) if d is _ZERO else d

    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div):
        pair = both(_d(e.left, x), _d(e.right, x))
        if pair is None:
            return None
        da, db = map(zero_or, pair)
        return _bin(_bin(_bin(da, ast.Mult(), e.right), ast.Sub(), _bin(e.left, ast.Mult(), db)),
                    ast.Div(), _bin(e.right, ast.Mult(), e.right))
    if not isinstance(e, ast.Call) or e.keywords:
        return None
    name, args = _call_name(e), e.args
    if len(args) == 1:
        u = args[0]
        outer = {"sin": lambda: ct("cos", u),
                 "cos": lambda: ast.UnaryOp(ast.USub(), ct("sin", u)),
                 "tan": lambda: _bin(ast.Constant(1.0), ast.Add(), _bin(e, ast.Mult(), e)),
                 "log": lambda: _bin(ast.Constant(1.0), ast.Div(), u),
                 "log2": lambda: _bin(ast.Constant(1.4426950408889634), ast.Div(), u),
                 "sqrt": lambda: _bin(ast.Constant(0.5), ast.Div(), e),
                 "rsqrt": lambda: _bin(_bin(ast.Constant(-0.5), ast.Mult(), e), ast.Div(), u),
                 "abs": lambda: ct("where", ast.Compare(u, [ast.Lt()], [ast.Constant(0)]),
                                   ast.Constant(-1.0), ast.Constant(1.0))}.get(name)
        return None if outer is None else chain(outer(), u)
    if name in ("minimum", "maximum") and len(args) == 2:
        pair = both(_d(args[0], x), _d(args[1], x))
        if pair is None:
            return None
        op = ast.LtE() if name == "minimum" else ast.GtE()
        return ct("where", ast.Compare(args[0], [op], [args[1]]), *map(zero_or, pair))
    if name == "pow" and len(args) == 2 and not _uses(args[1], x):
        return chain(_bin(args[1], ast.Mult(), ct("pow", args[0], _bin(
            args[1], ast.Sub(), ast.Constant(1.0)))), args[0])
    if name == "where" and len(args) == 3:
        pair = both(_d(args[1], x), _d(args[2], x))
        return None if pair is None else ct("where", args[0], *map(zero_or, pair))
    return None


def _ct_where(call: ast.Call, cond, a, b) -> ast.Call:
    """``<module of call>.where(cond, a, b)``."""
    return _sibling(call, "where", cond, a, b)


def _sibling(call: ast.Call, name: str, *args) -> ast.Call:
    """A call of ``name`` from the module of ``call``'s function (``ct.tanh`` -> ``ct.name``)."""
    return ast.Call(ast.Attribute(call.func.value, name, ast.Load()), list(args), [])


# ----------------------------------------------------------------------------- captured grads
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
        axis = [] if not (on_q or on_kv) else [ast.keyword("axis", ast.Constant(
            1 if on_q else 0)), ast.keyword("keepdims", ast.Constant(True))]
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
        fn, source = _compile_raw("score_capgrad", params, body, env)
        found = dataclasses.replace(mods, captured_grad=Lifted(fn, ("score_capgrad", source),
                                                               mods.score_mod.cells),
                                    key=(*mods.key, ("score_capgrad", source)))
        if len(_captured_cache) >= 256:
            _captured_cache.clear()
        _captured_cache[key] = found
    return found


_captured_cache: dict[tuple, Mods] = {}


# ----------------------------------------------------------------------------- variants
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


# ----------------------------------------------------------------------------- kernels
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
