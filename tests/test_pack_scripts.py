"""The wheel-kit scripts never remove what they did not make: scripts/pack-study-wheels.sh
replaces only the files its manifest names, scripts/pack-baseline-wheels.sh only the loads
its marker names; a DEST holding anything else is refused in one line (exit 2) and left as
it was. pip is a stand-in here (no network): `python3 -m pip download|wheel` writes an empty
wheel per pin; every other python3 call is the real interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_PIP = """#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = pip ]; then
  dir=; pins=()
  shift 2
  while [ $# -gt 0 ]; do
    case "$1" in
      -d|-w) dir=$2; shift 2 ;;
      --platform|--python-version|--implementation|--find-links) shift 2 ;;
      *==*) pins+=("$1"); shift ;;
      *) shift ;;
    esac
  done
  mkdir -p "$dir"
  for p in "${pins[@]}"; do
    n=${p%%==*}; v=${p#*==}
    : > "$dir/${n//-/_}-$v-py3-none-any.whl"
  done
  exit 0
fi
exec %s "$@"
"""


def _run(script: str, dest: Path, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PIP % sys.executable)
    fake.chmod(0o755)
    return subprocess.run(["bash", f"scripts/{script}", str(dest)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_pack_study_wheels_replaces_only_its_own_files(tmp_path):
    dest = tmp_path / "kit"
    run = _run("pack-study-wheels.sh", dest, tmp_path)
    assert run.returncode == 0, run.stderr
    made = (dest / ".pack-study-wheels").read_text().split()
    assert made and all(n.endswith(".whl") for n in made)
    assert sorted(made) == sorted(p.name for p in dest.glob("*.whl"))
    (dest / made[0]).write_text("old")  # the last pack's own file: replaced
    run = _run("pack-study-wheels.sh", dest, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (dest / made[0]).read_text() == ""


@pytest.mark.parametrize("name", ["mine-1.0-py3-none-any.whl", "notes.tar.gz", ".hidden"])
def test_pack_study_wheels_refuses_a_dest_holding_other_files(tmp_path, name):
    dest = tmp_path / "kit"
    assert _run("pack-study-wheels.sh", dest, tmp_path).returncode == 0
    (dest / name).write_text("the user's")
    before = _tree(dest)
    run = _run("pack-study-wheels.sh", dest, tmp_path)
    assert run.returncode == 2 and name in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "nothing removed" in run.stderr
    assert _tree(dest) == before
    # a DEST that was never a kit: the same
    other = tmp_path / "wheels"
    other.mkdir()
    (other / "torch-2.11.0-cp312-linux_x86_64.whl").write_text("big")
    run = _run("pack-study-wheels.sh", other, tmp_path)
    assert run.returncode == 2 and (other / "torch-2.11.0-cp312-linux_x86_64.whl").exists()


def test_pack_baseline_wheels_replaces_only_its_own_loads(tmp_path):
    dest = tmp_path / "fa4kit"
    env = {"PINS": "a==1 b==2", "PART": "10", "LOAD": "20"}
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, **env)
    assert run.returncode == 0, run.stderr
    assert (dest / ".fa4kit-pack").read_text().split() == ["load1"]
    assert _run("pack-baseline-wheels.sh", dest, tmp_path, **env).returncode == 0
    (dest / "README.txt").write_text("the user's")
    before = _tree(dest)
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, **env)
    assert run.returncode == 2 and "README.txt" in run.stderr and _tree(dest) == before
    home = tmp_path / "home"  # a directory that was never a kit (was: rm -rf DEST)
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    run = _run("pack-baseline-wheels.sh", home, tmp_path, **env)
    assert run.returncode == 2 and (home / "thesis.tex").read_text() == "years of work"
