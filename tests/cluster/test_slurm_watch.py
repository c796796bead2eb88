"""A cluster run the user can watch, stop and change, against the real SLURM cluster
(tests/cluster/start-slurm.sh): a request that can never start fails at once in one
line; a cancel inside SLURM's grace period still fails its step; SIGINT to a running
study cancels its jobs and a rerun resumes; a changed shard count re-shards the measured
rows; a typo'd launcher option stops the study before any job.

Each wait has a bound, generous for two shared cores; run this file on its own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import rows as _rows  # tests/cluster/waiting.py
from waiting import wait_for as _wait_for

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
SMALL = {"partition": "gpu", "gpus_per_job": 1, "cpus_per_job": 1, "mem_gb": 1,
         "time_min": 10, "timeout_s": 600, "poll_s": 1}
ACTIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED"}


def _grid(seqs: list[int], reps: int = 2) -> str:
    return (f"grid: {{seqs: {seqs}, head_dims: [32], dtypes: [float32], causal: [false], "
            "shape_policy: explicit, batch: 1, heads: 2}\nmethods: [eager, math]\n"
            f"timing: {{warmup: 1, reps: {reps}, rounds: 2}}\ndevice: cpu\n")


def _study(tmp_path: Path, seqs: list[int], reps: int = 2, shards: int = 2) -> Path:
    """A study config with only the bench shards as GPU steps (the rest off)."""
    study = tmp_path / "study.yaml"
    bench = "\n".join("  " + ln for ln in _grid(seqs, reps).splitlines())
    study.write_text(f"results_dir: {tmp_path / 'out'}\nshards: {shards}\nlauncher: slurm\n"
                     "tune: {enabled: false}\nladder: {enabled: false}\n"
                     "shapes: {enabled: false}\nmodel: {enabled: false}\n"
                     f"profile: {{enabled: false}}\nbench:\n{bench}\n")
    return study


def _snakemake(study: Path, *config: str, options=SMALL, lock=False, **kw):
    cmd = [SNAKEMAKE, *([] if lock else ["--nolock"]), "--profile", "profiles/slurm",
           "--configfile", str(study), "--config", *config]
    if options is not None:
        cmd.append(f"launcher_options={json.dumps(options)}")
    return subprocess.Popen(cmd, cwd=kw.pop("cwd", ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _sweep(config: Path, out: Path, options: dict, shards: int = 1):
    return subprocess.run(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "slurm", "--launcher-options", json.dumps(options), "--shards",
         str(shards), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
        timeout=600)


def _job_ids(results: Path) -> list[str]:
    return sorted({p.name.split("_")[0] for p in results.rglob("logs/*_submitted.pkl")})


def _states(ids: list[str]) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "--states=all", "-j", ",".join(ids), "-o", "%i|%T"],
                         capture_output=True, text=True, timeout=60).stdout
    return dict(ln.split("|") for ln in out.split() if "|" in ln)




def _sacct_state(job: str) -> str:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "State"],
                         capture_output=True, text=True, timeout=60).stdout.split()
    return out[0] if out else ""


def _one_line(err: str, words: str) -> None:
    hits = [ln for ln in err.splitlines() if words in ln]
    assert len(hits) == 1, err[-3000:]


# 1. Jobs that can never start ------------------------------------------------------------

def test_the_shipped_profile_on_a_node_too_small_fails_at_once_before_any_job(tmp_path):
    # The profile as shipped asks each job for 8 CPUs and 64 GB; the CI node has 2 CPUs.
    # sbatch --test-only refuses it before anything is queued, in one line on the terminal.
    # Asked once for the run (two shards would run in parallel), the refusal names each
    # setting that exceeds what the partition offers.
    started = time.monotonic()
    run = _snakemake(_study(tmp_path, [64], shards=2), options=None)
    _, err = run.communicate(timeout=600)
    assert run.returncode != 0
    _one_line(err, "slurm launcher: sbatch --test-only refuses the request")
    line = next(ln for ln in err.splitlines() if "refuses the request" in ln)
    assert "cpus_per_job 8 > 2" in line and "mem_gb 64 GB > " in line, line
    assert "time_min 120 min > 60 min" in line and "partition gpu" in line, line
    assert "Requested node configuration is not available" in line, line
    assert "Error in rule" not in err, err[-3000:]
    assert not _job_ids(tmp_path / "out"), "a job was queued"
    assert time.monotonic() - started < 300


def test_a_wrong_partition_name_is_named_as_such(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64]))
    out = _sweep(config, tmp_path / "out", {**SMALL, "partition": "gpux"})
    assert out.returncode == 2, out.stderr[-2000:]
    _one_line(out.stderr, "partition 'gpux' does not exist on this cluster (its partitions: gpu)")
    assert "sinfo" not in out.stderr


def _node_state(state: str, reason: str = "") -> None:
    node = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                          timeout=30).stdout.split()[0]
    extra = [f"reason={reason}"] if reason else []
    subprocess.run(["scontrol", "update", f"nodename={node}", f"state={state}", *extra],
                   check=True, timeout=30)


def test_a_drained_partition_is_not_called_a_mis_sized_request(tmp_path):
    # Every node drained: sbatch --test-only says "Requested node configuration is not
    # available", but the request fits the nodes. It is queued and waits (its pending
    # reason reported), and runs once the node is back; a request too big for the node is
    # still refused, naming the setting.
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64]))
    _node_state("drain", "tiledattn-test")
    try:
        big = _sweep(config, tmp_path / "big", {**SMALL, "cpus_per_job": 8})
        assert big.returncode == 2 and "cpus_per_job 8 > 2" in big.stderr, big.stderr[-2000:]
        sweep = subprocess.Popen(
            [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
             "--launcher", "slurm", "--launcher-options", json.dumps(SMALL), "--shards", "1",
             "--out", str(tmp_path / "out")], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        ids = _wait_for(lambda: _job_ids(tmp_path / "out"), "queued job", 120)
        _wait_for(lambda: _states(ids).get(ids[0]) == "PENDING", "pending job", 60)
    finally:
        _node_state("resume")
    try:
        _, err = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
    assert sweep.returncode == 0, err[-2000:]
    _one_line(err, "no node of partition gpu takes jobs")
    assert "drain" in err and "refuses the request:" not in err


def test_a_drained_partition_is_said_once_in_a_workflow_run_not_once_per_step(tmp_path):
    # The preflight and each of the two shard steps ask sbatch --test-only; the run says
    # "queued and waits" once (it used to say it once per step: 11 times in a study).
    _node_state("drain", "tiledattn-test")
    try:
        run = _snakemake(_study(tmp_path, [64], shards=2))
        shards = tmp_path / "out" / "shards"
        ids = _wait_for(lambda: len(_job_ids(shards)) == 2 and _job_ids(shards),
                        "two queued jobs", 300)
        _wait_for(lambda: set(_states(ids).values()) == {"PENDING"}, "pending jobs", 60)
    finally:
        _node_state("resume")
    try:
        _, err = run.communicate(timeout=600)
    finally:
        run.kill()
    assert run.returncode == 0, err[-3000:]
    _one_line(err, "is queued and waits for a node")


def test_a_job_pending_for_a_reason_that_never_resolves_fails_naming_it(tmp_path):
    # time_min above the partition's MaxTime (60): sbatch --test-only lets it through,
    # SLURM queues it PENDING (PartitionConfig) for ever. The step fails on the first
    # poll that sees the reason, names job, reason and setting, and cancels the job.
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64]))
    out = _sweep(config, tmp_path / "out", {**SMALL, "time_min": 120})
    assert out.returncode == 2, out.stderr[-2000:]
    _one_line(out.stderr, "can never start: pending (Partition")
    assert "time_min" in out.stderr and "time limit 1:00:00" in out.stderr
    ids = _job_ids(tmp_path / "out")
    assert len(ids) == 1 and f"slurm: job {ids[0]} PENDING (Partition" in out.stderr
    # Cancelled, not left in the queue.
    states = _wait_for(lambda: (s := _states(ids)) and not (set(s.values()) & ACTIVE) and s,
                       "cancelled job", 60)
    assert set(states.values()) == {"CANCELLED"}, states


# 2. Every outcome not COMPLETED fails its step --------------------------------------------

def test_a_cancel_inside_the_grace_period_fails_the_step_though_it_finished(tmp_path):
    # scancel sends SIGTERM, which submitit's job bypasses; with little work left the step
    # finishes inside SLURM's KillWait and writes its result, yet sacct says CANCELLED:
    # the sweep must fail, naming the job, its state and its log.
    config = tmp_path / "bench.yaml"
    seqs = [64, 128, 192, 256, 320, 384]
    config.write_text(_grid(seqs, reps=20))
    out = tmp_path / "out"
    rows = out / "rows-shard0of1.jsonl"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "slurm", "--launcher-options", json.dumps({**SMALL, "array": False}),
         "--shards", "1", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        # Cancel once all but the last point are measured: what is left fits KillWait.
        _wait_for(lambda: len(_rows(rows)) >= 2 * (len(seqs) - 1), "rows", 400, 0.1)
        job = _job_ids(out)[0]
        subprocess.run(["scancel", job], check=True, timeout=60)
        _, err = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
    log = (out / "logs" / f"{job}_0_log.err").read_text()
    assert "Bypassing signal SIGTERM" in log
    assert list((out / "logs").glob(f"{job}_0_result.pkl")), "the step did not finish: " \
        "not the grace-period case this test is about"
    assert sweep.returncode == 1, err[-2000:]
    _one_line(err, f"SLURM job {job} (CANCELLED, log {out / 'logs'}")


def test_a_cancelled_job_stops_measuring_at_once_and_keeps_only_its_finished_points(
        tmp_path):
    # scancel in the middle of a long point: the job must stop measuring when SIGTERM
    # arrives, not measure on until SLURM's KillWait (30 s here) sends SIGKILL. The points
    # it finished keep their rows (real measurements); the one it cut has none (measured
    # again on resume). The watcher's status lines name the step.
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64, 1024, 1280], reps=20000))
    out = tmp_path / "out"
    rows = out / "rows-shard0of1.jsonl"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "slurm", "--launcher-options", json.dumps({**SMALL, "array": False}),
         "--shards", "1", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(_rows(rows)) >= 2, "first point's rows", 400, 0.2)
        time.sleep(3)  # inside the second point's measurement
        job = _job_ids(out)[0]
        subprocess.run(["scancel", job], check=True, timeout=60)
        cancelled = time.monotonic()
        _wait_for(lambda: _states([job]).get(job) not in ACTIVE | {None}, "ended job", 120,
                  0.2)
        took = time.monotonic() - cancelled
        _, err = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
    log = (out / "logs" / f"{job}_0_log.err").read_text()
    assert "SIGTERM: stopped; " in log and "measured again on resume" in log, log[-2000:]
    assert took < 20, f"the job measured on for {took:.0f}s after scancel (KillWait is 30 s)"
    keys = {r["point_key"] for r in _rows(rows)}
    assert len(keys) == 1 and len(_rows(rows)) == 2, keys  # the first point only, once
    assert sweep.returncode == 1, err[-2000:]
    assert f"slurm: job {job} RUNNING [tiledattn-bench-shard0of1]" in err, err[-2000:]


def _job_python(logs: Path) -> int | None:
    """The pid of the job's Python (submitit's runner for the jobs of ``logs``; not the
    srun that started it, whose command line names it too)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        argv = argv.split("\0")
        if argv[1:4] == ["-u", "-m", "submitit.core._submit"] and str(logs) in argv:
            return int(pid)
    return None


