"""The Zenodo-ready bundle of a study, and its verification.

``create`` gathers the study's data, tables, figures, profiles (as one archive), manifest,
exact config and a snapshot of the workflow and container definitions into a directory
and a zip, with README, .zenodo.json, CITATION.cff, ro-crate-metadata.json and SHA256SUMS.
``verify`` recomputes every checksum and validates the metadata; every problem is named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import gzip
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import zipfile
import zlib

from ...errors import StudyError
from ...safeio import (
    JSON_MAX,
    ROWS_MAX,
    UnsafeFileError,
    load_json,
    parse_json,
    read_bytes,
    regular_file,
    sha256,
)
from ..presentation.frame import columns_markdown, columns_of
from .metadata import (
    Publication,
    check_ro_crate,
    citation_cff,
    repository_url,
    validate_cff,
    validate_zenodo,
    write_ro_crate,
    zenodo,
)

ZENODO_MAX_FILES = 100
SUMS = "SHA256SUMS"
# Written into every bundle: the files it holds. A non-empty --out is replaced only when it
# is a bundle of ours holding nothing else (or with force).
MARKER = ".tiledattention-bundle"
# What the workflow snapshot holds, relative to the repository root: only what git tracks
# there; without git, an allow-list: in config/ and profiles/, where users keep their own
# files (a cluster account, a token), only the files the project ships, by name; in the
# code directories, files of the kinds below (never dotfiles such as config/.env).
SNAPSHOT = ("Snakefile", "workflow", "config", "profiles", "containers", "pyproject.toml")
# The package that ran (from the checkout it was imported from) goes into the snapshot too:
# the bundle README installs from it. tiledattn reproduce lays out only the workflow.
SNAPSHOT_SOURCE = ("tiledattention", "README.md")
SNAPSHOT_SHIPPED = (
    "Snakefile", "pyproject.toml", "README.md", "config/README.md", "config/config.yaml",
    "config/reference.yaml", "config/scaling.yaml",
    "config/smoke.yaml", "config/bench-backward.yaml", "config/bench-decode.yaml",
    "config/bench-h100-small.yaml", "config/bench-sdpa.yaml", "config/bench-smoke.yaml",
    "config/shapes-head-dims.yaml", "config/shapes-models.yaml", "config/shapes-seqs.yaml",
    "config/variants-h100.yaml",
    "profiles/README.md", "profiles/local/config.yaml", "profiles/slurm/README.md",
    "profiles/slurm/config.yaml")
SNAPSHOT_CODE = ("workflow", "containers", "tiledattention")
SNAPSHOT_SUFFIXES = (".smk", ".py", ".yaml", ".yml", ".json", ".lock", ".def", ".md", ".txt",
                     ".sh", ".toml", ".cfg", ".tsv", ".csv", ".rst", ".json.gz")
SNAPSHOT_NAMES = ("Snakefile", "Dockerfile", "Containerfile")
STUDY_CONFIG = "config/study-config.yaml"  # in the bundle and in its workflow snapshot
# Limits for verifying a bundle nobody vouches for: far above a real study's.
MAX_MEMBERS = 1000
MAX_FILE_BYTES = 2 << 30
MAX_TOTAL_BYTES = 4 << 30
MAX_RATIO = 200  # uncompressed / compressed, for members over 1 MiB
MAX_META_BYTES = 16 << 20  # SHA256SUMS and each metadata file
# A compact bundle (a reference committed to git): every row file gzipped, no figures (they
# regenerate from the rows). The stage rows: (study subdirectory, name in data/).
COMPACT_STAGE_ROWS = (("model", "model-rows.jsonl.gz"), ("variants", "variants-rows.jsonl.gz"))
REBUILT = "../rebuilt"  # where the README's commands unpack the rows: outside the bundle


def _files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def _zip_dir(src: str, dest_zip: str, arc_root: str = "", skip: tuple[str, ...] = (),
             files: list[str] | None = None) -> None:
    with zipfile.ZipFile(dest_zip, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in _files(src) if files is None else files:
            if rel not in skip:
                z.write(os.path.join(src, rel), os.path.join(arc_root, rel))


def _copy(src: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(src, dest)


def snapshot_files(repo_root: str, items: tuple[str, ...] = SNAPSHOT) -> tuple[list[str], str]:
    """(files for the workflow snapshot, how they were chosen): what git tracks under
    ``items``, or without git the allow-listed kinds of file there."""
    try:
        run = subprocess.run(["git", "-C", repo_root, "ls-files", "-z", "--", *items],
                             capture_output=True, timeout=60)
        tracked = [f for f in run.stdout.decode().split("\0") if f] if run.returncode == 0 \
            else []
    except (OSError, subprocess.TimeoutExpired, UnicodeDecodeError):
        tracked = []
    if tracked:
        return sorted(f for f in tracked if _plain_file(os.path.join(repo_root, f))), \
            "the files git tracks"
    chosen = [rel for rel in SNAPSHOT_SHIPPED if rel.split("/")[0] in items
              and _plain_file(os.path.join(repo_root, rel))]
    for item in (c for c in SNAPSHOT_CODE if c in items):
        path = os.path.join(repo_root, item)
        for rel in [os.path.join(item, r) for r in _files(path)] if os.path.isdir(path) else []:
            parts = rel.split(os.sep)
            name = parts[-1]
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            if (name in SNAPSHOT_NAMES or name.endswith(SNAPSHOT_SUFFIXES)) and \
                    _plain_file(os.path.join(repo_root, rel)):
                chosen.append(rel)
    return sorted(chosen), "an allow-list (no git checkout: the shipped files of config/ " \
        "and profiles/ by name; in " + ", ".join(SNAPSHOT_CODE) + " the kinds " + \
        ", ".join(SNAPSHOT_NAMES + SNAPSHOT_SUFFIXES) + "; never dotfiles)"


_plain_file = regular_file


def _source(path: str, study_dir: str) -> str:
    """``path`` (inside the study) if it may go into the bundle: a regular file, or a link
    that stays inside the study; a link out of it (it would publish an outside file) or a
    FIFO or device (reading it hangs or never ends) is one StudyError."""
    real, study = os.path.realpath(path), os.path.realpath(study_dir)
    if os.path.islink(path) and not real.startswith(study.rstrip(os.sep) + os.sep):
        raise StudyError(f"bundle: {path} is a link to {real}, outside the study; copy the "
                         "file into the study if it belongs to it, or remove the link")
    if not regular_file(real):
        raise StudyError(f"bundle: {path} is not a regular file (a FIFO, device or "
                         "dangling link); only regular files go into a bundle")
    return path


def _study_files(root: str, study_dir: str) -> list[str]:
    """``_files`` of a directory in the study, each file checked by ``_source``; a linked
    directory is refused (it may lead anywhere)."""
    rels = []
    for d, dirs, names in os.walk(root):
        for n in dirs + [""]:  # "": the directory itself
            if os.path.islink(os.path.join(d, n).rstrip(os.sep)):
                raise StudyError(f"bundle: {os.path.join(d, n)} is a linked directory; only "
                                 "regular files go into a bundle")
        for n in names:
            rel = os.path.relpath(_source(os.path.join(d, n), study_dir), root)
            if any(ord(c) < 32 or c == "\x7f" for c in rel) or \
                    not _confined(rel.replace(os.sep, "/")):
                raise StudyError(f"bundle: {os.path.join(d, n)!r}: a file name with a "
                                 "control character (a newline would break SHA256SUMS) or "
                                 "a backslash; rename it or move it out of the study")
            rels.append(rel)
    return sorted(rels)


def _snapshot(repo_root: str, dest_zip: str, config: str | None = None) -> tuple[int, str]:
    """The workflow snapshot, with the study's exact config as config/study-config.yaml
    (so the unpacked snapshot runs with --configfile config/study-config.yaml)."""
    files, how = snapshot_files(repo_root)
    # The package that ran, from where it was imported (a checkout, or an installed copy).
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    source = {rel: os.path.join(package_root, rel)
              for rel in snapshot_files(package_root, SNAPSHOT_SOURCE)[0]}
    if "README.md" not in source and _plain_file(os.path.join(repo_root, "README.md")):
        source["README.md"] = os.path.join(repo_root, "README.md")  # pyproject's readme
    with zipfile.ZipFile(dest_zip, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            if rel != STUDY_CONFIG or config is None:
                z.write(os.path.join(repo_root, rel), rel)
        for rel in sorted(set(source) - set(files)):  # the package that ran, to install
            z.write(source[rel], rel)
        if config is not None:
            z.write(config, STUDY_CONFIG)
    return len(set(files) | set(source) | ({STUDY_CONFIG} if config else set())), how


def headline(rows: list[dict], manifest: dict) -> str:
    """The README's headline on the benchmark rows (``presentation/headline.py`` computes it)."""
    from ..presentation.headline import bench_sentence

    return bench_sentence(rows, (manifest.get("gpu") or {}).get("name") or "a CPU (no GPU)")


