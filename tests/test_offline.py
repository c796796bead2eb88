"""The offline wheelhouse installs into a fresh environment with no index at all.

The two install tests are slow (about a minute each on 2 cores: a wheel build, a fresh
venv, a real pip install); they need no network, only the wheels pip can already reach."""

from __future__ import annotations

import base64
import hashlib
import os
import platform
import re
import subprocess
import sys
import venv
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
from study_kit import cli

from tiledattention.offline import OfflineError, PackOptions, locked

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = f"manylinux_2_28_{platform.machine()}"  # the running machine's, for the fresh venv


def test_pack_options_are_checked():
    with pytest.raises(OfflineError, match="expected e.g. 3.12"):
        PackOptions("d", python="312")
    with pytest.raises(OfflineError, match="valid are \\['gpu', 'node'\\]"):
        PackOptions("d", extras=("gpu", "docs"))


def test_the_gpu_extra_packs_the_locked_cutile_toolchain():
    pins = dict(p.split("==") for p in locked(("gpu",)))
    assert pins["cuda-tile"] == "1.7.0" and pins["nvidia-cuda-tileiras"] == "13.4.92"


def test_a_missing_lock_is_named(tmp_path):
    with pytest.raises(OfflineError, match="nolock is missing"):
        locked(("gpu",), lock=str(tmp_path / "nolock"))


def _pack(house: Path, *extra: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", "offline", "pack",
                          str(house), "--platform", PLATFORM, *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"wheels for Python {sys.version_info.major}.{sys.version_info.minor}" in out.stdout
    # SHA256SUMS covers every wheel, with the right hashes; the pins are exact.
    sums = dict(ln.split("  ")[::-1] for ln in (house / "SHA256SUMS").read_text().splitlines())
    wheels = sorted(p.name for p in house.glob("*.whl"))
    assert sorted(sums) == wheels and any(w.startswith("tiledattention-0.1.0-") for w in wheels)
    for w in wheels:
        assert hashlib.sha256((house / w).read_bytes()).hexdigest() == sums[w], w
    lines = [ln for ln in (house / "requirements.txt").read_text().splitlines()
             if not ln.startswith("#")]
    # Exact pins, each with the sha256 of its wheel(s): pip runs with --require-hashes.
    assert all(re.fullmatch(r"[\w\-\[\]]+==\S+( --hash=sha256:[0-9a-f]{64})+", r)
               for r in lines), lines
    reqs = [ln.split(" ")[0] for ln in lines]
    assert reqs[0] == "tiledattention[gpu]==0.1.0" and "cuda-tile==1.7.0" in reqs


def _fresh_env(where: Path) -> tuple[Path, dict[str, str]]:
    venv.EnvBuilder(with_pip=True).create(where)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
                        "VIRTUAL_ENV")}
    env["PATH"] = f"{where / 'bin'}:{env['PATH']}"  # install.sh's python3 is the fresh one
    # No pip config either: its find-links would offer wheels from outside the wheelhouse.
    env["PIP_CONFIG_FILE"] = os.devnull
    return where / "bin" / "python", env