def test_a_job_whose_python_was_killed_says_the_signal_and_its_log(tmp_path):
    # kill -9 of the job's Python (as the OOM killer does): not a bare "FAILED
    # (NonZeroExitCode)", but the signal from sacct's exit codes, and the job's log.
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64, 1024, 1280], reps=20000))
    out = tmp_path / "out"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
         "--launcher", "slurm", "--launcher-options", json.dumps({**SMALL, "array": False}),
         "--shards", "1", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _rows(out / "rows-shard0of1.jsonl"), "first rows", 400, 0.2)
        os.kill(_wait_for(lambda: _job_python(out / "logs"), "job's Python", 60), 9)
        _, err = sweep.communicate(timeout=300)
    finally:
        sweep.kill()
    job = _job_ids(out)[0]
    assert sweep.returncode == 1, err[-2000:]
    _one_line(err, f"SLURM job {job} (FAILED (")
    line = next(ln for ln in err.splitlines() if f"SLURM job {job} (FAILED (" in ln)
    # sacct records the kill either as the step's signal (DerivedExitCode 0:9) or as the
    # batch script's exit code 9 (ExitCode 9:0, DerivedExitCode 0:0): both seen on this
    # cluster (CI rehearsals of 2026-12-01); either says more than NonZeroExitCode alone
    assert ("signal 9 (SIGKILL)" in line or "signal 9, SIGKILL" in line
            or "exit code 9" in line), line
    assert f"log {out / 'logs' / f'{job}_0_log.err'}" in line, line


