"""Shards as SLURM jobs through submitit: sbatch (its request checked with ``sbatch
--test-only`` first), requeue on preemption/time limit, the job's Python inside a container
image when one is configured, and a watch that shows each job's state on the terminal,
fails at once on a job that can never start, fails every job SLURM did not report
COMPLETED, and cancels the jobs on SIGINT/SIGTERM."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import submitit

from . import base, interrupt, slurm_jobs
from .base import LauncherError, LauncherOptionError, check_options, job_name

# Status lines go to stderr, which the workflow's rules show on the terminal.
# A job that stays pending is reported again this often (with its reason), one that
# runs less often.
HEARTBEAT_S = {"PENDING": 60.0, "RUNNING": 600.0}
# How long a rerun waits for the jobs it cancelled (an earlier run's leftovers) to end:
# SLURM's KillWait (30 s by default) and a margin.
LEFTOVER_WAIT_S = 180.0


def study_mark(folder: str) -> str:
    """What every job of a step's log folder carries in its comment (no spaces: it is an
    #SBATCH line)."""
    digest = hashlib.sha256(os.path.abspath(folder).encode()).hexdigest()[:16]
    return f"tiledattn:{digest}"


def submitter(mark: str) -> str:
    """The job's comment: the study's mark and the process that submits and watches it
    (host, pid, start time), so a rerun tells a killed run's jobs from a live run's."""
    return f"{mark}:{socket.gethostname()}:{os.getpid()}:{interrupt._started(os.getpid())}"


def submitter_alive(comment: str) -> bool:
    """Whether the process that submitted a job (see ``submitter``) still runs. One on
    another host cannot be asked: taken as gone (a rerun on another login node then
    cancels the jobs of a killed run there)."""
    host, _, rest = comment.split(":", 2)[2].partition(":")
    pid, _, start = rest.partition(":")
    return (host == socket.gethostname() and pid.isdigit()
            and interrupt._started(int(pid)) == start)


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus_per_job: int = 1
    cpus_per_job: int = 8
    mem_gb: int = 64
    time_min: int = 120
    extra_sbatch: dict = field(default_factory=dict)  # e.g. {"reservation": "x"}
    image: str | None = None  # Apptainer image: jobs run "apptainer exec --nv IMAGE python3"
    array: bool = True  # submit a shard set as one job array
    max_requeue: int = 3
    signal_delay_s: int = 90  # USR2 this long before the time limit: checkpoint + requeue
    timeout_s: float | None = None  # give up waiting (jobs are cancelled)
    poll_s: float = 5.0
    test_only: bool = True  # sbatch --test-only before the first real submission


# An sbatch option name as sbatch spells it (extra_sbatch keys become `#SBATCH --<key>=`).
_SBATCH_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def check(options: dict) -> SlurmOptions:
    """The typed options, or LauncherOptionError naming the option and what is allowed."""
    o = check_options(SlurmOptions, options, "slurm")
    if (o.gpus_per_job < 0 or o.cpus_per_job < 1 or o.mem_gb < 1 or o.time_min < 1
            or o.signal_delay_s < 0 or o.max_requeue < 0 or o.poll_s <= 0):
        raise LauncherOptionError("slurm launcher: gpus_per_job, signal_delay_s, max_requeue "
                                  ">= 0; cpus_per_job, mem_gb and time_min >= 1; poll_s > 0")
    if o.signal_delay_s >= o.time_min * 60:
        raise LauncherOptionError(
            f"slurm launcher: signal_delay_s={o.signal_delay_s} is not below time_min="
            f"{o.time_min} ({o.time_min * 60} s): every job would be signalled to requeue as "
            "soon as it starts; raise time_min or lower signal_delay_s")
    if not isinstance(o.extra_sbatch, dict):
        raise LauncherOptionError("slurm launcher option extra_sbatch: expected a mapping of "
                                  f"sbatch options, e.g. {{\"reservation\": \"x\"}}, got "
                                  f"{o.extra_sbatch!r}")
    for key, value in o.extra_sbatch.items():
        if not (isinstance(key, str) and _SBATCH_KEY.match(key)):
            raise LauncherOptionError(f"slurm launcher option extra_sbatch: {key!r} is not an "
                                      "sbatch option name (letters, digits, - and _)")
        if not isinstance(value, (str, int, float, bool)) or "\n" in str(value) \
                or "\r" in str(value):
            raise LauncherOptionError(f"slurm launcher option extra_sbatch.{key}: {value!r} "
                                      "must be one line of text or a number")
    return o


