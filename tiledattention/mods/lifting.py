"""Lifting a user's ``score_mod`` / ``mask_mod`` into one cuTile expression.

The function's body is resolved at lift time into a single expression of its parameters:

- assignments (also tuple unpacking and ``+=``), a docstring and ``if``/``else`` are inlined
  into the returned expression (a branch on a captured constant picks its side; a branch on
  a tile becomes ``ct.where``), so the symbolic derivative sees one expression;
- a Python helper it calls (closure or module global) is inlined the same way, with its
  own closure and globals;
- captured numbers and bools (closure, module globals, ``math.pi``, ``float("-inf")``) are
  folded in as literals: the generated source, and so the compile identity, holds them;
- a captured tensor is an array indexed on every axis (``bias[b, q_idx]``; chained
  ``bias[b][q_idx]`` is the same); a 0-d tensor used as a number is read as element 0;
- torch functions (``_TORCH``, by identity) and tensor methods (``_METHOD_NAMES``) become
  ``ct`` code (``translate``).

Everything else is refused here with a ``VariantError`` naming the user's file and line
and what to write instead, never later inside the compiler.
"""

from __future__ import annotations

import ast
import copy
import itertools
import linecache
import math
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import source as _m
from .derivative import derivative_of
from .translate import (
    _CAST_METHODS,
    _DTYPES,
    _LIKE,
    _METHOD_NAMES,
    _SAME,
    _TENSOR_OF,
    _TORCH,
    _const,
    _ct_attr,
    _ct_call,
    _ct_expr,
    _fold,
    _ident,
    _is_ct,
    _is_number,
    translate,
)

_counter = itertools.count()


class _Obj:
    """A Python object met while resolving (module, function, dtype, container...)."""

    __slots__ = ("value", "path")

    def __init__(self, value, path: str):
        self.value, self.path = value, path


class _Tensor:
    """A captured tensor, not yet indexed; ``fn``/``name`` say where it lives."""

    __slots__ = ("fn", "name", "value", "path")

    def __init__(self, fn, name: str, value: torch.Tensor):
        self.fn, self.name, self.value, self.path = fn, name, value, name


class Inliner:
    """One lifting: the captured tensors met (A<offset>.. in order) and the depth of
    helper calls."""

    MAX_DEPTH = 16

    def __init__(self, role: str, offset: int):
        self.role, self.offset = role, offset
        self.tensors: list[tuple] = []  # (where key, name, getter)
        self.depth = 0

    def cells(self) -> tuple:
        return tuple((name, get) for _, name, get in self.tensors)

    def top(self, fn, node, params: list[str]) -> ast.expr:
        env = {p: ast.Name(p, ast.Load()) for p in params}
        scope = _Scope(self, fn, env)
        body = _m.body_of(node)
        return scope.expr(scope.block(body), body[-1] if body else node)

    def inline(self, fn, args: list, kw: dict, caller, at) -> ast.expr:
        """The body of helper ``fn`` with its parameters bound to ``args`` / ``kw``."""
        if self.depth >= self.MAX_DEPTH:
            raise caller.refuse(at, f"helper calls nest deeper than {self.MAX_DEPTH} "
                                "(recursion cannot be compiled into the kernels)")
        node = _m.function_node(fn)
        a = node.args
        if a.vararg or a.kwarg or a.kwonlyargs:
            raise caller.refuse(at, f"helper `{_m.name_of(fn)}` takes *args/**kwargs or "
                                "keyword-only parameters; the kernels need plain parameters")
        names = [p.arg for p in (*a.posonlyargs, *a.args)]
        if len(args) > len(names) or set(kw) - set(names):
            raise caller.refuse(at, f"helper `{_m.name_of(fn)}` called with arguments that do "
                                "not match its parameters")
        env = dict(zip(names, args))
        env.update(kw)
        defaults = fn.__defaults__ or ()
        for name, value in zip(names[len(names) - len(defaults):], defaults):
            env.setdefault(name, _const(value) if _is_number(value) else _Obj(value, name))
        missing = [n for n in names if n not in env]
        if missing:
            raise caller.refuse(at, f"helper `{_m.name_of(fn)}` called without {missing}")
        self.depth += 1
        try:
            if isinstance(node, ast.Lambda):
                return _Scope(self, fn, env).block([ast.Return(node.body)])
            return _Scope(self, fn, env).block(node.body)
        finally:
            self.depth -= 1

    def array(self, t: _Tensor, scope, at) -> str:
        """The A<i> name of a captured tensor (one array per cell or global)."""
        code = t.fn.__code__
        key = (("cell", id(t.fn.__closure__[code.co_freevars.index(t.name)]))
               if t.name in code.co_freevars else ("global", id(t.fn.__globals__), t.name))
        for i, (k, _, _) in enumerate(self.tensors):
            if k == key:
                return _m.AUX[self.offset + i]
        if self.offset + len(self.tensors) >= _m.MAX_TENSORS:
            raise scope.refuse(at, f"captures more than {_m.MAX_TENSORS} tensors (at most "
                               f"{_m.MAX_TENSORS} per call, score_mod and mask_mod together; "
                               f"`{t.name}` is one too many): stack "
                               "them into one tensor and index it")
        get = _m.cell_getter(t.fn, t.name)
        if t.value.dim() == 0:  # a 0-d tensor is read as element 0 of a 1-element view
            get = (lambda g: lambda: g().reshape(1))(get)
        self.tensors.append((key, t.name, get))
        return _m.AUX[self.offset + len(self.tensors) - 1]