def test_a_time_limit_in_the_last_attempt_fails_the_study_naming_it_and_stores_no_row(
        tmp_path):
    # max_requeue 0: SLURM's USR2 (signal_delay_s before the 2-minute limit) makes
    # submitit raise UncompletedJobError inside the measurement. It must not become the
    # point's error row (the job would end COMPLETED, the study green): the job fails,
    # and the terminal says "time limit" with the step, job id and log, in one line.
    study = _study(tmp_path, [256, 384, 512, 640, 768, 896], reps=20000, shards=1)
    run = _snakemake(study, options={**SMALL, "time_min": 2, "max_requeue": 0})
    _, err = run.communicate(timeout=600)
    assert run.returncode != 0, err[-3000:]
    shards = tmp_path / "out" / "shards"
    ids = _job_ids(shards)
    assert len(ids) == 1, ids
    _one_line(err, f"time limit: step tiledattn-bench-shard0of1, SLURM job {ids[0]} (")
    line = next(ln for ln in err.splitlines() if "time limit: step" in ln)
    assert str(shards / "logs") in line and "max_requeue=0" in line, line
    log = (shards / "logs" / f"{ids[0]}_0_log.err").read_text()
    assert "UncompletedJobError" in log, log[-2000:]  # the case this test is about
    rows = _rows(shards / "rows-shard0of1.jsonl")
    assert all(r["status"] == "ok" for r in rows), [r for r in rows if r["status"] != "ok"]
    assert not (shards / "shard0of1.done").exists()


