"""Shards as SLURM jobs through submitit: sbatch, requeue on preemption/time limit, and
the job's Python inside a container image when one is configured."""

from __future__ import annotations

from dataclasses import dataclass, field

import submitit

from .base import LauncherError, ShardTask, check_options, job_name, wait


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


def job_python(o: SlurmOptions) -> str | None:
    """The interpreter a job runs: inside the image when one is configured."""
    return f"apptainer exec --nv {o.image} python3" if o.image else None


def sbatch_parameters(o: SlurmOptions) -> dict:
    """submitit SlurmExecutor parameters (they become #SBATCH lines)."""
    params = dict(partition=o.partition, account=o.account, qos=o.qos,
                  constraint=o.constraint, cpus_per_task=o.cpus_per_job, mem=f"{o.mem_gb}G",
                  time=o.time_min, signal_delay_s=o.signal_delay_s, job_name="tiledattn",
                  additional_parameters=dict(o.extra_sbatch))
    if o.gpus_per_job:
        params["gres"] = f"gpu:{o.gpus_per_job}"
    return {k: v for k, v in params.items() if v is not None}


class Launcher:
    name = "slurm"

    def __init__(self, folder: str, options: dict):
        self.options = check_options(SlurmOptions, options, self.name)
        o = self.options
        if (o.gpus_per_job < 0 or o.cpus_per_job < 1 or o.mem_gb < 1 or o.time_min < 1
                or o.signal_delay_s < 0 or o.max_requeue < 0):
            raise LauncherError("slurm launcher: gpus_per_job, signal_delay_s, max_requeue >= 0;"
                                " cpus_per_job, mem_gb and time_min >= 1")
        try:
            self.executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=o.max_requeue,
                                                   python=job_python(o))
        except RuntimeError as exc:  # submitit: "Could not detect srun"
            raise LauncherError(f"slurm launcher: no SLURM client on this machine ({exc}); "
                                "run from a cluster login node or use --launcher local") from exc
        self.executor.update_parameters(**sbatch_parameters(o))

    def run(self, tasks: list[ShardTask]) -> list[dict]:
        # Each job is named after its step (tiledattn-tune, tiledattn-bench-shard0of8, ...)
        # so sacct shows what ran where; an array carries the name of its step.
        if self.options.array and len(tasks) > 1:
            self.executor.update_parameters(job_name=job_name(tasks[0]).rsplit("-shard", 1)[0])
            jobs = self.executor.submit_array(tasks)
        else:
            jobs = []
            for t in tasks:
                self.executor.update_parameters(job_name=job_name(t))
                jobs.append(self.executor.submit(t))
        return wait(jobs, self._describe, self.options.timeout_s, self.options.poll_s)

    @staticmethod
    def _describe(job) -> str:
        try:
            state = job.state
        except Exception:  # sacct unreachable: say so rather than hide the log path
            state = "UNKNOWN"
        return f"SLURM job {job.job_id} (state {state}, log {job.paths.stderr})"