class _Scope:
    """Resolving one function's body: ``env`` maps its parameters and locals to
    expressions (or Python objects); other names are looked up in its closure/globals."""

    def __init__(self, lifter: Inliner, fn, env: dict):
        self.lifter, self.fn, self.env = lifter, fn, env

    def refuse(self, node, what: str) -> _m.VariantError:
        return _m.VariantError(f"{_m.location(self.fn, node)}: {self.lifter.role} "
                               f"{_m.name_of(self.fn)}: {what}")

    # ------------------------------------------------------------------ statements
    def block(self, stmts: list[ast.stmt]) -> ast.expr:
        for i, st in enumerate(stmts):
            if isinstance(st, ast.Pass) or (isinstance(st, ast.Expr) and isinstance(
                    st.value, ast.Constant) and isinstance(st.value.value, str)):
                continue
            if isinstance(st, (ast.Assign, ast.AnnAssign)):
                if st.value is None:
                    continue
                value = self.value(st.value)
                for target in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                    self.bind(target, value, st)
                continue
            if isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
                load = ast.copy_location(ast.Name(st.target.id, ast.Load()), st)
                self.env[st.target.id] = self.value(ast.copy_location(
                    ast.BinOp(load, st.op, st.value), st))
                continue
            if isinstance(st, ast.Return):
                if st.value is None:
                    raise self.refuse(st, "returns nothing; return the score (score_mod) or "
                                      "a bool tile (mask_mod)")
                return self.value(st.value)  # a helper may return a tensor or object
            if isinstance(st, ast.If):
                rest = stmts[i + 1:]
                cond = self.value(st.test)
                known = self.constant(cond, st.test, strict=False)
                if known is not _m.EMPTY:
                    return self.block((st.body if known else st.orelse) + rest)
                yes = _Scope(self.lifter, self.fn, dict(self.env)).block(st.body + rest)
                no = _Scope(self.lifter, self.fn, dict(self.env)).block(st.orelse + rest)
                return _ct_call("where", self.expr(cond, st.test), self.expr(yes, st),
                                self.expr(no, st))
            raise self.refuse(st, f"a `{type(st).__name__}` statement cannot be compiled into "
                              "the kernels; write the body as assignments, if/else and one "
                              "return (loops: unroll them, or use ct.where)")
        raise self.refuse(stmts[-1] if stmts else None, "has no return statement")

    def bind(self, target, value, st) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
            return
        if isinstance(target, (ast.Tuple, ast.List)):
            items = (value.elts if isinstance(value, ast.Tuple) else
                     [_const(v) if _is_number(v) else _Obj(v, "") for v in value.value]
                     if isinstance(value, _Obj) and isinstance(value.value, (tuple, list))
                     else None)
            if items is None or len(items) != len(target.elts):
                raise self.refuse(st, "unpacks a value that is not a tuple of matching length")
            for t, v in zip(target.elts, items):
                self.bind(t, v, st)
            return
        raise self.refuse(st, "assigns to something other than a name (attributes and "
                          "subscripts cannot be written in the kernels)")

    # ------------------------------------------------------------------ expressions
    def expr(self, v, at=None) -> ast.expr:
        """An expression node for the resolved value ``v`` (``at``: the user's node, for
        messages)."""
        if isinstance(v, ast.AST):
            return v
        if isinstance(v, _Tensor):
            if v.value.dim() == 0:
                return _ct_call("gather", ast.Name(self.lifter.array(v, self, at), ast.Load()),
                                ast.Tuple([ast.Constant(0)], ast.Load()))
            raise self.refuse(at, f"the captured tensor `{v.name}` ({v.value.dim()}-d) is used "
                              f"without an index; index every axis, e.g. `{v.name}[...]` with "
                              "b, h, q_idx, kv_idx")
        value = v.value
        if _is_number(value) or value is None:
            return _const(value) if value is not None else ast.Constant(None)
        node = _ct_expr(value) if _is_ct(value) else None
        if node is not None:
            return node
        raise self.refuse(at, f"`{v.path}` is a {type(value).__name__}; the kernels take "
                          "numbers, bools, indexed tensors and ct/torch functions")

    def constant(self, v, at, strict: bool = True):
        """The Python value of a resolved constant (``EMPTY`` when it is a tile unless
        ``strict``, which refuses)."""
        if isinstance(v, ast.Constant):
            return v.value
        if isinstance(v, _Obj) and (_is_number(v.value) or isinstance(v.value, str)
                                    or v.value is None):
            return v.value
        if strict:
            raise self.refuse(at, "needs a constant here")
        return _m.EMPTY

    def value(self, e: ast.AST):
        """``e`` resolved: an expression node, an ``_Obj`` or a ``_Tensor``."""
        method = getattr(self, "_" + type(e).__name__, None)
        if method is None:
            raise self.refuse(e, f"`{_src(e)}` ({type(e).__name__}) cannot be compiled into "
                              "the kernels")
        return method(e)

    def _Constant(self, e):
        return ast.Constant(e.value)

    def _Name(self, e):
        if e.id in self.env:
            v = self.env[e.id]
            return copy.deepcopy(v) if isinstance(v, ast.AST) else v
        try:
            value = _m.lookup(self.fn, e.id)
        except KeyError:
            raise self.refuse(e, f"name `{e.id}` is not defined") from None
        if value is _m.EMPTY:
            raise self.refuse(e, f"`{e.id}` is a variable of the enclosing function that has "
                              "no value yet (an empty closure cell: assigned after the "
                              "function was made, or deleted); assign it before")
        return self.capture(e.id, value, e)

    def capture(self, name: str, value, at):
        if isinstance(value, torch.Tensor):
            return _Tensor(self.fn, name, value)
        if _is_number(value):
            return _const(value)
        if isinstance(value, (list, tuple)) and _cyclic(value):
            raise self.refuse(at, f"the captured {type(value).__name__} `{name}` contains "
                              "itself; capture numbers or a tensor")
        return _Obj(value, name)

    def _Attribute(self, e):
        base = self.value(e.value)
        if isinstance(base, _Obj):
            obj = base.value
            path = f"{base.path}.{e.attr}"
            if isinstance(obj, (types.ModuleType, type)) or _is_ct(obj):
                try:
                    return self.capture(path, getattr(obj, e.attr), e)
                except AttributeError:
                    raise self.refuse(e, f"`{path}` does not exist") from None
            raise self.refuse(e, f"reads `{path}` from a captured {type(obj).__name__} "
                              "object; the kernels take numbers, bools, tensors and "
                              f"functions by name: bind it outside the function (`{e.attr} "
                              f"= {path}`) and use `{e.attr}`")
        if isinstance(base, _Tensor):
            raise self.refuse(e, f"reads `.{e.attr}` of the captured tensor `{base.name}`; "
                              "index it instead (its values are read in the kernels)")
        raise self.refuse(e, f"reads `.{e.attr}` of a tile; tiles have no attributes in the "
                          "kernels (tensor methods that are translated: "
                          f"{', '.join(sorted(_METHOD_NAMES))})")

    def _Subscript(self, e):
        slices, base = [], e
        while isinstance(base, ast.Subscript):
            slices.insert(0, base.slice)
            base = base.value
        root = self.value(base)
        elts = [x for s in slices for x in (s.elts if isinstance(s, ast.Tuple) else [s])]
        if any(isinstance(x, (ast.Slice, ast.Starred)) for x in elts) or any(
                isinstance(x, ast.Constant) and x.value in (None, Ellipsis) for x in elts):
            raise self.refuse(e, f"`{_src(e)}` slices; only element reads (one index per "
                              "axis) can be compiled into the kernels")
        if isinstance(root, _Tensor):
            ndim = root.value.dim()
            if len(elts) != ndim:
                raise self.refuse(e, f"`{_src(e)}` indexes {len(elts)} of the {ndim} axes of "
                                  f"the captured tensor `{root.name}`; index every axis (a "
                                  "score is one number per (b, h, q_idx, kv_idx))")
            index = [self.expr(self.value(x), x) for x in elts]
            return ast.Call(_ct_attr("gather"), [ast.Name(self.lifter.array(root, self, e),
                                                          ast.Load()),
                                                 ast.Tuple(index, ast.Load())], [])
        if isinstance(root, _Obj) and isinstance(root.value, (tuple, list, dict)):
            value = root.value
            for x in elts:
                key = self.constant(self.value(x), x, strict=False)
                if key is _m.EMPTY:
                    raise self.refuse(e, f"`{_src(e)}` indexes the captured "
                                      f"{type(value).__name__} `{root.path}` with a tile; "
                                      "make it a tensor to index it in the kernels")
                try:
                    value = value[key]
                except (IndexError, KeyError, TypeError):
                    raise self.refuse(e, f"`{_src(e)}`: no item {key!r}") from None
            return self.capture(_src(e), value, e)
        if isinstance(root, ast.Tuple) and len(elts) == 1:
            key = self.constant(self.value(elts[0]), e, strict=False)
            if isinstance(key, int) and -len(root.elts) <= key < len(root.elts):
                return root.elts[key]
        raise self.refuse(e, f"`{_src(e)}` indexes something that is not a captured tensor")

    def _Call(self, e):
        if any(isinstance(a, ast.Starred) for a in e.args) or any(
                k.arg is None for k in e.keywords):
            raise self.refuse(e, "calls with *args / **kwargs cannot be compiled")
        if isinstance(e.func, ast.Attribute):
            base = self.value(e.func.value)
            if isinstance(base, ast.AST) or isinstance(base, _Tensor) and base.value.dim() == 0:
                return self.method(e, e.func.attr, self.expr(base, e.func.value))
            func = self._Attribute(e.func) if isinstance(base, _Obj) else None
            if func is None:
                raise self.refuse(e, f"calls `.{e.func.attr}()` on the captured tensor "
                                  f"`{base.name}`; index it (its values are read per element)")
        else:
            func = self.value(e.func)
        if not isinstance(func, _Obj):
            raise self.refuse(e, f"`{_src(e.func)}` is not a function")
        args = [self.value(a) for a in e.args]
        kw = {k.arg: self.value(k.value) for k in e.keywords}
        return self.call(e, func, args, kw)

    def call(self, e, func: _Obj, args: list, kw: dict):
        f = func.value
        name = _TORCH.get(_ident(f))
        if name is not None:
            out = translate(name, [self.expr(a, e) for a in args], kw, self, e)
            if out is not None:
                return out
        if isinstance(f, types.FunctionType) and not _is_ct(f) and not (
                getattr(f, "__module__", None) or "").startswith("torch"):
            return self.lifter.inline(f, args, kw, self, e)
        consts = [self.constant(a, e, strict=False) for a in args]
        const_kw = {k: self.constant(v, e, strict=False) for k, v in kw.items()}
        all_const = _m.EMPTY not in consts and _m.EMPTY not in const_kw.values()
        if _is_ct(f):
            exprs = [self.expr(a, e) for a in args]
            return ast.Call(self.expr(func, e), exprs,
                            [ast.keyword(k, self.expr(v, e)) for k, v in kw.items()])
        if f in _TENSOR_OF and consts and _is_number(consts[0]):
            return _const(consts[0])  # torch.tensor(-inf): the number itself
        if f in _LIKE:
            fill = _LIKE[f] if f is not torch.full_like else (
                consts[1] if len(consts) > 1 else const_kw.get("fill_value", _m.EMPTY))
            if fill is not _m.EMPTY and _is_number(fill):
                return _const(fill)  # broadcasts like the tile it imitates
        if f in (float, int, bool) and all_const and not kw and len(consts) <= 1:
            try:
                return _const(f(*consts))
            except (TypeError, ValueError, OverflowError):
                raise self.refuse(e, f"`{_src(e)}` is not a number") from None
        if getattr(f, "__module__", None) == "math" or getattr(f, "__self__", None) is math:
            if all_const:
                return _const(f(*consts, **const_kw))
            if f.__name__ in _SAME:
                return translate(f.__name__, [self.expr(a, e) for a in args], kw, self, e)
        if f in (abs, min, max) and not kw:
            exprs = [self.expr(a, e) for a in args]
            if all_const:
                return _const(f(*consts))
            if f is abs and len(exprs) == 1:
                return _ct_call("abs", exprs[0])
            if len(exprs) == 2:
                return _ct_call("minimum" if f is min else "maximum", *exprs)
        if f in (float, int, bool) and len(args) == 1 and not kw:
            return _ct_call("astype", self.expr(args[0], e),
                            _ct_attr({float: "float32", int: "int32", bool: "bool_"}[f]))
        raise self.refuse(e, f"calls `{_src(e.func)}`, which has no translation to the "
                          "kernels; supported: ct.* functions, Python helpers returning one "
                          "expression, abs/min/max/float/int, math.*, and torch "
                          f"{', '.join(sorted(set(_TORCH.values())))}")

    def method(self, e, name: str, this: ast.expr):
        args = [self.value(a) for a in e.args]
        kw = {k.arg: self.value(k.value) for k in e.keywords}
        if name in _CAST_METHODS and not args and not kw:
            return _ct_call("astype", this, _ct_attr(_CAST_METHODS[name]))
        if name in ("to", "type"):
            target = args[0] if args else kw.get("dtype")
            dtype = target.value if isinstance(target, _Obj) else None
            if dtype not in _DTYPES:
                raise self.refuse(e, f"`{_src(e)}`: only `.to(<torch dtype>)` is translated")
            return _ct_call("astype", this, _ct_attr(_DTYPES[dtype]))
        if name == "where":  # x.where(cond, y) = where(cond, x, y)
            exprs = [self.expr(a, e) for a in args]
            if len(exprs) != 2:
                raise self.refuse(e, "`x.where(cond, other)` takes two arguments")
            return _ct_call("where", exprs[0], this, exprs[1])
        if name in _METHOD_NAMES:
            out = translate(name, [this, *(self.expr(a, e) for a in args)], kw, self, e)
            if out is not None:
                return out
        raise self.refuse(e, f"calls `.{name}()` on a tile, which has no translation; "
                          f"translated methods: {', '.join(sorted(_METHOD_NAMES))}")

    def _BinOp(self, e):
        a, b = self.value(e.left), self.value(e.right)
        ca, cb = self.constant(a, e, strict=False), self.constant(b, e, strict=False)
        if _m.EMPTY not in (ca, cb):
            folded = _fold(e.op, ca, cb)
            if folded is not _m.EMPTY and _is_number(folded):
                return _const(folded)
        return ast.BinOp(self.expr(a, e.left), type(e.op)(), self.expr(b, e.right))

    def _UnaryOp(self, e):
        a = self.value(e.operand)
        ca = self.constant(a, e, strict=False)
        if ca is not _m.EMPTY:
            folded = _fold(e.op, ca)
            if folded is not _m.EMPTY and _is_number(folded):
                return _const(folded)
        op = ast.Invert() if isinstance(e.op, ast.Not) else type(e.op)()
        return ast.UnaryOp(op, self.expr(a, e.operand))

    def _BoolOp(self, e):
        values = [self.value(v) for v in e.values]
        consts = [self.constant(v, e, strict=False) for v in values]
        if _m.EMPTY not in consts:
            out = consts[0]
            for c in consts[1:]:
                out = (out and c) if isinstance(e.op, ast.And) else (out or c)
            return _const(out) if _is_number(out) else ast.Constant(out)
        op = ast.BitAnd if isinstance(e.op, ast.And) else ast.BitOr
        node = self.expr(values[0], e)
        for v in values[1:]:
            node = ast.BinOp(node, op(), self.expr(v, e))
        return node

    def _Compare(self, e):
        operands = [self.value(x) for x in (e.left, *e.comparators)]
        for op in e.ops:
            if isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                raise self.refuse(e, f"`{_src(e)}`: is / in cannot be compiled; use == or !=")
        parts = []
        for op, a, b in zip(e.ops, operands, operands[1:]):
            ca, cb = self.constant(a, e, strict=False), self.constant(b, e, strict=False)
            if _m.EMPTY not in (ca, cb):
                parts.append(ast.Constant(bool(_fold(op, ca, cb))))
            else:
                parts.append(ast.Compare(self.expr(a, e), [type(op)()], [self.expr(b, e)]))
        node = parts[0]
        for p in parts[1:]:
            node = ast.BinOp(node, ast.BitAnd(), p)
        return node

    def _IfExp(self, e):
        cond = self.value(e.test)
        known = self.constant(cond, e, strict=False)
        if known is not _m.EMPTY:
            return self.value(e.body if known else e.orelse)
        return _ct_call("where", self.expr(cond, e.test), self.expr(self.value(e.body), e),
                        self.expr(self.value(e.orelse), e))

    def _Tuple(self, e):
        return ast.Tuple([self.expr(self.value(x), x) for x in e.elts], ast.Load())