# 3. Ctrl-C / SIGTERM cancels the jobs; a rerun resumes ------------------------------------

@pytest.mark.parametrize("sig,group", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                       (signal.SIGINT, True)],
                         ids=["SIGINT", "SIGTERM", "Ctrl-C"])
def test_interrupting_a_running_study_cancels_its_jobs_and_a_rerun_resumes(sig, group,
                                                                           tmp_path):
    # To Snakemake alone (as `kill` does), or to its whole process group (as a terminal's
    # Ctrl-C does: the steps get it too).
    # reps=2000: each shard measures for ~25 s after its first row (~1 s at reps=40, when
    # a shard could finish before the signal reached it and end COMPLETED).
    study = _study(tmp_path, [256, 384, 512, 640, 768, 896], reps=2000)
    shards = tmp_path / "out" / "shards"
    run = _snakemake(study, start_new_session=group)
    try:
        # Both shard jobs running and writing rows: then the signal.
        def counts():
            return [len(_rows(shards / f"rows-shard{i}of2.jsonl")) for i in range(2)]
        _wait_for(lambda: len(_job_ids(shards)) == 2 and all(counts()), "running shards", 400)
        ids = _job_ids(shards)
        assert max(at_signal := counts()) < 6, f"a shard finished before the signal " \
            f"{at_signal}: not the case this test is about"
        os.killpg(run.pid, sig) if group else run.send_signal(sig)
        _, err = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode != 0
    assert "cancelled jobs" in err, err[-3000:]
    how = "Ctrl-C (SIGINT)" if sig == signal.SIGINT else "SIGTERM (SIGTERM)"
    _one_line(err, f"workflow: stopped by {how}: the 'Error in rule' blocks above")
    states = _wait_for(lambda: (s := _states(ids)) and not (set(s.values()) & ACTIVE) and s,
                       "ended jobs", 120)
    assert set(states.values()) == {"CANCELLED"}, states
    measured = sum(len(_rows(shards / f"rows-shard{i}of2.jsonl")) for i in range(2))
    # The rerun resumes at once: the cancelled jobs' locks do not stop it.
    rerun = _snakemake(study)
    _, err2 = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, err2[-3000:]
    keys = [(r["point_key"], r["method"]) for i in range(2)
            for r in _rows(shards / f"rows-shard{i}of2.jsonl")]
    assert len(keys) == len(set(keys)) == 6 * 2  # every row once
    log = "".join(p.read_text() for p in shards.glob("logs/*_log.err"))
    assert "already done" in log and measured > 0


