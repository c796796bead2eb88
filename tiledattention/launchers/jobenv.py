"""What belongs to the job environment, not to the code a job measures: a KeyboardInterrupt
(Ctrl-C, or SIGTERM turned into one), SystemExit, submitit's UncompletedJobError (raised
from its USR2 handler when a job reaches its time limit and may not be requeued again), and
``JobStopped`` (the harness's own stop: SIGTERM from scancel or SLURM while a point is
measured). None of these says anything about a method: a harness that records errors as
rows re-raises them first (``reraise``), so the job ends failed instead of publishing the
signal as a measurement."""

from __future__ import annotations

import sys


class JobStopped(BaseException):
    """The job was told to stop (SIGTERM: scancel, its time limit, the workflow stopping)
    while it measured; the point it cut is measured again on resume. A BaseException, so
    no ``except Exception`` takes it for a method's failure."""


_requeueing = [False]  # set by ``requeue``: submitit's handler is requeueing this attempt


def requeue(task):
    """submitit's ``checkpoint`` hook of a resumable task: the same task, requeued.

    From here until submitit's USR2 handler ends the attempt (``scontrol requeue``, its
    "Requeued job" line, ``sys.exit``), the SIGTERM SLURM sends because of that requeue is
    the attempt ending, not a stop: ``requeueing()`` tells the measure loop not to raise
    ``JobStopped`` for it, which would unwind submitit's handler before it logs and exits
    and end the requeued attempt with an error instead."""
    import submitit

    _requeueing[0] = True
    return submitit.helpers.DelayedSubmission(task)


def requeueing() -> bool:
    return _requeueing[0]


def belongs_to_job(exc: BaseException) -> bool:
    """True for an exception the job environment raised (see the module's docstring)."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit, JobStopped)):
        return True
    # Only a process that imported submitit can have received its error.
    utils = sys.modules.get("submitit.core.utils")
    return utils is not None and isinstance(exc, utils.UncompletedJobError)


def job_cause(exc: BaseException) -> BaseException | None:
    """The job-environment exception ``exc`` is or wraps (a compiler error raised ``from``
    a signal that landed inside the compile), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if belongs_to_job(exc):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def reraise(exc: BaseException) -> None:
    """Raise the job-environment exception ``exc`` is or wraps; return otherwise."""
    cause = job_cause(exc)
    if cause is not None:
        raise cause
