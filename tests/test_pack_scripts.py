"""The wheel-kit scripts never remove what they did not make: scripts/pack-study-wheels.sh
replaces only the files its manifest names, scripts/pack-baseline-wheels.sh only the loads
its marker names; a DEST holding anything else is refused in one line (exit 2) and left as
it was. pip is a stand-in here (no network): `python3 -m pip download|wheel` writes a wheel
of FAKE_WHEEL_BYTES zeros per pin; every other python3 call is the real interpreter (whose
files stop growing at FAKE_FULL_KB: a full disk)."""

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
    head -c "${FAKE_WHEEL_BYTES:-0}" /dev/zero > "$dir/${n//-/_}-$v-py3-none-any.whl"
  done
  exit 0
fi
if [ "$1" = - ] && [ -n "${FAKE_FULL_KB:-}" ]; then  # a disk that fills up: no file of the
  ulimit -f "$FAKE_FULL_KB"; trap '' XFSZ           # pack grows past FAKE_FULL_KB (EFBIG)
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


def _old_study_kit(dest: Path) -> list[str]:
    """DEST as pack-study-wheels.sh left it before its manifest (ff437f1~1): the .gitignore
    it wrote and the wheels of its pins, as the index names them, nothing else."""
    dest.mkdir()
    (dest / ".gitignore").write_text("*\n")
    wheels = ["snakemake-9.16.3-py3-none-any.whl", "ConfigArgParse-1.9.0-py3-none-any.whl",
              "snakemake_interface_scheduler_plugins-2.0.2-py3-none-any.whl",
              "rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.whl",
              "connection_pool-0.0.3-py3-none-any.whl"]
    for w in wheels:
        (dest / w).write_text("old")
    return wheels


def test_pack_study_wheels_replaces_a_kit_of_its_manifest_less_past_in_one_line(tmp_path):
    dest = tmp_path / "kit"
    old = _old_study_kit(dest)
    run = _run("pack-study-wheels.sh", dest, tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"{dest} is a kit of this script from before its manifest; its 5 wheel(s) are " \
           "replaced" in run.stderr
    made = (dest / ".pack-study-wheels").read_text().split()
    assert sorted(p.name for p in dest.iterdir()) == sorted(made + [".gitignore",
                                                                    ".pack-study-wheels"])
    assert "snakemake-9.16.3-py3-none-any.whl" in old and (dest / old[-1]).read_text() == ""


@pytest.mark.parametrize("name", ["mine-1.0-py3-none-any.whl", "snakemake-9.1.0-py3-none-any.whl",
                                  "notes.txt", "link.whl"])
def test_pack_study_wheels_refuses_an_old_kit_holding_a_file_it_could_not_have_written(
        tmp_path, name):
    # Another wheel (even of a pinned package at another version), another file, or a
    # symlink: the user's; nothing is removed.
    dest = tmp_path / "kit"
    _old_study_kit(dest)
    if name == "link.whl":
        (dest / "snakemake-9.9.0-py3-none-any.whl").symlink_to(tmp_path / "elsewhere")
        name = "snakemake-9.9.0-py3-none-any.whl"
    else:
        (dest / name).write_text("the user's")
    before = _tree(dest)
    run = _run("pack-study-wheels.sh", dest, tmp_path)
    assert run.returncode == 2 and name in run.stderr and "nothing removed" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and _tree(dest) == before
    # without the .gitignore the old script wrote first, its wheels are not taken for its own
    plain = tmp_path / "wheels"
    plain.mkdir()
    (plain / "snakemake-9.16.3-py3-none-any.whl").write_text("the user's")
    run = _run("pack-study-wheels.sh", plain, tmp_path)
    assert run.returncode == 2 and (plain / "snakemake-9.16.3-py3-none-any.whl").exists()


def _old_baseline_kit(dest: Path) -> None:
    """DEST as pack-baseline-wheels.sh left it before its marker (ff437f1~1): .gitignore and
    loads of wheels and parts, each load with MD5SUMS (whole wheels) and PARTS (parts)."""
    for load, files in (("load1", ["big-1-py3-none-any.whl.part00"]),
                        ("load2", ["big-1-py3-none-any.whl.part01", "a-1-py3-none-any.whl"])):
        (dest / load).mkdir(parents=True)
        for f in files:
            (dest / load / f).write_text("old")
        (dest / load / "MD5SUMS").write_text("0" * 32 + "  a-1-py3-none-any.whl\n" + "1" * 32 +
                                             "  big-1-py3-none-any.whl\n")
        (dest / load / "PARTS").write_text("".join(
            f"{'2' * 32}  big-1-py3-none-any.whl.part0{i}\n" for i in range(2)))
    (dest / ".gitignore").write_text("*\n")


def test_pack_baseline_wheels_replaces_a_kit_of_its_marker_less_past(tmp_path):
    dest = tmp_path / "fa4kit"
    _old_baseline_kit(dest)
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, PINS="a==1 b==2", PART="10",
               LOAD="20")
    assert run.returncode == 0, run.stderr
    assert f"{dest} is a kit of this script from before its marker; its 2 load(s) are " \
           "replaced" in run.stderr
    assert sorted(_tree(dest)) == [".fa4kit-pack", ".gitignore", "load1/MD5SUMS", "load1/PARTS",
                                   "load1/a-1-py3-none-any.whl", "load1/b-2-py3-none-any.whl"]


