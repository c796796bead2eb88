"""A wheelhouse for a node without network: the project, its pinned dependencies and the
cuTile toolchain (tileiras, ptxas, libnvvm come as wheels), for one Python version and
platform. Torch is left out unless asked for: GPU nodes and images bring their own CUDA
build, and a CUDA torch wheel is several GB.

    tiledattn offline pack DIR --python 3.12 --platform manylinux_2_28_x86_64
    # on the node: checks SHA256SUMS, then installs DIR/requirements.txt (exact versions)
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


class OfflineError(TiledAttentionError, RuntimeError):
    """The wheelhouse could not be built; the message says which step and why."""


@dataclass(frozen=True)
class PackOptions:
    dest: str
    python: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platform: str = "manylinux_2_28_x86_64"
    extras: tuple[str, ...] = ("gpu", "node")
    torch: str | None = None  # e.g. "torch==2.11.0" to pack torch too

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python):
            raise OfflineError(f"--python {self.python!r}: expected e.g. 3.12")
        unknown = sorted(set(self.extras) - set(EXTRAS))
        if unknown:
            raise OfflineError(f"--extras {unknown}: valid are {sorted(EXTRAS)}")


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
    os.makedirs(o.dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # to know which wheel this build made
        _pip("wheel", "--no-deps", "-q", "-w", tmp, source)
        built = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if len(built) != 1:
            raise OfflineError(f"pip wheel {source} made {built}, expected one wheel")
        shutil.move(os.path.join(tmp, built[0]), os.path.join(o.dest, built[0]))
    project_version = built[0].split("-")[1]
    target = ["--only-binary=:all:", "--python-version", o.python, "--implementation", "cp",
              "-d", o.dest]
    for tag in _platforms(o.platform):
        target += ["--platform", tag]
    pins = locked(o.extras)
    _pip("download", "-q", "--no-deps", *target, *pins)
    if o.torch:  # with its own dependencies (sympy, networkx, the CUDA wheels, ...)
        _pip("download", "-q", *target, o.torch, "numpy")
    else:
        _pip("download", "-q", "--no-deps", *target, *COMPANIONS)
    wheels = sorted(f for f in os.listdir(o.dest) if f.endswith(".whl"))
    with open(os.path.join(o.dest, "SHA256SUMS"), "w") as f:
        for w in wheels:
            with open(os.path.join(o.dest, w), "rb") as g:
                f.write(f"{hashlib.sha256(g.read()).hexdigest()}  {w}\n")
    # Exact versions, so wheels left in DIR by an earlier pack cannot be picked instead.
    spec = "tiledattention[gpu]" if "gpu" in o.extras else "tiledattention"
    with open(os.path.join(o.dest, "requirements.txt"), "w") as f:
        f.write(f"# installed by install.sh from this directory only (pip --no-index)\n"
                f"{spec}=={project_version}\n" + "".join(f"{p}\n" for p in pins)
                + (f"{o.torch}\n" if o.torch else ""))
    with open(os.path.join(o.dest, "install.sh"), "w") as f:
        f.write("#!/bin/sh\n# Install TiledAttention from this wheelhouse, no network: torch "
                "must already be\n# installed unless it was packed (--torch).\nset -e\n"
                'here=$(cd "$(dirname "$0")" && pwd)\n'
                '(cd "$here" && sha256sum -c --quiet SHA256SUMS)\n'
                'python3 -m pip install --no-index --find-links "$here" '
                '-r "$here/requirements.txt" "$@"\n')
    os.chmod(os.path.join(o.dest, "install.sh"), 0o755)
    return {"dest": o.dest, "wheels": len(wheels), "python": o.python, "platform": o.platform,
            "tiledattention": project_version}