def why_refused(o: SlurmOptions, sbatch_says: str) -> str | None:
    """The one line that says why sbatch --test-only refused ``o`` and what to change,
    or None where the refusal is only the nodes' current state (every node of the
    partition drained or down, or just resumed): the request is then submitted and waits,
    its pending reason reported."""
    nodes = slurm_jobs.partition_nodes(o.partition)
    where = f"partition {o.partition}" if o.partition else "the default partition"
    if nodes == [] and o.partition:
        return (f"slurm launcher: partition {o.partition!r} does not exist on this cluster "
                f"(its partitions: {', '.join(slurm_jobs.partitions()) or 'none'}); set "
                f"launcher_options partition [sbatch --test-only: {sbatch_says}]")
    too_big = slurm_jobs.exceeding(
        {"cpus_per_job": o.cpus_per_job, "mem_gb": o.mem_gb, "gpus_per_job": o.gpus_per_job,
         "time_min": o.time_min}, nodes or [])
    if too_big:
        return (f"slurm launcher: sbatch --test-only refuses the request: {', '.join(too_big)}"
                f" on {where}; change these launcher_options (see profiles/slurm/README.md) "
                f"[sbatch: {sbatch_says}]")
    if nodes and not any(n.usable for n in nodes):
        states = ", ".join(sorted({f"{n.name} {n.state}" for n in nodes}))
        _say_changed(f"slurm: sbatch --test-only refuses the request now ({sbatch_says}), but "
                     f"no node of {where} takes jobs ({states}) and the request fits them: it "
                     "is queued and waits for a node")
        return None
    limits = slurm_jobs.partition_limits(o.partition) or "sinfo did not answer"
    return (f"slurm launcher: sbatch --test-only refuses the request: {sbatch_says} "
            f"({_settings(o)}; {limits}); change these launcher_options (see "
            "profiles/slurm/README.md)")


def preflight(options: dict, folder: str) -> None:
    """Ask SLURM once, before any step, whether the study's request can ever run (the
    workflow calls this at its start): a refusal is one line for the whole run, not one
    per parallel step."""
    o = check(options)
    if o.test_only:
        Launcher(folder, options)._test_only()


def job_python(o: SlurmOptions) -> str | None:
    """The interpreter a job runs: inside the image when one is configured (quoted: the
    command is a line of the sbatch script)."""
    return f"apptainer exec --nv {shlex.quote(o.image)} python3" if o.image else None


def sbatch_parameters(o: SlurmOptions) -> dict:
    """submitit SlurmExecutor parameters (they become #SBATCH lines)."""
    params = dict(partition=o.partition, account=o.account, qos=o.qos,
                  constraint=o.constraint, cpus_per_task=o.cpus_per_job, mem=f"{o.mem_gb}G",
                  time=o.time_min, signal_delay_s=o.signal_delay_s, job_name="tiledattn",
                  additional_parameters=dict(o.extra_sbatch),
                  # The step's log appends too (submitit's #SBATCH --open-mode=append is the
                  # job's; srun documents its own default as the site's JobFileAppend), so
                  # a requeued job keeps both attempts' lines whatever the site sets.
                  srun_args=["--open-mode=append"])
    if o.gpus_per_job:
        params["gres"] = f"gpu:{o.gpus_per_job}"
    return {k: v for k, v in params.items() if v is not None}


def _settings(o: SlurmOptions) -> str:
    shown = {k: getattr(o, k) for k in ("partition", "account", "qos", "constraint",
                                        "gpus_per_job", "cpus_per_job", "mem_gb", "time_min")}
    return ", ".join(f"{k}={v}" for k, v in shown.items() if v is not None)


