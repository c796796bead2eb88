"""How a SLURM job ended, read from what SLURM recorded (squeue and sacct outputs recorded
on the CI cluster, replayed here): a rerun after kill -9 of Snakemake calls cancelled only
the jobs its scancel stopped, not those that had already completed."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

import pytest

from tiledattention.launchers import slurm, slurm_jobs

MARK = "tiledattn:0123456789abcdef"
# The killed run's jobs: submitted from another host (taken as gone), one array of 2 shards.
LEFT = {"squeue -h -r -u": f"4101_0|COMPLETING|{MARK}:login2:999:1\n"
                           f"4101_1|RUNNING|{MARK}:login2:999:1\n"}


def _replay(monkeypatch, recorded: dict[str, str]) -> list[list[str]]:
    """slurm_jobs' commands answered from ``recorded`` (command prefix -> output, sacct's
    by job: one line each, "id|..."); the commands run, in order."""
    ran = []

    def run(cmd):
        ran.append(cmd)
        line = " ".join(cmd)
        if cmd[0] == "sacct":
            ids = cmd[cmd.index("-j") + 1].split(",")
            return "".join(ln + "\n" for ln in recorded["sacct"].splitlines()
                           if ln.split("|")[0] in ids)
        return next((out for prefix, out in recorded.items() if line.startswith(prefix)), "")

    monkeypatch.setattr(slurm_jobs, "_run", run)
    cancelled = []
    monkeypatch.setattr(slurm_jobs, "cancel", cancelled.extend)
    return cancelled


def _launcher() -> slurm.Launcher:
    launcher = slurm.Launcher.__new__(slurm.Launcher)
    launcher.options = slurm.check({"poll_s": 0.01})
    launcher.mark = MARK
    launcher._jobs = []
    return launcher


@pytest.mark.parametrize("squeue_after", [
    # The controller still knows them: the one finishing at the scancel ended COMPLETED.
    "4101_0|COMPLETED|None\n4101_1|CANCELLED|None\n",
    # It has forgotten them (MinJobAge): accounting only.
    "",
], ids=["squeue", "sacct only"])
def test_a_rerun_calls_cancelled_only_the_leftovers_its_scancel_stopped(monkeypatch, capsys,
                                                                        squeue_after):
    cancelled = _replay(monkeypatch, {
        **LEFT, "squeue -h -r --states=all": squeue_after,
        "sacct": "4101_0|COMPLETED|None|0:0|0:0\n4101_1|CANCELLED by 0|None|0:15|0:0"})
    _launcher()._end_leftovers(["tiledattn-bench"])
    assert cancelled == ["4101_0", "4101_1"]
    line = capsys.readouterr().err.strip()
    assert line.startswith("slurm: job(s) 4101_0 4101_1 of tiledattn-bench (this study, left "
                           "running by an earlier run that was killed): "), line
    assert ": 4101_1 cancelled; 4101_0 had already completed; their rows are kept" in line, line


def test_sacct_not_squeue_says_how_a_leftover_ended(monkeypatch, capsys):
    # squeue's view of a job cancelled while completing can differ; accounting is final.
    _replay(monkeypatch, {
        **LEFT, "squeue -h -r --states=all": "4101_0|CANCELLED|None\n4101_1|CANCELLED|None\n",
        "sacct": "4101_0|COMPLETED|None|0:0|0:0\n4101_1|CANCELLED by 0|None|0:15|0:0"})
    _launcher()._end_leftovers(["tiledattn-bench"])
    assert ": 4101_1 cancelled; 4101_0 had already completed;" in capsys.readouterr().err


def test_a_step_whose_snakemake_died_names_as_cancelled_only_the_jobs_that_had_not_ended(
        monkeypatch):
    # kill -9 of Snakemake alone: its step notices on the next poll and cancels its jobs;
    # job 46 had completed, 47 ran.
    cancelled = _replay(monkeypatch, {
        "squeue -h -r --states=all": "46|COMPLETED|None\n47|RUNNING|None\n", "sacct": ""})
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    monkeypatch.setenv("TILEDATTN_WORKFLOW_PID", str(gone.pid))
    assert not os.path.exists(f"/proc/{gone.pid}")
    launcher = _launcher()
    launcher._jobs = [SimpleNamespace(job_id="46"), SimpleNamespace(job_id="47")]
    with pytest.raises(slurm.LauncherError) as err:
        launcher._watch(launcher._jobs)
    assert cancelled == ["47"]
    assert str(err.value).endswith("has ended; cancelled 47 (46 had ended)"), err.value


@pytest.mark.parametrize("exit_code,derived,says", [
    ("0:9", "0:0", "FAILED (NonZeroExitCode, killed by signal 9 (SIGKILL))"),
    ("137:0", "0:9", "FAILED (NonZeroExitCode, exit code 137 (128 + signal 9, SIGKILL), "
                     "a job step killed by signal 9 (SIGKILL))"),
    # Recorded on the CI cluster after kill -9 of the job's Python: srun exits 9, its step
    # was killed by signal 9.
    ("9:0", "0:9", "FAILED (NonZeroExitCode, exit code 9, a job step killed by signal 9 "
                   "(SIGKILL))"),
    ("1:0", "1:0", "FAILED (NonZeroExitCode, exit code 1)"),
    ("", "", "FAILED (NonZeroExitCode)"),  # accounting has no record (yet)
])
def test_a_failed_job_says_its_exit_code_or_signal_and_its_log(monkeypatch, capsys, tmp_path,
                                                               exit_code, derived, says):
    # The job's Python killed (kill -9, the OOM killer): squeue says only FAILED
    # (NonZeroExitCode); sacct's ExitCode says how it ended.
    _replay(monkeypatch, {"squeue -h -r --states=all": "4200|FAILED|NonZeroExitCode\n",
                          "sacct": f"4200|FAILED|NonZeroExitCode|{exit_code}|{derived}"})
    monkeypatch.delenv("TILEDATTN_WORKFLOW_PID", raising=False)
    log = tmp_path / "logs" / "4200_0_log.err"
    launcher = _launcher()
    launcher.executor = SimpleNamespace(parameters={"job_name": "tiledattn-bench-shard0of1"})
    launcher._jobs = [SimpleNamespace(job_id="4200", paths=SimpleNamespace(stderr=log))]
    with pytest.raises(slurm.LauncherError) as err:
        launcher._watch(launcher._jobs)
    assert str(err.value).startswith(f"SLURM job 4200 ({says}, log {log}): SLURM did not "
                                     "report COMPLETED"), err.value
    status = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("slurm: job")]
    assert status == [f"slurm: job 4200 {says}, log {log} [tiledattn-bench-shard0of1]"], status


def test_a_completed_or_cancelled_job_is_described_without_exit_codes():
    from tiledattention.launchers.slurm_jobs import JobState

    assert JobState("1", "COMPLETED", "None", "0:0", "0:0").describe() == "COMPLETED"
    # scancel's SIGTERM: CANCELLED says it.
    assert JobState("1", "CANCELLED", "None", "0:15", "0:0").describe() == "CANCELLED"
    assert JobState("1", "RUNNING", "None", "0:0", "0:0").describe() == "RUNNING"
