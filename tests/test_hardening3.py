"""The third hardening round (issue 38): nothing of the user's is lost and nothing wrong is
published, whatever the environment says: --force and the marker file, the device script's
OUT, compact bundles' rows, compare/reproduce inputs, scaling and config inputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hardening import ROOT, _tiny_study, tiny_config
from test_hardening2 import one_line


def _run_cli(*argv: str, env: dict | None = None, cwd: Path | None = None,
             timeout: int = 120) -> subprocess.CompletedProcess:
    """The real ``tiledattn`` in a child process (the environment is the child's own)."""
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "tiledattention.cli", *argv],
                          env={**base, **(env or {})}, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


# -- bundle create --force: the marker decides, never $HOME --------------------------------

def test_bundle_create_force_never_removes_a_directory_without_its_marker_whatever_home_says(
        tmp_path):
    study = _tiny_study(tmp_path)
    home = tmp_path / "realhome"  # a user's directory; HOME names somewhere else
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    (home / "thesis.tex").write_text("years of work")
    before = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    proc = _run_cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(home), "--force",
                    env={"HOME": str(tmp_path / "elsewhere")})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "not a bundle tiledattn made" in proc.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == before
    assert not (tmp_path / "realhome.zip").exists()
    # a marker that is not ours (a list, another format) does not make it ours either
    (home / ".tiledattention-bundle").write_text("[]")
    proc = _run_cli("bundle", "create", "--study", str(study), "--config",
                    str(tiny_config(tmp_path)), "--out", str(home), "--force")
    assert proc.returncode == 2 and (home / "thesis.tex").exists()


def test_bundle_create_force_never_replaces_a_zip_it_did_not_make(tmp_path):
    study = _tiny_study(tmp_path)
    (tmp_path / "b.zip").write_bytes(b"my archive")
    err = one_line(_cli_inproc("bundle", "create", "--study", str(study), "--config",
                               str(tiny_config(tmp_path)), "--out", str(tmp_path / "b"),
                               "--force"))
    assert "not a bundle zip of tiledattn's" in err
    assert (tmp_path / "b.zip").read_bytes() == b"my archive"
    assert not (tmp_path / "b").exists()


def _cli_inproc(*argv):
    from test_hardening import cli

    return cli(*argv)


# -- scripts/device-study.sh: OUT and GPUS --------------------------------------------------

def _device_study(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """The script up to its packing, on the CPU: no kit, a stand-in ``snakemake`` on PATH
    that finishes at once, RESULTS naming a prepared results directory."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / "snakemake").write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 9.0\nexit 0\n")
    (stub / "snakemake").chmod(0o755)
    base = {"PATH": f"{stub}:/usr/bin:/bin", "KIT": str(tmp_path / "no-kit"),
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
