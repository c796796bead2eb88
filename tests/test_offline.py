"""The offline wheelhouse installs into a fresh environment with no index at all."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tiledattention.offline import OfflineError, PackOptions, locked

ROOT = Path(__file__).resolve().parent.parent


def test_pack_options_are_checked():
    with pytest.raises(OfflineError, match="expected e.g. 3.12"):
        PackOptions("d", python="312")
    with pytest.raises(OfflineError, match="valid are \\['gpu', 'node'\\]"):
        PackOptions("d", extras=("gpu", "docs"))


def test_the_gpu_extra_packs_the_locked_cutile_toolchain():
    pins = dict(p.split("==") for p in locked(("gpu",)))
    assert pins["cuda-tile"] == "1.7.0" and pins["nvidia-cuda-tileiras"] == "13.4.92"


@pytest.mark.xdist_group("offline")
def test_wheelhouse_installs_with_no_index_and_imports(tmp_path):
    import torch

    house = tmp_path / "wheels"
    # torch is packed as well so the fresh environment needs nothing from this one; the
    # same version as here, which the local index has as a CPU build.
    pack = subprocess.run([sys.executable, "-m", "tiledattention.cli", "offline", "pack",
                           str(house), "--torch", f"torch=={torch.__version__.split('+')[0]}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert pack.returncode == 0, pack.stderr[-3000:]
    assert (house / "SHA256SUMS").exists() and (house / "install.sh").exists()
    env_dir = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL",
                                                               "PIP_FIND_LINKS")}
    clean["PATH"] = f"{env_dir / 'bin'}:{clean['PATH']}"
    install = subprocess.run(["sh", str(house / "install.sh")], capture_output=True,
                             text=True, timeout=900, env=clean)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    probe = subprocess.run([str(py), "-c", "import tiledattention, cuda.tile, submitit, yaml; "
                            "from tiledattention.toolchain import tileiras_version; "
                            "print(tiledattention.__file__); print(tileiras_version())"],
                           cwd="/", capture_output=True, text=True, timeout=300, env=clean)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.splitlines()[0].startswith(str(env_dir))
    assert "13.4" in probe.stdout