def test_a_rerun_after_snakemake_and_its_steps_were_killed_unlocks_and_ends_the_orphans(
        tmp_path):
    # kill -9 of the whole process group: no launcher is left to cancel the jobs, and
    # Snakemake's lock stays. The rerun removes the dead run's lock by itself, cancels the
    # jobs the killed run left (found by step name and study) instead of queueing the
    # same shards behind them, and measures every row once.
    study = _study(tmp_path, [256, 384, 512, 640, 768, 896], reps=2000)
    shards = tmp_path / "out" / "shards"
    work = ROOT
    run = _snakemake(study, lock=True, start_new_session=True)
    try:
        def counts():
            return [len(_rows(shards / f"rows-shard{i}of2.jsonl")) for i in range(2)]
        _wait_for(lambda: len(_job_ids(shards)) == 2 and all(counts()), "running shards", 400)
        orphans = _job_ids(shards)
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate(timeout=60)
    finally:
        run.kill()
    assert list((work / ".snakemake" / "locks").iterdir()), "no lock left: not the case"
    assert set(_states(orphans).values()) <= ACTIVE, _states(orphans)  # still running
    rerun = _snakemake(study, lock=True)
    _, err = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, err[-3000:]
    _one_line(err, "workflow: removed the lock left by an earlier run")
    for job in orphans:
        _one_line(err, f"slurm: job(s) {job} of tiledattn-bench-shard")
        line = next(ln for ln in err.splitlines() if f"slurm: job(s) {job} of" in ln)
        # Called cancelled only where accounting says so (a shard may have completed).
        state = _sacct_state(job)
        assert (f": {job} cancelled;" if state == "CANCELLED" else
                f": {job} had already completed;") in line, (state, line)
    assert set(_states(orphans).values()) <= {"CANCELLED", "COMPLETED"}, _states(orphans)
    keys = [(r["point_key"], r["method"]) for i in range(2)
            for r in _rows(shards / f"rows-shard{i}of2.jsonl")]
    assert len(keys) == len(set(keys)) == 6 * 2  # every row once


# 4. A changed shard count re-shards the measured rows -------------------------------------

def test_a_changed_shard_count_reshards_the_measured_rows_and_both_counts_work(tmp_path):
    study = _study(tmp_path, [64, 128, 192], shards=2)
    shards = tmp_path / "out" / "shards"
    for count, expect_reshard in ((2, False), (3, True), (2, True)):
        run = _snakemake(study, f"shards={count}")
        _, err = run.communicate(timeout=900)
        assert run.returncode == 0, (count, err[-3000:])
        assert ("re-sharded 6 measured rows" in err) == expect_reshard, err[-3000:]
        files = sorted(p.name for p in shards.glob("rows-shard*.jsonl"))
        assert files == [f"rows-shard{i}of{count}.jsonl" for i in range(count)]
    rows = [r for p in shards.glob("rows-shard*.jsonl") for r in _rows(p)]
    first = [r for p in shards.glob("resharded-of2-*/rows-shard*.jsonl") for r in _rows(p)]
    # Nothing measured twice: the rows are the first run's, value for value.
    assert sorted(json.dumps(r, sort_keys=True) for r in rows) == sorted(
        json.dumps(r, sort_keys=True) for r in first)
    assert len(rows) == 3 * 2


# 5. Launcher options checked before anything is submitted ----------------------------------

def test_a_typod_launcher_option_stops_the_study_before_the_first_rule(tmp_path):
    study = _study(tmp_path, [64])
    study.write_text(study.read_text().replace("launcher: slurm\n", "launcher: slurm\n"
                                               "launcher_options: {acount: ci-account}\n"))
    run = _snakemake(study)
    _, err = run.communicate(timeout=300)
    assert run.returncode != 0
    _one_line(err, "config: launcher_options: slurm launcher: unknown option(s) ['acount']; "
                   "valid options are ['partition', 'account'")
    assert not (tmp_path / "out" / "plan").exists(), "a rule ran"
    assert not _job_ids(tmp_path / "out")


