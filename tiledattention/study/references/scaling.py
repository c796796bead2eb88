"""Study wall time against GPU count, and what stays serial, from the studies' own timelines.

``tiledattn scaling STUDY... --out DIR``: each study's finished runs (``logs/runs.jsonl``,
written by the workflow, see ``timeline``) give a run's wall time, its GPU count (the
``gpu`` slots of ``profiles/local``; under SLURM the most GPU steps in flight, which the
cluster decides) and its jobs' start and end. Per run:

- GPU work: the sum of the GPU steps' times (what more GPUs share out); GPU busy: the time
  at least one GPU step ran; mean in flight = work / busy; peak in flight;
- serial: Snakemake's own start (before its first job) plus every CPU rule's time (plan,
  aggregate, figures, manifest, bundle, bundle_verify): what more GPUs do not shorten. At
  low GPU counts some CPU rules overlap a GPU step still running (e.g. aggregate beside the
  profile), so this is the serial part's upper bound. Kernel compiles happen inside each
  GPU step (each process compiles the variants its points use): GPU work, repeated in each
  shard that needs the same variant.

Against the run with the fewest GPUs (n0): speedup = wall(n0) / wall(n), efficiency =
speedup × n0 / n, ideal (linear) = wall(n0) × n0 / n, and Amdahl's bound = serial(n0) +
(wall(n0) - serial(n0)) × n0 / n. Written as scaling.md, scaling.csv and scaling.png/.pdf.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass

from ...errors import StudyError
from .. import timeline


@dataclass(frozen=True)
class Run:
    study: str
    gpus: int | None  # the gpu slots the run had (None: not a local run)
    launcher: str | None
    wall_s: float
    startup_s: float  # run start to its first job's start
    gpu_work_s: float
    gpu_busy_s: float
    gpu_steps: int
    peak: int  # most GPU steps in flight at once
    cpu_rules: dict[str, float]  # rule -> seconds (sum over its jobs)

    @property
    def serial_s(self) -> float:
        return self.startup_s + sum(self.cpu_rules.values())

    @property
    def mean_busy(self) -> float | None:
        return self.gpu_work_s / self.gpu_busy_s if self.gpu_busy_s > 0 else None

    @property
    def count(self) -> int:
        """The GPU count the run is plotted at: its slots, else the peak it reached."""
        return self.gpus if self.gpus else self.peak


def _sweep(intervals: list[tuple[float, float]]) -> tuple[int, float]:
    """(most intervals overlapping at once, length of their union)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = now = 0
    covered, since = 0.0, None
    for t, step in events:  # an end sorts before a start at the same instant
        if now == 0 and step > 0:
            since = t
        now += step
        peak = max(peak, now)
        if now == 0 and since is not None:
            covered += t - since
    return peak, covered


