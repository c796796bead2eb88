"""Launchers (submitit backends): options checked, shards run, failures name the job."""

from __future__ import annotations

import json
import os
import re

import pytest
from speed import scaled  # tests/speed.py

from tiledattention.bench.store import read_rows
from tiledattention.launchers import LauncherError, get_launcher
from tiledattention.stages.bench import ShardTask

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


def test_gpu_reservations_never_share_a_gpu_and_free_on_release(tmp_path):
    from tiledattention.launchers.gpu_lock import reserve

    a = reserve(["0", "1"], lock_dir=str(tmp_path))
    b = reserve(["0", "1"], lock_dir=str(tmp_path))
    assert {a.gpu, b.gpu} == {"0", "1"}
    with pytest.raises(LauncherError, match="no free GPU"):
        reserve(["0", "1"], timeout_s=0.2, poll_s=0.05, lock_dir=str(tmp_path))
    a.release()
    c = reserve(["0", "1"], timeout_s=1, lock_dir=str(tmp_path))
    assert c.gpu == a.gpu
    b.release()
    c.release()


def test_gpu_reservation_is_exclusive_across_processes(tmp_path):
    import subprocess
    import sys

    from tiledattention.launchers.gpu_lock import reserve

    held = reserve(["0"], lock_dir=str(tmp_path))
    code = ("import sys; from tiledattention.launchers.gpu_lock import reserve\n"
            "from tiledattention.launchers import LauncherError\n"
            f"try: reserve(['0'], timeout_s=0.3, poll_s=0.05, lock_dir={str(tmp_path)!r})\n"
            "except LauncherError: sys.exit(3)\n")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 3
    held.release()
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_local_launcher_schedules_shards_over_free_gpus(tmp_path, monkeypatch):
    # The GPU scheduling path, driven on a CPU: two "GPUs" (only CUDA_VISIBLE_DEVICES is
    # set for the jobs), three shards, each shard on a reserved GPU until it ends.
    from tiledattention.launchers import gpu_lock, local

    monkeypatch.setattr(local, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr(gpu_lock, "LOCK_DIR", str(tmp_path / "locks"))
    out = tmp_path / "out"
    tasks = [ShardTask(SMOKE, str(out), i, 3) for i in range(3)]
    results = get_launcher("local", str(tmp_path / "logs"), {"timeout_s": 300}).run(tasks)
    assert [r["shard"] for r in results] == [0, 1, 2]
    rows = sum((read_rows(str(out / f"rows-shard{i}of3.jsonl")) for i in range(3)), [])
    assert len({r["point_key"] for r in rows}) == 8
    held = gpu_lock.reserve(["0", "1"], timeout_s=1)  # all released again
    held.release()


def test_every_gpu_step_names_its_job_after_the_step():
    from tiledattention.launchers import job_name
    from tiledattention.stages.profile import ProfileTask
    from tiledattention.stages.tune import TuneTask

    assert job_name(ShardTask(SMOKE, "out", 1, 8)) == "tiledattn-bench-shard1of8"
    assert job_name(ShardTask(SMOKE, "out", 0, 1, "ladder")) == "tiledattn-ladder-shard0of1"
    assert job_name(TuneTask("t.json", "s.jsonl")) == "tiledattn-tune"
    assert job_name(ProfileTask(("float16:full:64:256",), ("torch_sdpa",), "p")) == \
        "tiledattn-profile"


def test_tuning_as_a_local_job_without_a_gpu_records_why(tmp_path):
    import torch

    from tiledattention.launchers import run_step
    from tiledattention.stages.tune import TuneTask

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the task would tune instead")
    out = tmp_path / "tune" / "table.json"
    task = TuneTask(str(out), str(tmp_path / "tune" / "state.jsonl"), seqs=(512,),
                    head_dims=(64,), dtypes=("float16",))
    result = run_step("local", {"timeout_s": 120}, str(tmp_path / "logs"), task)
    assert result["status"] == "unavailable"
    table = json.loads(out.read_text())
    assert table["entries"] == [] and table["meta"]["unavailable"].startswith(
        "no CUDA GPU visible on ")
    assert list((tmp_path / "logs").glob("*_submitted.pkl"))  # it ran as a submitit job


PROFILE = {"launcher": "slurm", "launcher_options": {"partition": "gpu"}}


def test_a_command_line_config_keeps_the_profiles_launcher():
    from tiledattention.launchers.profiles import restore

    config = {"launcher": "local", "launcher_options": {}, "shards": 4}
    assert restore(config, PROFILE, {"shards": 4}) == ["launcher", "launcher_options"]
    assert config == {"launcher": "slurm", "launcher_options": {"partition": "gpu"},
                      "shards": 4}
    # Options given on the command line win over the profile's; the launcher stays.
    config = {"launcher": "local", "launcher_options": {"partition": "debug"}}
    assert restore(config, PROFILE, {"launcher_options": {"partition": "debug"}}) == [
        "launcher"]
    assert config["launcher"] == "slurm" and config["launcher_options"]["partition"] == "debug"


def test_a_command_line_launcher_against_the_profiles_is_refused():
    from tiledattention.launchers.profiles import restore

    with pytest.raises(LauncherError, match="launcher=slurm, but --config says launcher=local"):
        restore({"launcher": "local"}, PROFILE, {"launcher": "local"})


def test_the_profiles_config_is_read_as_snakemake_reads_it(monkeypatch):
    from pathlib import Path

    from tiledattention.launchers.profiles import profile_config

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    slurm = profile_config(["-n", "--profile", "profiles/slurm", "--config", "shards=4"])
    assert slurm["launcher"] == "slurm" and slurm["launcher_options"]["partition"] == "gpu"
    assert profile_config(["--profile=profiles/local"])["launcher"] == "local"
    assert profile_config([], env_profile="profiles/slurm")["launcher"] == "slurm"
    assert profile_config(["-n"]) == {}


def test_a_failed_gpu_step_job_fails_naming_its_job_and_log(tmp_path):
    # The profiling job raises on the node (its summary.json cannot be written: a directory
    # is in the way): the step exits 1 and names the job and its log, as the rule's log
    # then shows.
    import subprocess
    import sys

    (tmp_path / "profile" / "summary.json").mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-m", "tiledattention.cli", "profile", "--shape",
         "bfloat16:full:64:256", "--launcher", "local",
         "--launcher-options", '{"timeout_s": 120}', "--out", str(tmp_path / "profile")],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 1
    assert re.search(r"tiledattn profile: local job \S+ \(log \S+_log\.err\) failed: .*"
                     r"summary\.json", out.stderr, re.S), out.stderr[-2000:]


