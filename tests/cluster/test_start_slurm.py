"""tests/cluster/start-slurm.sh on a machine where a cluster already runs (the one CI
started): it refuses in one line with exit 3 and leaves that cluster as it was; it never
empties a directory it did not make."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("start-slurm.sh")


def _daemons() -> dict[str, str]:
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm in ("slurmctld", "slurmd", "slurmdbd"):
            found[pid] = comm
    return found


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        pytest.skip("start-slurm.sh runs as root")


def _start(tmp_path: Path, directory: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TILEDATTN_SLURM_DIR": str(directory), "TILEDATTN_SLURM_PORT": "26817"}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)


def test_a_second_cluster_is_refused_and_the_running_one_is_left_alone(tmp_path, as_root):
    before = _daemons()
    assert before, "no SLURM daemon runs: not the case this test is about"
    out = _start(tmp_path, tmp_path / "second")
    assert out.returncode == 3, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "another SLURM cluster runs on this machine" in lines[0], lines
    assert _daemons() == before  # same daemons, same PIDs
    assert not (tmp_path / "second").exists()
    state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                           timeout=30).stdout.split()
    assert state and state[0] in ("idle", "mixed", "allocated", "completing"), state


def test_a_directory_it_did_not_make_is_never_emptied(tmp_path, as_root):
    mine = tmp_path / "user-files"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    out = _start(tmp_path, mine)
    assert out.returncode == 3, out.stderr
    assert "is not a cluster directory of this script" in out.stderr, out.stderr
    assert (mine / "thesis.tex").read_text() == "keep me"