def _seconds(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_run(study: str, run: dict) -> None:
    """A finished run's record as the workflow writes it, or one StudyError naming what is
    wrong: times finite numbers that do not run backwards, jobs with a rule, a start and
    an end, a local run's GPU count a positive whole number."""
    where = f"{study}/{timeline.NAME}: run {str(run.get('run'))[:40]}"
    end = run["end"]
    if not _seconds(run.get("time")) or not _seconds(end.get("time")) or \
            end["time"] < run["time"]:
        raise StudyError(f"{where}: start {run.get('time')!r} and end {end.get('time')!r} "
                         "are not finite times in order")
    jobs = end.get("jobs", [])
    if not isinstance(jobs, list):
        raise StudyError(f"{where}: jobs is not a list")
    for j in jobs:
        if not isinstance(j, dict) or not isinstance(j.get("rule"), str) or \
                not _seconds(j.get("start")) or not _seconds(j.get("end")) or \
                j["end"] < j["start"]:
            raise StudyError(f"{where}: job {str(j)[:80]} lacks a rule or finite start and "
                             "end times in order")
    gpus = run.get("gpus")
    if run.get("launcher") == "local" and gpus is not None and (
            not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1):
        raise StudyError(f"{where}: gpus {gpus!r} is not a positive whole number of GPUs")


def run_of(study: str, run: dict) -> Run | None:
    """The scaling facts of one finished run, or None when it did not end well or ran no
    GPU step (a rerun that found everything done); a malformed record is a StudyError."""
    end = run.get("end")
    if not isinstance(end, dict) or end.get("status") != "ok":
        return None
    _check_run(study, run)
    t0, t1 = run["time"], end["time"]
    jobs = [j for j in end.get("jobs", []) if j["start"] >= t0 - 1 and j["end"] <= t1 + 1]
    gpu = [j for j in jobs if j.get("gpu")]
    if not gpu:
        return None
    cpu: dict[str, float] = {}
    for j in jobs:
        if not j.get("gpu") and j["rule"] != "all":
            cpu[j["rule"]] = cpu.get(j["rule"], 0.0) + (j["end"] - j["start"])
    peak, busy = _sweep([(j["start"], j["end"]) for j in gpu])
    gpus = run.get("gpus") if run.get("launcher") == "local" else None
    return Run(study, int(gpus) if gpus else None, run.get("launcher"), t1 - t0,
               max(0.0, min(j["start"] for j in jobs) - t0),
               sum(j["end"] - j["start"] for j in gpu), busy, len(gpu), peak, cpu)


def collect(studies: list[str]) -> tuple[list[Run], list[str]]:
    """The finished runs with GPU steps of each study, and one note per study without any."""
    runs, notes = [], []
    for study in studies:
        if not os.path.isdir(study):
            raise StudyError(f"{study}: no such study results directory")
        try:
            recorded = timeline.read(study)
        except (TypeError, KeyError, AttributeError) as exc:  # a record of the wrong shape
            raise StudyError(f"{study}/{timeline.NAME}: malformed run records "
                             f"({type(exc).__name__}: {exc})") from None
        found = [r for r in (run_of(study, x) for x in recorded) if r]
        if not found:
            why = "no runs recorded (logs/runs.jsonl)" if not recorded else \
                f"{len(recorded)} run(s) recorded, none finished with GPU steps timed" + \
                next((f" ({x['end']['why']})" for x in recorded
                      if isinstance(x.get("end"), dict) and x["end"].get("why")), "")
            notes.append(f"{study}: {why}")
        runs += found
    return sorted(runs, key=lambda r: (r.count, r.wall_s)), notes


COLUMNS = ["study", "launcher", "GPUs", "wall s", "speedup", "efficiency", "ideal s",
           "Amdahl s", "GPU work s", "GPU busy s", "GPU steps", "mean in flight",
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
                    None if scale is None else round(base.serial_s + max(
                        0.0, base.wall_s - base.serial_s) * scale, 1),
                    round(r.gpu_work_s, 1), round(r.gpu_busy_s, 1), r.gpu_steps,
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
                  "wall time shared linearly; Amdahl = its serial part plus the rest of "
                  "its wall time shared linearly. Serial = Snakemake's start before its first "
                  "job plus the CPU rules' times (plan, aggregate, figures, manifest, "
                  "bundle, verify; an upper bound where they overlap a GPU step). Kernel "
                  "compiles run inside the GPU steps (each process compiles the variants "
                  "it uses) and count as GPU work.",
                  "", "CPU rules' own times (s), per run:", ""]
        for r in runs:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.cpu_rules.items()))
            lines.append(f"- {r.study} ({r.count} GPU(s)): {parts or '—'}")
    else:
        lines.append("(no finished run with timed GPU steps)")
    if notes:
        lines += ["", "Not included:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def figure(runs: list[Run], out_dir: str, gpu: str | None = None) -> list[str]:
    """Wall time per GPU count (serial and GPU phase stacked) with the ideal and Amdahl's
    estimate, and the speedup against the ideal; ``gpu`` (the studies' manifests' GPU)
    opens the title, as on every figure of a study."""
    from ..presentation.plotting import grid, no_data, plt

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
        ax.bar(pos, [max(0.0, r.wall_s - r.serial_s) for r in runs],
               bottom=[r.serial_s for r in runs], color="C0", label="rest (GPU steps)")
        ax.plot(pos, [row[6] for row in rows], "k--", marker="o", ms=3, label="ideal (linear)")
        # Not a bound: the serial part is an upper bound (CPU rules overlapping a GPU
        # step count whole), so a run may land under this estimate.
        ax.plot(pos, [row[7] for row in rows], "r:", marker="s", ms=3,
                label="Amdahl estimate (serial part an upper bound)")
        ax.set_xticks(pos, labels)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("study wall time (s)")
        ax.set_title("wall time")
        ax.legend(fontsize=6)
        bx.plot(xs, [row[4] for row in rows], "o-", color="C0", label="measured")
        bx.plot(xs, [x / xs[0] for x in xs], "k--", label="ideal")
        bx.set_xticks(xs, [str(x) for x in xs])  # whole GPUs, never 1.5
        bx.set_xlabel("GPUs")
        bx.set_ylabel(f"speedup over {xs[0]} GPU(s)")
        bx.set_title("speedup")
        bx.legend(fontsize=6)
    fig.suptitle(f"{gpu + ': ' if gpu else ''}study wall time against GPU count")
    from ..presentation.plotting import save

    return save(fig, out_dir, "scaling", record=False)


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
    return runs, paths + figure(runs, out_dir, _gpu_of(studies))


def _gpu_of(studies: list[str]) -> str | None:
    """The GPU the studies' manifests name (the first that names one), else None."""
    import json

    for study in studies:
        path = os.path.join(study, "manifest.json")
        try:
            with open(path, encoding="utf-8") as f:
                name = ((json.load(f).get("gpu") or {}).get("name"))
        except (OSError, ValueError, AttributeError):
            continue
        if name:
            return name
    return None
