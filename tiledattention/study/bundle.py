"""The Zenodo-ready bundle of a study, and its verification.

``create`` gathers the study's data, tables, figures, profiles (as one archive), manifest,
exact config and a snapshot of the workflow and container definitions into a directory
and a zip, with README, .zenodo.json, CITATION.cff, ro-crate-metadata.json and SHA256SUMS.
``verify`` recomputes every checksum and validates the metadata; every problem is named.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile

from ..errors import StudyError
from .frame import columns_markdown, columns_of
from .metadata import (
    Publication,
    check_ro_crate,
    citation_cff,
    validate_cff,
    validate_zenodo,
    write_ro_crate,
    zenodo,
)

ZENODO_MAX_FILES = 100
SUMS = "SHA256SUMS"
# What the workflow snapshot holds, relative to the repository root.
SNAPSHOT = ("Snakefile", "workflow", "config", "profiles", "containers", "pyproject.toml")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def _zip_dir(src: str, dest_zip: str, arc_root: str = "") -> None:
    with zipfile.ZipFile(dest_zip, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in _files(src):
            z.write(os.path.join(src, rel), os.path.join(arc_root, rel))


def _copy(src: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(src, dest)


def _snapshot(repo_root: str, dest_zip: str) -> None:
    with zipfile.ZipFile(dest_zip, "w", zipfile.ZIP_DEFLATED) as z:
        for item in SNAPSHOT:
            path = os.path.join(repo_root, item)
            if os.path.isfile(path):
                z.write(path, item)
            elif os.path.isdir(path):
                for rel in _files(path):
                    if "__pycache__" not in rel:
                        z.write(os.path.join(path, rel), os.path.join(item, rel))


def headline(rows: list[dict], manifest: dict) -> str:
    from .ratios import compare
    from .tables import FUSED, SUBJECT

    gpu = (manifest.get("gpu") or {}).get("name") or "a CPU (no GPU)"
    s = compare(rows, SUBJECT, FUSED)
    if not s.n:
        return (f"Measured on {gpu}. {SUBJECT} and {FUSED} were never both ok at one point, "
                "so no throughput ratio is reported.")
    text = (f"Measured on {gpu}: {SUBJECT} reaches a geometric mean of {s.geomean:.3f}x the "
            f"throughput of PyTorch SDPA ({FUSED}, automatic dispatch) over {s.n} points "
            f"(median {s.median:.3f}x, min {s.min:.3f}x, faster at {s.wins}/{s.n}) by kernel "
            "time (host work hidden)")
    c = compare(rows, SUBJECT, FUSED, measure="call")
    if not c.n:
        return text + "; call latency was not measured in these rows."
    return text + (f"; by call latency (wall time per back-to-back call, host work included) "
                   f"the geometric mean is {c.geomean:.3f}x over {c.n} points (min "
                   f"{c.min:.3f}x, faster at {c.wins}/{c.n}).")


def _readme(pub: Publication, rows: list[dict], manifest: dict, table4: str,
            config_name: str) -> str:
    stack = manifest.get("stack") or {}
    gpu = manifest.get("gpu") or {}
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    lines = [
        f"# {pub.title}", "", pub.description, "", "## Headline", "", headline(rows, manifest),
        table4, "", "## What was measured", "",
        f"{len({r['point_key'] for r in rows})} benchmark points × "
        f"{len({r['method'] for r in rows})} methods = {len(rows)} rows; rows by status: "
        + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        + " (`tables/status.*` lists every row that is not ok, with the reason).", "",
        ("Timing: CUDA events around each call (L2 flushed before each call when the "
         "config says so), " if gpu else "Timing: wall clock around each call on the CPU, ")
        + "methods interleaved over rounds; throughput from the median time with the FLOP "
        "model "
        "4·B·H·Sq·Skv·D (halved when causal). Correctness: each method's output against a "
        "float64 reference on a slice of heads.", "", "## On what", "",
        f"- GPU: {gpu.get('name', '—')} (compute capability "
        f"{gpu.get('compute_capability', '—')}, driver {gpu.get('driver', '—')})",
        f"- Software: tiledattention {stack.get('tiledattention')}, torch {stack.get('torch')}"
        f" (CUDA {stack.get('cuda_runtime')}, cuDNN {stack.get('cudnn')}), cuda-tile "
        f"{stack.get('cuda_tile')}, tileiras {stack.get('tileiras')}, Python "
        f"{stack.get('python')}",
        f"- Source revision: {stack.get('git_commit')}",
        f"- One software stack and GPU across all runs: "
        f"{'yes' if manifest.get('consistent') else 'NO — see manifest.json mismatches'}",
        f"- Container: {(manifest.get('container') or {}).get('image') or 'none'}", "",
        "## How to reproduce", "",
        "Unpack `workflow-snapshot.zip` (the Snakefile, rules, configs, profiles and "
        "container definitions of this run) over a checkout of the recorded source "
        "revision, then:", "", "```bash",
        f"snakemake --profile profiles/local --configfile {config_name}   # or profiles/slurm",
        "tiledattn bundle verify results/<study>/bundle", "```", "",
        "## Files", "",
        "- `data/rows.parquet`, `data/rows.csv`, `data/rows.jsonl`: every row; "
        "`data/columns.md`: the column dictionary (also below)",
        "- `tables/`: Table 4 (ratios against each baseline), per-D and per-regime ratios, "
        "Table 5 (schedules), Table 6 (schedule ladder), throughput, status — Markdown, CSV, "
        "LaTeX",
        "- `figures/`: PNG and PDF", "- `profiles.zip`: Nsight Compute reports, raw CSV "
        "exports and `summary.md`", "- `manifest.json`: merged version manifest",
        "- `config/`: the exact study config", "- `.zenodo.json`, `CITATION.cff`, "
        "`ro-crate-metadata.json`, `SHA256SUMS` (check: `sha256sum -c SHA256SUMS` or "
        "`tiledattn bundle verify`)", "", "## Column dictionary", "",
        columns_markdown(columns_of(rows)) if rows else "(no rows)", ""]
    return "\n".join(lines)


def not_run(study_dir: str, rows: list[dict]) -> list[str]:
    """One Markdown bullet per study step (or method) that did not run, with the reason
    its job recorded: GPU methods without a GPU, tuning and profiles on a node without
    one."""
    from ..bench.aggregate import concat

    out = []
    for step, step_rows in (("benchmark", rows),
                            ("schedule ladder", concat(os.path.join(study_dir, "ladder"))
                             if os.path.isdir(os.path.join(study_dir, "ladder")) else [])):
        by_method: dict[tuple[str, str], list[dict]] = {}
        for r in step_rows:
            if r.get("status") != "ok":
                by_method.setdefault((r["method"], r["status"]), []).append(r)
        for (method, status), group in sorted(by_method.items()):
            out.append(f"- {step}: {method} {status} at {len(group)} point(s): "
                       f"{group[0].get('reason') or group[0].get('error') or '—'}")
    tune = os.path.join(study_dir, "tune", "schedule-table.json")
    if os.path.exists(tune):
        with open(tune) as f:
            why = (json.load(f).get("meta") or {}).get("unavailable")
        if why:
            out.append(f"- tuning (Table 5): not run: {why}")
    prof = os.path.join(study_dir, "profile", "summary.json")
    if os.path.exists(prof):
        with open(prof) as f:
            caps = json.load(f).get("captures", [])
        for c in caps:
            if c.get("status") != "ok":
                out.append(f"- profile {c['shape']} {c['method']}: {c['status']}: {c['reason']}")
    return out


def create(study_dir: str, out_dir: str, *, config: dict, config_name: str, repo_root: str,
           publication: Publication, command: str = "snakemake") -> dict:
    """Build ``out_dir`` (a directory) and ``out_dir + '.zip'`` from a finished study."""
    from ..bench.store import read_rows

    agg = os.path.join(study_dir, "aggregate")
    rows_jsonl = os.path.join(agg, "rows.jsonl")
    manifest_path = os.path.join(study_dir, "manifest.json")
    for need in (rows_jsonl, manifest_path):
        if not os.path.exists(need):
            raise StudyError(f"bundle: {need} is missing (run the aggregate and manifest "
                             "steps first)")
    rows = read_rows(rows_jsonl)
    with open(manifest_path) as f:
        manifest = json.load(f)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    for name in ("rows.parquet", "rows.csv", "rows.jsonl", "columns.md"):
        src = os.path.join(agg, name)
        if os.path.exists(src):
            _copy(src, os.path.join(out_dir, "data", name))
    for sub in ("tables", "figures"):
        src_dir = os.path.join(study_dir, sub) if sub == "figures" else os.path.join(agg, sub)
        if os.path.isdir(src_dir):
            for rel in _files(src_dir):
                _copy(os.path.join(src_dir, rel), os.path.join(out_dir, sub, rel))
    prof = os.path.join(study_dir, "profile")
    if os.path.isdir(prof):
        _zip_dir(prof, os.path.join(out_dir, "profiles.zip"), "profiles")
    _copy(manifest_path, os.path.join(out_dir, "manifest.json"))
    import yaml

    os.makedirs(os.path.join(out_dir, "config"))
    with open(os.path.join(out_dir, "config", "study-config.yaml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    _snapshot(repo_root, os.path.join(out_dir, "workflow-snapshot.zip"))
    # Zenodo takes at most 100 files per record: group directories into archives until the
    # bundle fits (metadata files stay loose so Zenodo and readers see them).
    for sub in ("figures", "tables"):
        if len(_files(out_dir)) + 5 <= ZENODO_MAX_FILES:
            break
        if os.path.isdir(os.path.join(out_dir, sub)):
            _zip_dir(os.path.join(out_dir, sub), os.path.join(out_dir, f"{sub}.zip"), sub)
            shutil.rmtree(os.path.join(out_dir, sub))
    t4 = os.path.join(agg, "tables", "table4_ratios.md")
    table4 = ""
    if os.path.exists(t4):
        with open(t4) as f:
            table4 = "\n" + f.read()
    readme = _readme(publication, rows, manifest, table4, f"config/{config_name}")
    missing = not_run(study_dir, rows)
    if missing:  # before the column dictionary: what a reader must know first
        cut = readme.index("## How to reproduce")
        readme = (readme[:cut] + "## What did not run\n\n" + "\n".join(missing) + "\n\n"
                  + readme[cut:])
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(readme)
    head = headline(rows, manifest)
    with open(os.path.join(out_dir, ".zenodo.json"), "w") as f:
        json.dump(zenodo(publication, head), f, indent=2)
    with open(os.path.join(out_dir, "CITATION.cff"), "w") as f:
        yaml.safe_dump(citation_cff(publication), f, sort_keys=False, allow_unicode=True)
    runs = manifest.get("runs") or [{}]
    write_ro_crate(out_dir, publication, _files(out_dir), manifest, command,
                   min((r.get("started") or "" for r in runs), default=None) or None,
                   max((r.get("finished") or "" for r in runs), default=None) or None)
    files = _files(out_dir)
    if len(files) + 1 > ZENODO_MAX_FILES:
        raise StudyError(f"bundle: {len(files) + 1} files exceed Zenodo's "
                         f"{ZENODO_MAX_FILES} per record")
    with open(os.path.join(out_dir, SUMS), "w") as f:
        for rel in files:
            f.write(f"{sha256(os.path.join(out_dir, rel))}  {rel}\n")
    zip_path = out_dir.rstrip("/") + ".zip"
    _zip_dir(out_dir, zip_path, os.path.basename(out_dir.rstrip("/")))
    return {"dir": out_dir, "zip": zip_path, "files": len(files) + 1}


def verify(path: str) -> list[str]:
    """Problems found in the bundle at ``path`` (a directory or its zip); empty: verified."""
    if zipfile.is_zipfile(path):
        with tempfile.TemporaryDirectory() as tmp:
            with zipfile.ZipFile(path) as z:
                z.extractall(tmp)
            tops = os.listdir(tmp)
            root = os.path.join(tmp, tops[0]) if len(tops) == 1 else tmp
            return verify(root)
    if not os.path.isdir(path):
        return [f"{path}: not a bundle directory or zip"]
    problems = []
    sums = os.path.join(path, SUMS)
    if not os.path.exists(sums):
        return [f"{SUMS} is missing"]
    listed = {}
    with open(sums) as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("  ", 1)
            if len(parts) != 2:
                problems.append(f"{SUMS} line {n} is malformed")
                continue
            listed[parts[1]] = parts[0]
    for rel, digest in listed.items():
        full = os.path.join(path, rel)
        if not os.path.exists(full):
            problems.append(f"missing: {rel}")
        elif sha256(full) != digest:
            problems.append(f"changed: {rel} (checksum differs)")
    present = set(_files(path)) - {SUMS}
    problems += [f"not in {SUMS}: {rel}" for rel in sorted(present - set(listed))]
    if len(present) + 1 > ZENODO_MAX_FILES:
        problems.append(f"{len(present) + 1} files exceed Zenodo's {ZENODO_MAX_FILES}")
    problems += _check_metadata(path)
    return problems


def _check_metadata(path: str) -> list[str]:
    import yaml

    problems = []
    try:
        with open(os.path.join(path, ".zenodo.json")) as f:
            validate_zenodo(json.load(f))
    except (OSError, json.JSONDecodeError, StudyError) as exc:
        problems.append(f".zenodo.json: {exc}")
    try:
        with open(os.path.join(path, "CITATION.cff")) as f:
            validate_cff(yaml.safe_load(f))
    except (OSError, yaml.YAMLError, StudyError, AttributeError) as exc:
        problems.append(f"CITATION.cff: {exc}")
    if not os.path.exists(os.path.join(path, "ro-crate-metadata.json")):
        problems.append("ro-crate-metadata.json is missing")
    else:
        problems += check_ro_crate(path)
    return problems