@pytest.mark.parametrize("where", ["load2/thesis.tex", "load3/MD5SUMS", "notes.txt"])
def test_pack_baseline_wheels_refuses_an_old_kit_holding_a_file_it_could_not_have_written(
        tmp_path, where):
    # A file no listing names, a load without its PARTS, a file beside the loads.
    dest = tmp_path / "fa4kit"
    _old_baseline_kit(dest)
    (dest / where).parent.mkdir(exist_ok=True)
    (dest / where).write_text("the user's")
    before = _tree(dest)
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, PINS="a==1", PART="10", LOAD="20")
    assert run.returncode == 2 and where.split("/")[0] in run.stderr, run.stderr
    assert "nothing removed" in run.stderr and _tree(dest) == before


@pytest.mark.parametrize("line", ["../sibling", "ABS", "load1/../../sibling", "notes", ""])
def test_pack_baseline_wheels_removes_nothing_a_marker_line_names_outside_its_loads(tmp_path,
                                                                                      line):
    # Each marker line was removed unchecked: '../sibling' deleted a directory beside DEST.
    dest = tmp_path / "fa4kit"
    env = {"PINS": "a==1 b==2", "PART": "10", "LOAD": "20"}
    assert _run("pack-baseline-wheels.sh", dest, tmp_path, **env).returncode == 0
    sibling = tmp_path / "sibling"
    sibling.mkdir()
    (sibling / "thesis.tex").write_text("years of work")
    (dest / "notes").mkdir()
    (dest / "notes" / "n.txt").write_text("the user's")
    line = str(sibling) if line == "ABS" else line
    with open(dest / ".fa4kit-pack", "a") as f:
        f.write(line + "\n")
    before = _tree(tmp_path)
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, **env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"pack-baseline-wheels: line 2 of {dest}/.fa4kit-pack names '{line}', not a load this "
        f"script writes; nothing removed: move {dest} aside or name another DEST"]
    assert _tree(tmp_path) == before


def test_pack_baseline_wheels_refuses_part_over_load_before_removing_the_last_pack(tmp_path):
    dest = tmp_path / "fa4kit"
    assert _run("pack-baseline-wheels.sh", dest, tmp_path, PINS="a==1", PART="10",
                LOAD="20").returncode == 0
    before = _tree(dest)
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, PINS="a==1", PART="30", LOAD="20")
    assert run.returncode == 2
    assert run.stderr.strip() == "pack-baseline-wheels: PART 30 exceeds LOAD 20"
    assert _tree(dest) == before and "load1/a-1-py3-none-any.whl" in before


