"""Every test in this folder submits jobs to a real SLURM cluster, and only to one that is
the suite's to use: the private cluster tests/cluster/start-slurm.sh started (SLURM_CONF
points into its directory, whose run/pids names its slurmctld, still running), or the
cluster the user names, TILEDATTN_CLUSTER=<its ClusterName>. A cluster sinfo merely
reaches (a login node's: a user's real allocation) is never used unasked: the tests skip,
saying how to opt in. Where CI's start script refused (another cluster runs on the
machine), .ci/run says why in TILEDATTN_CLUSTER_SKIP and the tests skip with that reason."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# sinfo's long state names: a node running another job is "mixed" or "allocated", one
# ending a job "completing".
READY_STATES = {"idle", "mixed", "allocated", "completing"}
# start-slurm.sh's default directory and the marker it leaves in the directories it made.
DEFAULT_DIR = "/var/tmp/tiledattn-ci-slurm"
MARK = ".tiledattn-ci-slurm"
OPT_IN = (f"the cluster tests submit jobs only to a cluster the suite started (as root: "
          f"tests/cluster/start-slurm.sh, then . {DEFAULT_DIR}/env.sh) or to one you name: "
          "TILEDATTN_CLUSTER=<its ClusterName>")


def _runs(pid: str, program: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == program
    except OSError:
        return False


def started_cluster(slurm_conf: str) -> Path | None:
    """The directory of the start-slurm.sh cluster that ``slurm_conf`` belongs to, while the
    slurmctld it recorded still runs; None for any other configuration."""
    if not slurm_conf:
        return None
    conf = Path(slurm_conf)
    directory = conf.parent.parent
    if conf.parts[-2:] != ("etc", "slurm.conf") or not (directory / MARK).is_file():
        return None
    try:
        recorded = [ln.split() for ln in (directory / "run" / "pids").read_text().splitlines()]
    except OSError:
        return None
    alive = any(len(r) == 2 and r[0] == "slurmctld" and _runs(r[1], "slurmctld")
                for r in recorded)
    return directory if alive else None


def cluster_name() -> str | None:
    """The ClusterName of the cluster SLURM's clients reach here, None if none answers."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    return None


def not_ours(env) -> str | None:
    """Why the reachable cluster is not one the tests may use, or None when it is."""
    if started_cluster(env.get("SLURM_CONF", "")) is not None:
        return None
    named = env.get("TILEDATTN_CLUSTER", "").strip()
    if not named:
        where = f"SLURM_CONF={env['SLURM_CONF']}" if env.get("SLURM_CONF") else \
            "SLURM_CONF is not set"
        return f"no cluster of tests/cluster/start-slurm.sh is running for {where}: {OPT_IN}"
    reached = cluster_name()
    if reached != named:
        return (f"TILEDATTN_CLUSTER={named}, but the cluster SLURM reaches here is "
                f"{reached or 'none (scontrol show config did not answer)'}: not submitting "
                "to it; name the cluster SLURM_CONF points at")
    return None


@functools.cache
def cluster_unavailable() -> str | None:
    """Why the cluster tests cannot submit jobs here, or None when they can."""
    refused = os.environ.get("TILEDATTN_CLUSTER_SKIP", "").strip()
    if refused:
        return refused
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return f"no SLURM client; {OPT_IN}"
    foreign = not_ours(os.environ)
    if foreign:
        return foreign
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not (READY_STATES & set(out.stdout.split())):
        return f"SLURM cluster not ready: {out.stdout.strip()} {out.stderr.strip()}"
    return None


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "cluster")
    mine = [item for item in items if str(item.path).startswith(here)]
    reason = cluster_unavailable() if mine else None
    for item in mine:
        # One worker for the folder: its jobs share the cluster's two CPUs.
        item.add_marker(pytest.mark.xdist_group("slurm"))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