def rows_summary(rows: list[dict]) -> str:
    """The README's count of the published rows (verify recomputes it from the rows)."""
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
    return (f"{len({r.get('point_key') for r in rows})} benchmark points × "
            f"{len({r.get('method') for r in rows})} methods = {len(rows)} rows; rows by "
            "status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))


def _readme(pub: Publication, rows: list[dict], manifest: dict, table4: str,
            config_name: str, snapshot: tuple[int, str], variants_line: str = "",
            compact: list[str] | None = None) -> str:
    """The bundle's README; ``compact``: the data files of a compact bundle (its Files
    section names them, and how the figures and tables rebuild from them)."""
    stack = manifest.get("stack") or {}
    gpu = manifest.get("gpu") or {}
    lines = [
        f"# {pub.title}", "", pub.description, "", "## Headline", "",
        headline(rows, manifest) + variants_line, table4, "", "## What was measured", "",
        rows_summary(rows)
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
        f"- Source: {pub.repository or NO_REPOSITORY}"
        f" at revision {stack.get('git_commit')}"
        + (" (some runs from a tree with uncommitted changes: manifest.json)"
           if manifest.get("runs_from_dirty_tree") else ""),
        f"- One software stack and GPU across all runs: "
        f"{'yes' if manifest.get('consistent') else 'NO — see manifest.json mismatches'}",
        f"- Container: {(manifest.get('container') or {}).get('image') or 'none'}", "",
        *reproduce_section(pub, manifest, snapshot),
        "## Files", "",
        *(_compact_files(compact) if compact is not None else [
            "- `data/rows.parquet`, `data/rows.csv`, `data/rows.jsonl`: every row; "
            "`data/columns.md`: the column dictionary (also below); `data/model-rows.jsonl`: "
            "the tiny Llama's tokens/s rows, when the study ran the model stage; "
            "`data/variants-rows.jsonl`: the variants stage's rows, when it ran"]),
        "- `tables/`: Table 4 (ratios against the fastest fused baseline at each point and "
        "against each baseline), per-D, per-regime and per-point ratios, "
        "Table 5 (schedules), Table 6 (schedule ladder), throughput, status, model_e2e (tiny "
        "Llama tokens/s per attention implementation), variants and variants_summary (against "
        "FlexAttention and SDPA + mask, and the targets) — "
        "Markdown, CSV, "
        "LaTeX",
        *([] if compact is not None else ["- `figures/`: PNG and PDF"]),
        "- `compare/`: `tiledattn compare` against a reference (table and figure), when the "
        "study was compared (`tiledattn reproduce`)",
        "- `profiles.zip`: Nsight Compute reports, raw CSV "
        "exports and `summary.md`", "- `manifest.json`: merged version manifest",
        "- `config/`: the exact study config",
        "- `scaling/`: `tiledattn scaling`, study wall time against GPU count (table and "
        "figure), when the study's runs were set side by side",
        "- `.zenodo.json`, `CITATION.cff`, "
        "`ro-crate-metadata.json`, `SHA256SUMS` (check: `sha256sum -c SHA256SUMS` or "
        "`tiledattn bundle verify`)", "", "## Column dictionary", "",
        columns_markdown(columns_of(rows)) if rows else "(no rows)", ""]
    if compact is not None:
        cut = lines.index("## Column dictionary")
        lines[cut:cut] = _rebuild_section(compact)
    return "\n".join(lines)


def _compact_files(data_files: list[str]) -> list[str]:
    """The Files bullet of a compact bundle's data/."""
    what = {"data/rows.jsonl.gz": "every row (the aggregate's rows.jsonl, gzipped)",
            "data/model-rows.jsonl.gz": "the tiny Llama's tokens/s rows (model stage)",
            "data/variants-rows.jsonl.gz": "the variants stage's rows",
            "data/ladder-rows.jsonl.gz": "the schedule ladder's rows (Table 6, tile "
                                         "sensitivity)",
            "data/schedule-table.json": "the study's tuning table (Table 5)",
            "data/columns.md": "the column dictionary (also below)"}
    return ["- " + "; ".join(
        f"`{f}`: " + what.get(f, "a shapes grid's rows (tables/shapes*, the shapes figure)")
        for f in data_files) + ". A compact bundle: the rows gzipped (`gunzip -c`), "
        "no figures (they rebuild from the rows, below)"]


def _rebuild_section(data_files: list[str]) -> list[str]:
    """## Figures and tables from the rows: the exact commands (tests run them)."""
    return ["## Figures and tables from the rows", "",
            "This compact bundle holds the measurements, not the figures. In the directory "
            "holding this README, with tiledattention installed (above), these lines unpack the "
            "rows beside the bundle and rebuild every figure (`$R/figures`, PNG and PDF) and "
            "every table (`$R/aggregate/tables`: `tables/` again, `diff -r` shows at most a "
            "float's last digit where another machine's math library rounds differently) from "
            "them:", "",
            "```bash", *rebuild_commands(data_files), "```", ""]


# What the README says where no repository URL was known when the bundle was made.
NO_REPOSITORY = ("no repository URL recorded (set `publication.repository` in the study config, "
                 "or `Repository` under `[project.urls]` in pyproject.toml, or a git remote "
                 "`origin`, then rebuild the bundle)")


CPU_TORCH = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU wheels (no CUDA)


def install_lines(manifest: dict) -> list[str]:
    """The README's install steps: tiledattention from the bundle's own source snapshot
    (the run's package, workflow and pyproject.toml), with the gpu extra where the study ran
    on a GPU; a CPU study's torch from PyTorch's CPU wheels unless one is installed (PyPI's
    default Linux wheel carries the CUDA libraries, gigabytes)."""
    gpu = isinstance(manifest.get("gpu"), dict) and bool(manifest["gpu"].get("name"))
    lines = ["python -m zipfile -e workflow-snapshot.zip ../source   # this run's source"]
    if not gpu:
        lines.append(f'python -c "import torch" 2>/dev/null || python -m pip install torch '
                     f"--index-url {CPU_TORCH}")
    lines.append(f'python -m pip install "../source[{"gpu,workflow" if gpu else "workflow"}]"')
    return lines


def reproduce_section(pub: Publication, manifest: dict, snapshot: tuple[int, str]) -> list[str]:
    """## How to reproduce: the install step and the one command (tests/test_reproduce.py
    follows these lines literally)."""
    image = (manifest.get("container") or {}).get("image")
    return [
        "## How to reproduce", "",
        "In the directory holding this README (the unpacked bundle), install this run's "
        "source (the bundle's `workflow-snapshot.zip` holds it) with its workflow tools, "
        "then re-run the study: the same config and grid "
        "(`config/study-config.yaml`), the workflow of this run (`workflow-snapshot.zip`), "
        "through a Snakemake profile (`local`, `slurm`, or the path of your own). It ends "
        "with a verified bundle of the new run and `tiledattn compare` of it against this "
        "one (exit 1 on a regression beyond the tolerances; `--source checkout` takes the "
        "workflow from a checkout of the recorded revision instead).", "",
        "```bash", *install_lines(manifest),
        "tiledattn reproduce . --out ../reproduction --profile local", "```", "",
        *([f"The study ran on {manifest['gpu']['name']}: on a machine without a CUDA GPU "
           "`tiledattn reproduce` with the local profile refuses it (it would measure on the "
           "CPU for hours); run it on such a GPU, or through `--profile slurm`.", ""]
          if isinstance(manifest.get("gpu"), dict) and manifest["gpu"].get("name") else []),
        (f"The jobs ran in the container image `{image}` (the config's "
         "`launcher_options.image`), so the reproduction's jobs do too." if image else
         "The jobs ran without a container image (the config names none)."), "",
        f"The snapshot holds {snapshot[0]} files: {snapshot[1]} under "
        f"{', '.join(SNAPSHOT)} — untracked and ignored files (a local `.env`, credentials) "
        "are never included. `tiledattn bundle verify .` checks this bundle's files.", ""]


def _variant_rows(study_dir: str) -> list[dict]:
    """The variants stage's rows, when the study ran it."""
    path = os.path.join(study_dir, "variants", "rows.jsonl")
    if not os.path.lexists(path):
        return []
    from ...bench.variants_run import load_rows

    _source(path, study_dir)  # a link out of the study or a FIFO is refused
    return load_rows(os.path.dirname(path))


def _variants_not_run(study_dir: str) -> list[str]:
    """One bullet per variants method and status that did not run, with its reason."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in _variant_rows(study_dir):
        if r.get("status") != "ok":
            groups.setdefault((r["method"], r["status"]), []).append(r)
    return [f"- variants: {m} {st} at {len(g)} point(s): {_line(g[0].get('reason') or '—')}"
            for (m, st), g in sorted(groups.items())]


def not_run(study_dir: str, rows: list[dict]) -> list[str]:
    """One Markdown bullet per study step (or method) that did not run, with the reason
    its job recorded: GPU methods without a GPU, tuning and profiles on a node without
    one."""
    from ...bench.aggregate import load_checked

    out = []
    for step, step_rows in (("benchmark", rows),
                            ("schedule ladder", load_checked(os.path.join(study_dir, "ladder"))
                             if os.path.isdir(os.path.join(study_dir, "ladder")) else [])):
        by_method: dict[tuple[str, str], list[dict]] = {}
        for r in step_rows:
            if r.get("status") != "ok":
                by_method.setdefault((r["method"], r["status"]), []).append(r)
        for (method, status), group in sorted(by_method.items()):
            out.append(f"- {step}: {method} {status} at {len(group)} point(s): "
                       f"{_line(group[0].get('reason') or group[0].get('error') or '—')}")
    model = os.path.join(study_dir, "model", "rows.jsonl")
    if os.path.lexists(model):
        from ...bench.model import load_rows

        skipped = [r for r in load_rows(os.path.dirname(model)) if r.get("status") != "ok"]
        if skipped:
            out.append(f"- model benchmark (model_e2e): {skipped[0]['status']} at "
                       f"{len(skipped)} row(s): {_line(skipped[0].get('reason') or '—')}")
    out += _variants_not_run(study_dir)
    tune = os.path.join(study_dir, "tune", "schedule-table.json")
    if os.path.lexists(tune):
        from ...schedules.table import ScheduleTable

        why = ScheduleTable.load(_source(tune, study_dir)).meta.get("unavailable")
        if why:
            out.append(f"- tuning (Table 5): not run: {_line(why)}")
    prof = os.path.join(study_dir, "profile", "summary.json")
    if os.path.lexists(prof):
        caps = _load_json(_source(prof, study_dir), "profile summary")
        caps = caps.get("captures") if isinstance(caps, dict) else None
        for c in caps if isinstance(caps, list) else []:
            if isinstance(c, dict) and c.get("status") != "ok":
                out.append(f"- profile {c.get('shape')} {c.get('method')}: {c.get('status')}: "
                           f"{_line(c.get('reason'))}")
    return out


def _line(text) -> str:
    """A reason as one Markdown line (a newline would end the bullet)."""
    return " ".join(str(text).split())


def _load_json(path: str, what: str):
    try:
        return load_json(path, cap=JSON_MAX, what=what)
    except UnsafeFileError as exc:
        raise StudyError(str(exc)) from None


def _is_ours(out_dir: str) -> bool:
    """A bundle this module wrote, holding nothing else (SHA256SUMS may be gone: Snakemake
    removes a rule's declared outputs before re-running it)."""
    try:
        listed = set(load_json(os.path.join(out_dir, MARKER), cap=JSON_MAX)["files"])
    except (UnsafeFileError, KeyError, TypeError):
        return False
    return set(_files(out_dir)) <= listed | {SUMS, MARKER}


def _zip_is_ours(zip_path: str, base: str) -> bool:
    try:
        with zipfile.ZipFile(zip_path) as z:
            return f"{base}/{MARKER}" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _has_marker(out_dir: str) -> bool:
    """``out_dir`` holds the marker file bundle create writes into every bundle it makes."""
    try:
        mark = load_json(os.path.join(out_dir, MARKER), cap=JSON_MAX)
    except UnsafeFileError:
        return False
    return isinstance(mark, dict) and str(mark.get("format", "")).startswith(
        "tiledattention-bundle/")


def bundle_holding(path: str) -> str | None:
    """The bundle directory that is or holds ``path`` (one with SHA256SUMS and the marker
    file), or None: what is written there breaks its verify."""
    d = os.path.realpath(path)
    while True:
        if os.path.isfile(os.path.join(d, SUMS)) and os.path.isfile(os.path.join(d, MARKER)):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _account_home() -> str:
    """The home directory of the account (the password database), whatever $HOME says."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_dir or "/"
    except KeyError:
        return "/"


def _replaces(out_dir: str) -> bool:
    """Replacing ``out_dir`` would delete files that are not a bundle of ours."""
    return os.path.isdir(out_dir) and bool(os.listdir(out_dir)) and not _is_ours(out_dir)


def _check_out(out_dir: str, study_dir: str, repo_root: str, force: bool) -> None:
    """Refuse an --out whose replacement would lose something: the study, the source, a
    directory or zip this tool did not make. ``force`` replaces a bundle of ours that has
    files added to it, nothing else: what is replaced is decided by the marker file in the
    directory, never by the environment ($HOME can name any directory)."""
    out = os.path.realpath(out_dir)
    for what, path in (("the study directory", study_dir), ("the source checkout", repo_root),
                       ("your home directory", os.path.expanduser("~")),
                       ("your home directory", _account_home()), ("/", "/")):
        p = os.path.realpath(path)
        if out == p or p.startswith(out.rstrip(os.sep) + os.sep):
            raise StudyError(f"--out {out_dir}: is or contains {what}; name a new directory "
                             "for the bundle")
    zip_path = out_dir.rstrip("/") + ".zip"
    if os.path.lexists(out_dir) and (os.path.islink(out_dir) or not os.path.isdir(out_dir)):
        raise StudyError(f"--out {out_dir}: exists and is not a directory")
    # Inside the study or the checkout --force does not apply: what is there (the study's
    # own results, untracked files) is never replaced, only a bundle of ours.
    for what, path in (("the study directory", study_dir), ("the source checkout", repo_root)):
        inside = os.path.realpath(path).rstrip(os.sep) + os.sep
        if force and out.startswith(inside) and (
                _replaces(out_dir) or os.path.lexists(zip_path)
                and not _zip_is_ours(zip_path, os.path.basename(out))):
            raise StudyError(f"--out {out_dir}: inside {what}, --force never replaces what is "
                             "there; name a new directory (or a previous bundle) for the "
                             "bundle")
    if _replaces(out_dir) and not (force and _has_marker(out_dir)):
        if force:
            raise StudyError(f"--out {out_dir}: not a bundle tiledattn made (no {MARKER}); "
                             "--force replaces only a bundle of ours, never another directory"
                             "; name a new directory for the bundle")
        raise StudyError(f"--out {out_dir}: not empty and not a bundle of tiledattn's alone "
                         f"(no {MARKER}, or files it did not write); name a new directory, or "
                         "pass --force to replace a bundle of ours that has files added")
    if os.path.lexists(zip_path) and not (
            os.path.isfile(zip_path) and not os.path.islink(zip_path)
            and _zip_is_ours(zip_path, os.path.basename(out))):
        raise StudyError(f"{zip_path}: exists and is not a bundle zip of tiledattn's; move it "
                         "away (--force never replaces a file tiledattn did not make)")


def create(study_dir: str, out_dir: str, *, config: dict, config_name: str, repo_root: str,
           publication: Publication, command: str = "snakemake", force: bool = False,
           compact: bool = False) -> dict:
    """Build ``out_dir`` (a directory) and ``out_dir + '.zip'`` from a finished study
    (and its ``compare/`` directory, when ``tiledattn compare`` wrote one). ``compact``: the
    rows gzipped (with the ladder's and the shapes grids'), no figures (``_build_compact``).

    Built beside ``out_dir`` and moved into place at the end, so a failure leaves any previous
    bundle as it was; an existing ``out_dir`` is replaced only when it is a previous bundle
    (or with ``force``), never when it is or holds the study or the source."""
    from ...bench.store import Lock

    agg = os.path.join(study_dir, "aggregate")
    rows_jsonl = os.path.join(agg, "rows.jsonl")
    manifest_path = os.path.join(study_dir, "manifest.json")
    for need in (rows_jsonl, manifest_path):
        if not os.path.lexists(need):
            raise StudyError(f"bundle: {need} is missing (run the aggregate and manifest "
                             "steps first)")
    _check_tables(agg)
    _check_out(out_dir, study_dir, repo_root, force)
    publication = dataclasses.replace(
        publication, repository=repository_url(publication.repository, repo_root))
    rows = _published_rows(study_dir)
    manifest = _load_json(_source(manifest_path, study_dir), "manifest")
    if not isinstance(manifest, dict):
        raise StudyError(f"{manifest_path}: not a manifest (expected a JSON object)")
    _check_config(manifest, config, manifest_path)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(os.path.abspath(out_dir))
    with Lock(os.path.join(parent, base), what="tiledattn bundle create"), _exit_on_signals():
        for stale in glob.glob(os.path.join(parent, glob.escape(f".{base}.building-") + "*")):
            shutil.rmtree(stale, ignore_errors=True)  # a killed run's; we hold the lock
        work = tempfile.mkdtemp(prefix=f".{base}.building-", dir=parent)
        try:
            files = _build(work, study_dir, rows, manifest, config=config,
                           config_name=config_name, repo_root=repo_root,
                           publication=publication, command=command, compact=compact)
            zip_path = out_dir.rstrip("/") + ".zip"
            tmp_zip = os.path.join(work, ".bundle.zip")
            _zip_dir(work, tmp_zip, base, skip=(".bundle.zip",))
            os.replace(tmp_zip, zip_path)
            if os.path.isdir(out_dir) and not os.path.islink(out_dir):
                shutil.rmtree(out_dir)  # checked above: a bundle of ours (its marker) or empty
            os.replace(work, out_dir)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return {"dir": out_dir, "zip": zip_path, "files": files}


def _check_tables(agg: str) -> None:
    """The aggregate's tables are all there: an aggregate stopped before them (or run with
    --rows-only) left a study that is not ready to publish."""
    from ..presentation.tables import NAMES

    missing = [n for n in NAMES if not os.path.isfile(os.path.join(agg, "tables", f"{n}.md"))]
    if missing:
        raise StudyError(f"bundle: {agg}/tables lacks {len(missing)} of the study's "
                         f"{len(NAMES)} tables ({', '.join(missing[:3])}"
                         f"{', …' if len(missing) > 3 else ''}); run the aggregate step "
                         "again (without --rows-only)")


def _check_config(manifest: dict, config: dict, manifest_path: str) -> None:
    """The config given is the one the study's manifest recorded (when it recorded one)."""
    from .manifest import config_hash

    want = manifest.get("study_config_hash")
    if want is not None and config_hash(config) != want:
        raise StudyError(f"--config: not the config this study ran with ({manifest_path} "
                         f"records study_config_hash {want[:12]}…, this one hashes to "
                         f"{config_hash(config)[:12]}…); pass the study's own config "
                         "(results/<study>/plan/study-config.yaml)")


def _published_rows(study_dir: str) -> list[dict]:
    """The aggregated rows, refused in one line unless every one can be published: no torn
    or unreadable line (a killed aggregate), one config, finite and physical numbers, no
    pair twice, and rows.csv (when there) listing the same rows."""
    from ...bench.store import ResultStore, check_one_config, check_rows

    agg = os.path.join(study_dir, "aggregate")
    path = _source(os.path.join(agg, "rows.jsonl"), study_dir)
    store = ResultStore(path)
    if store.skipped_lines:
        raise StudyError(f"bundle: {path} has {store.skipped_lines} unreadable line(s) (torn "
                         "by a killed aggregate?); run the aggregate step again")
    rows = list(store.rows.values())
    check_one_config(rows, path)
    check_rows(rows, path, store.conflicts)
    table = os.path.join(agg, "rows.csv")
    if os.path.lexists(table):
        problem = _csv_disagrees(rows, read_bytes(_source(table, study_dir), cap=ROWS_MAX))
        if problem:
            raise StudyError(f"bundle: {table} and rows.jsonl disagree ({problem}); run the "
                             "aggregate step again")
    return rows


def _csv_disagrees(rows: list[dict], data: bytes) -> str | None:
    """Why rows.csv does not list ``rows`` value for value (same pairs, same order, every
    column of each row with the same value), or None."""
    import csv
    import io

    try:
        listed = list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        return f"rows.csv unreadable: {exc}"
    if len(listed) != len(rows):
        return f"rows.csv has {len(listed)} rows, rows.jsonl {len(rows)}"
    if [(c.get("point_key"), c.get("method")) for c in listed] != \
            [(r.get("point_key"), r.get("method")) for r in rows]:
        return "rows.csv lists other points or methods"
    from ...bench.aggregate import flatten

    for n, (row, cells) in enumerate(zip(rows, listed), 1):
        flat = flatten(row)
        for col in sorted(set(flat) | set(cells)):
            if col is None or not _same_cell(flat.get(col), cells.get(col)):
                return (f"rows.csv row {n} ({row.get('point_key')}, {row.get('method')}): "
                        f"{col} is {cells.get(col)!r} there, {flat.get(col)!r} in rows.jsonl")
    return None


def _same_cell(value, cell: str | None) -> bool:
    """A rows.jsonl value and its rows.csv cell (as pandas writes it) say the same."""
    import math

    if cell is None:  # no such column in the CSV
        return value is None
    if value is None or value == "":
        return cell == ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return cell == (value if isinstance(value, str) else str(value))
    try:
        got = float(cell)
    except ValueError:
        return False
    return math.isclose(got, float(value), rel_tol=1e-12, abs_tol=0.0)


def _copy_data(out_dir: str, study_dir: str) -> None:
    """data/ of a full bundle: the rows as Parquet, CSV and JSONL, and the stages' rows."""
    agg = os.path.join(study_dir, "aggregate")
    # Every source is checked by _source: a link out of the study or a FIFO is refused.
    for name in ("rows.parquet", "rows.csv", "rows.jsonl", "columns.md"):
        src = os.path.join(agg, name)
        if os.path.lexists(src):
            _copy(_source(src, study_dir), os.path.join(out_dir, "data", name))
    model_rows = os.path.join(study_dir, "model", "rows.jsonl")
    if os.path.lexists(model_rows):  # the model stage's own rows (another row format)
        _copy(_source(model_rows, study_dir), os.path.join(out_dir, "data", "model-rows.jsonl"))
    variant_rows = os.path.join(study_dir, "variants", "rows.jsonl")
    if os.path.lexists(variant_rows):  # the variants stage's rows (its own points)
        _copy(_source(variant_rows, study_dir),
              os.path.join(out_dir, "data", "variants-rows.jsonl"))


def _gzip_to(dest: str, data: bytes) -> None:
    """``data`` gzipped at ``dest``, byte for byte the same each time (no name, no time)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                                mtime=0, compresslevel=9) as g:
        g.write(data)


def _shard_rows(rows_dir: str, study_dir: str) -> bytes:
    """A stage's shard files (rows-shard*.jsonl) as one JSONL: its checked rows."""
    from ...bench.aggregate import load_checked

    for path in glob.glob(os.path.join(rows_dir, "rows-shard*.jsonl")):
        _source(path, study_dir)
    return "".join(json.dumps(r) + "\n" for r in load_checked(rows_dir, point=True)).encode()


def _compact_data(out_dir: str, study_dir: str) -> list[str]:
    """data/ of a compact bundle: every row file gzipped (the aggregate's rows.jsonl byte for
    byte; the ladder's and each shapes grid's shards as one file each, so that every table
    and figure rebuilds from the bundle), the tuning table, the column dictionary. Returns
    the data files written, relative to ``out_dir``."""
    agg = os.path.join(study_dir, "aggregate")
    data = os.path.join(out_dir, "data")
    srcs = [(os.path.join(agg, "rows.jsonl"), "rows.jsonl.gz")] + [
        (os.path.join(study_dir, sub, "rows.jsonl"), name) for sub, name in COMPACT_STAGE_ROWS]
    for src, name in srcs:
        if os.path.lexists(src):
            _gzip_to(os.path.join(data, name), read_bytes(_source(src, study_dir), cap=ROWS_MAX))
    grids = sorted(d for d in glob.glob(os.path.join(study_dir, "shapes", "g*"))
                   if glob.glob(os.path.join(d, "rows-shard*.jsonl")))
    for name, rows_dir in [("ladder", os.path.join(study_dir, "ladder"))] + \
            [(f"shapes-{os.path.basename(g)}", g) for g in grids]:
        if glob.glob(os.path.join(rows_dir, "rows-shard*.jsonl")):
            _gzip_to(os.path.join(data, f"{name}-rows.jsonl.gz"),
                     _shard_rows(rows_dir, study_dir))
    tune = os.path.join(study_dir, "tune", "schedule-table.json")
    if os.path.lexists(tune):
        _copy(_source(tune, study_dir), os.path.join(data, "schedule-table.json"))
    columns = os.path.join(agg, "columns.md")
    if os.path.lexists(columns):
        _copy(_source(columns, study_dir), os.path.join(data, "columns.md"))
    return ["data/" + rel for rel in _files(data)]


def rebuild_commands(data_files: list[str]) -> list[str]:
    """The shell lines that unpack a compact bundle's rows (outside it, in REBUILT) and
    rebuild its figures and tables with ``tiledattn figures`` and ``tiledattn aggregate``."""
    have = set(data_files)
    grids = sorted(f[len("data/shapes-"):-len("-rows.jsonl.gz")] for f in have
                   if f.startswith("data/shapes-") and f.endswith("-rows.jsonl.gz"))
    unpack = [("rows.jsonl.gz", "rows/rows-shard0of1.jsonl"),
              ("ladder-rows.jsonl.gz", "ladder/rows-shard0of1.jsonl"),
              *[(f"shapes-{g}-rows.jsonl.gz", f"shapes/{g}/rows-shard0of1.jsonl")
                for g in grids],
              ("model-rows.jsonl.gz", "model/rows.jsonl"),
              ("variants-rows.jsonl.gz", "variants/rows.jsonl")]
    unpack = [(src, dest) for src, dest in unpack if f"data/{src}" in have]
    r = REBUILT
    lines = [f"R={r}   # outside the bundle: SHA256SUMS lists exactly what is in it",
             "mkdir -p " + " ".join(sorted({f"$R/{os.path.dirname(d)}" for _, d in unpack}))]
    lines += [f"gunzip -c data/{src} > $R/{dest}" for src, dest in unpack]
    extra = []
    if "data/ladder-rows.jsonl.gz" in have:
        extra.append("--ladder $R/ladder")
    if "data/schedule-table.json" in have:
        extra.append("--tune-table data/schedule-table.json")
    if grids:
        extra.append("--shapes " + " ".join(f"$R/shapes/{g}" for g in grids))
    if "data/variants-rows.jsonl.gz" in have:
        extra.append("--variants $R/variants")
    model = " --model $R/model" if "data/model-rows.jsonl.gz" in have else ""
    opts = (" " + " ".join(extra)) if extra else ""
    lines += [f"tiledattn figures --rows $R/rows/rows-shard0of1.jsonl --out $R/figures{opts}",
              f"tiledattn aggregate --rows $R/rows --out $R/aggregate{opts}{model}"]
    return lines


def _build(out_dir: str, study_dir: str, rows: list[dict], manifest: dict, *, config: dict,
           config_name: str, repo_root: str, publication: Publication, command: str,
           compact: bool = False) -> int:
    agg = os.path.join(study_dir, "aggregate")
    manifest_path = os.path.join(study_dir, "manifest.json")
    data_files = _compact_data(out_dir, study_dir) if compact else \
        _copy_data(out_dir, study_dir)
    # compare: tiledattn compare's table, figure; a compact bundle's figures regenerate.
    for sub in ("tables", "compare") if compact else ("tables", "figures", "compare"):
        src_dir = os.path.join(study_dir, sub) if sub != "tables" else os.path.join(agg, sub)
        if os.path.lexists(src_dir):
            for rel in _study_files(src_dir, study_dir):
                _copy(os.path.join(src_dir, rel), os.path.join(out_dir, sub, rel))
    scaling_dir = os.path.join(study_dir, "scaling")  # tiledattn scaling's table, figure
    if os.path.lexists(scaling_dir):
        for rel in _study_files(scaling_dir, study_dir):
            _copy(os.path.join(scaling_dir, rel), os.path.join(out_dir, "scaling", rel))
    prof = os.path.join(study_dir, "profile")
    if os.path.lexists(prof):
        _zip_dir(prof, os.path.join(out_dir, "profiles.zip"), "profiles",
                 files=_study_files(prof, study_dir))
    _copy(_source(manifest_path, study_dir), os.path.join(out_dir, "manifest.json"))
    import yaml

    os.makedirs(os.path.join(out_dir, "config"))
    with open(os.path.join(out_dir, "config", "study-config.yaml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    snap = _snapshot(repo_root, os.path.join(out_dir, "workflow-snapshot.zip"),
                     os.path.join(out_dir, STUDY_CONFIG))
    # Zenodo takes at most 100 files per record: group directories into archives until the
    # bundle fits (metadata files stay loose so Zenodo and readers see them).
    for sub in ("figures", "tables"):
        if len(_files(out_dir)) + 6 <= ZENODO_MAX_FILES:
            break
        if os.path.isdir(os.path.join(out_dir, sub)):
            _zip_dir(os.path.join(out_dir, sub), os.path.join(out_dir, f"{sub}.zip"), sub)
            shutil.rmtree(os.path.join(out_dir, sub))
    t4 = os.path.join(agg, "tables", "table4_ratios.md")
    table4 = ""
    if os.path.lexists(t4):
        table4 = "\n" + read_bytes(_source(t4, study_dir), cap=JSON_MAX).decode("utf-8",
                                                                               "replace")
    from ..presentation.headline import variants_sentence

    variants_line = variants_sentence(_variant_rows(study_dir))
    readme = _readme(publication, rows, manifest, table4, f"config/{config_name}", snap,
                     variants_line, data_files if compact else None)
    missing = not_run(study_dir, rows)
    if missing:  # before the column dictionary: what a reader must know first
        cut = readme.index("## How to reproduce")
        readme = (readme[:cut] + "## What did not run\n\n" + "\n".join(missing) + "\n\n"
                  + readme[cut:])
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(readme)
    head = headline(rows, manifest) + variants_line
    with open(os.path.join(out_dir, ".zenodo.json"), "w") as f:
        json.dump(zenodo(publication, head), f, indent=2)
    with open(os.path.join(out_dir, "CITATION.cff"), "w") as f:
        yaml.safe_dump(citation_cff(publication), f, sort_keys=False, allow_unicode=True)
    runs = manifest.get("runs") or [{}]
    write_ro_crate(out_dir, publication, _files(out_dir), manifest, command,
                   min((r.get("started") or "" for r in runs), default=None) or None,
                   max((r.get("finished") or "" for r in runs), default=None) or None)
    files = _files(out_dir)
    with open(os.path.join(out_dir, MARKER), "w") as f:
        json.dump({"format": "tiledattention-bundle/1", "files": files + [MARKER, SUMS],
                   "rows": len(rows)}, f)
    files = _files(out_dir)
    if len(files) + 1 > ZENODO_MAX_FILES:
        raise StudyError(f"bundle: {len(files) + 1} files exceed Zenodo's "
                         f"{ZENODO_MAX_FILES} per record")
    with open(os.path.join(out_dir, SUMS), "w") as f:
        for rel in files:
            f.write(f"{sha256(os.path.join(out_dir, rel))}  {rel}\n")
    return len(files) + 1


def _confined(rel: str) -> bool:
    """A relative path that stays inside the bundle: no absolute, no '..', no oddities."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and "\\" not in rel and "\0" not in rel \
        and all(p not in ("", ".", "..") for p in parts) and ":" not in parts[0]


class _DirView:
    """A bundle directory: regular files only; links and special files are findings."""

    def __init__(self, root: str):
        self.root, self.problems, self.names = root, [], set()
        for d, dirs, names in os.walk(root):
            for n in dirs + names:
                full = os.path.join(d, n)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                mode = os.lstat(full).st_mode
                if stat.S_ISLNK(mode):
                    self.problems.append(f"link: {rel} (links are not allowed in a bundle)")
                elif n in names and not stat.S_ISREG(mode):
                    self.problems.append(f"special file: {rel} (only regular files allowed)")
                elif n in names:
                    self.names.add(rel)

    def open(self, rel: str):
        return open(os.path.join(self.root, rel), "rb")


class _ZipView:
    """A bundle zip read in place (nothing extracted): members checked against the limits
    before a byte is decompressed."""

    def __init__(self, z: zipfile.ZipFile):
        self.z, self.problems, self.members = z, [], {}
        infos = z.infolist()
        if len(infos) > MAX_MEMBERS:
            raise StudyError(f"{len(infos)} zip members, more than the {MAX_MEMBERS} allowed")
        total = sum(i.file_size for i in infos)
        if total > MAX_TOTAL_BYTES:
            raise StudyError(f"{total} bytes uncompressed, more than the {MAX_TOTAL_BYTES} "
                             "allowed")
        files = [i for i in infos if not i.is_dir()]
        tops = {i.filename.split("/", 1)[0] for i in infos}
        prefix = f"{tops.pop()}/" if len(tops) == 1 and all("/" in i.filename
                                                             for i in files) else ""
        for i in infos:
            kind = stat.S_IFMT(i.external_attr >> 16)  # 0: not recorded (a plain file)
            if not _confined(i.filename.rstrip("/")):
                self.problems.append(f"unsafe zip member name: {i.filename!r}")
            elif kind == stat.S_IFLNK:
                self.problems.append(f"link: {i.filename} (links are not allowed in a bundle)")
            elif i.is_dir():
                continue
            elif kind not in (0, stat.S_IFREG):
                self.problems.append(f"special file: {i.filename} (only regular files allowed)")
            elif i.file_size > MAX_FILE_BYTES:
                self.problems.append(f"too large: {i.filename} ({i.file_size} bytes, limit "
                                     f"{MAX_FILE_BYTES})")
            elif i.file_size > 1 << 20 and i.file_size > MAX_RATIO * max(1, i.compress_size):
                self.problems.append(f"compression ratio of {i.filename} above {MAX_RATIO} "
                                     "(a zip bomb?)")
            elif i.filename in self.members.values() or i.filename[len(prefix):] in self.members:
                self.problems.append(f"zip member listed twice: {i.filename}")
            else:
                self.members[i.filename[len(prefix):]] = i.filename
        self.names = set(self.members)

    def open(self, rel: str):
        return self.z.open(self.members[rel])  # reads at most the member's declared size


def _read_capped(view, rel: str, cap: int) -> bytes:
    with view.open(rel) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise StudyError(f"{rel}: larger than the {cap} bytes allowed")
    return data


def _read_gz_capped(view, rel: str, cap: int) -> bytes:
    """A gzipped member's content, decompressed no further than ``cap`` bytes (a gzip bomb
    stops there); a file that is not whole gzip (bad header, torn, wrong CRC) is one
    StudyError."""
    with view.open(rel) as f:
        try:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                data = g.read(cap + 1)  # reaching the end checks the CRC and the length
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise StudyError(f"{rel}: not a whole gzip file ({exc or type(exc).__name__})") \
                from None
    if len(data) > cap:
        raise StudyError(f"{rel}: over the {cap} bytes allowed once decompressed")
    return data


def verify(path: str, partial: dict | None = None) -> list[str]:
    """Problems found in the bundle at ``path`` (a directory or its zip); empty: verified.

    The bundle may come from anyone: every path in SHA256SUMS must name a regular file
    inside it, and a zip is read in place under size, count and ratio limits; only the
    three metadata files are written out (to a scratch dir removed even on SIGTERM)."""
    if os.path.isdir(path):
        return _verify(_DirView(path), scratch=None, root=path, partial=partial)
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        return [f"{path}: not a bundle directory or zip"]
    try:
        with zipfile.ZipFile(path) as z:
            view = _ZipView(z)
            with _scratch() as tmp:
                return _verify(view, scratch=tmp, root=None, partial=partial)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        return [f"{path}: unreadable zip ({exc})"]
    except StudyError as exc:
        return [f"{path}: {exc}"]


def _verify(view, *, scratch: str | None, root: str | None,
            partial: dict | None = None) -> list[str]:
    """``partial`` (a dict): a committed summary of a bundle, not the bundle: files SHA256SUMS
    lists that are absent go to partial["withheld"], files it does not list to
    partial["extra"]; every file present that it lists must still match."""
    problems = list(view.problems)
    if SUMS not in view.names:
        return problems + [f"{SUMS} is missing"]
    listed: dict[str, str] = {}
    try:
        text = _read_capped(view, SUMS, MAX_META_BYTES).decode("utf-8")
    except (StudyError, UnicodeDecodeError) as exc:
        return problems + [f"{SUMS}: unreadable ({exc})"]
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split("  ", 1)
        if len(parts) != 2 or len(parts[0]) != 64 or \
                not all(c in "0123456789abcdef" for c in parts[0]):
            problems.append(f"{SUMS} line {n} is malformed")
        elif not _confined(parts[1]):
            problems.append(f"{SUMS} line {n}: {parts[1]!r} is not a path inside the bundle")
        elif parts[1] in listed:
            problems.append(f"{SUMS} line {n}: {parts[1]} is listed twice")
        else:
            listed[parts[1]] = parts[0]
        if n > MAX_MEMBERS:
            return problems + [f"{SUMS}: more than {MAX_MEMBERS} lines"]
    changed: set[str] = set()  # their content is not the published one: nothing more to say
    for rel, digest in listed.items():
        if rel not in view.names:
            if partial is not None:
                partial.setdefault("withheld", []).append(rel)
            else:
                problems.append(f"missing: {rel}")
            continue
        h, size = hashlib.sha256(), 0
        with view.open(rel) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                size += len(block)
                if size > MAX_FILE_BYTES:
                    break
                h.update(block)
        if size > MAX_FILE_BYTES:
            problems.append(f"too large: {rel} (over {MAX_FILE_BYTES} bytes)")
            changed.add(rel)
        elif h.hexdigest() != digest:
            problems.append(f"changed: {rel} (checksum differs)")
            changed.add(rel)
    present = view.names - {SUMS}
    if partial is not None:
        partial["extra"] = sorted(present - set(listed))
    else:
        problems += [f"not in {SUMS}: {rel}" for rel in sorted(present - set(listed))]
    if len(present) + 1 > ZENODO_MAX_FILES:
        problems.append(f"{len(present) + 1} files exceed Zenodo's {ZENODO_MAX_FILES}")
    problems += _check_listing(view, listed)
    problems += _check_rows(view, changed)
    meta = {}
    for name in (".zenodo.json", "CITATION.cff", "ro-crate-metadata.json"):
        if name in view.names:  # regular files only: a FIFO is a finding, never opened
            try:
                meta[name] = _read_capped(view, name, MAX_META_BYTES)
            except StudyError as exc:
                problems.append(str(exc))
    if scratch is not None and "ro-crate-metadata.json" in meta:  # rocrate reads a dir
        with open(os.path.join(scratch, "ro-crate-metadata.json"), "wb") as f:
            f.write(meta["ro-crate-metadata.json"])
        root = scratch
    found = _check_metadata(meta, root)
    if partial is not None:  # a metadata file withheld is listed there, not a problem
        found = [m for m in found if not any(m.startswith(w) and "missing" in m
                                             for w in partial.get("withheld", []))]
    return problems + found


def _check_listing(view, listed: dict[str, str]) -> list[str]:
    """Every file the bundle's own list (MARKER) names is in SHA256SUMS and present: a line
    deleted from SHA256SUMS with its file is found."""
    if MARKER not in view.names:
        return []
    try:
        files = _json_of(view, MARKER).get("files")
    except (StudyError, AttributeError) as exc:
        return [f"{MARKER}: unreadable ({exc})"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return [f"{MARKER}: 'files' is not a list of names"]
    return [f"deleted from {SUMS}: {rel} (the bundle lists it)" for rel in files
            if rel not in (SUMS, MARKER) and rel not in listed]


def _json_of(view, rel: str, cap: int = MAX_META_BYTES):
    try:
        return parse_json(_read_capped(view, rel, cap), rel)
    except UnsafeFileError as exc:
        raise StudyError(str(exc)) from None


def _jsonl_of(view, rel: str) -> tuple[list[dict], list]:
    """(rows, conflicting (point, method) pairs) of a rows file of the bundle, plain or
    gzipped (decompressed under ROWS_MAX); StudyError names the first thing wrong."""
    data = _read_gz_capped(view, rel, ROWS_MAX) if rel.endswith(".gz") else \
        _read_capped(view, rel, ROWS_MAX)
    if data and not data.endswith(b"\n"):
        raise StudyError(f"{rel}: the last line is cut short (a truncated file)")
    rows, seen, conflicts = [], {}, []
    for n, line in enumerate(data.splitlines(), 1):
        try:
            row = parse_json(line, f"{rel} line {n}")
        except UnsafeFileError as exc:
            raise StudyError(str(exc)) from None
        if not isinstance(row, dict):
            raise StudyError(f"{rel} line {n}: not a row (JSON object)")
        key = (row.get("point_key"), row.get("method"))
        if key in seen and seen[key] != row:
            conflicts.append(key)
        seen[key] = row
        rows.append(row)
    return rows, conflicts


def _check_rows(view, changed: set[str] = frozenset()) -> list[str]:
    """Published rows (data/rows.jsonl, or a compact bundle's data/rows.jsonl.gz): whole
    lines (none torn), finite and physical numbers, one config, no pair twice, the same rows
    as rows.csv, and measured under a config the manifest names (its runs' measure hashes,
    its study config's hash). A compact bundle's other row files: whole gzip of JSON rows.
    A file whose checksum already failed (``changed``) is not read again."""
    problems = []
    for rel in sorted(n for n in view.names - changed
                      if n.startswith("data/") and n.endswith(".jsonl.gz")
                      and n != "data/rows.jsonl.gz"):
        try:
            _jsonl_of(view, rel)
        except StudyError as exc:
            problems.append(str(exc))
    if {"data/rows.jsonl", "data/rows.jsonl.gz"} <= view.names:
        return problems + ["data/rows.jsonl beside data/rows.jsonl.gz: a bundle publishes "
                           "its rows once (a full bundle plain, a compact one gzipped)"]
    rels = [r for r in ("data/rows.jsonl", "data/rows.jsonl.gz")
            if r in view.names and r not in changed]
    return problems + (_check_published(view, rels[0], changed) if rels else [])


def _check_published(view, rel: str, changed: set[str]) -> list[str]:
    """``_check_rows`` of the published rows file ``rel``."""
    from ...bench.store import RowsError, check_one_config, check_rows

    try:
        rows, conflicts = _jsonl_of(view, rel)
    except StudyError as exc:
        return [str(exc)]
    if not rows:
        return [f"{rel}: no rows (an empty or emptied rows file)"]
    problems = []
    try:
        check_one_config(rows, rel)
        check_rows(rows, rel, conflicts)
    except RowsError as exc:
        problems.append(str(exc))
    problems += _check_counts(view, rows, rel, changed)
    if "data/rows.csv" in view.names and "data/rows.csv" not in changed:
        try:
            why = _csv_disagrees(rows, _read_capped(view, "data/rows.csv", ROWS_MAX))
        except StudyError as exc:
            why = str(exc)
        if why:
            problems.append(f"data/rows.csv and {rel} disagree: {why}")
    return problems + _check_manifest(view, rows)


def _check_counts(view, rows: list[dict], rel: str, changed: set[str]) -> list[str]:
    """The rows against what the bundle says of them: the README's count (points, methods,
    rows, rows by status) and the row count the bundle's own list (MARKER) records."""
    import re

    problems = []
    if "README.md" in view.names and "README.md" not in changed:
        try:
            text = _read_capped(view, "README.md", MAX_META_BYTES).decode("utf-8", "replace")
        except StudyError as exc:
            text, problems = "", [str(exc)]
        said = re.search(r"^\d+ benchmark points × .*?rows by status: [^(\n]*", text, re.M)
        want = rows_summary(rows)
        if text and (said is None or said.group(0).rstrip() != want):
            problems.append(f"README.md and {rel} disagree: the README says "
                            f"{said.group(0).rstrip() if said else 'no row count'!r}, the "
                            f"rows are {want!r}")
    if MARKER in view.names and MARKER not in changed:
        try:
            count = _json_of(view, MARKER).get("rows")
        except (StudyError, AttributeError):
            count = None  # _check_listing names it
        if count is not None and count != len(rows):
            problems.append(f"{rel}: {len(rows)} rows, the bundle was made with {count}")
    return problems


def _check_manifest(view, rows: list[dict]) -> list[str]:
    """The manifest's hashes against what the bundle holds: the study config's hash against
    config/study-config.yaml, its runs' measure hashes against the rows' config_hash."""
    from ...yamlio import YAMLInputError, parse_yaml
    from .manifest import config_hash

    if "manifest.json" not in view.names:
        return ["manifest.json is missing"]
    try:
        manifest = _json_of(view, "manifest.json")
    except StudyError as exc:
        return [str(exc)]
    if not isinstance(manifest, dict):
        return ["manifest.json: not a JSON object"]
    problems = []
    want = manifest.get("study_config_hash")
    cfg = "config/study-config.yaml"
    if want is not None:
        try:
            got = config_hash(parse_yaml(_read_capped(view, cfg, MAX_META_BYTES), cfg)) \
                if cfg in view.names else None
        except (StudyError, YAMLInputError) as exc:
            got = f"unreadable: {exc}"
        if got != want:
            problems.append(f"manifest.json: study_config_hash {want} does not match {cfg} "
                            f"({'missing' if got is None else got})")
    runs = manifest.get("runs") if isinstance(manifest.get("runs"), list) else []
    measured = {r.get("measure_hash") for r in runs if isinstance(r, dict)} - {None}
    if measured:
        stray = sorted({str(r.get("config_hash")) for r in rows} - measured)
        if stray:
            problems.append(f"data/rows.jsonl: rows measured under config hash(es) {stray} "
                            f"that no run in manifest.json measured ({sorted(measured)})")
    return problems


@contextlib.contextmanager
def _exit_on_signals():
    """SIGTERM and SIGHUP (a scancel, a closed terminal) raise SystemExit inside the block,
    so its cleanup runs as on Ctrl-C."""
    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _scratch():
    """A temporary directory removed on return, on exceptions, on Ctrl-C and on SIGTERM or
    SIGHUP."""
    with _exit_on_signals():
        tmp = tempfile.mkdtemp(prefix="tiledattn-verify-")
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _check_metadata(meta: dict[str, bytes], root: str | None) -> list[str]:
    """The three metadata files' contents (read bounded by the caller) against their
    schemas; the RO-Crate from ``root``, where its file lies."""
    from ...yamlio import YAMLInputError, parse_yaml

    problems = []
    if ".zenodo.json" not in meta:
        problems.append(".zenodo.json is missing")
    else:
        try:
            validate_zenodo(parse_json(meta[".zenodo.json"], ".zenodo.json"))
        except UnsafeFileError as exc:
            problems.append(str(exc))
        except StudyError as exc:
            problems.append(f".zenodo.json: {exc}")
    if "CITATION.cff" not in meta:
        problems.append("CITATION.cff is missing")
    else:
        try:
            cff = parse_yaml(meta["CITATION.cff"], "CITATION.cff")
            if not isinstance(cff, dict):
                raise StudyError("not a mapping")
            validate_cff(cff)
        except YAMLInputError as exc:
            problems.append(str(exc))
        except StudyError as exc:
            problems.append(f"CITATION.cff: {exc}")
    if "ro-crate-metadata.json" not in meta or root is None:
        problems.append("ro-crate-metadata.json is missing")
    else:
        problems += check_ro_crate(root)
    return problems
