"""What a study bundle holds and how its files are read: the format's names and limits, the
study files that may go into a bundle, and a bundle read back (a directory or a zip read in
place, every member under size, count and ratio limits). ``create`` and ``verify`` share it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import stat
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
    regular_file,
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
# the bundle README installs from it; the README's pages (docs/) with it, so its links
# resolve. tiledattn reproduce lays out only the workflow.
SNAPSHOT_SOURCE = ("tiledattention", "README.md", "docs")
SNAPSHOT_SHIPPED = (
    "Snakefile", "pyproject.toml", "README.md", "config/README.md", "config/config.yaml",
    "config/reference.yaml", "config/scaling.yaml",
    "config/smoke.yaml", "config/bench-backward.yaml", "config/bench-decode.yaml",
    "config/bench-cudnn-fe.yaml", "config/bench-h100-small.yaml", "config/bench-sdpa.yaml",
    "config/bench-smoke.yaml",
    "config/shapes-fp8.yaml", "config/shapes-head-dims.yaml", "config/shapes-heads.yaml",
    "config/shapes-models.yaml",
    "config/shapes-seqs.yaml",
    "config/variants-h100.yaml",
    "profiles/README.md", "profiles/local/config.yaml", "profiles/slurm/README.md",
    "profiles/slurm/config.yaml")
SNAPSHOT_CODE = ("workflow", "containers", "tiledattention", "docs")
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


def tree_files(root: str) -> list[str]:
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return sorted(out)


def study_file(path: str, study_dir: str) -> str:
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


def read_json(path: str, what: str):
    try:
        return load_json(path, cap=JSON_MAX, what=what)
    except UnsafeFileError as exc:
        raise StudyError(str(exc)) from None


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


def csv_disagrees(rows: list[dict], data: bytes) -> str | None:
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


def confined(rel: str) -> bool:
    """A relative path that stays inside the bundle: no absolute, no '..', no oddities."""
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and "\\" not in rel and "\0" not in rel \
        and all(p not in ("", ".", "..") for p in parts) and ":" not in parts[0]


class DirView:
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


class ZipView:
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
            if not confined(i.filename.rstrip("/")):
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


def read_capped(view, rel: str, cap: int) -> bytes:
    with view.open(rel) as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise StudyError(f"{rel}: larger than the {cap} bytes allowed")
    return data


def read_gz_capped(view, rel: str, cap: int) -> bytes:
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


def json_of(view, rel: str, cap: int = MAX_META_BYTES):
    try:
        return parse_json(read_capped(view, rel, cap), rel)
    except UnsafeFileError as exc:
        raise StudyError(str(exc)) from None


def jsonl_of(view, rel: str) -> tuple[list[dict], list]:
    """(rows, conflicting (point, method) pairs) of a rows file of the bundle, plain or
    gzipped (decompressed under ROWS_MAX); StudyError names the first thing wrong."""
    data = read_gz_capped(view, rel, ROWS_MAX) if rel.endswith(".gz") else \
        read_capped(view, rel, ROWS_MAX)
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


@contextlib.contextmanager
def exit_on_signals():
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