def _src(e) -> str:
    try:
        return ast.unparse(e)
    except Exception:  # noqa: BLE001 - only for a message
        return type(e).__name__


def _cyclic(value, seen=()) -> bool:
    if any(value is s for s in seen):
        return True
    return any(_cyclic(v, (*seen, value)) for v in value if isinstance(v, (list, tuple)))


# ct functions whose value moves by about an ulp when an argument does: a quotient inside
# them may be rounded differently. Not floor/ceil, casts, comparisons, isnan, a gather's
# index, // or %: there one ulp can change the value itself.
_CONTINUOUS = frozenset({"tanh", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos",
                         "tan", "sinh", "cosh", "abs", "minimum", "maximum"})
_FP32_NORMAL, _FP32_MAX = 2.0 ** -126, 2.0 ** 127


def _ct_name(e) -> str | None:
    f = e.func if isinstance(e, ast.Call) else None
    return f.attr if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                      and f.value.id == _m.CT) else None


def _reciprocal(e) -> float | None:
    """1 / c of a number ``c`` whose reciprocal fp32 holds as a normal number."""
    c = e.value if isinstance(e, ast.Constant) else None
    if isinstance(c, bool) or not isinstance(c, (int, float)) or c == 0 or not math.isfinite(c):
        return None
    return 1.0 / c if _FP32_NORMAL <= abs(1.0 / c) <= _FP32_MAX else None


