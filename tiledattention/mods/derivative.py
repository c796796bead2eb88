"""The derivative of a lifted ``score_mod`` by its score: symbolic, over the closed set
``CLOSED_SET`` (``_d``; ``None`` outside it), with comparisons piecewise constant as
torch's autograd takes them. ``captures`` differentiates by a captured tensor's reads
with the same rules.
"""

from __future__ import annotations

import ast

from .source import CT, VariantError, name_of

_ONE = ast.Constant(1.0)
CLOSED_SET = ("closed set: + - * /, ** with a constant exponent, unary -, comparisons, "
              "ct.tanh, ct.exp, ct.exp2, ct.log, ct.log2, ct.sqrt, ct.sin, ct.cos, ct.abs, "
              "ct.maximum, ct.minimum, ct.where")


def derivative_of(body: list[ast.stmt], wrt: str, fn) -> ast.expr:
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


# Derivative rules of the ops the lifter translates torch code into (``translate``) that
# ``_d_call`` does not know: tan, rsqrt, and pow by a score-free exponent (no keywords).
def _d_more(e: ast.Call, x: str):
    def chain(outer, u):
        du = _d(u, x)
        return du if du is None or du is _ZERO else _times(outer, du)

    def ct(name, *args):
        return ast.Call(ast.Attribute(ast.Name(CT, ast.Load()), name, ast.Load()),
                        list(args), [])

    if e.keywords:
        return None
    name, args = _call_name(e), e.args
    if len(args) == 1:
        u = args[0]
        outer = {"tan": lambda: _bin(ast.Constant(1.0), ast.Add(), _bin(e, ast.Mult(), e)),
                 "rsqrt": lambda: _bin(_bin(ast.Constant(-0.5), ast.Mult(), e), ast.Div(), u),
                 }.get(name)
        return None if outer is None else chain(outer(), u)
    if name == "pow" and len(args) == 2 and not _uses(args[1], x):
        return chain(_bin(args[1], ast.Mult(), ct("pow", args[0], _bin(
            args[1], ast.Sub(), ast.Constant(1.0)))), args[0])
    return None


def _ct_where(call: ast.Call, cond, a, b) -> ast.Call:
    """``<module of call>.where(cond, a, b)``."""
    return _sibling(call, "where", cond, a, b)


def _sibling(call: ast.Call, name: str, *args) -> ast.Call:
    """A call of ``name`` from the module of ``call``'s function (``ct.tanh`` -> ``ct.name``)."""
    return ast.Call(ast.Attribute(call.func.value, name, ast.Load()), list(args), [])
