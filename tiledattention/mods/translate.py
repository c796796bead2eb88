"""Torch to cuTile: the ``ct`` expression of each torch function and tensor method the
lifter translates (``translate``), by identity (``_TORCH``, so ``from torch import where``
works) or by method name (``_METHOD_NAMES``), and constant folding of Python operators.
"""

from __future__ import annotations

import ast
import copy
import numbers
import operator
import types

import torch

from . import source as _m

_CTX = _m.CT


def _ct():
    import cuda.tile as ct

    return ct


def _ct_attr(*names: str) -> ast.expr:
    node: ast.expr = ast.Name(_CTX, ast.Load())
    for n in names:
        node = ast.Attribute(node, n, ast.Load())
    return node


def _ct_call(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(_ct_attr(name), list(args), [])


def _is_ct(value) -> bool:
    """Whether ``value`` belongs to cuda.tile (the module, a function, a dtype, an enum)."""
    module = (value.__name__ if isinstance(value, types.ModuleType)
              else getattr(value, "__module__", None))
    return isinstance(module, str) and module.split(".")[:2] == ["cuda", "tile"]


def _ct_expr(value) -> ast.expr | None:
    """``_ta_ct.<name>`` for an object of cuda.tile (function, dtype, enum member)."""
    ct = _ct()
    if value is ct:
        return ast.Name(_CTX, ast.Load())
    for name in dir(ct):
        if getattr(ct, name) is value:
            return _ct_attr(name)
    cls = type(value)
    if getattr(ct, cls.__name__, None) is cls and hasattr(value, "name"):
        return _ct_attr(cls.__name__, value.name)
    return None


_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
           torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
           torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8",
           torch.bool: "bool_"}
_CAST_METHODS = {"float": "float32", "half": "float16", "bfloat16": "bfloat16",
                 "double": "float64", "int": "int32", "long": "int64", "bool": "bool_"}


def _sigmoid(x: ast.expr) -> ast.expr:
    # sigmoid(x) = (1 + tanh(x / 2)) / 2: one tanh, and a form the derivative knows.
    return ast.BinOp(ast.BinOp(ast.Constant(0.5), ast.Mult(), _ct_call(
        "tanh", ast.BinOp(ast.Constant(0.5), ast.Mult(), x))), ast.Add(), ast.Constant(0.5))


def _clamp(x, lo, hi) -> ast.expr:
    if lo is not None:
        x = _ct_call("maximum", x, lo)
    if hi is not None:
        x = _ct_call("minimum", x, hi)
    return x


_SAME = ("where", "tanh", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan",
         "sinh", "cosh", "floor", "ceil", "abs", "minimum", "maximum", "atan2", "pow",
         "isnan")
_BINARY = {"add": ast.Add, "sub": ast.Sub, "subtract": ast.Sub, "mul": ast.Mult,
           "multiply": ast.Mult, "true_divide": ast.Div, "floor_divide": ast.FloorDiv,
           "remainder": ast.Mod, "fmod": ast.Mod, "bitwise_and": ast.BitAnd,
           "logical_and": ast.BitAnd, "bitwise_or": ast.BitOr, "logical_or": ast.BitOr,
           "bitwise_xor": ast.BitXor, "logical_xor": ast.BitXor}
_COMPARE = {"eq": ast.Eq, "ne": ast.NotEq, "lt": ast.Lt, "le": ast.LtE, "gt": ast.Gt,
            "ge": ast.GtE, "less": ast.Lt, "less_equal": ast.LtE, "greater": ast.Gt,
            "greater_equal": ast.GtE, "not_equal": ast.NotEq}


_UNARY = ("sigmoid", "silu", "relu", "square", "neg", "negative", "logical_not",
          "bitwise_not", "sign", "clone", "detach", "contiguous")


def _unary(name: str, x: ast.expr) -> ast.expr:
    def again():
        return copy.deepcopy(x)

    if name == "sigmoid":
        return _sigmoid(x)
    if name == "silu":
        return ast.BinOp(x, ast.Mult(), _sigmoid(again()))
    if name == "relu":
        return _ct_call("maximum", x, ast.Constant(0.0))
    if name == "square":
        return ast.BinOp(x, ast.Mult(), again())
    if name in ("neg", "negative"):
        return ast.UnaryOp(ast.USub(), x)
    if name in ("logical_not", "bitwise_not"):
        return ast.UnaryOp(ast.Invert(), x)
    if name == "sign":
        neg = _ct_call("where", ast.Compare(again(), [ast.Lt()], [ast.Constant(0)]),
                       ast.Constant(-1.0), ast.Constant(0.0))
        return _ct_call("where", ast.Compare(x, [ast.Gt()], [ast.Constant(0)]),
                        ast.Constant(1.0), neg)
    return x  # clone / detach / contiguous: the value itself