def _products(e: ast.expr) -> ast.expr:
    """A score's ``x / c`` by a number ``c`` as ``x * (1 / c)``, where the quotient only
    feeds arithmetic and continuous functions. cuTile compiles a float division
    IEEE-rounded: per element a range check, a refinement and a slow-path call behind a
    convergence barrier; a product is one FMUL (benchmarks/notes/variants.md §52d: a
    softcap written as FlexAttention users write it, loops 25-35 % shorter). The product is
    within an fp32 ulp of the quotient, and exact for a power of two. Where an ulp could
    flip a decision (a comparison, a cast, floor, a gather's index) the quotient stays."""
    # New nodes, never edits: the inliner shares subtrees, and a quotient that is also
    # compared elsewhere must stay a quotient there.
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _products(e.left), _products(e.right)
        r = _reciprocal(right) if isinstance(e.op, ast.Div) else None
        return ast.BinOp(left, e.op if r is None else ast.Mult(),
                         right if r is None else ast.Constant(r))
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        return ast.UnaryOp(e.op, _products(e.operand))
    if _ct_name(e) in _CONTINUOUS:
        return ast.Call(e.func, [_products(a) for a in e.args], e.keywords)
    if _ct_name(e) == "where":  # the condition decides: only the values
        return ast.Call(e.func, [e.args[0], *(_products(a) for a in e.args[1:])], e.keywords)
    if isinstance(e, ast.IfExp):
        return ast.IfExp(e.test, _products(e.body), _products(e.orelse))
    return e


