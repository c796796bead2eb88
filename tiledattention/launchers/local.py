"""Shards as local processes through submitit's LocalExecutor: in parallel, one GPU each
where GPUs are visible (each shard reserves a free GPU machine-wide, see gpu_lock), one at
a time on a CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import submitit
from submitit.local import local as submitit_local

from . import base
from .base import LauncherError, interrupts_raise, wait
from .gpu_lock import reserve


@dataclass(frozen=True)
class LocalOptions:
    timeout_s: float | None = None
    timeout_min: int = 600  # per job, as submitit counts it
    python: str | None = None  # e.g. "apptainer exec --nv IMAGE python3"


class _Executor(submitit.LocalExecutor):
    """submitit's LocalExecutor whose job controller ends without a traceback when the
    job is cancelled or the terminal's Ctrl-C reaches it (see local_controller). The
    controller is started as submitit's ``start_controller`` starts it (same environment),
    through our entry point, and recorded in ``started`` at once; ``setup`` commands are
    not used here."""

    def __init__(self, folder: str, python: str | None, started: list):
        super().__init__(folder=folder, python=python)
        self.started = started

    def _submit_command(self, command: str):
        p = self.parameters
        ntasks = p.get("tasks_per_node", 1)
        n_gpus, visible = p.get("gpus_per_node", 0), p.get("visible_gpus", ())
        gpus = range(n_gpus) if visible == () else visible[:n_gpus]
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ,
               "SUBMITIT_LOCAL_NTASKS": str(ntasks),
               "SUBMITIT_LOCAL_COMMAND": command,
               "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * p.get("timeout_min", 2.0))),
               "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(p.get("signal_delay_s", 30))),
               "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
               "SUBMITIT_STDERR_TO_STDOUT": "1" if p.get("stderr_to_stdout") else "",
               "SUBMITIT_EXECUTOR": "local",
               "CUDA_VISIBLE_DEVICES": ",".join(str(k) for k in gpus),
               "SUBMITIT_LOCAL_WITH_SHELL": "",
               # the controller imports this package from where this process did
               "PYTHONPATH": os.pathsep.join(filter(None, [here,
                                                           os.environ.get("PYTHONPATH")]))}
        process = start_blocking_sigint([sys.executable, "-m",
                                         f"{__package__}.local_controller", str(self.folder)],
                                        self.started, env=env)
        return submitit_local.LocalJob(folder=self.folder, job_id=str(process.pid),
                                       process=process, tasks=list(range(ntasks)))


def start_blocking_sigint(args: list, started: list, **kwargs) -> subprocess.Popen:
    """``Popen`` whose child starts with SIGINT blocked (the mask survives fork and exec;
    ``local_controller`` unblocks it once its handler is in place), appended to
    ``started``. A SIGINT sent to a controller that was still starting (a cancel or Ctrl-C
    right after submit) used to be lost between fork and exec, or to end it with a
    traceback mid-import; blocked, it waits for the handler."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process = subprocess.Popen(args, **kwargs)
        # Recorded while this process's SIGINT is still blocked: one that came meanwhile
        # raises as the mask is restored, and the launcher's Ctrl-C path must find the
        # controller to stop it (returned only, it ran on, holding the caller's pipes).
        started.append(process)
        return process
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def visible_gpus() -> list[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch CUDA: CPU only
        return []


class Launcher(base.Launcher):
    name = "local"
    Options = LocalOptions

    def run(self, tasks: list) -> list[dict]:
        self.started: list[subprocess.Popen] = []  # every job controller, as it starts
        with interrupts_raise():
            try:
                return self._run(tasks)
            except KeyboardInterrupt:
                # Also a controller started inside submitit's submit, before its job was
                # handed back (no cancel reached it). One SIGINT more than a cancel sent is
                # harmless: the controller ignores all but the first (local_controller).
                for process in self.started:
                    if process.poll() is None:
                        process.send_signal(signal.SIGINT)
                raise

    def _executor(self) -> _Executor:
        return _Executor(folder=self.folder, python=self.options.python,
                         started=self.started)

    def _run(self, tasks: list) -> list[dict]:
        gpus = visible_gpus()
        if gpus:
            return self._run_on_gpus(tasks, gpus)
        # CPU: one shard at a time, so shards do not fight over two cores.
        results = []
        for t in tasks:
            ex = self._executor()
            ex.update_parameters(timeout_min=self.options.timeout_min)
            results += wait([ex.submit(t)], self._describe, self.options.timeout_s)
        return results

    def _run_on_gpus(self, tasks: list, gpus: list[str]) -> list[dict]:
        # Start each shard as soon as a GPU is free; hold the GPU until its shard ends.
        # Results are kept by position: any picklable task works, not only shards.
        running, results, pending = [], {}, list(enumerate(tasks))
        try:
            while pending or running:
                for job, res, i in list(running):
                    if job.done():
                        res.release()
                        running.remove((job, res, i))
                        results[i] = wait([job], self._describe, None)[0]
                if pending:
                    try:
                        res = reserve(gpus, timeout_s=0)
                    except LauncherError:
                        time.sleep(0.5)
                        continue
                    i, task = pending.pop(0)
                    ex = self._executor()
                    ex.update_parameters(timeout_min=self.options.timeout_min, gpus_per_node=1,
                                         visible_gpus=(int(res.gpu),))
                    running.append((ex.submit(task), res, i))
                else:
                    time.sleep(0.5)
        finally:
            for job, res, _ in running:
                job.cancel(check=False)
                res.release()
        return [results[i] for i in range(len(tasks))]

    @staticmethod
    def _describe(job) -> str:
        return f"local job {job.job_id} (log {job.paths.stderr})"
