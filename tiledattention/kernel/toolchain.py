"""Locating cuTile and its tileiras compiler, with the install line when missing, and the
once-per-device check that a GPU can run what they build."""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import subprocess
import tempfile
from types import ModuleType

import torch

from ..errors import GPUTooOldError, ToolchainMissingError

MIN_CAPABILITY = (8, 0)  # tileiras targets Ampere and newer; tested on Hopper (sm_90)
INSTALL_LINE = "pip install 'cuda-tile[tileiras]>=1.7'  (or: pip install 'tiledattention[gpu]')"
# What reading SASS (the compile tests, benchmarks/bwd_sass.py) needs beside tileiras.
SASS_MISSING = ("cuobjdump/nvdisasm not found: pip install nvidia-cuda-cuobjdump "
                "nvidia-cuda-nvdisasm (in tiledattention[dev])")


@functools.cache
def kernel_module() -> ModuleType:
    """Import the kernel module (and so cuda.tile) once, or explain what is missing."""
    try:
        kernel = importlib.import_module(f"{__package__}.attention")
    except ImportError as exc:  # cuda.tile itself, or numpy under it
        raise ToolchainMissingError(
            f"cuTile is not importable ({exc}); install it with: {INSTALL_LINE}"
        ) from exc
    return kernel


def cuda_tool(name: str) -> str | None:
    """A CUDA tool (tileiras; cuobjdump and nvdisasm for SASS) in the order cuTile searches
    for tileiras: the pip wheels (``nvidia/cu13/bin``), PATH, then $CUDA_HOME/bin."""
    try:
        import nvidia  # the cu13 wheels install under the nvidia namespace
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        candidate = os.path.join(root, "cu13", "bin", name)
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    home = os.environ.get("CUDA_PATH") or os.environ.get("CUDA_HOME")
    if home and os.access(os.path.join(home, "bin", name), os.X_OK):
        return os.path.join(home, "bin", name)
    return None


def sass_tool() -> str | None:
    """cuobjdump where it can print SASS (its ``-sass`` runs nvdisasm), else None."""
    cuobjdump = cuda_tool("cuobjdump")
    return cuobjdump if cuobjdump and cuda_tool("nvdisasm") else None


def cuobjdump_text(cubin: bytes | os.PathLike, flag: str = "-sass",
                   cuobjdump: str | None = None) -> str:
    """What ``cuobjdump FLAG`` prints for a cubin (its bytes, or a file): ``-sass``,
    ``-res-usage``. ``cuobjdump`` defaults to ``sass_tool()``'s; callers check for it first
    (``SASS_MISSING``)."""
    tool = cuobjdump or sass_tool()
    if tool is None:
        raise ToolchainMissingError(SASS_MISSING)
    nvdisasm = cuda_tool("nvdisasm")  # cuobjdump finds it through NVDISASM_PATH, else PATH
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm)) if nvdisasm else None
    if not isinstance(cubin, bytes):
        return subprocess.run([tool, flag, os.fspath(cubin)], capture_output=True, text=True,
                              check=True, env=env).stdout
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True,
                              env=env).stdout


def tileiras_path() -> str | None:
    return cuda_tool("tileiras")


@functools.cache
def tileiras_version() -> str:
    path = tileiras_path()
    if path is None:
        raise ToolchainMissingError(f"tileiras (the cuTile compiler) was not found; {INSTALL_LINE}")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    release = [ln for ln in lines if "release" in ln]
    return (release or lines or ["unknown"])[-1]


@functools.cache
def check_gpu(index: int) -> None:
    """Once per device: capability and toolchain, so the call path stays cheap (the
    tensors' own device is ``validate.check_device``'s)."""
    cap = torch.cuda.get_device_capability(index)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        raise GPUTooOldError(
            f"{name} has compute capability {cap[0]}.{cap[1]}; cuTile needs "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ampere, Hopper, Blackwell)")
    kernel_module()
    if tileiras_path() is None:
        raise ToolchainMissingError(f"tileiras (the cuTile compiler) was not found on PATH or "
                                    f"in $CUDA_HOME/bin; {INSTALL_LINE}")
