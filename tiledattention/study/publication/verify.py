"""A bundle's verification: ``verify`` recomputes every checksum and validates the
metadata; every problem is named. The bundle may come from anyone (archive.py reads it).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import tempfile
import zipfile

from ...errors import StudyError
from ...safeio import (
    ROWS_MAX,
    UnsafeFileError,
    parse_json,
)
from .archive import (
    MARKER,
    MAX_FILE_BYTES,
    MAX_MEMBERS,
    MAX_META_BYTES,
    SUMS,
    ZENODO_MAX_FILES,
    DirView,
    ZipView,
    confined,
    csv_disagrees,
    exit_on_signals,
    json_of,
    jsonl_of,
    read_capped,
)
from .metadata import (
    check_ro_crate,
    validate_cff,
    validate_zenodo,
)
from .prose import rows_summary
from .source import SOURCE_DIR, WHEEL_GLOB


def verify(path: str, partial: dict | None = None) -> list[str]:
    """Problems found in the bundle at ``path`` (a directory or its zip); empty: verified.

    The bundle may come from anyone: every path in SHA256SUMS must name a regular file
    inside it, and a zip is read in place under size, count and ratio limits; only the
    three metadata files are written out (to a scratch dir removed even on SIGTERM)."""
    if os.path.isdir(path):
        return _verify(DirView(path), scratch=None, root=path, partial=partial)
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        return [f"{path}: not a bundle directory or zip"]
    try:
        with zipfile.ZipFile(path) as z:
            view = ZipView(z)
            with _scratch() as tmp:
                return _verify(view, scratch=tmp, root=None, partial=partial)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        return [f"{path}: unreadable zip ({exc})"]
    except StudyError as exc:
        return [f"{path}: {exc}"]


def _check_sums(view, partial: dict | None = None
                ) -> tuple[list[str], dict[str, str] | None, set[str]]:
    """SHA256SUMS against the files it lists: (problems, {file: digest} it lists (None: no
    usable SHA256SUMS), the files whose content is not the published one)."""
    problems = list(view.problems)
    if SUMS not in view.names:
        return problems + [f"{SUMS} is missing"], None, set()
    listed: dict[str, str] = {}
    try:
        text = read_capped(view, SUMS, MAX_META_BYTES).decode("utf-8")
    except (StudyError, UnicodeDecodeError) as exc:
        return problems + [f"{SUMS}: unreadable ({exc})"], None, set()
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split("  ", 1)
        if len(parts) != 2 or len(parts[0]) != 64 or \
                not all(c in "0123456789abcdef" for c in parts[0]):
            problems.append(f"{SUMS} line {n} is malformed")
        elif not confined(parts[1]):
            problems.append(f"{SUMS} line {n}: {parts[1]!r} is not a path inside the bundle")
        elif parts[1] in listed:
            problems.append(f"{SUMS} line {n}: {parts[1]} is listed twice")
        else:
            listed[parts[1]] = parts[0]
        if n > MAX_MEMBERS:
            return problems + [f"{SUMS}: more than {MAX_MEMBERS} lines"], None, set()
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
    return problems, listed, changed


def checksums(path: str) -> list[str]:
    """The checksum problems alone of the bundle at ``path`` (a directory or its zip):
    files SHA256SUMS lists that are missing or changed. What a reader of a bundle's rows
    (tiledattn compare) checks first: rows edited after the bundle was made are refused."""
    if os.path.isdir(path):
        return _check_sums(DirView(path))[0]
    try:
        with zipfile.ZipFile(path) as z:
            return _check_sums(ZipView(z))[0]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError,
            OSError) as exc:
        return [f"{path}: unreadable zip ({exc})"]
    except StudyError as exc:
        return [f"{path}: {exc}"]


def _verify(view, *, scratch: str | None, root: str | None,
            partial: dict | None = None) -> list[str]:
    """``partial`` (a dict): a committed summary of a bundle, not the bundle: files SHA256SUMS
    lists that are absent go to partial["withheld"], files it does not list to
    partial["extra"]; every file present that it lists must still match."""
    problems, listed, changed = _check_sums(view, partial)
    if listed is None:
        return problems
    present = view.names - {SUMS}
    if partial is not None:
        partial["extra"] = sorted(present - set(listed))
    else:
        problems += [f"not in {SUMS}: {rel}" for rel in sorted(present - set(listed))]
    if len(present) + 1 > ZENODO_MAX_FILES:
        problems.append(f"{len(present) + 1} files exceed Zenodo's {ZENODO_MAX_FILES}")
    problems += _check_listing(view, listed)
    if partial is None:
        problems += _check_source(view, listed)
    problems += _check_rows(view, changed)
    meta = {}
    for name in (".zenodo.json", "CITATION.cff", "ro-crate-metadata.json"):
        if name in view.names:  # regular files only: a FIFO is a finding, never opened
            try:
                meta[name] = read_capped(view, name, MAX_META_BYTES)
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
        files = json_of(view, MARKER).get("files")
    except (StudyError, AttributeError) as exc:
        return [f"{MARKER}: unreadable ({exc})"]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return [f"{MARKER}: 'files' is not a list of names"]
    return [f"deleted from {SUMS}: {rel} (the bundle lists it)" for rel in files
            if rel not in (SUMS, MARKER) and rel not in listed]


def _check_source(view, listed: dict[str, str]) -> list[str]:
    """A publication bundle carries the package that ran (source/, a wheel; create.py):
    without it the bundle does not re-run on its own."""
    wheels = [rel for rel in listed if rel.startswith(f"{SOURCE_DIR}/")
              and fnmatch.fnmatchcase(rel[len(SOURCE_DIR) + 1:], WHEEL_GLOB)]
    if not wheels:
        return [f"missing: the package source ({SOURCE_DIR}/{WHEEL_GLOB}, a wheel of the "
                "revision that ran, listed in SHA256SUMS): a publication bundle carries it so "
                "that it re-runs on its own; make the bundle again with tiledattn bundle "
                "create"]
    named = None
    if MARKER in view.names:
        try:
            named = (json_of(view, MARKER).get("source") or {}).get("wheel")
        except (StudyError, AttributeError):
            named = None  # _check_listing names an unreadable marker
    if isinstance(named, str) and named not in wheels:
        return [f"missing: {named} (the package source the bundle lists in {MARKER})"]
    return []


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
            jsonl_of(view, rel)
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
        rows, conflicts = jsonl_of(view, rel)
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
            why = csv_disagrees(rows, read_capped(view, "data/rows.csv", ROWS_MAX))
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
            text = read_capped(view, "README.md", MAX_META_BYTES).decode("utf-8", "replace")
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
            count = json_of(view, MARKER).get("rows")
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
        manifest = json_of(view, "manifest.json")
    except StudyError as exc:
        return [str(exc)]
    if not isinstance(manifest, dict):
        return ["manifest.json: not a JSON object"]
    problems = []
    want = manifest.get("study_config_hash")
    cfg = "config/study-config.yaml"
    if want is not None:
        try:
            got = config_hash(parse_yaml(read_capped(view, cfg, MAX_META_BYTES), cfg)) \
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
def _scratch():
    """A temporary directory removed on return, on exceptions, on Ctrl-C and on SIGTERM or
    SIGHUP."""
    with exit_on_signals():
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
