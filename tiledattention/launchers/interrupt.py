"""Ctrl-C or SIGTERM to Snakemake reaches the GPU steps' launchers, which cancel their jobs.

Snakemake on SIGTERM only stops scheduling and waits for running jobs (a SLURM step may wait
a day); on SIGINT sent to it alone it stops without telling the steps. The workflow calls
``forward`` at start: either signal is passed on as SIGTERM to every ``tiledattn`` process
Snakemake started (each launcher then cancels what it submitted, see slurm._cancel_on_signal) and
Snakemake stops as on Ctrl-C. A launcher whose Snakemake has gone altogether (SIGKILL)
notices on its next poll (slurm.workflow_gone).
"""

from __future__ import annotations

import contextlib
import os
import signal


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # comm may hold spaces and parentheses: the ppid follows the last ")".
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_step(pid: int) -> bool:
    """A ``tiledattn`` process (a GPU step's launcher): only those are signalled, so the
    rule's shell and its ``tee`` stay to carry the launcher's last lines to the terminal."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")[:3]
    except OSError:
        return False
    return any(os.path.basename(a) == "tiledattn" or a == "tiledattention.cli" for a in argv)


# The signal that stopped this run (set by ``_handler``), for ``stopped_line``.
STOPPED_BY: list[int] = []


def _handler(signum, frame):
    STOPPED_BY.append(signum)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal stops Snakemake as usual
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                      else signal.SIG_DFL)
    for pid in descendants(os.getpid()):
        if is_step(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    raise KeyboardInterrupt


def forward() -> None:
    """Install the handlers (in Snakemake's main thread, after its scheduler set its own)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def stopped_line() -> str | None:
    """The run's last line when a signal stopped it (the workflow's onerror): Snakemake
    prints an "Error in rule" block for every step that was running, which read as failures
    (about 110 lines for a study's parallel steps); this line says what they were."""
    if not STOPPED_BY:
        return None
    name = signal.Signals(STOPPED_BY[0]).name
    how = "Ctrl-C" if STOPPED_BY[0] == signal.SIGINT else name
    return (f"workflow: stopped by {how} ({name}): the 'Error in rule' blocks above are the "
            "steps that were running, stopped, their jobs cancelled, not failures; the same "
            "command resumes (finished rows are kept)")


def export_pid() -> None:
    """Tell the steps which process is the workflow's (see slurm.workflow_gone)."""
    os.environ["TILEDATTN_WORKFLOW_PID"] = str(os.getpid())


# Where a run's SLURM launchers keep what they last said about waiting (slurm._say_changed).
SAID_ENV = "TILEDATTN_SLURM_SAID"


def export_said_file(results: str) -> None:
    """Tell the steps where this run keeps what it said (the study's logs folder)."""
    os.environ[SAID_ENV] = os.path.abspath(os.path.join(results, "logs", "slurm-said"))


# Snakemake's lock after a kill: Snakemake records no holder, so a killed run leaves
# .snakemake/locks/N.{input,output}.lock behind and every rerun stops asking for --unlock.
# The workflow records, for each lock file it holds, its process (pid and start time); a
# rerun removes exactly the lock files whose recorded process is gone, as `snakemake
# --unlock` would. A lock file with no record, or whose holder runs, is left to Snakemake.
HOLDERS = os.path.join(".snakemake", "tiledattn-lock-holders")


def _started(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record_holder(lock_files: list[str], holders: str = HOLDERS) -> None:
    """Say that this process holds ``lock_files`` (called at onstart)."""
    me = f"{os.getpid()} {_started(os.getpid())}\n"
    with contextlib.suppress(OSError):
        os.makedirs(holders, exist_ok=True)
        for path in lock_files:
            with open(os.path.join(holders, os.path.basename(path)), "w") as f:
                f.write(me)


def forget_holder(lock_files: list[str], holders: str = HOLDERS) -> None:
    """Drop this run's records as it ends (Snakemake removes the lock files themselves)."""
    for path in lock_files:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(holders, os.path.basename(path)))


def release_stale_lock(locks: str = os.path.join(".snakemake", "locks"),
                       holders: str = HOLDERS) -> str | None:
    """Remove the lock files whose recorded holder is no longer running; the line to show,
    or None where nothing was removed (Snakemake then decides, naming --unlock)."""
    try:
        names = os.listdir(locks)
    except OSError:
        return None
    gone = set()
    for name in names:
        try:
            with open(os.path.join(holders, name)) as f:
                pid, start = f.read().split()
        except (OSError, ValueError):
            continue
        if not (pid.isdigit() and _started(int(pid)) == start):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(locks, name))
                os.remove(os.path.join(holders, name))
                gone.add(pid)
    if not gone:
        return None
    return (f"workflow: removed the lock left by an earlier run (pid {', '.join(sorted(gone))},"
            " no longer running), as snakemake --unlock would")


# Runs that ask Snakemake for no lock (or only for --unlock itself): no line for them.
_NO_LOCK = {"-n", "--dry-run", "--dryrun", "--unlock", "--nolock", "--lint", "-l",
            "--list-rules", "--list", "--list-target-rules", "--lt", "-S", "--summary",
            "-D", "--detailed-summary", "--dag", "--rulegraph", "--filegraph", "--report",
            "--cleanup-metadata", "--cm", "--version", "-v", "-h", "--help"}


def unrecorded_lock(argv: list[str], locks: str = os.path.join(".snakemake", "locks"),
                    holders: str = HOLDERS) -> str | None:
    """The one line for lock files no run recorded a holder for (a run of an older workflow,
    or one killed before its onstart): nothing here can tell whether their holder still
    runs, so they stay, and the line names the command that releases them, the user's own
    arguments and all. None when there are none, or when this run takes no lock."""
    if any(a in _NO_LOCK or a.startswith("--dry") for a in argv[1:]):
        return None
    try:
        names = sorted(n for n in os.listdir(locks) if n.endswith(".lock"))
    except OSError:
        return None
    unknown = [n for n in names if not os.path.exists(os.path.join(holders, n))]
    if not unknown:
        return None
    import shlex

    command = shlex.join(["snakemake", "--unlock", *argv[1:]])
    return (f"workflow: {len(unknown)} Snakemake lock file(s) in {locks} were left by a run "
            "that recorded no holder (an older workflow, or one killed before it started); "
            f"if no other snakemake runs in {os.getcwd()}, release them with: {command}")
