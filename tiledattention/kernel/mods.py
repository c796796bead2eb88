"""Attention variants as tile functions: lifting a user's ``score_mod`` / ``mask_mod`` into
the kernels, the derivative of a ``score_mod``, and the per-variant kernel copies.

A ``score_mod(score, b, h, q_idx, kv_idx)`` returns a new fp32 score tile (``score`` is
``scale * q.k`` of a [TILE_M, TILE_N] tile, ``q_idx`` a [TILE_M, 1] and ``kv_idx`` a
[1, TILE_N] tile of absolute positions, ``b`` and ``h`` the batch and query head); a
``mask_mod(b, h, q_idx, kv_idx)`` returns a bool tile (True: attend). Both are cuTile tile
code (``import cuda.tile as ct``: ``ct.tanh``, ``ct.where``, ``ct.exp``, ...), compiled into
the forward and backward kernels, which cuTile inlines.

What a function may use:

- numbers, bools and functions it captures (closure or module globals) are compile-time
  constants: a factory ``def window(n): return lambda b, h, q, k: q - k < n`` compiles once
  per ``n``;
- torch tensors it captures (per-head ALiBi slopes, per-token document ids) are passed to
  the kernels as arrays (up to ``MAX_TENSORS`` per call) and indexed with subscripts, which
  become ``ct.gather`` (out-of-range indices read 0): ``slopes[h]``, ``doc[b, q_idx]``.

The derivative (``score_mod`` only; ``mask_mod`` needs none): a ``ScoreMod(fn, grad=g)``
pairs the function with ``g(score, b, h, q_idx, kv_idx) = d fn / d score``; without one, a
function whose body is one ``return`` expression built from ``+ - * /``, unary minus,
``ct.tanh``, ``ct.exp``, ``ct.exp2``, ``ct.where`` and score-free terms is differentiated
symbolically (softcapping, ALiBi and other biases need nothing). A ``score_mod`` with no
derivative is refused before anything runs when an input requires grad. Captured tensors
get no gradient.

The compile identity of a variant (``Lifted.key``) is the generated source (the function's
code after lifting) plus the values of its captured constants, so a new variant compiles
once, like any other flag, and equal variants share kernels.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import linecache
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import InputError

MAX_TENSORS = 4  # the kernels' A0..A3 arrays
AUX = tuple(f"_ta_aux{i}" for i in range(MAX_TENSORS))
_CT = "_ta_ct"
_counter = itertools.count()


class VariantError(InputError):
    """A score_mod / mask_mod the kernels cannot compile or differentiate."""


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


# ----------------------------------------------------------------------------- source
def _function_node(fn: Callable, nargs: int) -> ast.FunctionDef | ast.Lambda:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise VariantError(f"{_name(fn)}: its source is not available ({exc}); define it in a "
                           "file or a notebook cell") from exc
    try:
        tree = ast.parse(src)
    except SyntaxError:  # a lambda cut out of a longer expression
        tree = ast.parse("(" + src.strip().rstrip(",") + ")") if "lambda" in src else None
        if tree is None:
            raise VariantError(f"{_name(fn)}: its source could not be parsed") from None
    if fn.__name__ == "<lambda>":
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
        if len(nodes) > 1:
            nodes = [n for n in nodes if len(n.args.args) == nargs]
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.name == fn.__name__]
    if len(nodes) != 1:
        raise VariantError(f"{_name(fn)}: cannot single out its definition in its source "
                           "(define it with def, or one lambda per line)")
    node = nodes[0]
    if len(node.args.args) != nargs or node.args.vararg or node.args.kwonlyargs:
        raise VariantError(f"{_name(fn)} must take exactly {nargs} positional parameters")
    return node


def _name(fn) -> str:
    return getattr(fn, "__qualname__", repr(fn))


def _captures(fn: Callable) -> dict[str, object]:
    """Names the function reads from its closure and its module, with their values."""
    names = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    for name in _global_names(fn.__code__):
        if name in fn.__globals__ and name not in names:
            names[name] = fn.__globals__[name]
    return names


def _global_names(code) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _global_names(const)
    return out


def _cell_getter(fn: Callable, name: str):
    if name in fn.__code__.co_freevars:
        cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
        return lambda: cell.cell_contents
    return lambda: fn.__globals__[name]


def _constant_key(value) -> object:
    if isinstance(value, (bool, int, float, str, type(None))):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_constant_key(v) for v in value))
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    return ("object", id(value))  # functions and other objects: by identity


class _Lift(ast.NodeTransformer):
    """Captured tensors -> the A0.. parameters; ``t[i, j]`` on them -> ``ct.gather``."""

    def __init__(self, tensors: dict[str, str]):
        self.tensors = tensors

    def visit_Subscript(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.tensors:
            index = self.visit(node.slice)
            elts = index.elts if isinstance(index, ast.Tuple) else [index]
            return ast.copy_location(ast.Call(
                func=ast.Attribute(ast.Name(_CT, ast.Load()), "gather", ast.Load()),
                args=[ast.Name(self.tensors[node.value.id], ast.Load()),
                      ast.Tuple(elts, ast.Load())], keywords=[]), node)
        return self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.tensors:
            return ast.copy_location(ast.Name(self.tensors[node.id], node.ctx), node)
        return node


def _body(node) -> list[ast.stmt]:
    if isinstance(node, ast.Lambda):
        return [ast.Return(node.body)]
    return node.body


def _compile(name: str, params: list[str], body: list[ast.stmt], env: dict) -> Callable:
    """Exec the generated function under a fake filename cuTile can read back."""
    fdef = ast.FunctionDef(name=name, args=ast.arguments(
        posonlyargs=[], args=[ast.arg(p) for p in params + list(AUX)], kwonlyargs=[],
        kw_defaults=[], defaults=[]), body=body, decorator_list=[], returns=None,
        type_params=[])
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
    ``A<offset>...``; ``derivative``: its d/d(first parameter), differentiated symbolically
    (VariantError when its form is outside the closed set)."""
    node = _function_node(fn, nargs)
    captured = _captures(fn)
    tensor_names = [n for n, v in captured.items() if isinstance(v, torch.Tensor)]
    if len(tensor_names) + offset > MAX_TENSORS:
        raise VariantError(f"{role} {_name(fn)} captures {len(tensor_names)} tensors "
                           f"({tensor_names}); at most {MAX_TENSORS} are supported per call "
                           "(score_mod and mask_mod together)")
    mapping = dict(zip(tensor_names, AUX[offset:]))
    params = [a.arg for a in node.args.args]
    body = _body(node)
    if derivative:
        body = [ast.Return(_derivative_of(body, params[0], fn))]
    body = [_Lift(mapping).visit(ast.parse(ast.unparse(stmt)).body[0]) for stmt in body]
    env = {**fn.__globals__, **{n: v for n, v in captured.items() if n not in mapping}}
    import cuda.tile as ct

    env[_CT] = ct
    out, source = _compile(f"{role}_{fn.__name__.strip('<>')}", params, body, env)
    constants = tuple(sorted((n, _constant_key(v)) for n, v in captured.items()
                             if n not in mapping))
    return Lifted(out, (role, source, constants),
                  tuple((n, _cell_getter(fn, n)) for n in tensor_names))