def test_an_unknown_profile_method_is_refused_before_any_job(tmp_path, capsys):
    from tiledattention.cli import main

    # The verb's --methods takes the config field's choices (issue 49: options from the
    # dataclass), so the command line refuses it, as every stage verb's.
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--shape", "bfloat16:full:64:256", "--methods", "nonesuch",
              "--launcher", "local", "--out", str(tmp_path / "profile")])
    assert exit_.value.code == 2
    assert "argument --methods: invalid choice: 'nonesuch'" in capsys.readouterr().err
    assert not (tmp_path / "profile" / "logs").exists()


@pytest.mark.parametrize("reason,never", [
    ("PartitionConfig", True), ("PartitionTimeLimit", True), ("InvalidAccount", True),
    ("InvalidQOS", True), ("QOSMaxWallDurationPerJobLimit", True),
    ("AssocMaxCpuPerJobLimit", True), ("QOSMaxGRESPerJob", True),
    # These clear as other jobs end or nodes come back: reported, never fatal.
    ("AssocMaxJobsLimit", False), ("QOSMaxJobsPerUserLimit", False), ("Resources", False),
    ("Priority", False), ("AssocGrpCPULimit", False), ("ReqNodeNotAvail", False),
    ("None", False),
])
def test_only_pending_reasons_that_can_never_resolve_fail_a_job(reason, never):
    from tiledattention.launchers.slurm_jobs import JobState

    assert bool(JobState("1", "PENDING", reason).never_starts()) is never
    assert JobState("1", "RUNNING", reason).never_starts() is None


@pytest.mark.parametrize("options", [
    {"partition": "gpu\ntouch /tmp/x"}, {"account": "a\rb"}, {"qos": "q\x00"},
    {"image": "x.sif\nrm -rf ~"}, {"extra_sbatch": {"comment": "x\ntouch /tmp/x"}},
    {"extra_sbatch": {"x\ny": 1}}, {"extra_sbatch": {"--exclusive; touch": 1}},
    {"extra_sbatch": ["exclusive"]}, {"gpus_per_job": True}, {"mem_gb": "2G"},
])
def test_a_launcher_option_that_could_inject_a_script_line_or_is_mistyped_is_refused(options):
    from tiledattention.launchers import LauncherOptionError, check_launcher

    with pytest.raises(LauncherOptionError, match="slurm launcher option"):
        check_launcher("slurm", options)