# ----------------------------------------------------------------------------- lift
@dataclass(frozen=True, eq=False)
class Lifted:
    """A user's function rewritten to take its captured tensors as the arrays A0..A3."""

    fn: Callable  # the generated function: the user's parameters, then A0..A3
    key: tuple  # compile identity: generated source and captured constants
    cells: tuple  # (name, getter) of each captured tensor, in A0.. order

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(get() for _, get in self.cells)



def _compile(name: str, params: list[str], body: list[ast.stmt], env: dict) -> Callable:
    """Exec the generated function, the user's parameters then A0..A3."""
    return compile_raw(name, params + list(_m.AUX), body, env)


def compile_raw(name: str, params: list[str], body: list[ast.stmt], env: dict):
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
    node = _m.function_node(fn, nargs)
    params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    inliner = Inliner(role, offset)
    expr = inliner.top(fn, node, params)
    if role != "mask_mod":  # a mask is all decisions
        expr = _products(expr)
    if derivative:
        try:
            expr = derivative_of([ast.Return(expr)], params[0], fn)
        except _m.VariantError as exc:  # at the user's definition, as every refusal
            raise _m.VariantError(f"{_m.location(fn)}: {exc}") from None
    import cuda.tile as ct

    out, source = _compile(f"{role}_{fn.__name__.strip('<>')}", params,
                           [ast.Return(expr)], {_m.CT: ct})
    return Lifted(out, (role, source), inliner.cells())
