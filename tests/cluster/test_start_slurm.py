"""tests/cluster/start-slurm.sh on a machine where a cluster already runs (the one CI
started): it refuses in one line with exit 3 and leaves that cluster as it was, also when
started again with that cluster's own directory; it never empties a directory it did not
make. (Without a cluster: tests/test_start_slurm_again.py.)"""

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


def test_a_second_start_in_the_running_clusters_directory_is_refused_and_keeps_its_jobs(
        tmp_path, as_root):
    # Two CI runs on one machine share the default directory: the second must not stop the
    # first's cluster, cancel its jobs or empty its accounting.
    conf = Path(os.environ.get("SLURM_CONF", ""))
    if not (conf.parent.parent / ".tiledattn-ci-slurm").is_file():
        pytest.skip("the cluster in use is not one of start-slurm.sh (TILEDATTN_CLUSTER)")
    before = _daemons()
    job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    try:
        out = _start(tmp_path, conf.parent.parent)
        assert out.returncode == 3, out.stderr
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "a cluster of this script runs in" in lines[0], lines
        assert _daemons() == before  # same daemons, same PIDs
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                               text=True, timeout=30).stdout.split()
        assert state and state[0] in ("PENDING", "RUNNING"), state
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=60)
