"""submitit's local job controller, ended quietly. submitit starts one controller process
per local job; a cancel (``LocalJob.cancel`` sends SIGINT) or the terminal's Ctrl-C (the
controller shares its process group) raises KeyboardInterrupt in it, and submitit's own
entry point prints that traceback on the user's terminal. Here the controller stops its
tasks as submitit's does (``Controller.run``'s ``finally``), then ends by the same signal
without a traceback, so the job still reads as interrupted."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def _first_interrupt(signum, frame):
    # Ctrl-C reaches the controller twice (the terminal's, then the launcher's cancel): a
    # second KeyboardInterrupt inside submitit's kill_tasks (SIGINT to the tasks, a second's
    # wait, SIGKILL) would end the controller before the SIGKILL and leave a task running.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(folder: str) -> None:
    signal.signal(signal.SIGINT, _first_interrupt)
    try:
        # The launcher starts this process with SIGINT blocked
        # (``local.start_blocking_sigint``): one sent while it started arrives here.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        from submitit.local.local import Controller

        Controller(Path(folder)).run()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    main(sys.argv[1])
