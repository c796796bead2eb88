"""Study wall time against GPU count, and what stays serial, from the studies' own timelines.

``tiledattn scaling STUDY... --out DIR``: each study's finished runs (``logs/runs.jsonl``,
written by the workflow, see ``timeline``) give a run's wall time, its GPU count (the
``gpu`` slots of ``profiles/local``; under SLURM the jobs in flight, which the cluster
decides) and its jobs' start and end. Per run:

- the GPU phase: from the first GPU step's start to the last one's end; GPU work: the sum
  of the GPU steps' times (what more GPUs share out); mean and peak GPU steps in flight;
- serial: the run's wall time less its GPU phase (Snakemake's start, the plan before the
  first GPU step; aggregate, figures, manifest, bundle and its verification after the last);
  the CPU rules' own times are listed by rule. Kernel compiles happen inside each GPU step
  (each process compiles the variants its points use), so they are GPU work, repeated in
  each shard that needs the same variant.

Against the run with the fewest GPUs (n0): speedup = wall(n0) / wall(n), efficiency =
speedup × n0 / n, ideal (linear) = wall(n0) × n0 / n, and Amdahl's bound = serial(n0) +
GPU phase(n0) × n0 / n. Written as scaling.md, scaling.csv and scaling.png/.pdf.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

from ..errors import StudyError
from . import timeline


@dataclass(frozen=True)
class Run:
    study: str
    gpus: int | None  # the gpu slots the run had (None: not a local run)
    launcher: str | None
    wall_s: float
    gpu_phase_s: float
    gpu_work_s: float
    gpu_steps: int
    peak: int  # most GPU steps in flight at once
    serial_s: float
    cpu_rules: dict[str, float]  # rule -> seconds (sum over its jobs)

    @property
    def mean_busy(self) -> float | None:
        return self.gpu_work_s / self.gpu_phase_s if self.gpu_phase_s > 0 else None

    @property
    def count(self) -> int:
        """The GPU count the run is plotted at: its slots, else the peak it reached."""
        return self.gpus if self.gpus else self.peak


def _peak(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = now = 0
    for _, step in events:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


def run_of(study: str, run: dict) -> Run | None:
    """The scaling facts of one finished run, or None when it did not end well or ran no
    GPU step (a rerun that found everything done)."""
    end = run.get("end")
    if not end or end.get("status") != "ok":
        return None
    t0, t1 = run["time"], end["time"]
    jobs = [j for j in end.get("jobs", []) if j["start"] >= t0 - 1 and j["end"] <= t1 + 1]
    gpu = [j for j in jobs if j.get("gpu")]
    if not gpu:
        return None
    phase = max(j["end"] for j in gpu) - min(j["start"] for j in gpu)
    cpu: dict[str, float] = {}
    for j in jobs:
        if not j.get("gpu") and j["rule"] != "all":
            cpu[j["rule"]] = cpu.get(j["rule"], 0.0) + (j["end"] - j["start"])
    gpus = run.get("gpus") if run.get("launcher") == "local" else None
    return Run(study, int(gpus) if gpus else None, run.get("launcher"), t1 - t0, phase,
               sum(j["end"] - j["start"] for j in gpu), len(gpu),
               _peak([(j["start"], j["end"]) for j in gpu]), (t1 - t0) - phase, cpu)


def collect(studies: list[str]) -> tuple[list[Run], list[str]]:
    """The finished runs with GPU steps of each study, and one note per study without any."""
    runs, notes = [], []
    for study in studies:
        if not os.path.isdir(study):
            raise StudyError(f"{study}: no such study results directory")
        recorded = timeline.read(study)
        found = [r for r in (run_of(study, x) for x in recorded) if r]
        if not found:
            why = "no runs recorded (logs/runs.jsonl)" if not recorded else \
                f"{len(recorded)} run(s) recorded, none finished with GPU steps timed" + \
                next((f" ({x['end']['why']})" for x in recorded
                      if x.get("end") and x["end"].get("why")), "")
            notes.append(f"{study}: {why}")
        runs += found
    return sorted(runs, key=lambda r: (r.count, r.wall_s)), notes


COLUMNS = ["study", "launcher", "GPUs", "wall s", "speedup", "efficiency", "ideal s",
           "Amdahl s", "GPU phase s", "GPU work s", "GPU steps", "mean in flight",
           "peak in flight", "serial s", "serial %"]


def table(runs: list[Run]) -> list[list]:
    if not runs:
        return []
    base = runs[0]
    out = []
    for r in runs:
        scale = base.count / r.count if r.count else None
        speedup = base.wall_s / r.wall_s if r.wall_s > 0 else None
        out.append([r.study, r.launcher, r.count, round(r.wall_s, 1),
                    None if speedup is None else round(speedup, 3),
                    None if speedup is None or scale is None else round(speedup * scale, 3),
                    None if scale is None else round(base.wall_s * scale, 1),
                    None if scale is None else round(base.serial_s
                                                     + base.gpu_phase_s * scale, 1),
                    round(r.gpu_phase_s, 1), round(r.gpu_work_s, 1), r.gpu_steps,
                    None if r.mean_busy is None else round(r.mean_busy, 2), r.peak,
                    round(r.serial_s, 1),
                    round(100 * r.serial_s / r.wall_s, 1) if r.wall_s > 0 else None])
    return out


def markdown(runs: list[Run], notes: list[str]) -> str:
    lines = ["# Study wall time against GPU count", ""]
    rows = table(runs)
    if rows:
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join("—" if v is None else str(v) for v in r) + " |"
                  for r in rows]
        lines += ["", f"Against the run with the fewest GPUs ({runs[0].count}): ideal = its "
                  "wall time shared linearly; Amdahl = its serial part plus its GPU phase "
                  "shared linearly. Serial = wall time less the GPU phase (Snakemake's "
                  "start and plan before the first GPU step; aggregate, figures, manifest, "
                  "bundle and verify after the last). Kernel compiles run inside the GPU "
                  "steps (each process compiles the variants it uses) and count as GPU work.",
                  "", "CPU rules' own times (s), per run:", ""]
        for r in runs:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.cpu_rules.items()))
            lines.append(f"- {r.study} ({r.count} GPU(s)): {parts or '—'}")
    else:
        lines.append("(no finished run with timed GPU steps)")
    if notes:
        lines += ["", "Not included:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def figure(runs: list[Run], out_dir: str) -> list[str]:
    """Wall time per GPU count (serial and GPU phase stacked) with the ideal and Amdahl's
    bound, and the speedup against the ideal."""
    from .plotting import grid, no_data, plt

    p = plt()
    fig, (ax, bx) = grid(p, 2)
    rows = table(runs)
    if not rows:
        for a in (ax, bx):
            no_data(a, "no finished run with timed GPU steps")
    else:
        xs = [r.count for r in runs]
        labels = [str(x) for x in xs]
        pos = list(range(len(runs)))
        ax.bar(pos, [r.serial_s for r in runs], color="0.6", label="serial")
        ax.bar(pos, [r.gpu_phase_s for r in runs], bottom=[r.serial_s for r in runs],
               color="C0", label="GPU phase")
        ax.plot(pos, [row[6] for row in rows], "k--", marker="o", ms=3, label="ideal (linear)")
        ax.plot(pos, [row[7] for row in rows], "r:", marker="s", ms=3, label="Amdahl")
        ax.set_xticks(pos, labels)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("study wall time (s)")
        ax.set_title("wall time")
        ax.legend(fontsize=6)
        bx.plot(xs, [row[4] for row in rows], "o-", color="C0", label="measured")
        bx.plot(xs, [x / xs[0] for x in xs], "k--", label="ideal")
        bx.set_xlabel("GPUs")
        bx.set_ylabel(f"speedup over {xs[0]} GPU(s)")
        bx.set_title("speedup")
        bx.legend(fontsize=6)
    fig.suptitle("Study wall time against GPU count")
    from .plotting import save

    return save(fig, out_dir, "scaling")


def write(studies: list[str], out_dir: str) -> tuple[list[Run], list[str]]:
    runs, notes = collect(studies)
    if not runs:
        raise StudyError("no finished run with timed GPU steps in " + ", ".join(studies)
                         + ": " + "; ".join(notes))
    os.makedirs(out_dir, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    w.writerows(["" if v is None else v for v in r] for r in table(runs))
    paths = [os.path.join(out_dir, "scaling.csv"), os.path.join(out_dir, "scaling.md")]
    with open(paths[0], "w") as f:
        f.write(buf.getvalue())
    with open(paths[1], "w") as f:
        f.write(markdown(runs, notes))
    return runs, paths + figure(runs, out_dir)
