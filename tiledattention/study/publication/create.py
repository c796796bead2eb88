"""The Zenodo-ready bundle of a study.

``create`` gathers the study's data, tables, figures, profiles (as one archive), manifest,
exact config, a snapshot of the workflow and container definitions and a wheel of the
package that ran (source/, so that the bundle alone re-runs) into a directory and a zip,
with README, .zenodo.json, CITATION.cff, ro-crate-metadata.json and SHA256SUMS.
``verify`` (publication/verify.py) checks what it made.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import shutil
import subprocess
import tempfile
import zipfile

from ...errors import StudyError
from ...safeio import (
    JSON_MAX,
    ROWS_MAX,
    UnsafeFileError,
    load_json,
    read_bytes,
    regular_file,
    sha256,
)
from .archive import (
    MARKER,
    SNAPSHOT,
    SNAPSHOT_CODE,
    SNAPSHOT_NAMES,
    SNAPSHOT_SHIPPED,
    SNAPSHOT_SOURCE,
    SNAPSHOT_SUFFIXES,
    STUDY_CONFIG,
    SUMS,
    ZENODO_MAX_FILES,
    confined,
    csv_disagrees,
    exit_on_signals,
    read_json,
    study_file,
    tree_files,
)
from .metadata import (
    Publication,
    citation_cff,
    repository_url,
    write_ro_crate,
    zenodo,
)
from .prose import headline, not_drawn, not_run, readme_text, stage_rows_in, variant_rows_in
from .source import SOURCE_DIR, write_wheel


def stage_rows() -> list[tuple[str, str]]:
    """(the rows file under the study directory, its name in a bundle's data/) of each GPU
    stage with rows of its own, in registry order. A compact bundle (a reference committed
    to git) gzips them (+ ".gz"), as every row file, and holds no figures, no CSV or LaTeX
    tables (they regenerate from the rows) and no package source in its workflow snapshot
    (its wheel, source/, holds it)."""
    from ...stages import STAGES

    return [(os.path.join(s.name, s.rows.file), s.publish.data_name) for s in STAGES.values()
            if s.rows and s.rows.file and s.publish.data_name]


def _zip_dir(src: str, dest_zip: str, arc_root: str = "", skip: tuple[str, ...] = (),
             files: list[str] | None = None) -> None:
    with zipfile.ZipFile(dest_zip, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in tree_files(src) if files is None else files:
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
        for rel in [os.path.join(item, r) for r in tree_files(path)] if os.path.isdir(path) else []:
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


def snapshot_revision(repo_root: str, manifest: dict) -> str | None:
    """The revision whose checkout holds a compact bundle's package source, so that its
    snapshot may leave the source out: the checkout's HEAD (where the snapshot's workflow
    comes from) when it is a revision the manifest records a run at, no run came from a
    tree with uncommitted changes, and the snapshot's tracked files are HEAD's; else None
    (the snapshot keeps the source)."""
    stack, mism = manifest.get("stack") or {}, manifest.get("mismatches") or {}
    recorded = {stack.get("git_commit")} | set(mism.get("git_commit") or [])
    if manifest.get("runs_from_dirty_tree") or not recorded - {None}:
        return None

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", "-C", repo_root, *args], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None

    head = git("rev-parse", "HEAD")
    if head is None or head.returncode != 0 or head.stdout.strip() not in recorded:
        return None
    same = git("diff", "--quiet", "HEAD", "--", *SNAPSHOT)  # 0: tracked files as committed
    return head.stdout.strip() if same is not None and same.returncode == 0 else None


def _study_files(root: str, study_dir: str) -> list[str]:
    """``tree_files`` of a directory in the study, each file checked by ``study_file``; a linked
    directory is refused (it may lead anywhere)."""
    rels = []
    for d, dirs, names in os.walk(root):
        for n in dirs + [""]:  # "": the directory itself
            if os.path.islink(os.path.join(d, n).rstrip(os.sep)):
                raise StudyError(f"bundle: {os.path.join(d, n)} is a linked directory; only "
                                 "regular files go into a bundle")
        for n in names:
            rel = os.path.relpath(study_file(os.path.join(d, n), study_dir), root)
            if any(ord(c) < 32 or c == "\x7f" for c in rel) or \
                    not confined(rel.replace(os.sep, "/")):
                raise StudyError(f"bundle: {os.path.join(d, n)!r}: a file name with a "
                                 "control character (a newline would break SHA256SUMS) or "
                                 "a backslash; rename it or move it out of the study")
            rels.append(rel)
    return sorted(rels)


def _snapshot(repo_root: str, dest_zip: str, config: str | None = None,
              with_source: bool = True) -> tuple[int, str]:
    """The workflow snapshot, with the study's exact config as config/study-config.yaml
    (so the unpacked snapshot runs with --configfile config/study-config.yaml).
    ``with_source``: the package that ran too (a compact bundle leaves it out where
    ``snapshot_revision`` names the recorded revision holding it: a reference committed to
    the repository; ``tiledattn reproduce`` lays out only the workflow either way)."""
    files, how = snapshot_files(repo_root)
    source = _package_source(repo_root) if with_source else {}
    with zipfile.ZipFile(dest_zip, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in files:
            if rel != STUDY_CONFIG or config is None:
                z.write(os.path.join(repo_root, rel), rel)
        for rel in sorted(set(source) - set(files)):  # the package that ran, to install
            z.write(source[rel], rel)
        if config is not None:
            z.write(config, STUDY_CONFIG)
    return len(set(files) | set(source) | ({STUDY_CONFIG} if config else set())), how


def _package_root() -> str:
    """The directory above tiledattention/, however deep this module sits in it."""
    package_root = os.path.abspath(__file__)
    for _ in range(__name__.count(".") + 1):
        package_root = os.path.dirname(package_root)
    return package_root


def _package_source(repo_root: str) -> dict[str, str]:
    """{name in the snapshot: path} of the package that ran, from where it was imported (a
    checkout, or an installed copy: the directory above tiledattention/, however deep this
    module sits in it), and the README its pyproject names."""
    package_root = _package_root()
    source = {rel: os.path.join(package_root, rel)
              for rel in snapshot_files(package_root, SNAPSHOT_SOURCE)[0]}
    if "README.md" not in source and _plain_file(os.path.join(repo_root, "README.md")):
        source["README.md"] = os.path.join(repo_root, "README.md")  # pyproject's readme
    return source


def wheel_cli_options(wheel: str) -> dict[str, set[str]] | None:
    """The options ``tiledattn figures`` and ``aggregate`` of the bundle's own wheel take
    (its README's rebuild lines must run with it: a reference made again ships the older
    revision that measured), read from the wheel's ``--help``; None where it cannot say."""
    import re
    import sys

    out = {}
    for verb in ("figures", "aggregate"):
        run = subprocess.run(
            [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
             "from tiledattention.cli import main; main([sys.argv[2], '--help'])", wheel, verb],
            capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            return None
        out[verb] = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", run.stdout))
    return out


def _source_wheel(out_dir: str, repo_root: str, revision: str | None) -> str:
    """source/<wheel> in the bundle (its path there): the recorded revision's committed
    tree where ``revision`` names it, else the package that ran with its pyproject.toml."""
    files = {} if revision else _package_source(repo_root)
    for root in ([] if revision else [_package_root(), repo_root]):
        if _plain_file(os.path.join(root, "pyproject.toml")):
            files.setdefault("pyproject.toml", os.path.join(root, "pyproject.toml"))
    name = write_wheel(os.path.join(out_dir, SOURCE_DIR), repo_root, revision, files)
    return f"{SOURCE_DIR}/{name}"


def _is_ours(out_dir: str) -> bool:
    """A bundle this module wrote, holding nothing else (SHA256SUMS may be gone: Snakemake
    removes a rule's declared outputs before re-running it)."""
    try:
        listed = set(load_json(os.path.join(out_dir, MARKER), cap=JSON_MAX)["files"])
    except (UnsafeFileError, KeyError, TypeError):
        return False
    return set(tree_files(out_dir)) <= listed | {SUMS, MARKER}


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
    rows gzipped (with the ladder's and the shapes grids'), no figures, the tables as
    Markdown only, the workflow snapshot without the package source (``_build``).

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
    _check_tables(agg, study_dir)
    _check_out(out_dir, study_dir, repo_root, force)
    publication = dataclasses.replace(
        publication, repository=repository_url(publication.repository, repo_root))
    rows = _published_rows(study_dir)
    manifest = read_json(study_file(manifest_path, study_dir), "manifest")
    if not isinstance(manifest, dict):
        raise StudyError(f"{manifest_path}: not a manifest (expected a JSON object)")
    _check_config(manifest, config, manifest_path)
    from .measured import for_study

    publication = for_study(publication, rows + variant_rows_in(study_dir),
                            (manifest.get("gpu") or {}).get("name"))
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(os.path.abspath(out_dir))
    with Lock(os.path.join(parent, base), what="tiledattn bundle create"), exit_on_signals():
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


def needed_tables(study_dir: str) -> list[str]:
    """The tables (file stems) a study's aggregate must have written: every one, less the
    workloads stage's where the study never ran it."""
    from ..presentation.tables import NAMES
    from ..presentation.workloads_report import NAMES as WORKLOADS

    ran = os.path.isdir(os.path.join(study_dir, "workloads"))
    return [n for n in NAMES if ran or n not in WORKLOADS]


def _check_tables(agg: str, study_dir: str) -> None:
    """The aggregate's tables are all there: an aggregate stopped before them (or run with
    --rows-only) left a study that is not ready to publish. A study made before the
    workloads stage existed (a committed reference made again) has no rows for it and
    needs no tables of it."""
    needed = needed_tables(study_dir)
    missing = [n for n in needed if not os.path.isfile(os.path.join(agg, "tables", f"{n}.md"))]
    if missing:
        raise StudyError(f"bundle: {agg}/tables lacks {len(missing)} of the study's "
                         f"{len(needed)} tables ({', '.join(missing[:3])}"
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
    path = study_file(os.path.join(agg, "rows.jsonl"), study_dir)
    store = ResultStore(path)
    if store.skipped_lines:
        raise StudyError(f"bundle: {path} has {store.skipped_lines} unreadable line(s) (torn "
                         "by a killed aggregate?); run the aggregate step again")
    rows = list(store.rows.values())
    check_one_config(rows, path)
    check_rows(rows, path, store.conflicts)
    table = os.path.join(agg, "rows.csv")
    if os.path.lexists(table):
        problem = csv_disagrees(rows, read_bytes(study_file(table, study_dir), cap=ROWS_MAX))
        if problem:
            raise StudyError(f"bundle: {table} and rows.jsonl disagree ({problem}); run the "
                             "aggregate step again")
    return rows


def _copy_data(out_dir: str, study_dir: str) -> None:
    """data/ of a full bundle: the rows as Parquet, CSV and JSONL, and the stages' rows."""
    agg = os.path.join(study_dir, "aggregate")
    # Every source is checked by study_file: a link out of the study or a FIFO is refused.
    for name in ("rows.parquet", "rows.csv", "rows.jsonl", "columns.md"):
        src = os.path.join(agg, name)
        if os.path.lexists(src):
            _copy(study_file(src, study_dir), os.path.join(out_dir, "data", name))
    for rel, name in stage_rows():  # the GPU stages' own rows (their own row formats)
        src = os.path.join(study_dir, rel)
        if os.path.lexists(src):
            _copy(study_file(src, study_dir), os.path.join(out_dir, "data", name))


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
        study_file(path, study_dir)
    return "".join(json.dumps(r) + "\n" for r in load_checked(rows_dir, point=True)).encode()


def _compact_data(out_dir: str, study_dir: str) -> list[str]:
    """data/ of a compact bundle: every row file gzipped (the aggregate's rows.jsonl byte for
    byte; the ladder's and each shapes grid's shards as one file each, so that every table
    and figure rebuilds from the bundle), the tuning table, the column dictionary. Returns
    the data files written, relative to ``out_dir``."""
    agg = os.path.join(study_dir, "aggregate")
    data = os.path.join(out_dir, "data")
    srcs = [(os.path.join(agg, "rows.jsonl"), "rows.jsonl.gz")] + [
        (os.path.join(study_dir, rel), name + ".gz") for rel, name in stage_rows()]
    for src, name in srcs:
        if os.path.lexists(src):
            _gzip_to(os.path.join(data, name), read_bytes(study_file(src, study_dir), cap=ROWS_MAX))
    grids = sorted(d for d in glob.glob(os.path.join(study_dir, "shapes", "g*"))
                   if glob.glob(os.path.join(d, "rows-shard*.jsonl")))
    for name, rows_dir in [("ladder", os.path.join(study_dir, "ladder"))] + \
            [(f"shapes-{os.path.basename(g)}", g) for g in grids]:
        if glob.glob(os.path.join(rows_dir, "rows-shard*.jsonl")):
            _gzip_to(os.path.join(data, f"{name}-rows.jsonl.gz"),
                     _shard_rows(rows_dir, study_dir))
    from ...stages import STAGES

    for stage in STAGES.values():  # the stages' other files (tune's schedule table)
        for name in stage.publish.copies:
            src = os.path.join(study_dir, stage.name, name)
            if os.path.lexists(src):
                _copy(study_file(src, study_dir), os.path.join(data, name))
    columns = os.path.join(agg, "columns.md")
    if os.path.lexists(columns):
        _copy(study_file(columns, study_dir), os.path.join(data, "columns.md"))
    return ["data/" + rel for rel in tree_files(data)]


def _build(out_dir: str, study_dir: str, rows: list[dict], manifest: dict, *, config: dict,
           config_name: str, repo_root: str, publication: Publication, command: str,
           compact: bool = False) -> int:
    agg = os.path.join(study_dir, "aggregate")
    manifest_path = os.path.join(study_dir, "manifest.json")
    data_files = _compact_data(out_dir, study_dir) if compact else \
        _copy_data(out_dir, study_dir)
    # compare: tiledattn compare's table, figure; a compact bundle's figures regenerate, and
    # of its tables only the Markdown is kept (CSV and LaTeX rebuild with the figures).
    # A figure with nothing drawn stays out (the README's What did not run says why).
    from ..presentation.plotting import NOT_DRAWN

    empty = not_drawn(study_dir)
    for sub in ("tables", "compare") if compact else ("tables", "figures", "compare"):
        src_dir = os.path.join(study_dir, sub) if sub != "tables" else os.path.join(agg, sub)
        if os.path.lexists(src_dir):
            for rel in _study_files(src_dir, study_dir):
                if sub == "figures" and (rel == NOT_DRAWN or rel.rsplit(".", 1)[0] in empty):
                    continue
                if not (compact and sub == "tables" and not rel.endswith(".md")):
                    _copy(os.path.join(src_dir, rel), os.path.join(out_dir, sub, rel))
    scaling_dir = os.path.join(study_dir, "scaling")  # tiledattn scaling's table, figure
    if os.path.lexists(scaling_dir):
        for rel in _study_files(scaling_dir, study_dir):
            _copy(os.path.join(scaling_dir, rel), os.path.join(out_dir, "scaling", rel))
    from ...stages import STAGES

    for stage in (s for s in STAGES.values() if s.publish.archive):  # profile's: profiles.zip
        src, archive = os.path.join(study_dir, stage.name), stage.publish.archive
        if os.path.lexists(src):
            _zip_dir(src, os.path.join(out_dir, archive), archive.removesuffix(".zip"),
                     files=_study_files(src, study_dir))
    _copy(study_file(manifest_path, study_dir), os.path.join(out_dir, "manifest.json"))
    import yaml

    os.makedirs(os.path.join(out_dir, "config"))
    with open(os.path.join(out_dir, "config", "study-config.yaml"), "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    recorded = snapshot_revision(repo_root, manifest)
    revision = recorded if compact else None
    snap = _snapshot(repo_root, os.path.join(out_dir, "workflow-snapshot.zip"),
                     os.path.join(out_dir, STUDY_CONFIG), with_source=revision is None)
    wheel = _source_wheel(out_dir, repo_root, recorded)
    # Zenodo takes at most 100 files per record: group directories into archives until the
    # bundle fits (metadata files stay loose so Zenodo and readers see them).
    for sub in ("figures", "tables"):
        if len(tree_files(out_dir)) + 6 <= ZENODO_MAX_FILES:
            break
        if os.path.isdir(os.path.join(out_dir, sub)):
            _zip_dir(os.path.join(out_dir, sub), os.path.join(out_dir, f"{sub}.zip"), sub)
            shutil.rmtree(os.path.join(out_dir, sub))
    t4 = os.path.join(agg, "tables", "table4_ratios.md")
    table4 = ""
    if os.path.lexists(t4):
        table4 = "\n" + read_bytes(study_file(t4, study_dir), cap=JSON_MAX).decode("utf-8",
                                                                               "replace")
    from ..presentation.headline import variants_sentence
    from ..presentation.workloads_report import sentence as workloads_sentence

    variant_rows = variant_rows_in(study_dir)
    variants_line = variants_sentence(variant_rows) + workloads_sentence(
        stage_rows_in(study_dir, "workloads"))
    readme = readme_text(publication, rows, manifest, table4, f"config/{config_name}", snap,
                     variants_line, data_files if compact else None, revision, wheel=wheel,
                     present=set(tree_files(out_dir)),
                     cli=wheel_cli_options(os.path.join(out_dir, wheel)) if compact else None,
                     variant_rows=variant_rows, shape_rows=stage_rows_in(study_dir, "shapes"))
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
    write_ro_crate(out_dir, publication, tree_files(out_dir), manifest, command,
                   min((r.get("started") or "" for r in runs), default=None) or None,
                   max((r.get("finished") or "" for r in runs), default=None) or None)
    files = tree_files(out_dir)
    with open(os.path.join(out_dir, MARKER), "w") as f:
        json.dump({"format": "tiledattention-bundle/1", "files": files + [MARKER, SUMS],
                   "rows": len(rows), "source": {"wheel": wheel, "revision": recorded,
                                                 "repository": publication.repository}}, f)
    files = tree_files(out_dir)
    if len(files) + 1 > ZENODO_MAX_FILES:
        raise StudyError(f"bundle: {len(files) + 1} files exceed Zenodo's "
                         f"{ZENODO_MAX_FILES} per record")
    with open(os.path.join(out_dir, SUMS), "w") as f:
        for rel in files:
            f.write(f"{sha256(os.path.join(out_dir, rel))}  {rel}\n")
    return len(files) + 1