def _probe(py: Path, env: dict[str, str]) -> list[str]:
    out = subprocess.run([str(py), "-c", "import tiledattention, cuda.tile, torch, submitit, yaml; "
                          "from tiledattention.kernel.toolchain import tileiras_version; "
                          "print(tiledattention.__file__); print(cuda.tile.__file__); "
                          "print(torch.__file__); print(tileiras_version())"],
                         cwd="/", capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


@pytest.mark.xdist_group("offline-torch")
def test_wheelhouse_with_torch_installs_with_no_index_and_imports(tmp_path):
    import torch

    house = tmp_path / "wheels"
    # torch packed as well (--torch): the fresh environment needs nothing from this one. The
    # same version as here, which pip's configured wheels have as a CPU build.
    _pack(house, "--torch", f"torch=={torch.__version__.split('+')[0]}")
    assert any(p.name.startswith("torch-") for p in house.glob("*.whl"))
    py, env = _fresh_env(tmp_path / "fresh")
    install = subprocess.run(["sh", str(house / "install.sh")], capture_output=True,
                             text=True, timeout=900, env=env)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    ours, tile, torch_file, tileiras = _probe(py, env)
    for path in (ours, tile, torch_file):
        assert path.startswith(str(tmp_path / "fresh")), path
    assert "13.4" in tileiras
    # A wheel changed after packing: install.sh stops before pip runs.
    sums = house / "SHA256SUMS"
    sums.write_text(re.sub(r"^[0-9a-f]{64}", "0" * 64, sums.read_text(), count=1))
    tampered = subprocess.run(["sh", str(house / "install.sh")], capture_output=True,
                              text=True, timeout=120, env=env)
    assert tampered.returncode != 0 and "FAILED" in tampered.stdout + tampered.stderr


def _link_node_torch(dest: Path) -> None:
    """Link torch, numpy and torch's own requirements from this environment into dest: what
    a GPU node's module or image provides, since the default pack leaves torch out."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = ["torch", "numpy"]
    while todo:
        dist = distribution(todo.pop())
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if name in seen:
            continue
        seen.add(name)
        tops = {str(f).split("/")[0] for f in dist.files or []}
        for top in tops - {"__pycache__"}:
            src = Path(dist.locate_file(top))
            if not top.startswith("..") and src.exists() and not (dest / top).exists():
                (dest / top).symlink_to(src)
        todo += [r.name for r in map(Requirement, dist.requires or [])
                 if r.marker is None or r.marker.evaluate({"extra": ""})]


@pytest.mark.xdist_group("offline-node")
def test_default_wheelhouse_installs_beside_a_node_provided_torch(tmp_path):
    house = tmp_path / "wheels"
    _pack(house)  # the default: no torch, but a setuptools for a node torch that needs one
    assert not any(p.name.startswith("torch-") for p in house.glob("*.whl"))
    assert any(p.name.startswith("setuptools-") for p in house.glob("*.whl"))
    node = tmp_path / "node-torch"
    node.mkdir()
    _link_node_torch(node)
    py, env = _fresh_env(tmp_path / "fresh")
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "node-torch.pth").write_text(f"{node}\n")  # as a module's PYTHONPATH would
    install = subprocess.run(["sh", str(house / "install.sh")], capture_output=True,
                             text=True, timeout=900, env=env)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    ours, tile, torch_file, _ = _probe(py, env)
    assert ours.startswith(site) and tile.startswith(site), (ours, tile)
    assert torch_file.startswith(str(node)), torch_file
    assert not Path(site, "torch").exists()  # pip took the node's torch as installed


def _wheel(dest: Path, name: str, version: str, body: str, build: str = "") -> str:
    tag = f"{name}-{version}" + (f"-{build}" if build else "") + "-py3-none-any.whl"
    di = f"{name}-{version}.dist-info"
    files = {f"{name}.py": body,
             f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
                            "Tag: py3-none-any\n" + (f"Build: {build}\n" if build else "")}
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},{len(c)}\n"  # noqa: E501
        for p, c in files.items()) + f"{di}/RECORD,,\n"
    with zipfile.ZipFile(dest / tag, "w") as z:
        for p, c in files.items():
            z.writestr(p, c)
        z.writestr(f"{di}/RECORD", record)
    return tag


def test_install_sh_installs_only_listed_wheels_checked_by_hash(tmp_path):
    from tiledattention.offline import write_installer

    house = tmp_path / "house"
    house.mkdir()
    good = _wheel(house, "demo", "1.0", "X = 'good'\n")
    write_installer(str(house), [good], ["demo==1.0"])
    assert "--require-hashes" in (house / "install.sh").read_text()
    _wheel(house, "demo", "1.0", "X = 'evil'\n", build="1")  # pip prefers a higher build tag
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PIP_NO_INPUT": "1"}
    run = subprocess.run(["sh", str(house / "install.sh"), "-q", "--target",
                          str(tmp_path / "t")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "t" / "demo.py").read_text() == "X = 'good'\n"
    # A listed wheel swapped for another: pip's hash check refuses it.
    (house / good).unlink()
    _wheel(house, "demo", "1.0", "X = 'evil'\n")
    run = subprocess.run(["sh", str(house / "install.sh"), "--target", str(tmp_path / "u")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and not (tmp_path / "u" / "demo.py").exists()


def test_offline_pack_takes_only_a_torch_requirement(tmp_path):
    code, err = cli("offline", "pack", str(tmp_path / "w"), "--torch=--index-url=http://x")
    assert code == 2 and "expected a requirement on torch" in err
    assert not (tmp_path / "w").exists()