def test_the_image_reaches_the_job_script_quoted():
    from tiledattention.launchers.slurm import SlurmOptions, job_python

    assert job_python(SlurmOptions(image="/a b/x.sif")) == \
        "apptainer exec --nv '/a b/x.sif' python3"


def test_sweep_option_errors_exit_2_in_one_line(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "bench.yaml"
    config.write_text("grid: {seqs: [64], head_dims: [32], dtypes: [float32], causal: [false],"
                      " shape_policy: explicit, batch: 1, heads: 2}\nmethods: [eager]\n"
                      "device: cpu\n")
    for options in ('{"gpu_per_job": 1}', '{"partition": "a\\nb"}', "not json"):
        out = subprocess.run(
            [sys.executable, "-m", "tiledattention.cli", "sweep", "--config", str(config),
             "--launcher", "slurm", "--launcher-options", options, "--out",
             str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("tiledattn sweep: ")


def test_config_files_lose_to_the_profile_which_loses_to_the_command_line_and_say_so():
    from tiledattention.launchers.profiles import losing, restore

    files = {"launcher": "local", "launcher_options": {"partition": "nosuchpart",
                                                        "mem_gb": 1, "qos": "high"}}
    profile = {"launcher": "slurm", "launcher_options": {"partition": "gpu", "mem_gb": 64}}
    cli = {"launcher_options": {"mem_gb": 2}}
    config = {"launcher": "local", "launcher_options": {"partition": "nosuchpart",
                                                         "mem_gb": 2, "qos": "high"}}
    assert restore(config, profile, cli) == ["launcher"]
    # Key by key: the profile's partition, the command line's memory, the file's qos.
    assert config == {"launcher": "slurm", "launcher_options": {
        "partition": "gpu", "mem_gb": 2, "qos": "high"}}
    lines = losing(files, profile, config)
    assert [ln.split(" from ")[0] for ln in lines] == [
        "config: launcher: 'local'", "config: launcher_options.partition: 'nosuchpart'"]
    assert "overridden by the profile ('gpu')" in lines[1]


def test_a_launcher_mismatch_gives_advice_that_works(tmp_path):
    from tiledattention.launchers.profiles import restore

    (tmp_path / "local").mkdir()
    with pytest.raises(LauncherError, match="use --profile .*/local instead"):
        restore({}, PROFILE, {"launcher": "local"}, str(tmp_path))
    with pytest.raises(LauncherError, match="run without a profile"):
        restore({}, PROFILE, {"launcher": "debug"}, str(tmp_path))
    with pytest.raises(LauncherError, match="launcher=slrum: unknown launcher; valid"):
        restore({}, PROFILE, {"launcher": "slrum"}, str(tmp_path))


# Launcher options checked against each other, and what the partition offers ------------

@pytest.mark.parametrize("time_min,delay", [(1, 90), (1, 60), (2, 120)])
def test_a_time_limit_at_or_below_the_requeue_signal_delay_is_refused(time_min, delay):
    from tiledattention.launchers import check_launcher
    from tiledattention.launchers.base import LauncherOptionError

    with pytest.raises(LauncherOptionError, match=f"signal_delay_s={delay} is not below "
                       f"time_min={time_min}"):
        check_launcher("slurm", {"time_min": time_min, "signal_delay_s": delay})
    check_launcher("slurm", {"time_min": time_min, "signal_delay_s": time_min * 60 - 1})


def _node(state="idle", cpus=2, mem_mb=22220, gres="gpu:2", limit="1:00:00"):
    from tiledattention.launchers import slurm_jobs

    return slurm_jobs.Node("gpu", "n1", state, cpus, mem_mb, slurm_jobs._gpus(gres), limit)


def test_the_refusal_names_each_setting_above_what_the_partition_offers(monkeypatch):
    from tiledattention.launchers import slurm, slurm_jobs

    monkeypatch.setattr(slurm_jobs, "partition_nodes", lambda p: [_node()])
    o = slurm.check({"partition": "gpu", "cpus_per_job": 8, "mem_gb": 64, "time_min": 120})
    line = slurm.why_refused(o, "Requested node configuration is not available")
    assert "cpus_per_job 8 > 2, mem_gb 64 GB > 21.7 GB, time_min 120 min > 60 min" in line
    assert "\n" not in line and "gpus_per_job" not in line


@pytest.mark.parametrize("state", ["drained", "down*", "draining", "idle*", "maint"])
def test_a_request_that_fits_drained_or_down_nodes_is_queued_not_refused(monkeypatch, capsys,
                                                                         state):
    from tiledattention.launchers import slurm, slurm_jobs

    monkeypatch.setattr(slurm_jobs, "partition_nodes", lambda p: [_node(state)])
    o = slurm.check({"partition": "gpu", "cpus_per_job": 1, "mem_gb": 1, "time_min": 10})
    assert slurm.why_refused(o, "Requested node configuration is not available") is None
    assert f"n1 {state}" in capsys.readouterr().err
    monkeypatch.setattr(slurm_jobs, "partition_nodes", lambda p: [_node("idle")])
    assert "refuses the request" in slurm.why_refused(o, "some other refusal")


def test_a_partition_the_cluster_lacks_is_named_not_called_sinfo_unavailable(monkeypatch):
    from tiledattention.launchers import slurm, slurm_jobs

    monkeypatch.setattr(slurm_jobs, "partition_nodes", lambda p: [])
    monkeypatch.setattr(slurm_jobs, "partitions", lambda: ["gpu", "debug"])
    line = slurm.why_refused(slurm.check({"partition": "gpux"}), "invalid partition")
    assert "partition 'gpux' does not exist on this cluster (its partitions: gpu, debug)" in line


@pytest.mark.parametrize("gres,gpus", [("gpu:2", 2), ("gpu:h100:8(S:0-1)", 8), ("(null)", 0),
                                       ("gpu:a100:4,gpu:h100:4", 8)])
def test_gpus_are_counted_from_sinfo_gres(gres, gpus):
    from tiledattention.launchers import slurm_jobs

    assert slurm_jobs._gpus(gres) == gpus


def test_a_time_limit_is_named_from_the_job_state_or_submitit_s_error_in_its_log(tmp_path):
    from types import SimpleNamespace

    from tiledattention.launchers import slurm
    from tiledattention.launchers.slurm_jobs import JobState

    log = tmp_path / "x_log.err"
    job = SimpleNamespace(paths=SimpleNamespace(stderr=log))
    assert not slurm._hit_time_limit(job, JobState("1", "FAILED"))
    assert slurm._hit_time_limit(job, JobState("1", "TIMEOUT"))
    log.write_text("submitit.core.utils.UncompletedJobError: Job not requeued because: "
                   "timed-out too many times.\n")
    assert slurm._hit_time_limit(job, JobState("1", "FAILED"))


def test_a_dead_runs_snakemake_lock_is_removed_and_a_live_or_unknown_holders_kept(tmp_path):
    import subprocess
    import sys

    from tiledattention.launchers import interrupt

    locks, holders = tmp_path / "locks", tmp_path / "holders"
    locks.mkdir()
    for name in ("0.input.lock", "0.output.lock", "1.input.lock", "2.input.lock"):
        (locks / name).write_text("/some/file\n")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    interrupt.record_holder([str(locks / "0.input.lock"), str(locks / "0.output.lock")],
                            str(holders))
    for name in ("0.input.lock", "0.output.lock"):  # as if a killed run had written them
        (holders / name).write_text(f"{dead} 1\n")
    interrupt.record_holder([str(locks / "1.input.lock")], str(holders))  # this live process
    line = interrupt.release_stale_lock(str(locks), str(holders))
    assert line and f"pid {dead}" in line and "snakemake --unlock" in line
    assert sorted(p.name for p in locks.iterdir()) == ["1.input.lock", "2.input.lock"]
    assert interrupt.release_stale_lock(str(locks), str(holders)) is None


def test_displayed_launcher_options_are_typed_not_the_profiles_strings():
    from tiledattention.launchers.base import typed_options

    shown = typed_options("slurm", {"partition": "gpu", "gpus_per_job": "1", "account": "null",
                                    "time_min": "120"})
    assert shown == {"partition": "gpu", "gpus_per_job": 1, "account": None, "time_min": 120}


def test_a_job_s_submitter_is_alive_only_while_that_very_process_runs():
    import subprocess
    import sys

    from tiledattention.launchers import slurm

    mine = slurm.submitter(slurm.study_mark("/study/logs"))
    assert mine.startswith(slurm.study_mark("/study/logs") + ":")
    assert slurm.submitter_alive(mine)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    host, start = mine.split(":")[2], mine.split(":")[4]
    assert not slurm.submitter_alive(f"tiledattn:x:{host}:{dead}:{start}")
    assert not slurm.submitter_alive(mine.replace(f":{start}", ":1"))  # a reused pid
    assert slurm.study_mark("/study/logs") != slurm.study_mark("/other/logs")


def test_a_lock_no_run_recorded_names_the_one_command_with_the_users_arguments(tmp_path):
    from tiledattention.launchers import interrupt

    locks, holders = tmp_path / "locks", tmp_path / "holders"
    locks.mkdir()
    (locks / "0.output.lock").write_text("/r/plan/bench.yaml\n")
    argv = ["/venv/bin/snakemake", "--profile", "profiles/slurm", "--config", "shards=3",
            "results_dir=my results"]
    line = interrupt.unrecorded_lock(argv, str(locks), str(holders))
    assert line.count("\n") == 0 and "1 Snakemake lock file(s)" in line
    assert line.endswith("release them with: snakemake --unlock --profile profiles/slurm "
                         "--config shards=3 'results_dir=my results'")
    assert (locks / "0.output.lock").exists()  # its holder may run: never removed
    for quiet in (["snakemake", "-n"], ["snakemake", "--unlock"], ["snakemake", "--nolock"]):
        assert interrupt.unrecorded_lock(quiet, str(locks), str(holders)) is None
    interrupt.record_holder([str(locks / "0.output.lock")], str(holders))  # a recorded one
    assert interrupt.unrecorded_lock(argv, str(locks), str(holders)) is None


def test_the_workflow_says_the_unlock_command_for_an_unrecorded_lock(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    if not Path(snakemake).exists():
        pytest.skip("snakemake not installed (pip install '.[workflow]')")
    results = tmp_path / "r"
    (tmp_path / ".snakemake" / "locks").mkdir(parents=True)
    (tmp_path / ".snakemake" / "locks" / "0.output.lock").write_text(
        f"{results}/plan/bench.yaml\n")
    (tmp_path / ".snakemake" / "locks" / "0.input.lock").write_text("")
    args = ["-s", str(root / "Snakefile"), "--configfile", str(root / "config/smoke.yaml"),
            "--config", f"results_dir={results}", "-c1", "--until", "plan"]
    run = subprocess.run([snakemake, *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0 and "LockException" in run.stdout + run.stderr
    lines = [ln for ln in run.stderr.splitlines() if "release them with" in ln]
    assert len(lines) == 1, run.stderr[-2000:]
    command = lines[0].split("release them with: ", 1)[1]
    assert command == "snakemake --unlock " + " ".join(args)
    unlock = subprocess.run([snakemake, *command.split()[1:]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert unlock.returncode == 0 and not (tmp_path / ".snakemake" / "locks").exists()


def test_a_signal_that_stopped_the_run_is_named_in_one_line(monkeypatch):
    import signal

    from tiledattention.launchers import interrupt

    monkeypatch.setattr(interrupt, "STOPPED_BY", [])
    assert interrupt.stopped_line() is None  # a step that failed: Snakemake's error stands
    monkeypatch.setattr(interrupt, "descendants", lambda pid: [])
    with pytest.raises(KeyboardInterrupt):
        interrupt._handler(signal.SIGINT, None)
    for sig in (signal.SIGINT, signal.SIGTERM):  # _handler set the defaults back
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                      else signal.SIG_DFL)
    line = interrupt.stopped_line()
    assert line.startswith("workflow: stopped by Ctrl-C (SIGINT): the 'Error in rule' "
                           "blocks above are the steps that were running")
    assert "\n" not in line and "the same command resumes" in line


@pytest.mark.parametrize("group", [True, False], ids=["Ctrl-C", "SIGINT-to-sweep"])
def test_interrupting_a_local_sweep_ends_in_one_line_without_a_traceback(group, tmp_path):
    # A terminal's Ctrl-C reaches the sweep, submitit's job controller and the job (one
    # process group); `kill -INT` reaches the sweep alone, which cancels the job (submitit
    # sends its controller SIGINT). Either way: one line, exit 130, no traceback from the
    # controller, and no process of the job left running.
    import os
    import signal
    import subprocess
    import sys
    import time

    config = tmp_path / "bench.yaml"
    config.write_text("grid: {seqs: [256, 384], head_dims: [32], dtypes: [float32], "
                      "causal: [false], shape_policy: explicit, batch: 1, heads: 2}\n"
                      "methods: [eager, math]\ntiming: {warmup: 1, reps: 100000, rounds: 2}\n"
                      "device: cpu\n")
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "tiledattention.cli", "sweep", "--config",
                            str(config), "--launcher", "local", "--shards", "1", "--out",
                            str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True, preexec_fn=_sigint_as_default)
    try:
        deadline = time.monotonic() + 120
        while not any("points in shard0of1" in p.read_text()  # the job is measuring
                      for p in out.glob("logs/*_log.err")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT) if group else run.send_signal(signal.SIGINT)
        try:
            stdout, err = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # say which process held on (CI saw this once)
            controllers = [int(p.name.split("_")[0]) for p in out.glob("logs/*_submitted.pkl")]
            alive = [c for c in controllers if os.path.exists(f"/proc/{c}")]
            tasks = _processes_running(str(out / "logs"))
            for pid in alive + tasks:  # this test's own job's processes, by pid
                os.kill(pid, signal.SIGKILL)
            exit_code = run.poll()
            run.kill()
            raise AssertionError(
                f"120 s after the SIGINT: sweep exit {exit_code}, controllers alive {alive} "
                f"of {controllers}, tasks alive {tasks}; the sweep's stderr: "
                f"{run.communicate(timeout=30)[1][-3000:]!r}") from None
    finally:
        run.kill()
    assert "Traceback" not in err + stdout, err
    assert err.strip().splitlines() == ["tiledattn sweep: interrupted"], err
    assert run.returncode == 130
    controller = int(next(out.glob("logs/*_submitted.pkl")).name.split("_")[0])
    deadline = time.monotonic() + scaled(30)  # it ends in ~1 s: a hang guard
    while os.path.exists(f"/proc/{controller}"):  # ended (it is the sweep's child: reaped)
        assert time.monotonic() < deadline, f"submitit's controller {controller} still runs"
        time.sleep(0.2)
    # ... and its task too (a Ctrl-C reached the controller twice and cut its kill_tasks
    # short before the SIGKILL: the task ran on, orphaned, measuring).
    while tasks := _processes_running(str(out / "logs")):
        if time.monotonic() > deadline:
            for pid in tasks:  # this test's own job's task, by its pid
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"the job's task {tasks} still ran")
        time.sleep(0.2)


def _sigint_as_default():
    # As a terminal starts it: a process that inherits SIGINT ignored keeps ignoring it
    # (Python's rule; a shell's background job, or a test worker left so), and the sweep
    # then never ends by it (CI: "sweep exit None" 120 s after the signal).
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processes_running(marker: str) -> list[int]:
    """Living processes whose command line names ``marker`` (a job's log folder)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker in f.read().decode(errors="replace") and not _reaped(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def _reaped(pid: int) -> bool:
    """A child that ended shows as a zombie until its parent reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_signal_while_submit_returns_stops_the_controller_it_started(tmp_path, monkeypatch):
    # The CI flake of the test above (SIGINT to the sweep alone, 1 run in many): a signal
    # that reached the launcher inside submitit's submit, after the job's controller had
    # started and before the job was handed back, left that controller running (and the
    # sweep's output pipes open). Here the interrupt comes right after submit's last step.
    import contextlib
    import functools
    import os
    import signal
    import time

    from submitit.core import utils

    original = utils.JobPaths.move_temporary_file

    def then_interrupt(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(utils.JobPaths, "move_temporary_file", then_interrupt)
    launcher = get_launcher("local", str(tmp_path / "logs"), {"timeout_s": 120})
    with pytest.raises(KeyboardInterrupt):
        launcher.run([functools.partial(time.sleep, 300)])
    # submitit names the job by its controller's pid: the one process to wait for.
    (pickle,) = (tmp_path / "logs").glob("*_submitted.pkl")
    controller = int(pickle.name.split("_")[0])
    deadline = time.monotonic() + scaled(30)  # it ends in ~1 s: a hang guard
    try:
        while os.path.exists(f"/proc/{controller}") and not _reaped(controller):
            assert time.monotonic() < deadline, f"controller {controller} still runs"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(OSError):
            os.kill(controller, signal.SIGKILL)  # this test's own child, by its pid


def test_a_job_controller_starts_with_sigint_blocked():
    # A SIGINT that reaches a controller between fork and exec was lost (CPython's handler
    # in the forked child only records it), and one during its first imports ended it
    # with a traceback: the launcher starts it with SIGINT blocked instead.
    import subprocess
    import sys

    from tiledattention.launchers.local import start_blocking_sigint

    child = start_blocking_sigint(
        [sys.executable, "-c", "import signal; "
         "print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"],
        [], stdout=subprocess.PIPE, text=True)
    assert child.communicate(timeout=60)[0].strip() == "True"


def test_a_sigint_sent_while_the_controller_starts_ends_it_quietly(tmp_path):
    # Sent at once, the signal is pending (blocked) until the controller's handler is in
    # place: the controller ends by it, before starting any task, with no traceback.
    import os
    import signal
    import subprocess
    import sys

    from tiledattention.launchers.local import start_blocking_sigint

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        here, os.environ.get("PYTHONPATH")]))}
    controller = start_blocking_sigint(
        [sys.executable, "-m", "tiledattention.launchers.local_controller", str(tmp_path)],
        [], env=env, stderr=subprocess.PIPE, text=True)
    controller.send_signal(signal.SIGINT)
    _, err = controller.communicate(timeout=60)
    assert controller.returncode == -signal.SIGINT, err
    assert "Traceback" not in err


def test_a_ctrl_c_reaching_the_launcher_while_a_controller_starts_leaves_it_recorded(
        monkeypatch):
    # The launcher's SIGINT is blocked while it starts a controller; one that arrives then
    # raises as the mask is restored. The controller must be in ``started`` by that time,
    # or the launcher's Ctrl-C path cannot stop it (CI: a sweep sent SIGINT exited, its
    # controller and job ran on holding the sweep's pipes).
    import signal
    import subprocess
    import sys
    import threading

    from tiledattention.launchers import local

    real_popen = subprocess.Popen

    def popen_then_sigint(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        # to this thread, where it is blocked (sent to the process, another thread of a
        # pytest-xdist worker would take it): pending until the mask goes
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        return process

    monkeypatch.setattr(local.subprocess, "Popen", popen_then_sigint)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever it was
    started = []
    try:
        with pytest.raises(KeyboardInterrupt):
            local.start_blocking_sigint([sys.executable, "-c", "import time; time.sleep(60)"],
                                        started)
    finally:
        signal.signal(signal.SIGINT, before)
    assert len(started) == 1
    started[0].kill()
    started[0].wait(timeout=60)


def test_an_interrupt_names_as_cancelled_only_the_jobs_that_had_not_ended(monkeypatch, capsys):
    # Issue 38: "cancelled jobs 46" was printed for a job that had completed. Job 46 has
    # ended, 47 runs: only 47 is cancelled and named.
    import signal
    from types import SimpleNamespace

    from tiledattention.launchers import slurm, slurm_jobs
    from tiledattention.launchers.slurm_jobs import JobState

    states = {"46": JobState("46", "COMPLETED"), "47": JobState("47", "RUNNING")}
    monkeypatch.setattr(slurm_jobs, "query", lambda ids: {i: states[i] for i in ids})
    cancelled = []
    monkeypatch.setattr(slurm_jobs, "cancel", cancelled.extend)
    launcher = slurm.Launcher.__new__(slurm.Launcher)
    launcher._jobs = [SimpleNamespace(job_id="46"), SimpleNamespace(job_id="47")]
    with pytest.raises(KeyboardInterrupt):
        slurm._cancel_on_signal(launcher)._handler(signal.SIGINT, None)
    assert cancelled == ["47"]
    assert capsys.readouterr().err.strip() == "slurm: SIGINT: cancelled jobs 47"
    states["47"] = JobState("47", "COMPLETED")
    with pytest.raises(KeyboardInterrupt):
        slurm._cancel_on_signal(launcher)._handler(signal.SIGTERM, None)
    assert capsys.readouterr().err.strip() == "slurm: SIGTERM: cancelled jobs (none)"
