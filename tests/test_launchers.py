"""Launchers (submitit backends): options checked, shards run, failures name the job."""

from __future__ import annotations

import json

import pytest

from tiledattention.bench.store import read_rows
from tiledattention.launchers import LauncherError, ShardTask, get_launcher

SMOKE = "config/bench-smoke.yaml"


@pytest.mark.parametrize("name", ["debug", "local"])
def test_launcher_runs_every_shard(name, tmp_path):
    out = tmp_path / "out"
    tasks = [ShardTask(SMOKE, str(out), i, 2) for i in range(2)]
    results = get_launcher(name, str(tmp_path / "logs"), {"timeout_s": 300}).run(tasks)
    assert [r["shard"] for r in results] == [0, 1]
    rows = read_rows(str(out / "rows-shard0of2.jsonl")) + read_rows(
        str(out / "rows-shard1of2.jsonl"))
    assert len(rows) == 8 * 8
    assert {r["point_key"] for r in rows} == {r["point_key"] for r in rows}  # 8 points
    assert len({r["point_key"] for r in rows}) == 8


def test_unknown_launcher_lists_the_valid_ones(tmp_path):
    with pytest.raises(LauncherError, match=r"valid launchers are \['debug', 'local', 'slurm'\]"):
        get_launcher("pbs", str(tmp_path))


@pytest.mark.parametrize("name", ["slurm", "local", "debug"])
def test_unknown_options_list_the_valid_ones(name, tmp_path):
    with pytest.raises(LauncherError, match=f"{name} launcher: unknown option.*valid options"):
        get_launcher(name, str(tmp_path), {"partitoin": "gpu"})


def test_slurm_options_become_the_sbatch_request():
    from tiledattention.launchers.slurm import SlurmOptions, job_python, sbatch_parameters

    o = SlurmOptions(partition="gpu", account="proj", qos="normal", constraint="h100",
                     gpus_per_job=2, cpus_per_job=16, mem_gb=128, time_min=90,
                     extra_sbatch={"reservation": "study"}, image="/images/tiledattn.sif")
    p = sbatch_parameters(o)
    assert (p["partition"], p["account"], p["qos"], p["constraint"]) == (
        "gpu", "proj", "normal", "h100")
    assert p["gres"] == "gpu:2" and p["cpus_per_task"] == 16 and p["mem"] == "128G"
    assert p["time"] == 90 and p["additional_parameters"] == {"reservation": "study"}
    assert job_python(o) == "apptainer exec --nv /images/tiledattn.sif python3"
    assert "gres" not in sbatch_parameters(SlurmOptions(gpus_per_job=0))


def test_slurm_launcher_without_slurm_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun anywhere
    with pytest.raises(LauncherError, match="no SLURM client on this machine"):
        get_launcher("slurm", str(tmp_path))


def test_a_failing_shard_is_reported_with_its_log(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps({"grid": {"seqs": [8]}, "methods": ["eager"],
                               "device": "cuda"}))  # no GPU here: the shard fails
    task = ShardTask(str(bad), str(tmp_path / "out"), 0, 1)
    with pytest.raises(LauncherError, match=r"local job \S+ \(log .*\) failed"):
        get_launcher("local", str(tmp_path / "logs"), {"timeout_s": 120}).run([task])