def _sbatch_error(text: str) -> str:
    """sbatch's own complaint out of its output (the last 'error' line)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "failure" in ln.lower()]
    return (errors or lines or ["no output"])[-1][-300:]


class Launcher(base.Launcher):
    name = "slurm"
    Options = SlurmOptions
    check = staticmethod(check)  # check_options, then the limits no one option states

    def __init__(self, folder: str, options: dict):
        super().__init__(folder, options)
        o = self.options
        try:
            self.executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=o.max_requeue,
                                                   python=job_python(o))
        except RuntimeError as exc:  # submitit: "Could not detect srun"
            raise LauncherOptionError(f"slurm launcher: no SLURM client on this machine ({exc});"
                                      " run from a cluster login node or use --launcher local"
                                      ) from exc
        self.mark = study_mark(folder)
        self.executor.update_parameters(**sbatch_parameters(o), comment=submitter(self.mark))
        self._jobs: list = []

    def run(self, tasks: list) -> list:
        # Each job is named after its step (tiledattn-tune, tiledattn-bench-shard0of8, ...)
        # so sacct shows what ran where; an array carries the name of its step.
        # Each job also carries the study's mark (its log folder, hashed) as its comment, so
        # a rerun after a killed Snakemake finds the jobs its step left running.
        array = self.options.array and len(tasks) > 1
        names = _job_names(tasks, array)
        with _cancel_on_signal(self):
            self._end_leftovers(names)
            if self.options.test_only:
                self._test_only()
            if array:
                self.executor.update_parameters(job_name=names[0])
                self._jobs = self._submit(lambda: self.executor.submit_array(tasks))
            else:
                for t in tasks:
                    self.executor.update_parameters(job_name=job_name(t))
                    self._jobs += self._submit(lambda t=t: [self.executor.submit(t)])
            return self._watch(self._jobs)

    def end_leftovers(self, tasks: list) -> None:
        """End what an earlier, killed run of these tasks left running (see below); the
        sweep calls it before it checks the rows locks those jobs hold."""
        self._end_leftovers(_job_names(tasks, self.options.array and len(tasks) > 1))

    def _end_leftovers(self, names: list[str]) -> None:
        """Cancel the jobs of these steps of this study that an earlier run left running
        (Snakemake and its steps killed at once: nobody cancelled them) and wait until they
        have ended, so the step is not queued twice behind its own rows lock. Their rows so
        far are kept; the new job resumes after them."""
        left = [j for name in names
                for j, comment in slurm_jobs.active_jobs(name, self.mark).items()
                if not submitter_alive(comment)]
        if not left:  # none, or a live run's (its rows lock then refuses, naming the job)
            return
        slurm_jobs.cancel(left)
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while time.monotonic() < deadline:
            states = slurm_jobs.query(left)
            if not any(s.state in slurm_jobs.ACTIVE for s in states.values()):
                _say(_leftovers_line(names, _final_states(states)))
                return
            time.sleep(self.options.poll_s)
        raise LauncherError(f"slurm launcher: job(s) {' '.join(left)} left by an earlier run "
                            f"did not end within {LEFTOVER_WAIT_S:.0f}s of scancel; check "
                            "`squeue -j " + ",".join(left) + "` and rerun")

    def cancel_all(self) -> list[str]:
        """Cancel this launcher's jobs that have not ended; their ids (an ended job is
        neither cancelled nor named)."""
        ids = [j.job_id for j in self._jobs]
        states = slurm_jobs.query(ids) if ids else {}
        live = [i for i in ids if not states[i].final]
        slurm_jobs.cancel(live)
        return live

    def _submit(self, submit) -> list:
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit echoes sbatch's errors
                jobs = submit()
        except Exception as exc:  # noqa: BLE001 - submitit wraps sbatch's failure variously
            raise LauncherOptionError(f"slurm launcher: sbatch refused the job: "
                                      f"{_sbatch_error(exc)} ({_settings(self.options)})"
                                      ) from None
        for j in jobs:
            _say(f"slurm: submitted job {j.job_id} ({self._name(j)}), log {j.paths.stderr}")
        return jobs

    def _test_only(self) -> None:
        """Ask sbatch whether the request could ever run, before anything is queued."""
        script = self.executor._make_submission_file_text("true", "test-only")
        try:
            out = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True,
                                 text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LauncherError(f"slurm launcher: sbatch --test-only did not answer ({exc})"
                                ) from None
        if out.returncode == 0:
            _say_changed(None)  # nodes take jobs: a later wait is said anew
            return
        refusal = why_refused(self.options, _sbatch_error(out.stderr + out.stdout))
        if refusal:
            raise LauncherOptionError(refusal)


    def _name(self, job) -> str:
        sub = getattr(self.executor, "parameters", {}).get("job_name", "tiledattn")
        return sub if "_" not in str(job.job_id) else f"{sub} task {job.job_id.split('_')[1]}"

    def _describe(self, job, state) -> str:
        return f"SLURM job {job.job_id} ({state.describe()}, log {job.paths.stderr})"

    def _watch(self, jobs: list) -> list:
        """Poll until every job has ended; report changes; fail fast on a job that can
        never start; then every job not COMPLETED fails the run, whatever it wrote."""
        o = self.options
        ids = [j.job_id for j in jobs]
        deadline = None if o.timeout_s is None else time.monotonic() + o.timeout_s
        shown: dict[str, tuple] = {}
        started = time.monotonic()
        final_seen: dict[str, str] = {}
        ran: set[str] = set()
        while True:
            if workflow_gone():
                live = self.cancel_all()
                ended = [i for i in ids if i not in live]
                raise LauncherError("slurm launcher: the Snakemake run that started this step "
                                    f"has ended; cancelled {' '.join(live) or '(none)'}"
                                    + (f" ({' '.join(ended)} had ended)" if ended else ""))
            states = slurm_jobs.query(ids)
            now = time.monotonic()
            for j in jobs:
                s = states[j.job_id]
                last = shown.get(j.job_id)
                if last is None or last[0] != s.describe() or (
                        now - last[1] > HEARTBEAT_S.get(s.state, float("inf"))):
                    again = f" (still, after {now - started:.0f}s)" if last and \
                        last[0] == s.describe() else ""
                    log = f", log {j.paths.stderr}" if s.final and s.state != "COMPLETED" \
                        else ""
                    _say(f"slurm: job {j.job_id} {s.describe()}{again}{log}"
                         f"{_requeued(j.job_id, s, ran)} [{self._name(j)}]")
                    shown[j.job_id] = (s.describe(), now)
                if s.state == "RUNNING":
                    ran.add(j.job_id)
                why = s.never_starts()
                if why:
                    slurm_jobs.cancel(ids)
                    raise LauncherOptionError(
                        f"slurm launcher: job {j.job_id} can never start: pending "
                        f"({s.reason}): {why} ({_settings(o)}; "
                        f"{slurm_jobs.partition_limits(o.partition) or 'sinfo did not answer'}); "
                        f"cancelled {' '.join(ids)}")
            # A final state counts once it is seen on two polls in a row: a job being
            # requeued (preemption, time limit) passes through such states.
            done = {j: s.state for j, s in states.items()
                    if s.final and final_seen.get(j) == s.state}
            final_seen = {j: s.state for j, s in states.items() if s.final}
            if len(done) == len(ids):
                break
            if deadline is not None and now > deadline:
                slurm_jobs.cancel(ids)
                raise LauncherError(f"slurm launcher: jobs did not finish within "
                                    f"{o.timeout_s:.0f}s (timeout_s); cancelled "
                                    f"{[self._describe(j, states[j.job_id]) for j in jobs]}")
            time.sleep(o.poll_s)
        failed = [self._describe(j, states[j.job_id]) for j in jobs
                  if states[j.job_id].state != "COMPLETED"]
        timed_out = [j for j in jobs if states[j.job_id].state != "COMPLETED"
                     and _hit_time_limit(j, states[j.job_id])]
        if timed_out:
            raise LauncherError("; ".join(
                f"time limit: step {self._name(j)}, SLURM job {j.job_id} "
                f"({states[j.job_id].describe()}, log {j.paths.stderr})" for j in timed_out)
                + f" ran out of its time limit (time_min={o.time_min}, not requeued again "
                f"after max_requeue={o.max_requeue}); raise time_min, or max_requeue (a "
                "requeued step resumes), and rerun")
        if failed:
            raise LauncherError(f"{'; '.join(failed)}: SLURM did not report COMPLETED, so the "
                                "step failed whatever it wrote (a rerun resumes it)")
        results = []
        for j in jobs:
            try:
                results.append(j.result())
            except Exception as exc:  # noqa: BLE001 - the job's own error, shortened
                last = [ln for ln in str(exc).strip().splitlines() if ln.strip()][-1:]
                raise LauncherError(f"{self._describe(j, states[j.job_id])} failed: "
                                    f"{(last or ['no error text'])[0][-500:]}") from None
        return results


def _final_states(states: dict) -> dict:
    """How each ended job ended, as accounting (sacct) records it: a job that was finishing
    (COMPLETING) when it was cancelled ends COMPLETED, not CANCELLED; squeue's view where
    sacct has no final record yet."""
    accounted = slurm_jobs.accounting(list(states))
    return {j: accounted[j] if j in accounted and accounted[j].final else s
            for j, s in states.items()}


def _leftovers_line(names: list[str], ended: dict) -> str:
    """The line for the jobs an earlier, killed run left, once they have ended: only those
    the scancel stopped are called cancelled."""
    by_state: dict[str, list[str]] = {}
    for j, s in ended.items():
        by_state.setdefault(s.state, []).append(j)
    said = [f"{' '.join(by_state.pop('CANCELLED'))} cancelled"] if "CANCELLED" in by_state \
        else []
    if "COMPLETED" in by_state:
        said.append(f"{' '.join(by_state.pop('COMPLETED'))} had already completed")
    others: dict[str, list[str]] = {}
    for ids in by_state.values():
        for j in ids:
            others.setdefault(ended[j].describe(), []).append(j)
    said += [f"{' '.join(ids)} ended {how}" for how, ids in sorted(others.items())]
    return (f"slurm: job(s) {' '.join(ended)} of {', '.join(names)} (this study, left "
            f"running by an earlier run that was killed): {'; '.join(said)}; their rows are "
            "kept and the step resumes after them")


def _job_names(tasks: list, array: bool) -> list[str]:
    """The job names the tasks are submitted under (one for an array: its step's)."""
    return ([job_name(tasks[0]).rsplit("-shard", 1)[0]] if array
            else [job_name(t) for t in tasks])


def _requeued(job_id: str, s, ran: set) -> str:
    """A job seen running that waits again (BeginTime) was requeued: say why it waits."""
    if s.state == "PENDING" and s.reason == "BeginTime" and job_id in ran:
        return (": requeued after its time limit or a preemption, it resumes once SLURM "
                "lets it start again")
    return ""


def _hit_time_limit(job, s) -> bool:
    """SLURM ended the job at its time limit, or submitit's USR2 handler stopped it there
    without a requeue left (UncompletedJobError, "timed-out", in its log)."""
    if s.state in ("TIMEOUT", "DEADLINE"):
        return True
    try:
        with open(job.paths.stderr, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().decode(errors="replace")
    except OSError:
        return False
    return ("UncompletedJobError" in tail and "timed-out" in tail) or "DUE TO TIME LIMIT" in tail


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # the terminal's pipe is gone (an interrupt)
        print(line, file=sys.stderr, flush=True)


# Every step of a workflow run asks sbatch --test-only: a partition whose nodes take no jobs
# would be reported once per step (11 times in one run). The workflow names a file (see
# interrupt.export_said_file) where its processes keep what they last said about waiting,
# so the run says a waiting state once per change.
SAID_ENV = interrupt.SAID_ENV


def _run_key() -> str | None:
    """The workflow run this process belongs to (its pid and start time), None outside one."""
    pid = os.environ.get("TILEDATTN_WORKFLOW_PID", "")
    start = interrupt._started(int(pid)) if pid.isdigit() else None
    return f"{pid}:{start}" if start else None


def _say_changed(line: str | None) -> None:
    """Say the waiting ``line`` unless this run said the same last; None: the nodes take jobs
    again, so the next wait is said anew."""
    path, run = os.environ.get(SAID_ENV), _run_key()
    if not (path and run):
        if line:
            _say(line)
        return
    now = f"{run}\n{line or ''}"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # parallel steps: one says it
            f.seek(0)
            said = f.read()
            if said == now or (line is None and said.partition("\n")[0] != run):
                return
            f.seek(0)
            f.truncate()
            f.write(now)
            f.flush()
            if line:
                _say(line)
    except OSError:  # no note to keep: say it (more often, never less)
        if line:
            _say(line)


class _cancel_on_signal:
    """While jobs are submitted and watched, SIGINT/SIGTERM (Ctrl-C, Snakemake stopping)
    and the workflow's process going away cancel this launcher's jobs before it exits."""

    def __init__(self, launcher: Launcher):
        self.launcher = launcher
        self.previous: dict = {}

    def _handler(self, signum, frame):
        for sig in self.previous:  # one cancel, however many signals follow
            signal.signal(sig, signal.SIG_IGN)
        ids = self.launcher.cancel_all()
        _say(f"slurm: {signal.Signals(signum).name}: cancelled jobs {' '.join(ids) or '(none)'}")
        raise KeyboardInterrupt

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self.previous.items():
            signal.signal(sig, old)
        return False


def workflow_gone() -> bool:
    """True when the Snakemake process that started this step has exited (it exports its
    pid as TILEDATTN_WORKFLOW_PID): its jobs are then orphans and are cancelled."""
    pid = os.environ.get("TILEDATTN_WORKFLOW_PID", "")
    return pid.isdigit() and not os.path.exists(f"/proc/{pid}")
