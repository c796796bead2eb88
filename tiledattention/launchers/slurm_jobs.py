"""What SLURM says about a job: its state and pending reason (squeue, then sacct once the
controller has forgotten it), which reasons can never resolve, and the one line that
tells the user what to change."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from dataclasses import dataclass, replace

# States after which the job never runs again (unless requeued, which squeue then shows).
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"}

# Pending reasons that no amount of waiting resolves: the request itself is beyond what the
# partition, account or QOS allows (or names something that does not exist), so only a
# changed setting helps. Limits on jobs *in flight* (AssocMaxJobsLimit, QOSMaxJobsPerUser,
# AssocGrp*, Resources, Priority, ReqNodeNotAvail of a node that is down or reserved) clear
# as other jobs end, and are only reported.
_NEVER = {
    "PartitionConfig": "the request does not fit the partition (its time limit, or its "
                       "nodes' CPUs, memory, GPUs): lower time_min / cpus_per_job / mem_gb / "
                       "gpus_per_job or pick another partition",
    "PartitionTimeLimit": "time_min is above the partition's MaxTime: lower time_min or pick "
                          "another partition",
    "PartitionNodeLimit": "the node count is outside the partition's limits: pick another "
                          "partition",
    "InvalidAccount": "the account does not exist or you are not in it: set account",
    "InvalidQOS": "the QOS does not exist or your account may not use it: set qos",
    "BadConstraints": "no node satisfies the constraint / GRES request: change constraint or "
                      "gpus_per_job",
    "DependencyNeverSatisfied": "a dependency can never be satisfied: drop it from extra_sbatch",
}
# A limit on the job's own size (not on how many run at once): it never clears.
_PER_JOB = re.compile(r"^(Assoc|QOS)(Max|Min)\w*PerJob(Limit)?$|^(Assoc|QOS)MaxWallDuration")


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, ... (UNKNOWN: SLURM has no record)
    reason: str = ""
    exit_code: str = ""  # sacct's ExitCode, "status:signal" of the job's batch script
    derived_exit_code: str = ""  # sacct's DerivedExitCode: the worst of its steps'

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def never_starts(self) -> str | None:
        """Why this pending job can never start (and what to change), or None."""
        if self.state != "PENDING":
            return None
        if self.reason in _NEVER:
            return _NEVER[self.reason]
        if _PER_JOB.match(self.reason):
            return ("the request is above a per-job limit of your account or QOS: lower "
                    "cpus_per_job / mem_gb / gpus_per_job / time_min, or set qos / account")
        nodes = self.reason.partition("UnavailableNodes:")[2].strip()
        if self.reason.startswith("ReqNodeNotAvail") and nodes and not _nodes_exist(nodes):
            # A down or reserved node comes back; a node the cluster no longer has does not.
            return (f"it asks for node(s) {nodes}, which this cluster does not have: drop "
                    "nodelist from extra_sbatch")
        return None

    def describe(self) -> str:
        """The state, with its reason and, for a job that failed, how it ended (the exit
        code or signal sacct recorded: FAILED (NonZeroExitCode) alone does not say that
        the job's Python was killed)."""
        parts = [self.reason] if self.reason and self.reason != "None" else []
        if self.final and self.state not in _SAYS_HOW:
            ended = exit_text(self.exit_code)
            step = exit_text(self.derived_exit_code)
            parts += [ended] if ended else []
            parts += [f"a job step {step}"] if step and step != ended else []
        return f"{self.state} ({', '.join(parts)})" if parts else self.state


# Final states that say how the job ended themselves (its exit code would only repeat it:
# scancel's and the time limit's SIGTERM).
_SAYS_HOW = {"COMPLETED", "CANCELLED", "TIMEOUT", "DEADLINE", "PREEMPTED"}


def exit_text(code: str) -> str | None:
    """sacct's "status:signal" in words (None for 0:0 or no record): "killed by signal 9
    (SIGKILL)", "exit code 1", "exit code 137 (128 + signal 9, SIGKILL)"."""
    status, _, sig = code.partition(":")
    if not (status.isdigit() and sig.isdigit()):
        return None
    status_n, sig_n = int(status), int(sig)
    if sig_n:
        return f"killed by signal {sig_n} ({_signal_name(sig_n)})"
    if status_n > 128 and _signal_name(status_n - 128) != "unknown signal":
        return f"exit code {status_n} (128 + signal {status_n - 128}, " \
               f"{_signal_name(status_n - 128)})"
    return f"exit code {status_n}" if status_n else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _nodes_exist(nodes: str) -> bool:
    """Whether scontrol knows the nodes (True when it cannot be asked: never guess fatal)."""
    try:
        out = subprocess.run(["scontrol", "show", "node", nodes], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return not (out.returncode != 0 and "not found" in (out.stderr + out.stdout).lower())


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


def _base(job_id: str) -> str:
    return job_id.split("_")[0]


def query(job_ids: list[str]) -> dict[str, JobState]:
    """The state of each job: the controller's view (squeue, which keeps ended jobs for
    MinJobAge), else accounting (sacct); UNKNOWN where neither knows the job yet."""
    found: dict[str, JobState] = {}
    bases = ",".join(sorted({_base(j) for j in job_ids}))
    # -r: one line per array task; --states=all: ended jobs too, with their final state.
    for line in _run(["squeue", "-h", "-r", "--states=all", "-j", bases,
                      "-o", "%i|%T|%r"]).splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in job_ids:
            found[parts[0]] = JobState(parts[0], parts[1], parts[2])
    # Accounting for the jobs squeue does not know, and for the exit codes of those that
    # ended otherwise than COMPLETED (squeue has none).
    ask = [j for j in job_ids if j not in found or
           (found[j].final and found[j].state != "COMPLETED")]
    accounted = accounting(ask) if ask else {}
    for j, s in accounted.items():
        if j not in found:
            found[j] = s
        elif s.state == found[j].state:
            found[j] = replace(found[j], exit_code=s.exit_code,
                               derived_exit_code=s.derived_exit_code)
    return {j: found.get(j, JobState(j, "UNKNOWN")) for j in job_ids}


def accounting(job_ids: list[str]) -> dict[str, JobState]:
    """What accounting (sacct) records of each job: its state (final once the job ended:
    the authority on how it ended), reason and exit codes; a job it has no record of is
    left out."""
    found = {}
    for line in _run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids),
                      "-o", "JobID,State,Reason,ExitCode,DerivedExitCode"]).splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5 and parts[0] in job_ids:
            # "CANCELLED by 0": the state is the first word.
            found[parts[0]] = JobState(parts[0], (parts[1].split() or ["UNKNOWN"])[0],
                                       parts[2], parts[3], parts[4])
    return found


