"""Kernel entry points generated from the flag dataclasses (``flags``).

cuTile 1.7 launches through the ``cutile_python_v1`` calling convention: a ``@ct.kernel``
takes arrays and scalars, each compile-time flag one ``ct.Constant`` parameter (no tuple,
dataclass or ``**kwargs`` parameter, and its frontend rejects ``Flags(**values)`` in device
code). So each entry point's source is written here from its family's fields: the
``FLAGS`` placeholder of a template's parameter list becomes one ``ct.Constant`` parameter
per field the entry point takes (in the dataclass's order, its own fields before the
sequences' ones), and ``FLAGS`` in its body the dataclass built from them by keyword. The
fields it does not take are fixed: ``fixed``'s value, else the field's default, else off
(False). A field's ``scope`` (``flags.flag``) says which entry points take it. cuTile reads
a kernel's source through ``inspect``, so the generated text is registered in ``linecache``
under a name of its own.
"""

from __future__ import annotations
import __future__

import dataclasses
import linecache
import re

from .flags import ModFlags, SeqFlags

_CONST = {"int": "ConstInt", "bool": "ConstBool"}


def declared_fields(cls) -> list:
    """``cls``' fields in the order the flags were declared before ``ModFlags`` and
    ``ScoreFlags`` held the shared ones (the entry points' parameter order): the
    sequences', the family's own, then the variant's (a base's fields come first in
    ``dataclasses.fields``, so ``ModFlags``' are moved behind the family's)."""
    seq = {f.name for f in dataclasses.fields(SeqFlags)}
    mod = {f.name for f in dataclasses.fields(ModFlags)} - seq
    fields = dataclasses.fields(cls)
    return ([f for f in fields if f.name in seq] + [f for f in fields if f.name not in seq | mod]
            + [f for f in fields if f.name in mod])


def entry_fields(cls, scopes) -> tuple[str, ...]:
    """The flags an entry point of ``scopes`` takes as parameters, in declaration order:
    the family's own fields, then the sequences' (``SeqFlags``)."""
    seq = list(dataclasses.fields(SeqFlags))
    own = [f for f in declared_fields(cls) if f.name not in {s.name for s in seq}]
    return tuple(f.name for f in own + seq if f.metadata.get("scope") in scopes)


def entry_source(cls, scopes, template: str, fixed: dict | None = None) -> str:
    """The entry point's source: ``template`` with its two ``FLAGS`` written out."""
    fixed = fixed or {}
    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    taken = [n for n in entry_fields(cls, scopes) if n not in fixed]
    params = ", ".join(f"{n}: {_CONST[types[n]]}" for n in taken)
    args = [f"{n}={n}" for n in taken]
    for f in declared_fields(cls):
        if f.name in taken:
            continue
        if f.name in fixed:
            args.append(f"{f.name}={fixed[f.name]!r}")
        elif f.default is dataclasses.MISSING:
            args.append(f"{f.name}=False")  # a flag this entry point leaves off
    head, sep, body = template.partition("):\n")
    if not sep or len(re.findall(r"\bFLAGS\b", head)) != 1 or len(
            re.findall(r"\bFLAGS\b", body)) != 1:
        raise ValueError("an entry template has one FLAGS parameter and one FLAGS use")
    return (re.sub(r"\bFLAGS\b", params, head) + sep
            + re.sub(r"\bFLAGS\b", f"{cls.__name__}({', '.join(args)})", body))


def entry_point(cls, scopes, template: str, namespace: dict, fixed: dict | None = None):
    """The ``@ct.kernel`` of ``template`` (a ``def``), its flags ``cls``' fields of
    ``scopes``, compiled against ``namespace`` (the kernel module's globals: the variant
    functions ``mods.with_mods`` replaces are read there)."""
    import cuda.tile as ct

    source = entry_source(cls, scopes, template.strip() + "\n", fixed)
    name = re.match(r"def (\w+)", source).group(1)
    filename = f"<{namespace['__name__']}.{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    code = compile(source, filename, "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)
    local: dict = {}
    exec(code, namespace, local)  # noqa: S102 - our own template, written out above
    fn = local[name]
    fn.__module__ = namespace["__name__"]
    return ct.kernel(fn)

