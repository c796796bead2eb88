"""Lend this interpreter's PyTorch to a virtual environment, and nothing else of its.

    PYTHON_WITH_TORCH scripts/borrow-torch.py VENV_SITE_PACKAGES

scripts/setup.sh makes its venv without the system's site packages (a distribution's own
packages, e.g. Debian's python3-pyparsing 3.0.9, would stand in for the locked versions) and
runs this with the interpreter that has torch (a GPU node's build): torch and what it needs
at run time that the locks do not pin (triton, the nvidia-* CUDA libraries, sympy,
networkx, numpy: the node's own builds) are linked into VENV/../borrowed-torch, which one
.pth file puts on the venv's path after its own site-packages. Everything a lock pins is
left to pip, so the venv's own copy is the locked one.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import PackageNotFoundError, distribution

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCKS = ("containers/requirements.lock", "containers/requirements-dev.lock")
NEVER = {"pip", "setuptools", "wheel"}  # the venv's own tools
EXTRA = ("numpy",)  # not a torch requirement, but built against the node's torch
PTH = "_borrowed_torch.pth"


def _name(n: str) -> str:
    return re.sub(r"[-_.]+", "-", n).lower()


def _requirement(text: str) -> str | None:
    """The distribution a Requires-Dist line names, None when only an extra needs it (a
    node's interpreter may lack ``packaging``: markers are read, not fully evaluated; one
    read too widely only links what is installed anyway)."""
    try:
        from packaging.requirements import Requirement

        req = Requirement(text)
        return req.name if req.marker is None or req.marker.evaluate({"extra": ""}) else None
    except ImportError:
        name = re.match(r"[A-Za-z0-9._-]+", text.strip())
        return None if not name or "extra" in text.partition(";")[2] else name.group(0)


def locked() -> set[str]:
    names = set()
    for rel in LOCKS:
        with open(os.path.join(ROOT, rel)) as f:
            names |= {_name(ln.split("==")[0]) for ln in f if "==" in ln
                      and not ln.startswith("#")}
    return names


def borrowed(pinned: set[str]) -> list:
    """torch and its run-time requirements (their closure) that no lock pins, installed."""
    out, seen, stack = [], set(), ["torch", *EXTRA]
    while stack:
        req = stack.pop()
        name = _name(req)
        if name in seen or name in NEVER or (name in pinned and name != "torch"):
            continue
        seen.add(name)
        try:
            dist = distribution(req)
        except PackageNotFoundError:
            continue  # an optional or platform-only requirement
        out.append(dist)
        stack += [n for n in map(_requirement, dist.requires or []) if n]
    return out


def top_levels(dist) -> set[str]:
    """The entries a distribution puts in its site directory (packages, modules, its
    metadata directory), from its RECORD (or top_level.txt without one)."""
    names = set()
    for f in dist.files or []:
        first = f.parts[0] if f.parts else ""
        if first and first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    if not names:
        names = set((dist.read_text("top_level.txt") or "").split())
    meta = getattr(dist, "_path", None)  # the .dist-info / .egg-info itself
    if meta is not None:
        names.add(os.path.basename(str(meta)))
    return names


def venv_root(site: str) -> str:
    """The virtual environment SITE belongs to: the directory above it holding pyvenv.cfg,
    else the one holding its lib/ (VENV/lib/pythonX.Y/site-packages), else SITE's parent."""
    site = os.path.abspath(site)
    here = site
    for _ in range(4):
        if os.path.exists(os.path.join(here, "pyvenv.cfg")):
            return here
        here = os.path.dirname(here)
    here = site
    while os.path.dirname(here) != here:
        if os.path.basename(here) == "lib":
            return os.path.dirname(here)
        here = os.path.dirname(here)
    return os.path.dirname(site)


def own_torch(site: str) -> str | None:
    """Where this interpreter's torch lies when it is the venv's own (installed in it, or
    lent to it earlier): lending it would link the venv to itself and list torch twice.
    Paths are compared as given and resolved (a venv's python links to the system's)."""
    try:
        base = str(distribution("torch").locate_file(""))
    except PackageNotFoundError:
        return None
    root = venv_root(site)
    for where, inside in ((os.path.abspath(base), os.path.abspath(root)),
                          (os.path.realpath(base), os.path.realpath(root))):
        if os.path.commonpath([where, inside]) == inside:
            return base
    return None


def lend(site: str) -> list[str]:
    """Link the borrowed distributions into SITE/../borrowed-torch; the names linked."""
    into = os.path.join(os.path.dirname(os.path.abspath(site)), "borrowed-torch")
    os.makedirs(into, exist_ok=True)
    for old in os.listdir(into):  # what an earlier run lent: only links of ours live here
        if os.path.islink(os.path.join(into, old)):
            os.unlink(os.path.join(into, old))
    linked = []
    for dist in borrowed(locked()):
        base = str(dist.locate_file(""))
        for top in sorted(top_levels(dist)):
            src, dest = os.path.join(base, top), os.path.join(into, top)
            if os.path.exists(src) and not os.path.lexists(dest):
                os.symlink(src, dest)
                linked.append(top)
    with open(os.path.join(site, PTH), "w") as f:
        f.write(into + "\n")
    return linked


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: PYTHON_WITH_TORCH scripts/borrow-torch.py VENV_SITE_PACKAGES")
    if (own := own_torch(sys.argv[1])) is not None:
        print(f"borrow-torch: {sys.executable}'s torch ({own}) is the venv's own; nothing lent "
              "(run scripts/setup.sh outside the venv, or set TORCH_FROM to the system's "
              "python)", file=sys.stderr)
        sys.exit(0)
    names = lend(sys.argv[1])
    print(f"borrow-torch: {len(names)} entries of {sys.executable}'s torch lent to the venv "
          f"({', '.join(n for n in names if not n.endswith('-info'))[:200]})", file=sys.stderr)