def partition_limits(partition: str | None) -> str:
    """What the partition offers (its time limit; its nodes' CPUs, memory, GRES), to name
    next to a request it cannot hold; empty when sinfo does not answer."""
    args = ["sinfo", "-h", "-o", "%P|%l|%c|%m|%G"] + (["-p", partition] if partition else [])
    rows = {tuple(ln.split("|")) for ln in _run(args).splitlines() if ln.count("|") == 4}
    return "; ".join(f"partition {p.rstrip('*')}: time limit {t}, nodes with {c} CPUs, "
                     f"{m} MB, gres {g}" for p, t, c, m, g in sorted(rows))


# Node states (sinfo %T, without its flag suffixes) in which a node takes new jobs.
_USABLE = {"idle", "mixed", "allocated", "completing", "planned"}


@dataclass(frozen=True)
class Node:
    partition: str
    name: str
    state: str  # sinfo's long state: idle, mixed, drained, down*, ...
    cpus: int
    mem_mb: int
    gpus: int
    time_limit: str  # as sinfo prints it: 1:00:00, 2-00:00:00, infinite

    @property
    def usable(self) -> bool:
        return self.state.rstrip("*~#!%$@^-+") in _USABLE and not self.state.endswith("*")


def partition_nodes(partition: str | None) -> list[Node] | None:
    """The nodes of ``partition`` (the default partition when None) with their state and
    size; [] when the cluster has no such partition, None when sinfo does not answer."""
    args = ["sinfo", "-h", "-N", "-o", "%P|%N|%T|%c|%m|%G|%l"] + (["-p", partition]
                                                                  if partition else [])
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    nodes = []
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7 or (partition is None and not parts[0].endswith("*")):
            continue
        with contextlib.suppress(ValueError):
            nodes.append(Node(parts[0].rstrip("*"), parts[1], parts[2], int(parts[3]),
                              int(parts[4].rstrip("+")), _gpus(parts[5]), parts[6]))
    return nodes


def partitions() -> list[str]:
    return sorted({ln.strip().rstrip("*") for ln in _run(["sinfo", "-h", "-o", "%P"]).split()})


def _gpus(gres: str) -> int:
    # gres as sinfo prints it: "gpu:2", "gpu:h100:8(S:0-1)", "(null)".
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def minutes(limit: str) -> float | None:
    """sinfo's time limit ([D-]HH:MM:SS, MM:SS, infinite) in minutes; None if unlimited."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 1440 + parts[0] * 60 + parts[1] + parts[2] / 60


def exceeding(request: dict, nodes: list[Node]) -> list[str]:
    """The settings of ``request`` (cpus_per_job, mem_gb, gpus_per_job, time_min) above
    what the largest node of the partition and its time limit offer, each as
    "setting asked > offered"."""
    if not nodes:
        return []
    limits = [minutes(n.time_limit) for n in nodes]
    offered = {
        "cpus_per_job": (max(n.cpus for n in nodes), ""),
        "mem_gb": (round(max(n.mem_mb for n in nodes) / 1024, 1), " GB"),
        "gpus_per_job": (max(n.gpus for n in nodes), " GPUs"),
        "time_min": (None if None in limits else max(limits), " min"),
    }
    out = []
    for key, (have, unit) in offered.items():
        want = request.get(key)
        if want is not None and have is not None and want > have:
            have_text = f"{have:g}" if isinstance(have, float) else str(have)
            out.append(f"{key} {want}{unit} > {have_text}{unit}")
    return out


# States of a job that still runs or will (squeue's long names).
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
          "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


def active_jobs(name: str, mark: str) -> dict[str, str]:
    """This user's jobs called ``name`` whose comment starts with ``mark`` (the study's)
    and that still run or wait, each with its comment: what a run of the same step
    submitted."""
    import getpass

    out = _run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-n", name, "-o", "%i|%T|%k"])
    found = {}
    for line in out.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3 and parts[1] in ACTIVE and parts[2].strip().startswith(mark + ":"):
            found[parts[0]] = parts[2].strip()
    return found


def state_of(job_id: str) -> JobState:
    return query([job_id])[job_id]


def cancel(job_ids: list[str]) -> None:
    """scancel, best effort (the jobs may have ended meanwhile)."""
    if job_ids:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(["scancel", *job_ids], capture_output=True, timeout=60)
