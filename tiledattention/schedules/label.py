"""Schedule labels from field metadata: one writer and one parser for every schedule class.

A field that appears in the label carries ``label(...)`` metadata: its place in the label
(``at``), its text before the number (``prefix``), and either nothing (a number always
written), ``absent`` (a number written unless it has that value) or ``when`` (a word,
``prefix`` alone, written when the field has that value; absent, the field's default).
``Schedule`` (``64x128_o2_c1_lk2_lv4_w8_natural_k4_pdl``) and ``BwdSchedule``
(``kv64x128_q128x64_o1_w8_atomic_keyrows``) both read and write theirs here.
"""

from __future__ import annotations

import functools
import re
from dataclasses import MISSING, field, fields

_NO = object()


def label(at: int, prefix: str, *, default=MISSING, absent=_NO, when=_NO):
    """A dataclass field written into the schedule's label (see the module)."""
    meta = {"label": (at, prefix, absent, when)}
    return field(default=default, metadata=meta)


def _parts(cls) -> tuple:
    return tuple(sorted(((f.metadata["label"], f) for f in fields(cls)
                         if "label" in f.metadata), key=lambda p: p[0][0]))


def write(schedule) -> str:
    out = []
    for (_, prefix, absent, when), f in _parts(type(schedule)):
        value = getattr(schedule, f.name)
        if when is not _NO:
            out.append(prefix if value == when else "")
        elif absent is _NO or value != absent:
            out.append(f"{prefix}{value}")
    return "".join(out)


@functools.cache
def _pattern(cls) -> re.Pattern:
    text = ""
    for (_, prefix, absent, when), f in _parts(cls):
        if when is not _NO:
            text += f"(?P<{f.name}>{re.escape(prefix)})?"
        elif absent is not _NO:
            text += f"(?:{re.escape(prefix)}(?P<{f.name}>\\d+))?"
        else:
            text += f"{re.escape(prefix)}(?P<{f.name}>\\d+)"
    return re.compile(text)


def parse(cls, text: str):
    """The ``cls`` whose label is ``text``, or None when it is not one."""
    m = _pattern(cls).fullmatch(text)
    if m is None:
        return None
    values = {}
    for (_, _prefix, absent, when), f in _parts(cls):
        got = m.group(f.name)
        if when is not _NO:
            values[f.name] = when if got is not None else f.default
        else:
            values[f.name] = absent if got is None else int(got)
    return cls(**values)
