"""The third hardening round (issue 38): nothing of the user's is lost and nothing wrong is
published, whatever the environment says: --force and the marker file, the device script's
OUT, compact bundles' rows, compare/reproduce inputs, scaling and config inputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