def test_a_config_file_value_the_profile_replaces_is_named(tmp_path):
    # The config file asks for partition nosuchpart; the profile's gpu wins (config files <
    # profile < command line) and the terminal says so, before the jobs run with it.
    study = _study(tmp_path, [64], shards=1)
    study.write_text(study.read_text().replace("launcher: slurm\n", "launcher: slurm\n"
                                               "launcher_options: {partition: nosuchpart}\n"))
    run = _snakemake(study)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    _one_line(err, "config: launcher_options.partition: 'nosuchpart' from the config file is "
                   "overridden by the profile ('gpu')")
    ids = _job_ids(tmp_path / "out")
    part = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(ids), "-o", "Partition"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    assert part and set(part) == {"gpu"}


def test_a_newline_in_a_launcher_option_is_refused_before_sbatch(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64]))
    marker = tmp_path / "ran"
    for options in ({"partition": f"gpu\ntouch {marker}"},
                    {"extra_sbatch": {"comment": f"x\ntouch {marker}"}},
                    {"image": f"x\ntouch {marker}"}):
        out = _sweep(config, tmp_path / "out", {**SMALL, **options})
        assert out.returncode == 2, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "line break" in out.stderr or "one line" in out.stderr
    assert not _job_ids(tmp_path / "out") and not marker.exists()


def test_sweep_when_sbatch_refuses_gives_one_line_and_exit_2(tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64]))
    out = _sweep(config, tmp_path / "out", {**SMALL, "partition": "nosuchpart",
                                            "test_only": False})
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "sbatch refused the job" in out.stderr
    assert "invalid partition" in out.stderr.lower(), out.stderr


# 3b. A rows lock held by a job that no longer runs is reclaimed -----------------------------

_HOLD = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, json.dumps({"host": "n", "pid": os.getpid(), "slurm_job": sys.argv[2]}).encode(), 0)
print("held", flush=True)
sys.stdin.read()  # hold until the test closes stdin
"""


def test_a_rows_lock_names_its_jobs_real_state_and_is_reclaimed_once_it_ended(tmp_path):
    # A cancelled job's process can outlive its cancel (KillWait): the rerun's bench meets
    # its lock. Held by a running job it is refused naming the job and RUNNING; once the
    # job is cancelled the bench waits for the lock and takes it over.
    config = tmp_path / "bench.yaml"
    config.write_text(_grid([64]))
    out = tmp_path / "out"
    out.mkdir()
    job = subprocess.run(["sbatch", "--parsable", "-p", "gpu", "--mem=100M", "-o", "/dev/null",
                          "--wrap", "sleep 600"], capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip().split(";")[0]
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out / ".rows-shard0of1.jsonl.lock"),
                               job], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _wait_for(lambda: _states([job]).get(job) == "RUNNING", "running job", 120)
        bench = [sys.executable, "-m", "tiledattention.cli", "bench", "--config", str(config),
                 "--out", str(out)]
        refused = subprocess.run(bench, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2
        _one_line(refused.stderr, f"(SLURM job {job}, which is RUNNING; lock")
        subprocess.run(["scancel", job], check=True, timeout=60)
        _wait_for(lambda: _states([job]).get(job) == "CANCELLED", "cancelled job", 120)
        resumed = subprocess.Popen(bench, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        time.sleep(5)
        holder.stdin.close()  # the ended job's process finally lets go
        _, err = resumed.communicate(timeout=300)
    finally:
        holder.kill()
        subprocess.run(["scancel", job], timeout=60)
    assert resumed.returncode == 0, err[-2000:]
    _one_line(err, f"from SLURM job {job} (CANCELLED)")
    assert len(_rows(out / "rows-shard0of1.jsonl")) == 2


def test_req_node_not_avail_is_fatal_only_for_a_node_the_cluster_does_not_have():
    # A down, drained or reserved node comes back; one SLURM has never heard of does not.
    from tiledattention.launchers.slurm_jobs import JobState

    node = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True,
                          timeout=60).stdout.split()[0]
    gone = JobState("1", "PENDING", "ReqNodeNotAvail, UnavailableNodes:nosuchnode7")
    down = JobState("1", "PENDING", f"ReqNodeNotAvail, UnavailableNodes:{node}")
    assert "nosuchnode7" in gone.never_starts() and down.never_starts() is None