# ----------------------------------------------------------------------------- derivative
_ONE = ast.Constant(1.0)


def _derivative_of(body: list[ast.stmt], wrt: str, fn) -> ast.expr:
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        raise VariantError(
            f"score_mod {_name(fn)}: no derivative given and its body is not one return "
            "expression; pass ScoreMod(fn, grad=dfn) with dfn(score, b, h, q_idx, kv_idx) "
            "= d fn / d score")
    d = _d(body[0].value, wrt)
    if d is None:
        raise VariantError(
            f"score_mod {_name(fn)}: cannot differentiate `{ast.unparse(body[0].value)}` "
            "(closed set: + - * /, unary -, ct.tanh, ct.exp, ct.exp2, ct.where); pass "
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


def _d(e: ast.expr, x: str):
    """d e / d x as an expression, _ZERO, or None (outside the closed set)."""
    if not _uses(e, x):
        return _ZERO
    if isinstance(e, ast.Name):
        return _ONE
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        da = _d(e.operand, x)
        if da is None or da is _ZERO or isinstance(e.op, ast.UAdd):
            return da
        return ast.UnaryOp(ast.USub(), da)
    if isinstance(e, ast.BinOp):
        da, db = _d(e.left, x), _d(e.right, x)
        if da is None or db is None:
            return None
        if isinstance(e.op, (ast.Add, ast.Sub)):
            if db is _ZERO:
                return da
            neg = ast.UnaryOp(ast.USub(), db) if isinstance(e.op, ast.Sub) else db
            return neg if da is _ZERO else _bin(da, e.op, db)
        if isinstance(e.op, ast.Mult):
            terms = [t for t in (None if da is _ZERO else _times(da, e.right),
                                 None if db is _ZERO else _times(e.left, db)) if t is not None]
            return terms[0] if len(terms) == 1 else _bin(terms[0], ast.Add(), terms[1])
        if isinstance(e.op, ast.Div) and db is _ZERO:
            return _bin(da, ast.Div(), e.right)
        return None
    if isinstance(e, ast.Call) and all(kw.arg in _PRECISION_KWARGS for kw in e.keywords):
        name = _call_name(e)
        if name in ("tanh", "exp", "exp2") and len(e.args) == 1:
            da = _d(e.args[0], x)
            if da is None:
                return None
            if name == "tanh":
                outer = _bin(ast.Constant(1.0), ast.Sub(), _bin(e, ast.Mult(), e))
            elif name == "exp":
                outer = e
            else:
                outer = _bin(e, ast.Mult(), ast.Constant(0.6931471805599453))
            return _times(outer, da)
        if name == "where" and len(e.args) == 3 and not _uses(e.args[0], x):
            da, db = _d(e.args[1], x), _d(e.args[2], x)
            if da is None or db is None:
                return None
            zero = ast.Constant(0.0)
            return ast.Call(e.func, [e.args[0], zero if da is _ZERO else da,
                                     zero if db is _ZERO else db], [])
    return None


# ----------------------------------------------------------------------------- variants
@dataclass(frozen=True, eq=False)
class Mods:
    """The variant of one call: lifted functions, their derivative and captured tensors."""

    score_mod: Lifted | None
    score_grad: Lifted | None
    mask_mod: Lifted | None
    key: tuple  # compile identity of the three together
    grad_error: str | None = None  # why a score_mod has no derivative (None: it has one)

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


def _fn_key(fn: Callable) -> tuple:
    cells = tuple(_constant_key(c.cell_contents) if not isinstance(
        c.cell_contents, torch.Tensor) else "tensor" for c in fn.__closure__ or ())
    return (fn.__code__, cells)


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
                               f"{type(f).__name__}")
    key = tuple(None if f is None else _fn_key(f) for f in (score_mod, grad, mask_mod))
    return _mods_cached(key, score_mod, grad, mask_mod)


@functools.lru_cache(maxsize=256)
def _mods_cached(key, score_mod, grad, mask_mod) -> Mods:
    s = None if score_mod is None else lift(score_mod, 5, "score_mod")
    g, error = None, None
    if score_mod is not None and grad is not None:
        g = lift(grad, 5, "score_grad")
        if [id(t) for t in g.tensors()] != [id(t) for t in s.tensors()]:
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
    from .body import no_mask_mod, no_score_mod

    env = dict(pyfunc.__globals__)
    env["SCORE_MOD"] = mods.score_mod.fn if mods.score_mod else no_score_mod
    env["SCORE_GRAD"] = mods.score_grad.fn if mods.score_grad else no_score_mod
    env["MASK_MOD"] = mods.mask_mod.fn if mods.mask_mod else no_mask_mod
    clone = types.FunctionType(pyfunc.__code__, env, pyfunc.__name__, pyfunc.__defaults__,
                               pyfunc.__closure__)
    clone.__kwdefaults__ = pyfunc.__kwdefaults__
    clone.__annotations__ = dict(pyfunc.__annotations__)
    clone.__qualname__ = pyfunc.__qualname__
    clone.__module__ = pyfunc.__module__
    clone.__doc__ = pyfunc.__doc__
    return clone
