"""The study's version manifest: every run manifest merged and checked for consistency.

One study should come from one GPU model and one software stack; any field that differs
between runs is listed under ``mismatches`` and ``consistent`` is false, so a mixed study
is flagged, never averaged silently. The workflow's own versions (Snakemake, submitit),
the container image (and its digest when known) and the config hash are added.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from importlib.metadata import PackageNotFoundError, version

from ...errors import StudyError
from ...safeio import UnsafeFileError, load_json, sha256

# Fields that must agree across every run of one study.
STACK_FIELDS = ("tiledattention", "python", "torch", "cuda_runtime", "cudnn", "cuda_tile",
                "tileiras", "triton", "git_commit", "gpu.name", "gpu.compute_capability",
                "gpu.driver")


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def load_manifests(dirs: list[str]) -> dict[str, dict]:
    found = {}
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "manifest-*.json"))):
            try:
                found[path] = load_json(path, what="run manifest")
            except UnsafeFileError as exc:
                raise StudyError(str(exc)) from None
            if not isinstance(found[path], dict):
                raise StudyError(f"{path}: not a run manifest (expected a JSON object)")
    return found


def _dist_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def image_reference(image: str | None) -> dict | None:
    """The container image jobs ran in: a SIF path gets its sha256; a registry reference
    pinned ``@sha256:`` carries its digest."""
    if not image:
        return None
    ref = {"image": image, "digest": None}
    if "@sha256:" in image:
        ref["digest"] = "sha256:" + image.split("@sha256:")[1]
    elif os.path.isfile(image):
        ref["digest"] = "sha256:" + sha256(image)
    return ref


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _earlier(manifest: dict) -> list[dict]:
    """The runs a resumed run continued (bench/runner.py keeps them in its manifest)."""
    return [e for e in manifest.get("earlier_runs") or [] if isinstance(e, dict)]


def _distinct(values: set[str]) -> list:
    """A field's distinct values (JSON texts) in order, None last: a run that lacked the
    package (its value None) does not compare with a version."""
    return sorted((json.loads(v) for v in values),
                  key=lambda x: (x is None, "" if x is None else x))


def merge(manifests: dict[str, dict], *, config: dict | None = None,
          image: str | None = None, base_dir: str | None = None) -> dict:
    if not manifests:
        raise StudyError("no run manifests (manifest-*.json) found: did the benchmark run?")
    mismatches = {}
    # A resumed run's earlier runs measured some of its rows: their stacks count too.
    every = [r for m in manifests.values() for r in [m, *_earlier(m)]]
    for field in STACK_FIELDS:
        values = {json.dumps(_get(m, field)) for m in every}
        if len(values) > 1:
            mismatches[field] = _distinct(values)
    first = next(iter(manifests.values()))
    dirty = sorted({os.path.relpath(p, base_dir) if base_dir else p
                    for p, m in manifests.items()
                    if any(r.get("git_dirty") for r in [m, *_earlier(m)])})
    return {
        "format": "tiledattention-study-manifest/1",
        "consistent": not mismatches,
        "mismatches": mismatches,
        "stack": {f: _get(first, f) for f in STACK_FIELDS},
        "gpu": first.get("gpu"),
        "runs": [{"manifest": os.path.relpath(p, base_dir) if base_dir else p,
                  "host": m.get("host"), "started": m.get("started"),
                  "finished": m.get("finished"), "config_hash": m.get("config_hash"),
                  "measure_hash": m.get("measure_hash"),
                  "slurm_job": (m.get("environment") or {}).get("SLURM_JOB_ID"),
                  "resumed": [{k: e.get(k) for k in ("host", "started", "finished",
                                                      "git_commit")} for e in _earlier(m)]}
                 for p, m in manifests.items()],
        "runs_from_dirty_tree": dirty,
        "workflow": {"snakemake": _dist_version("snakemake"),
                     "submitit": _dist_version("submitit"),
                     "tiledattention": _dist_version("tiledattention")},
        "container": image_reference(image),
        "study_config_hash": config_hash(config) if config is not None else None,
    }


def _values(merged: dict, field: str) -> list:
    """The values a merged manifest's runs had for ``field``: its mismatches', else the one."""
    return (merged.get("mismatches") or {}).get(field) or [(merged.get("stack") or {}).get(field)]


def extend(merged: dict, manifests: dict[str, dict], *, config: dict,
           base_dir: str | None = None) -> dict:
    """A merged manifest with more runs: a stage measured later for the same study, on the
    same GPU model (a committed reference gaining a stage). Its runs stay as they are, the
    new ones follow; ``mismatches`` covers all of them (a later run's revision is one);
    the config hash is ``config``'s, the study config with the new stage's section."""
    new = merge(manifests, config=config, base_dir=base_dir)
    have, got = (merged.get("gpu") or {}).get("name"), (new.get("gpu") or {}).get("name")
    if have != got:
        raise StudyError(f"the new runs were measured on {got or 'no GPU'}, the study on "
                         f"{have or 'no GPU'}: one study is one GPU model")
    mismatches = {}
    for field in STACK_FIELDS:
        values = {json.dumps(v) for v in [*_values(merged, field), *_values(new, field)]}
        if len(values) > 1:
            mismatches[field] = _distinct(values)
    return {**merged, "consistent": not mismatches, "mismatches": mismatches,
            "runs": [*merged.get("runs", []), *new["runs"]],
            "runs_from_dirty_tree": sorted({*merged.get("runs_from_dirty_tree", []),
                                            *new["runs_from_dirty_tree"]}),
            "study_config_hash": new["study_config_hash"]}

