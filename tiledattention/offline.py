"""A wheelhouse for a node without network: the project, its pinned dependencies and the
cuTile toolchain (tileiras, ptxas, libnvvm come as wheels), for one Python version and
platform. Torch is left out unless asked for: GPU nodes and images bring their own CUDA
build, and a CUDA torch wheel is several GB.

    tiledattn offline pack DIR --python 3.12 --platform manylinux_2_28_x86_64
    # on the node: checks SHA256SUMS, then installs DIR/requirements.txt with pip's
    # --require-hashes: only the wheels this pack listed, each checked against its sha256
    sh DIR/install.sh
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from .errors import TiledAttentionError

LOCK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "containers",
                    "requirements.lock")
# What a compute node runs: the kernel (gpu extra) and submitit jobs (submitit, pyyaml).
EXTRAS = {"gpu": ("cuda-tile", "cuda-toolkit", "nvidia-cuda-tileiras", "nvidia-cuda-nvcc",
                  "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-nvjitlink"),
          "node": ("submitit", "cloudpickle", "typing-extensions", "pyyaml")}

# Carried beside the pins when torch is not packed, installed only if the node's torch asks
# for it: torch 2.13 requires setuptools>=77.0.3 (2.10-2.12: <82), and a Python <= 3.11 venv
# brings its own setuptools 65, which would shadow the node's and leave pip, with no index,
# nothing to satisfy torch with. requirements.txt does not name it.
COMPANIONS = ("setuptools==80.9.0",)

# --torch takes a requirement on torch and nothing else (no pip option, URL or marker).
_VERSION_CLAUSE = r"\s*(===|==|>=|<=|~=|!=|<|>)\s*[0-9][0-9A-Za-z.+!*]*"
TORCH_SPEC = re.compile(rf"torch(?:{_VERSION_CLAUSE}(?:\s*,{_VERSION_CLAUSE})*)?")


class OfflineError(TiledAttentionError, RuntimeError):
    """The wheelhouse could not be built; the message says which step and why."""


class OfflineOptionError(OfflineError, ValueError):
    """An option of ``offline pack`` is not acceptable (bad input, not a failed step)."""


@dataclass(frozen=True)
class PackOptions:
    dest: str
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform: str = "manylinux_2_28_x86_64"
    extras: tuple[str, ...] = ("gpu", "node")
    torch: str | None = None  # e.g. "torch==2.11.0" to pack torch too

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise OfflineOptionError(f"--python {self.python!r}: expected e.g. 3.12")
        unknown = sorted(set(self.extras) - set(EXTRAS))
        if unknown:
            raise OfflineOptionError(f"--extras {unknown}: valid are {sorted(EXTRAS)}")
        if self.torch is not None and not TORCH_SPEC.fullmatch(self.torch):
            raise OfflineOptionError(f"--torch {self.torch!r}: expected a requirement on torch, "
                                     "e.g. torch==2.11.0 (no pip options, URLs or markers)")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", self.platform):
            raise OfflineOptionError(f"--platform {self.platform!r}: expected a platform tag, "
                                     "e.g. manylinux_2_28_x86_64")


def locked(extras: tuple[str, ...], lock: str = LOCK) -> list[str]:
    if not os.path.exists(lock):
        raise OfflineError(f"{lock} is missing: pack from a source checkout")
    wanted = {n for e in extras for n in EXTRAS[e]}
    pins = []
    with open(lock) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and line.split("==")[0] in wanted:
                pins.append(line)
    missing = wanted - {p.split("==")[0] for p in pins}
    if missing:
        raise OfflineError(f"{lock} has no pin for {sorted(missing)}")
    return sorted(pins)


def _platforms(platform: str) -> list[str]:
    # pip matches manylinux tags exactly: offer the older compatible ones too.
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux1_{arch}"]


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise OfflineError(f"{' '.join(cmd[2:5])} … failed:\n{run.stderr.strip()[-1500:]}")


def pack(o: PackOptions, source: str | None = None) -> dict:
    source = source or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(source, "pyproject.toml")):
        raise OfflineError(f"{source} is not a source checkout (no pyproject.toml)")
    pins = locked(o.extras)
    os.makedirs(o.dest, exist_ok=True)
    # Everything lands in a fresh staging dir first, so the lists name exactly this pack's
    # wheels (never one left in DEST by an earlier pack or by anyone else).
    stage = tempfile.mkdtemp(prefix=".pack-", dir=o.dest)
    try:
        _pip("wheel", "--no-deps", "-q", "-w", stage, source)
        built = [f for f in os.listdir(stage) if f.endswith(".whl")]
        if len(built) != 1:
            raise OfflineError(f"pip wheel {source} made {built}, expected one wheel")
        project_version = built[0].split("-")[1]
        target = ["--only-binary=:all:", "--python-version", o.python, "--implementation",
                  "cp", "-d", stage]
        for tag in _platforms(o.platform):
            target += ["--platform", tag]
        _pip("download", "-q", "--no-deps", *target, *pins)
        if o.torch:  # with its own dependencies (sympy, networkx, the CUDA wheels, ...)
            _pip("download", "-q", *target, o.torch, "numpy")
        else:
            _pip("download", "-q", "--no-deps", *target, *COMPANIONS)
        wheels = sorted(f for f in os.listdir(stage) if f.endswith(".whl"))
        for w in wheels:
            os.replace(os.path.join(stage, w), os.path.join(o.dest, w))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    spec = "tiledattention[gpu]" if "gpu" in o.extras else "tiledattention"
    top = [f"{spec}=={project_version}", *pins]
    if o.torch:
        top.append(f"torch=={_torch_version(wheels)}")
    write_installer(o.dest, wheels, top)
    return {"dest": o.dest, "wheels": len(wheels), "python": o.python, "platform": o.platform,
            "tiledattention": project_version}


def _name_version(wheel: str) -> tuple[str, str]:
    """(normalized name, version) of a wheel file name."""
    name, version = wheel.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), version


def _torch_version(wheels: list[str]) -> str:
    versions = {v for n, v in map(_name_version, wheels) if n == "torch"}
    if len(versions) != 1:
        raise OfflineError(f"expected one torch version among the packed wheels, got "
                           f"{sorted(versions)}")
    return versions.pop()


def write_installer(dest: str, wheels: list[str], requirements: list[str]) -> None:
    """SHA256SUMS, requirements.txt and install.sh for the wheels ``wheels`` in ``dest``.

    requirements.txt names every packed wheel, ``requirements`` first, each pinned with ==
    and hashed: pip --require-hashes refuses any requirement it reaches unpinned, and one
    reached only through a constraints file (setuptools, which a node's own torch pulls in)
    counts as unpinned there."""
    hashes: dict[tuple[str, str], list[str]] = {}
    with open(os.path.join(dest, "SHA256SUMS"), "w") as f:
        for w in wheels:
            h = hashlib.sha256()
            with open(os.path.join(dest, w), "rb") as g:
                for block in iter(lambda: g.read(1 << 20), b""):
                    h.update(block)
            f.write(f"{h.hexdigest()}  {w}\n")
            hashes.setdefault(_name_version(w), []).append(h.hexdigest())

    def line(spec: str, key: tuple[str, str]) -> str:
        return spec + "".join(f" --hash=sha256:{h}" for h in hashes[key]) + "\n"

    top, used = [], set()
    for req in requirements:
        name, version = req.split("==")
        key = (re.sub(r"[-_.]+", "-", name.split("[")[0]).lower(), version)
        if key not in hashes:
            raise OfflineError(f"{req}: no wheel of it was packed")
        top.append(line(req, key))
        used.add(key)
    rest = [line(f"{n}=={v}", (n, v)) for n, v in sorted(hashes) if (n, v) not in used]
    with open(os.path.join(dest, "requirements.txt"), "w") as f:
        f.write("# installed by install.sh from this directory only (pip --no-index "
                "--require-hashes): every wheel SHA256SUMS lists, pinned and hashed\n"
                + "".join(top + rest))
    with open(os.path.join(dest, "install.sh"), "w") as f:
        f.write(INSTALL_SH)
    os.chmod(os.path.join(dest, "install.sh"), 0o755)


# pip sees only the wheels SHA256SUMS lists (linked into a private directory), and checks
# each against the sha256 in requirements.txt: a wheel dropped into this
# directory later is never installed, whatever its version or build tag.
INSTALL_SH = """#!/bin/sh
# Install TiledAttention from this wheelhouse, no network: torch must already be
# installed unless it was packed (--torch). Only the wheels listed in SHA256SUMS are used,
# each checked against its sha256 (pip --require-hashes).
set -e
here=$(cd "$(dirname "$0")" && pwd)
(cd "$here" && sha256sum -c --quiet SHA256SUMS)
house=$(mktemp -d)
trap 'rm -rf "$house"' EXIT
trap 'exit 130' INT TERM
while read -r sum name; do
  case "$name" in
    ''|.*|*/*) echo "install.sh: bad file name in SHA256SUMS: $name" >&2; exit 2 ;;
  esac
  ln -s "$here/$name" "$house/$name"
done < "$here/SHA256SUMS"
python3 -m pip install --no-index --find-links "$house" --require-hashes \\
  -r "$here/requirements.txt" "$@"
"""
