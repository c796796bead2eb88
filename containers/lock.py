"""Print containers/requirements.lock from the running environment: the exact version of
every distribution tiledattention[gpu,workflow,hf] needs, except torch and numpy (a GPU
node's or base image's own builds).

    python containers/lock.py > containers/requirements.lock
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement

ROOTS = ("tiledattention[gpu,workflow,hf]",)
BASE = {"torch", "numpy", "tiledattention"}  # from the image / node, or the project itself


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


HEADER = """\
# Exact versions of everything tiledattention[gpu,workflow,hf] needs beside torch and numpy
# (the base image's or the node's). Installed with --no-deps into the containers and packed
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
    for name, version in closure().items():
        print(f"{name}=={version}")
