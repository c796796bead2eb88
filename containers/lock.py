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
    pins, stack = {}, [Requirement(r) for r in roots]
    while stack:
        req = stack.pop()
        name = _name(req.name)
        if name in pins:
            continue
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


if __name__ == "__main__":
    print(HEADER)
    for name, version in closure().items():
        print(f"{name}=={version}")
