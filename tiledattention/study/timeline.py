"""The study's own timeline: when each Snakemake run started and ended, on how many GPUs, and
when each of its jobs ran (``<results>/logs/runs.jsonl``, one JSON object a line).

The workflow appends a ``start`` record when a run begins (onstart) and an ``end`` record,
with every job's start and end as Snakemake's metadata recorded them, when it ends
(onsuccess, onerror). A run stopped by a signal leaves its start record only. ``tiledattn
scaling`` reads these records; nothing else depends on them, so a Snakemake whose metadata
cannot be read leaves the job list empty and says why, and the study goes on.
"""

from __future__ import annotations

import json
import os
import socket
import time

FORMAT = "tiledattention-runs/1"
NAME = os.path.join("logs", "runs.jsonl")


def _value(v):
    return getattr(v, "value", v)  # Snakemake's parsed resources wrap their values


def _resource(workflow, name: str):
    try:
        return _value(workflow.global_resources.get(name))
    except Exception:  # noqa: BLE001 - another Snakemake's internals: not recorded
        return None


def _append(results: str, record: dict) -> None:
    path = os.path.join(results, NAME)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:  # one short line: appends from one process stay whole
        f.write(json.dumps({"format": FORMAT, **record}, sort_keys=True) + "\n")


def run_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"


def start(results: str, workflow, config: dict, run: str) -> None:
    import snakemake

    _append(results, {
        "event": "start", "run": run, "time": time.time(),
        "gpus": _resource(workflow, "gpu"), "cores": _resource(workflow, "_cores"),
        "jobs_limit": _resource(workflow, "_nodes"), "launcher": config.get("launcher"),
        "shards": config.get("shards"), "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "snakemake": getattr(snakemake, "__version__", None)})


def jobs(workflow) -> tuple[list[dict], str | None]:
    """Every job of the run's DAG with its start and end (epoch seconds), and whether it ran
    a GPU step (a rule with a ``launcher`` parameter); (jobs, why empty)."""
    out = []
    try:
        for job in workflow.dag.jobs:
            if not job.output:
                continue
            rec = workflow.persistence.metadata(job.output[0])
            started, ended = _field(rec, "starttime"), _field(rec, "endtime")
            if started is None or ended is None:
                continue
            params = job.params.keys() if hasattr(job.params, "keys") else []
            out.append({"rule": job.rule.name, "wildcards": dict(job.wildcards_dict),
                        "output": str(job.output[0]), "start": float(started),
                        "end": float(ended), "gpu": "launcher" in params})
    except Exception as exc:  # noqa: BLE001 - a Snakemake whose metadata API moved
        return [], f"job times unreadable from this Snakemake: {type(exc).__name__}: {exc}"
    return sorted(out, key=lambda j: j["start"]), None


def _field(record, name: str):
    try:  # a dict (Snakemake < 9.17) or a record object with item access (later)
        return record[name]
    except (KeyError, TypeError, AttributeError):
        return None


def end(results: str, workflow, run: str, status: str) -> None:
    found, why = jobs(workflow)
    record = {"event": "end", "run": run, "time": time.time(), "status": status,
              "jobs": found}
    if why:
        record["why"] = why
    _append(results, record)


def read(results: str) -> list[dict]:
    """The runs of a study: one dict per run (its start record with ``end`` merged in when
    it ended), in start order; malformed lines are skipped, one nested too deeply for the
    parser is refused (StudyError naming it)."""
    path = os.path.join(results, NAME)
    runs: dict[str, dict] = {}
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            except RecursionError:  # nested past the parser's depth: no record of ours
                from ..errors import StudyError

                raise StudyError(f"line {n} of {path} is not a run record (JSON nested too "
                                 "deeply)") from None
            if not isinstance(rec, dict) or rec.get("format") != FORMAT or "run" not in rec:
                continue
            if rec.get("event") == "start":
                runs[rec["run"]] = {**rec, "end": None}
            elif rec.get("event") == "end" and rec["run"] in runs:
                runs[rec["run"]]["end"] = rec
    return sorted(runs.values(), key=lambda r: r.get("time") or 0)
