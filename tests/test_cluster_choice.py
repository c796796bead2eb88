"""The cluster tests (tests/cluster/) submit jobs only to a cluster the suite started
(tests/cluster/start-slurm.sh) or one the user names (TILEDATTN_CLUSTER), never to one sinfo
merely reaches: on a login node that is a user's real allocation. Checked with stand-in
SLURM clients (a ready cluster called "prod") and a stand-in slurmctld process."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def choice(tmp_path, monkeypatch):
    """tests/cluster/conftest.py, with sinfo, sbatch and scontrol of a ready cluster "prod"
    first on PATH and no SLURM setting inherited."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"sinfo": "echo idle", "sbatch": "exit 1",
                       "scontrol": "echo 'ClusterName             = prod'"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for var in ("SLURM_CONF", "TILEDATTN_CLUSTER", "TILEDATTN_CLUSTER_SKIP"):
        monkeypatch.delenv(var, raising=False)
    spec = importlib.util.spec_from_file_location("cluster_conftest",
                                                  ROOT / "tests" / "cluster" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cluster_unavailable.__wrapped__


def test_a_cluster_sinfo_merely_reaches_gets_no_job_and_the_skip_says_how_to_opt_in(choice):
    reason = choice()
    assert reason is not None, "the tests would submit to a cluster they did not start"
    assert "TILEDATTN_CLUSTER=<its ClusterName>" in reason and "start-slurm.sh" in reason
    assert "SLURM_CONF is not set" in reason


def test_the_cluster_the_user_names_is_used_and_a_wrong_name_is_refused(choice, monkeypatch):
    monkeypatch.setenv("TILEDATTN_CLUSTER", "prod")
    assert choice() is None
    monkeypatch.setenv("TILEDATTN_CLUSTER", "ci")
    reason = choice()
    assert reason and "TILEDATTN_CLUSTER=ci, but the cluster SLURM reaches here is prod" \
        in reason


def _cluster_dir(path: Path, pid: int) -> Path:
    """A directory as start-slurm.sh leaves it: marker, slurm.conf, the daemons' PIDs."""
    (path / "etc").mkdir(parents=True)
    (path / "run").mkdir()
    (path / ".tiledattn-ci-slurm").touch()
    (path / "etc" / "slurm.conf").write_text("ClusterName=ci\n")
    (path / "run" / "pids").write_text(f"munged 1\nslurmctld {pid}\n")
    return path / "etc" / "slurm.conf"


def test_the_cluster_the_suite_started_is_used_while_its_controller_runs(choice, tmp_path,
                                                                        monkeypatch):
    # A stand-in slurmctld: sleep under that name (what /proc/PID/comm shows).
    daemon = tmp_path / "slurmctld"
    shutil.copy(shutil.which("sleep"), daemon)
    proc = subprocess.Popen([str(daemon), "60"])
    # Popen may return before the child's exec: its comm is then still the parent's.
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "slurmctld":
        assert time.monotonic() < deadline, "the stand-in slurmctld did not start"
        time.sleep(0.01)
    try:
        monkeypatch.setenv("SLURM_CONF", str(_cluster_dir(tmp_path / "ours", proc.pid)))
        assert choice() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)
    reason = choice()  # its controller has gone: a leftover directory, not a cluster
    assert reason and "no cluster of tests/cluster/start-slurm.sh is running" in reason


def test_a_configuration_start_slurm_did_not_write_is_not_the_suites(choice, tmp_path,
                                                                     monkeypatch):
    conf = tmp_path / "site" / "etc" / "slurm.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("ClusterName=prod\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    reason = choice()
    assert reason and f"SLURM_CONF={conf}" in reason and "TILEDATTN_CLUSTER" in reason
