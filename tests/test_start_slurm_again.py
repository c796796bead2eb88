"""tests/cluster/start-slurm.sh run again with the directory of a cluster it started: a
cluster that still runs and answers (another CI run's, a user's) is refused in one line,
exit 3, its daemons, jobs and files untouched, unless --restart (or
TILEDATTN_SLURM_RESTART=1) asks to replace it; what a killed run left (daemons gone, or a
controller that does not answer) is stopped by PID before the start.

No SLURM needed: the daemons are stand-ins (sleep under a daemon's name, which is what
/proc/PID/comm shows and what the scripts check), squeue and scancel are stubs, and a
stand-in slurmd the directory does not record plays "another cluster", so that no start
goes further than its refusal."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "cluster" / "start-slurm.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="start-slurm.sh runs as root")


@pytest.fixture
def machine(tmp_path):
    """Stand-in daemons (started with ``machine.daemon(name)``, killed at the end), stub
    SLURM clients, and a cluster directory as start-slurm.sh leaves it."""
    procs: list[subprocess.Popen] = []
    bin_dir, daemons = tmp_path / "bin", tmp_path / "daemons"
    bin_dir.mkdir()
    daemons.mkdir()
    scancels = tmp_path / "scancel.log"
    stubs = {
        # squeue answers (exit 0, an empty queue) unless FAKE_SQUEUE_RC says otherwise.
        "squeue": 'exit "${FAKE_SQUEUE_RC:-0}"',
        "scancel": f'echo "$*" >> {scancels}',
        # Present, so start-slurm.sh installs nothing.
        "slurmctld": "exit 0", "mariadbd": "exit 0", "munged": "exit 0",
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)

    def daemon(name: str) -> int:
        exe = daemons / name
        if not exe.exists():
            shutil.copy(shutil.which("sleep"), exe)
        procs.append(subprocess.Popen([str(exe), "300"]))
        # Reaped as soon as it ends, as init reaps the real (setsid) daemons: a zombie's
        # /proc/PID/comm still names it.
        threading.Thread(target=procs[-1].wait, daemon=True).start()
        # Popen may return before the child's exec: its comm is then still the parent's.
        deadline = time.monotonic() + 30
        while not _runs(procs[-1].pid, name):
            assert time.monotonic() < deadline, f"the stand-in {name} did not start"
            time.sleep(0.01)
        return procs[-1].pid

    directory = tmp_path / "cluster"
    for sub in ("etc", "run", "log"):
        (directory / sub).mkdir(parents=True)
    (directory / ".tiledattn-ci-slurm").touch()
    (directory / "etc" / "slurm.conf").write_text("ClusterName=ci\n")
    (directory / "log" / "slurmctld.log").write_text("the running cluster's log\n")

    def start(*args: str, **env: str) -> subprocess.CompletedProcess:
        full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "TILEDATTN_SLURM_DIR": str(directory), "TILEDATTN_SLURM_PORT": "27817"}
        full.pop("TILEDATTN_SLURM_RESTART", None)
        full.update(env)
        return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                              timeout=120, env=full, cwd=tmp_path)

    class Machine:
        pass

    m = Machine()
    m.daemon, m.start, m.dir, m.scancels = daemon, start, directory, scancels
    yield m
    for p in procs:
        p.kill()
        p.wait(timeout=30)


def _record(directory: Path, **pids: int) -> None:
    (directory / "run" / "pids").write_text("".join(f"{n} {p}\n" for n, p in pids.items()))


def _runs(pid: int, name: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


def _stopped(pid: int, name: str) -> bool:
    deadline = time.monotonic() + 30
    while _runs(pid, name) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _runs(pid, name)


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_a_live_cluster_of_the_same_directory_is_refused_and_keeps_its_daemons_and_jobs(
        machine):
    pids = {"munged": machine.daemon("munged"), "slurmctld": machine.daemon("slurmctld"),
            "slurmd": machine.daemon("slurmd")}
    _record(machine.dir, **pids)
    out = machine.start()
    assert out.returncode == 3, out.stderr
    line = _one_line(out.stderr)
    assert f"a cluster of this script runs in {machine.dir} and answers" in line, line
    assert "--restart" in line and f"slurmctld(pid {pids['slurmctld']})" in line, line
    assert all(_runs(pid, name) for name, pid in pids.items()), "a daemon was stopped"
    assert not machine.scancels.exists(), "its jobs were cancelled"
    assert (machine.dir / "log" / "slurmctld.log").read_text() == "the running cluster's log\n"
    assert (machine.dir / "run" / "pids").exists()


@pytest.mark.parametrize("how", ["dead controller", "controller not answering"])
def test_what_a_killed_run_left_is_stopped_by_pid_before_the_start(machine, how):
    munged = machine.daemon("munged")
    if how == "dead controller":
        gone = subprocess.Popen(["true"])
        gone.wait(timeout=30)
        ctld, env = gone.pid, {}
    else:
        ctld, env = machine.daemon("slurmctld"), {"FAKE_SQUEUE_RC": "1"}
    _record(machine.dir, munged=munged, slurmctld=ctld)
    foreign = machine.daemon("slurmd")  # not recorded: another cluster's
    out = machine.start(**env)
    # Its leftovers stopped, it then meets the other cluster, left alone.
    assert out.returncode == 3, out.stderr
    assert "another SLURM cluster runs on this machine" in _one_line(out.stderr)
    assert _stopped(munged, "munged") and _stopped(ctld, "slurmctld")
    assert _runs(foreign, "slurmd")
    assert f"stopped munged (pid {munged})" in out.stdout, out.stdout


@pytest.mark.parametrize("opt_in", [("--restart",), ("TILEDATTN_SLURM_RESTART=1",)])
def test_restart_replaces_a_live_cluster_of_the_same_directory(machine, opt_in):
    pids = {"slurmctld": machine.daemon("slurmctld"), "slurmd": machine.daemon("slurmd")}
    _record(machine.dir, **pids)
    foreign = machine.daemon("slurmdbd")  # not recorded: the start stops at it
    args, env = (opt_in, {}) if opt_in[0].startswith("--") else \
        ((), dict([opt_in[0].split("=")]))
    out = machine.start(*args, **env)
    assert out.returncode == 3, out.stderr
    assert "another SLURM cluster runs on this machine" in _one_line(out.stderr)
    assert all(_stopped(pid, name) for name, pid in pids.items())
    assert machine.scancels.read_text().startswith("--full"), "its jobs were not cancelled"
    assert _runs(foreign, "slurmdbd")


def test_an_unknown_argument_is_one_line_and_exit_2(machine):
    out = machine.start("--restrat")
    assert out.returncode == 2
    assert "unknown argument '--restrat'" in _one_line(out.stderr)
