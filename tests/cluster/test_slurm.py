"""Against a real SLURM cluster (tests/cluster/start-slurm.sh brings one up in CI): the
smoke study through profiles/slurm → submitit → sbatch → rows; a cancelled shard fails the
run clearly and a rerun completes it without repeating finished rows; a shard that hits its
time limit is checkpointed, requeued and resumed.

Every wait has a hard limit, so a stuck cluster fails the test instead of hanging CI."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
SMALL_JOBS = {"partition": "gpu", "gpus_per_job": 1, "cpus_per_job": 1, "mem_gb": 1,
              "time_min": 10, "timeout_s": 240, "poll_s": 1}


def _job_ids(results: Path) -> list[str]:
    # submitit leaves <jobid>_submitted.pkl in each step's log folder: this study's jobs.
    return sorted({p.name.split("_")[0] for p in results.rglob("logs/*_submitted.pkl")})


def _sacct(ids: list[str]) -> list[dict]:
    # The accounting database may lag the job's end by a moment: retry within a limit.
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(["sacct", "-X", "-P", "-n", "-j", ",".join(ids),
                              "--format=JobID,JobName,State,ExitCode,Partition,Elapsed,AllocTRES"],
                             capture_output=True, text=True, timeout=30)
        jobs = [dict(zip(("id", "name", "state", "exit", "partition", "elapsed", "tres"),
                          ln.split("|")))
                for ln in out.stdout.splitlines() if ln.strip()]
        if len(jobs) == len(ids) and all(j["state"] == "COMPLETED" for j in jobs) \
                or time.monotonic() > deadline:
            return jobs
        time.sleep(2)


def test_smoke_study_runs_every_gpu_step_as_a_slurm_job(tmp_path):
    # The supported override: the grid from a --configfile, small jobs through --config.
    # The profile's launcher (slurm) survives the command line's --config.
    results = tmp_path / "smoke study"
    out = subprocess.run(
        [SNAKEMAKE, "--nolock", "--profile", "profiles/slurm", "--configfile",
         "config/smoke.yaml", "--config", f"results_dir={results}",
         f"launcher_options={json.dumps(SMALL_JOBS)}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "launcher from the profile" in out.stderr or "launcher," in out.stderr
    assert "bundle verify: OK" in (results / "bundle.verified").read_text()
    with open(results / "aggregate" / "rows.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 24 and {r["status"] for r in rows} <= {"ok", "unavailable"}
    # From SLURM's own accounting: tune, ladder, profile, the shapes grid, the model and every bench
    # shard ran as a job named after its step, on the gpu partition, and completed.
    ids = _job_ids(results)
    jobs = _sacct(ids)
    print("\n".join("|".join(j.values()) for j in jobs))  # the listing, for the record
    assert sorted(j["name"] for j in jobs) == [
        "tiledattn-bench-shard0of2", "tiledattn-bench-shard1of2",
        "tiledattn-ladder-shard0of1", "tiledattn-model", "tiledattn-profile",
        "tiledattn-shapes-g0-shard0of1", "tiledattn-tune"], jobs
    assert all(j["state"] == "COMPLETED" and j["partition"] == "gpu" for j in jobs), jobs
    # Each GPU step was given the GPU it asked for (start-slurm.sh accounts gres/gpu).
    assert all("gres/gpu=1" in j["tres"] for j in jobs), jobs
    # The node has no real GPU: the GPU steps recorded why, and the bundle says so.
    readme = (results / "bundle" / "README.md").read_text()
    assert "## What did not run" in readme
    assert "tuning (Table 5): not run: no CUDA GPU visible" in readme
    assert "profile bfloat16-full-d64-s256 tiledattention: skipped" in readme


def _sweep(config, out):
    return subprocess.Popen(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "slurm", "--launcher-options", json.dumps({**SMALL_JOBS, "array": False}),
         "--shards", "2", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_cancelled_shard_fails_clearly_and_a_rerun_completes_it(tmp_path):
    config = tmp_path / "slow.yaml"
    config.write_text("grid: {seqs: [256, 512, 768], head_dims: [32, 64], dtypes: [float32],"
                      " causal: [false, true], shape_policy: explicit, batch: 2, heads: 4}\n"
                      "methods: [eager, math]\ntiming: {warmup: 1, reps: 60, rounds: 2}\n"
                      "device: cpu\n")
    out = tmp_path / "out"
    rows0 = out / "rows-shard0of2.jsonl"
    proc = _sweep(config, out)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (rows0.exists() and rows0.read_text().strip()):
        time.sleep(0.2)
    assert rows0.exists(), "shard 0 never wrote a row"
    # This sweep's own jobs: submitit names its files in the log folder by job id.
    ids = sorted({p.name.split("_")[0] for p in (out / "logs").glob("*_submitted.pkl")})
    assert ids, "no submitted shard job to cancel"
    subprocess.run(["scancel", ids[0]], check=True, timeout=30)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "CANCELLED" in err and "log " in err, err[-2000:]
    before = rows0.read_text().count("\n")
    rerun = _sweep(config, out)
    _, err2 = rerun.communicate(timeout=400)
    assert rerun.returncode == 0, err2[-2000:]
    keys = []
    for path in (rows0, out / "rows-shard1of2.jsonl"):
        lines = [ln for ln in path.read_text().split("\n") if ln.strip()]
        keys += [(r["point_key"], r["method"]) for r in map(json.loads, lines)]
    assert len(keys) == len(set(keys)) == 12 * 2  # every row exactly once
    assert rows0.read_text().count("\n") > before  # the cancelled shard was resumed


def test_a_shard_hitting_its_time_limit_is_requeued_and_resumes(tmp_path):
    # A 1-minute job whose shard needs longer: SLURM signals USR2 signal_delay_s before the
    # limit, submitit checkpoints (ShardTask.checkpoint) and requeues, and the requeued run
    # continues from the rows already written.
    config = tmp_path / "long.yaml"
    config.write_text("grid: {seqs: [256, 512, 768, 1024], head_dims: [32, 64], dtypes: [float32],"
                      " causal: [false, true], shape_policy: explicit, batch: 2, heads: 4}\n"
                      "methods: [eager, math]\ntiming: {warmup: 1, reps: 60, rounds: 2}\n"
                      "device: cpu\n")
    out = tmp_path / "out"
    # Each run gets ~45 s before the signal (the shard needs ~55 s on an idle 2-core
    # machine, so at least one requeue) and a requeued job waits cred_expire (60 s) to
    # restart. A 1-minute limit left ~20 s per run: under CI's load (two test workers and
    # tileiras compiles) a run made 1-3 rows and the shard outlasted 10 requeues.
    options = {**SMALL_JOBS, "time_min": 2, "signal_delay_s": 75, "timeout_s": 1200,
               "array": False, "max_requeue": 10}
    run = subprocess.run(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "slurm", "--launcher-options", json.dumps(options), "--shards", "1",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1300)
    assert run.returncode == 0, run.stderr[-2000:]
    log = "".join(p.read_text() for p in (out / "logs").glob("*_log.out"))
    assert "this job is timed-out" in log and "Requeued job" in log, log[-2000:]
    job_id = next((out / "logs").glob("*_submitted.pkl")).name.split("_")[0]
    info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                          timeout=30).stdout
    restarts = re.search(r"Restarts=(\d+)", info)
    assert restarts and 1 <= int(restarts.group(1)) <= options["max_requeue"], info
    lines = [ln for ln in (out / "rows-shard0of1.jsonl").read_text().split("\n") if ln.strip()]
    keys = [(r["point_key"], r["method"]) for r in map(json.loads, lines)]
    assert len(keys) == len(set(keys)) == 16 * 2  # every row exactly once across both runs
