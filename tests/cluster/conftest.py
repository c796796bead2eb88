"""Every test in this folder needs the real SLURM cluster that tests/cluster/start-slurm.sh
brings up (CI starts it before the tests and points SLURM_CONF at it): where none answers,
they skip with the reason. Where CI's start script refused (another cluster runs on the
machine), .ci/run says why in TILEDATTN_CLUSTER_SKIP and the tests skip with that reason:
they never submit to a cluster that is not theirs."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

# sinfo's long state names: a node running another job is "mixed" or "allocated", one
# ending a job "completing".
READY_STATES = {"idle", "mixed", "allocated", "completing"}


@functools.cache
def cluster_unavailable() -> str | None:
    """Why no SLURM cluster can take jobs here, or None when one can."""
    refused = os.environ.get("TILEDATTN_CLUSTER_SKIP", "").strip()
    if refused:
        return refused
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return ("no SLURM client (run tests/cluster/start-slurm.sh as root to start one, then "
                ". /var/tmp/tiledattn-ci-slurm/env.sh)")
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
