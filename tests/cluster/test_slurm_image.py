"""The smoke study through profiles/slurm with `launcher_options.image` set to the SIF:
each shard's Python runs inside the image (`apptainer exec`) on the SLURM node, and the
study manifest records the image and its digest.

Needs a SLURM cluster (tests/cluster/start-slurm.sh) and the SIF and an `apptainer` that
containers/ci.sh (CI's container stage) builds and then runs this test with; elsewhere it
skips with the reason. Only launcher options are used, so it does not depend on which
rules go through the launcher."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
# As tests/cluster/test_slurm.py: small jobs on the CI cluster's "gpu" partition.
SMALL_JOBS = {"partition": "gpu", "gpus_per_job": 1, "cpus_per_job": 1, "mem_gb": 1,
              "time_min": 10, "timeout_s": 600, "poll_s": 1}


@pytest.fixture
def sif_and_path(tmp_path) -> tuple[str, str]:
    """The SIF, and a PATH whose `apptainer` is the one that runs it."""
    sif = os.environ.get("TILEDATTN_CI_SIF")
    tool = os.environ.get("TILEDATTN_CI_APPTAINER") or shutil.which("apptainer")
    if not (sif and tool):
        why = ("TILEDATTN_CI_SIF (and an apptainer) unset: containers/ci.sh, CI's container "
               "stage, builds the SIF and runs this test")
        (pytest.fail if os.environ.get("TILEDATTN_CI_IMAGES_REQUIRED") else pytest.skip)(why)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").symlink_to(tool)
    return sif, f"{bindir}:{os.environ['PATH']}"


def test_smoke_study_shards_run_inside_the_sif_and_the_manifest_records_its_digest(
        tmp_path, sif_and_path):
    sif, path = sif_and_path
    results = tmp_path / "smoke"
    options = {**SMALL_JOBS, "image": sif}
    # The jobs inherit this environment (sbatch exports it); a PYTHONPATH pointing at a
    # checkout would put the checkout's code before the image's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = path
    out = subprocess.run(
        [SNAKEMAKE, "--nolock", "--profile", "profiles/slurm", "--configfile",
         "config/smoke.yaml", "--config", "launcher=slurm", f"results_dir={results}",
         f"launcher_options={json.dumps(options)}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    digest = "sha256:" + hashlib.sha256(Path(sif).read_bytes()).hexdigest()
    study = json.loads((results / "manifest.json").read_text())
    assert study["container"] == {"image": sif, "digest": digest}
    runs = [json.loads(p.read_text()) for p in results.rglob("manifest-shard*.json")]
    assert runs, "no run manifests"
    revision = subprocess.run(
        [os.environ.get("TILEDATTN_CI_APPTAINER") or "apptainer", "inspect", "--labels",
         "--json", sif], capture_output=True, text=True, timeout=120)
    assert revision.returncode == 0, revision.stderr
    labels = json.loads(revision.stdout)["data"]["attributes"]["labels"]
    for run in runs:
        # Set only by the image's %environment: the shard's Python ran in the SIF, under SLURM.
        env_seen = run["environment"]
        assert env_seen["TILEDATTENTION_SOURCE_REVISION"] == labels[
            "org.opencontainers.image.revision"]
        assert env_seen.get("SLURM_JOB_ID"), env_seen
    rows = (results / "aggregate" / "rows.csv").read_text().splitlines()
    assert len(rows) > 1
