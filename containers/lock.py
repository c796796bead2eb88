"""Print containers/requirements.lock from the running environment: the exact version of
every distribution tiledattention[gpu,workflow,hf] needs, except torch and numpy (a GPU
node's or base image's own builds), and the baselines extra's exact pins as pyproject.toml
lists them (FA4's CUDA 13 wheels need not be installed where the lock is written).

    python containers/lock.py > containers/requirements.lock
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ("tiledattention[gpu,workflow,hf]",)
BASE = {"torch", "numpy", "tiledattention"}  # from the image / node, or the project itself
# Extras copied from pyproject.toml as they are: each line one exact ``==`` pin, their
# closure listed in the extra itself (beside torch, protobuf and cuda-bindings).
PINNED_EXTRAS = ("baselines",)
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _name(n: str) -> str:
    return re.sub(r"[-_.]+", "-", n).lower()


def closure(roots=ROOTS) -> dict[str, str]:
    pins, stack, seen = {}, [Requirement(r) for r in roots], set()
    while stack:
        req = stack.pop()
        name = _name(req.name)
        if (name, frozenset(req.extras)) in seen:  # rdflib, then rdflib[html]: both
            continue
        seen.add((name, frozenset(req.extras)))
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            sys.exit(f"lock.py: {req.name} is not installed in this environment")
        if name in BASE and name != "tiledattention":
            continue
        if name not in BASE:
            pins[name] = dist.version
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e})
                                         for e in (req.extras or {""})):
                stack.append(dep)
    return dict(sorted(pins.items()))


def pinned_extras(extras=PINNED_EXTRAS, pyproject=PYPROJECT) -> dict[str, str]:
    """The extras' pins from pyproject.toml; a line that is not one exact pin is refused."""
    import tomllib  # Python >= 3.11, where the lock is written

    deps = tomllib.loads(Path(pyproject).read_text())["project"]["optional-dependencies"]
    pins = {}
    for extra in extras:
        for text in deps[extra]:
            spec = list(Requirement(text).specifier)
            if len(spec) != 1 or spec[0].operator != "==":
                sys.exit(f"lock.py: {extra} extra: {text!r} is not one exact == pin")
            pins[_name(Requirement(text).name)] = spec[0].version
    return pins


HEADER = """\
# Exact versions of everything tiledattention[gpu,workflow,hf,baselines] needs beside torch and
# numpy (the base image's or the node's). Installed with --no-deps into the containers and packed
# by `tiledattn offline pack`. Regenerate: python containers/lock.py > containers/requirements.lock
# (tests check that the cuTile pins agree with pyproject.toml and containers/versions.env)."""


DEV_HEADER = """\
# Exact versions of what the tests add to containers/requirements.lock (tiledattention[dev]'s
# closure less what that lock pins, and the few it pins otherwise, DEV_OVERRIDES in lock.py):
# scripts/setup.sh installs with the two merged as pip constraints (this file winning), so a
# distribution's own package (Debian's python3-pyparsing 3.0.9) never stands in for a locked
# one. Regenerate: python containers/lock.py dev > containers/requirements-dev.lock"""


# Pinned again for the tests, over requirements.lock: roc-validator 0.13 needs rich < 14.
DEV_OVERRIDES = {"rich"}


def _locked() -> set[str]:
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.lock")
    with open(path) as f:
        return {_name(ln.split("==")[0]) for ln in f if "==" in ln and not ln.startswith("#")}


if __name__ == "__main__":
    if sys.argv[1:] == ["dev"]:
        print(DEV_HEADER)
        locked = _locked()
        for name, version in closure(("tiledattention[dev]",)).items():
            if name not in locked or name in DEV_OVERRIDES:
                print(f"{name}=={version}")
        sys.exit(0)
    print(HEADER)
    for name, version in sorted({**closure(), **pinned_extras()}.items()):
        print(f"{name}=={version}")
