"""Reading a user's ``score_mod`` / ``mask_mod``: its source and AST (checked against
the code that runs), the names it reads and their values, and the error every refusal
raises. The rest of the package builds on this module.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dis
import functools
import inspect
import linecache
import textwrap
import tokenize
import types
from collections.abc import Callable

from ..errors import InputError

MAX_TENSORS = 4  # the kernels' A0..A3 arrays
AUX = tuple(f"_ta_aux{i}" for i in range(MAX_TENSORS))
CT = "_ta_ct"


class VariantError(InputError):
    """A score_mod / mask_mod the kernels cannot compile or differentiate."""



# ----------------------------------------------------------------------------- source
# A function's source is found from its code object (file, first line) in the lines
# linecache holds, and checked against that code object: what is lifted is the function
# that runs, never a file edited since, and a decorator that replaced the function (a
# ``functools.wraps`` wrapper) is refused, not silently dropped.
_trees: dict[str, tuple[list, ast.Module | None]] = {}


def location(fn, node: ast.AST | None = None) -> str:
    """``file:line`` of ``node`` in ``fn``'s source (its definition without a node)."""
    code = fn.__code__
    line = getattr(node, "lineno", None) or code.co_firstlineno
    return f"{code.co_filename}:{line}"


def _refuse(fn, node, what: str) -> VariantError:
    return VariantError(f"{location(fn, node)}: {name_of(fn)}: {what}")


def _module_tree(filename: str, lines: list[str]) -> ast.Module | None:
    cached = _trees.get(filename)
    if cached is not None and cached[0] is lines:
        return cached[1]
    try:
        tree = ast.parse("".join(lines), filename)
    except (SyntaxError, ValueError):
        tree = None  # e.g. a notebook cell holding magics: fall back to the block
    if len(_trees) > 64:
        _trees.clear()
    _trees[filename] = (lines, tree)
    return tree


def _block_tree(lines: list[str], first: int) -> ast.Module | None:
    """The definition block starting at line ``first`` alone, line numbers kept."""
    try:
        block = inspect.getblock(lines[first - 1:])
    except (IndexError, SyntaxError, tokenize.TokenError):
        return None
    text = textwrap.dedent("".join(block))
    for src in (text, "(" + text.strip().rstrip(",") + ")"):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        ast.increment_lineno(tree, first - 1)
        return tree
    return None


def _candidates(tree: ast.AST, code) -> list:
    first = code.co_firstlineno
    if code.co_name == "<lambda>":
        return [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and n.lineno == first]
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and n.name == code.co_name
            and first in (n.lineno, *(d.lineno for d in n.decorator_list))]


def _signature(code) -> tuple:
    consts = tuple(_signature(c) if isinstance(c, types.CodeType) else (type(c), repr(c))
                   for c in code.co_consts)
    return (code.co_code, code.co_names, code.co_varnames, code.co_freevars,
            code.co_cellvars, consts)


def _imported_names(tree: ast.Module | None, fn) -> set[str]:
    """Names the module binds by import (Python 3.11 compiles ``mod.f()`` differently
    when ``mod`` is one); without the module's tree, its globals holding modules."""
    if tree is None:
        return {n for n, v in fn.__globals__.items() if isinstance(v, types.ModuleType)}
    out, stack = set(), list(tree.body)
    while stack:
        st = stack.pop()
        if isinstance(st, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in st.names}
        elif not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(c for c in ast.iter_child_nodes(st) if isinstance(c, ast.stmt))
    return out


def _code_matches(node, code, imported: set[str] = frozenset()) -> bool:
    """Whether ``node`` compiles to ``code`` (in a scope giving it the same free names,
    in a module importing the same names)."""
    node = copy.deepcopy(node)
    scope: list[ast.stmt] = []
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = []
        inner = node
        if node.name not in code.co_freevars:  # its own name stays a global (recursion)
            scope.append(ast.Global([node.name]))
    else:
        inner = ast.Assign([ast.Name("_ta_lambda", ast.Store())], node)
    outer = ast.FunctionDef(
        name="_ta_outer", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                             kw_defaults=[], defaults=[]),
        body=scope + [ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None))
                      for v in code.co_freevars] + [inner],
        decorator_list=[], returns=None, type_params=[])
    imports = [ast.Import([ast.alias("_ta_module", n)]) for n in sorted(imported)]
    module = ast.fix_missing_locations(ast.Module([*imports, outer], type_ignores=[]))
    try:
        compiled = compile(module, code.co_filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, TypeError):
        return False
    want = _signature(code)
    stack = [compiled]
    while stack:
        c = stack.pop()
        if c.co_name == code.co_name and _signature(c) == want:
            return True
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return False


def function_node(fn: Callable, nargs: int | None = None) -> ast.FunctionDef | ast.Lambda:
    """The definition of ``fn`` in its source, checked to be the code that runs."""
    if getattr(fn, "__wrapped__", None) is not None:
        raise _refuse(fn, None, "it is wrapped by a decorator (it has __wrapped__, e.g. "
                      "functools.wraps): the kernels would compile the wrapped body, not "
                      "what the wrapper does; pass the undecorated function")
    code = fn.__code__
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    if not lines:
        raise _refuse(fn, None, "its source is not available (defined in an interactive "
                      "prompt or by exec?); define it in a file or a notebook cell")
    found, module = [], _module_tree(code.co_filename, lines)
    for tree in (module, _block_tree(lines, code.co_firstlineno)):
        found = [n for n in _candidates(tree, code)] if tree is not None else []
        if found:
            break
    imported = _imported_names(module, fn)
    if not found:
        raise _refuse(fn, None, "cannot find its definition in its source at this line "
                      "(the file changed since import?); define it with def")
    matching = [n for n in found if _code_matches(n, code, imported)]
    if not matching:
        raise _refuse(fn, None, "its source no longer matches the code that runs (the file "
                      "was edited after import); re-import the module or restart")
    node = matching[0]
    args = node.args
    if nargs is not None and (len(args.args) + len(args.posonlyargs) != nargs or args.vararg
                              or args.kwonlyargs or args.kwarg):
        raise _refuse(fn, node, f"must take exactly {nargs} positional parameters")
    return node


def name_of(fn) -> str:
    return getattr(fn, "__qualname__", repr(fn))


EMPTY = object()  # an empty closure cell


def lookup(fn: Callable, name: str):
    """The value ``name`` has for ``fn``: closure, then module globals, then builtins
    (``EMPTY`` for an empty cell, KeyError when undefined)."""
    code = fn.__code__
    if name in code.co_freevars:
        try:
            return fn.__closure__[code.co_freevars.index(name)].cell_contents
        except ValueError:
            return EMPTY
    if name in fn.__globals__:
        return fn.__globals__[name]
    builtins_ = fn.__globals__.get("__builtins__", builtins)
    if isinstance(builtins_, dict):
        return builtins_[name]
    return getattr(builtins_, name) if hasattr(builtins_, name) else builtins.__dict__[name]


@functools.lru_cache(maxsize=1024)
def global_names(code) -> tuple[str, ...]:
    """The names ``code`` (and code nested in it) reads as globals, from its bytecode."""
    out = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out.update(global_names(const))
    return tuple(sorted(out))


def cell_getter(fn: Callable, name: str):
    if name in fn.__code__.co_freevars:
        cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
        return lambda: cell.cell_contents
    return lambda: fn.__globals__[name]


def body_of(node) -> list[ast.stmt]:
    if isinstance(node, ast.Lambda):
        return [ast.Return(node.body)]
    return node.body