def translate(name: str, args: list[ast.expr], kw: dict, scope, node) -> ast.expr | None:
    """The ``ct`` expression of torch's ``name(*args, **kw)`` (a function or a tensor
    method with its tensor first), or None when there is none."""
    def arg(i, key=None, default=_m.EMPTY):
        if i < len(args):
            return args[i]
        if key in kw:
            return scope.expr(kw[key], node)
        if default is _m.EMPTY:
            raise scope.refuse(node, f"`{name}` needs argument {key or i}")
        return default

    known = {"min", "max", "alpha", "rounding_mode", "other", "exponent", "input", "dtype",
             "value", "non_blocking", "copy"}
    if set(kw) - known:
        raise scope.refuse(node, f"`{name}` with keyword(s) {sorted(set(kw) - known)} is "
                           "not translated; pass the values positionally")
    if name in _SAME:
        n = {"where": 3, "atan2": 2, "pow": 2, "minimum": 2, "maximum": 2}.get(name, 1)
        keys = {"pow": (None, "exponent"), "minimum": (None, "other"),
                "maximum": (None, "other")}.get(name, (None,) * n)
        return _ct_call(name, *(arg(i, keys[i] if i < len(keys) else None)
                                for i in range(n)))
    if name in _UNARY:
        return _unary(name, arg(0, "input"))
    if name in ("clamp", "clip", "clamp_min", "clamp_max"):
        x = arg(0, "input")
        if name == "clamp_min":
            return _clamp(x, arg(1, "min"), None)
        if name == "clamp_max":
            return _clamp(x, None, arg(1, "max"))
        lo, hi = arg(1, "min", None), arg(2, "max", None)
        lo = None if isinstance(lo, ast.Constant) and lo.value is None else lo
        hi = None if isinstance(hi, ast.Constant) and hi.value is None else hi
        return _clamp(x, lo, hi)
    if name in _BINARY or name == "div" or name == "divide":
        a, b = arg(0, "input"), arg(1, "other")
        op = _BINARY.get(name, ast.Div)
        mode = kw.get("rounding_mode")
        if name in ("div", "divide") and mode is not None:
            mode = scope.constant(mode, node)
            if mode == "floor":
                op = ast.FloorDiv
            elif mode is not None:
                raise scope.refuse(node, f"`{name}(rounding_mode={mode!r})` is not "
                                   "translated; use // for floor division")
        if "alpha" in kw:
            b = ast.BinOp(scope.expr(kw["alpha"], node), ast.Mult(), b)
        return ast.BinOp(a, op(), b)
    if name in _COMPARE:
        return ast.Compare(arg(0, "input"), [_COMPARE[name]()], [arg(1, "other")])
    return None


def _fold(op: ast.AST, *values):
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
           ast.Not: operator.not_, ast.Eq: operator.eq, ast.NotEq: operator.ne,
           ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
           ast.GtE: operator.ge, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor, ast.Invert: operator.invert}
    fn = ops.get(type(op))
    if fn is None:
        return _m.EMPTY
    try:
        return fn(*values)
    except (ArithmeticError, TypeError, ValueError):
        return _m.EMPTY


def _is_number(v) -> bool:
    return isinstance(v, (bool, numbers.Real)) and not isinstance(v, torch.Tensor)


def _const(v) -> ast.Constant:
    if isinstance(v, bool):
        return ast.Constant(v)
    if isinstance(v, numbers.Integral):
        return ast.Constant(int(v))
    return ast.Constant(float(v))



def _ident(f):
    try:
        hash(f)
    except TypeError:
        return None
    return f


def _torch_table() -> dict:
    """torch callables (by identity, so ``from torch import where`` works) -> names
    ``translate`` knows."""
    names = [*_SAME, *_UNARY, "clamp", "clip", "clamp_min", "clamp_max", "div", "divide",
             *_BINARY, *_COMPARE]
    table = {}
    for name in names:
        for owner in (torch, torch.special, torch.nn.functional):
            f = getattr(owner, name, None)
            if f is not None and _ident(f) is not None and name not in ("less", "greater"):
                table.setdefault(f, name)
    table[torch.nn.functional.silu] = "silu"
    table[torch.special.expit] = "sigmoid"
    return table


_TORCH = _torch_table()
_TENSOR_OF = {torch.tensor, torch.as_tensor, torch.scalar_tensor}
_LIKE = {torch.zeros_like: 0.0, torch.ones_like: 1.0, torch.full_like: None}
_METHOD_NAMES = frozenset({*_SAME, *_UNARY, "clamp", "clip", "clamp_min", "clamp_max", "div",
                           *_BINARY, *_COMPARE, *_CAST_METHODS, "to"})