def test_a_pack_stopped_by_a_full_disk_says_so_in_one_line_and_the_next_pack_replaces_it(
        tmp_path):
    dest = tmp_path / "fa4kit"
    env = {"PINS": "a==1 b==2", "PART": "100000", "LOAD": "100000", "FAKE_WHEEL_BYTES": "6000"}
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, FAKE_FULL_KB="4", **env)
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "pack-baseline-wheels: writing the kit failed: File too large"), run.stderr
    assert (dest / "load1").is_dir()  # a partial kit
    run = _run("pack-baseline-wheels.sh", dest, tmp_path, **env)
    assert run.returncode == 0, run.stderr
    assert sorted(_tree(dest)) == [".fa4kit-pack", ".gitignore", "load1/MD5SUMS", "load1/PARTS",
                                   "load1/a-1-py3-none-any.whl", "load1/b-2-py3-none-any.whl"]
    assert (dest / "load1" / "a-1-py3-none-any.whl").stat().st_size == 6000


def _device_study(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """The script up to its packing, on the CPU: no kit, a stand-in ``snakemake`` on PATH
    that finishes at once, RESULTS naming a prepared results directory."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "snakemake").write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 9.0\nexit 0\n")
    (stub / "snakemake").chmod(0o755)
    # TOOLCHAIN: not the checkout's carried .toolchain (a developer's, Python 3.12's).
    base = {"PATH": f"{stub}:/usr/bin:/bin", "KIT": str(tmp_path / "no-kit"),
            "TOOLCHAIN": str(tmp_path / "no-toolchain"),
            "SITE": str(tmp_path / "site"), "RESULTS": str(tmp_path / "results" / "smoke"),
            "PRECOMPILE": "0", "TILEDATTENTION_SOURCE_REVISION": "x"}
    return subprocess.run(["bash", "scripts/device-study.sh", "config/smoke.yaml", "60"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**base, **env})


def test_device_study_never_splits_or_deletes_a_file_in_out_it_did_not_make(tmp_path):
    results = tmp_path / "results" / "smoke"
    results.mkdir(parents=True)
    (results / "rows.bin").write_bytes(os.urandom(17 << 20))  # a packed study over 16 MiB
    out = tmp_path / "out"
    out.mkdir()
    mine = os.urandom(17 << 20)
    (out / "dataset.bin").write_bytes(mine)
    run = _device_study(tmp_path, OUT=str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (out / "dataset.bin").read_bytes() == mine
    assert sorted(p.name for p in out.iterdir() if p.name != "dataset.bin") != []
    (sub,) = [p for p in out.iterdir() if p.is_dir()]
    assert sub.name.startswith("device-study-") and f"writing into {sub}" in run.stderr
    parts = sorted(sub.glob("smoke-results.tar.gz.part*"))
    assert len(parts) == 2 and not (sub / "smoke-results.tar.gz").exists()
    # a second run into its own (marked) directory packs there again, splitting only its own
    run = _device_study(tmp_path, OUT=str(sub))
    assert run.returncode == 0 and len(list(sub.glob("smoke-results.tar.gz.part*"))) == 2
    assert not [p for p in sub.iterdir() if p.is_dir()]


@pytest.mark.parametrize("env,words", [({"OUT": "FILE"}, "exists and is not a directory"),
                                       ({"GPUS": "00"}, "GPUS must be a positive whole"),
                                       ({"GPUS": "0"}, "GPUS must be a positive whole"),
                                       ({"GPUS": "2x"}, "GPUS must be a positive whole")])
def test_device_study_refuses_out_naming_a_file_and_a_zero_gpu_count(tmp_path, env, words):
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    f = tmp_path / "file"
    f.write_text("mine")
    env = {k: str(f) if v == "FILE" else v for k, v in env.items()}
    run = _device_study(tmp_path, **{"OUT": str(tmp_path / "out"), **env})
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert words in run.stderr and f.read_text() == "mine"


def test_device_study_never_removes_a_site_directory_it_did_not_install(tmp_path):
    (tmp_path / "results" / "smoke").mkdir(parents=True)
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "x-1.0-py3-none-any.whl").write_bytes(b"not really")
    site = tmp_path / "mysite"
    site.mkdir()
    (site / "mine.py").write_text("years of work")
    run = _device_study(tmp_path, OUT=str(tmp_path / "out"), KIT=str(kit), SITE=str(site))
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "holds files this script did not install" in run.stderr
    assert (site / "mine.py").read_text() == "years of work"
