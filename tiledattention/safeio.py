"""The one way a command reads and writes the files it is handed.

Reading: only a regular file, opened without blocking (a FIFO would wait for a writer
forever) and capped in size before a byte is parsed (``/dev/zero`` never ends); JSON that
nests deeper than Python's recursion limit is one error, not a RecursionError.
Writing: into a temporary file beside the target, fsynced, then renamed over it, so a
killed command leaves the old file or the new one, never a truncated one a later step
trusts.

    from tiledattention.safeio import atomic_write, load_json, read_bytes
    data = load_json("results/schedule-table.json", cap=JSON_MAX)   # or UnsafeFileError
    with atomic_write("out/rows.csv") as f:
        f.write(text)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile

from .errors import TiledAttentionError

JSON_MAX = 64 << 20  # a metadata file, manifest or tuning table: far below this
ROWS_MAX = 1 << 30  # a results file of rows: a full study is a few MiB


class UnsafeFileError(TiledAttentionError, ValueError):
    """A file to read is missing, not a regular file, too large or not parseable."""


def read_bytes(path: str, *, cap: int, what: str = "") -> bytes:
    """The bytes of the regular file at ``path``, at most ``cap`` of them (else refused)."""
    name = f"{what} {path}".strip()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except IsADirectoryError:
        raise UnsafeFileError(f"{name}: is a directory, not a file") from None
    except OSError as exc:
        raise UnsafeFileError(f"{name}: cannot read it ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a special file (FIFO, device or " \
            "socket)"
        raise UnsafeFileError(f"{name}: is {kind}, not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise UnsafeFileError(f"{name}: larger than the {cap} bytes allowed")
    return data


def parse_json(data: bytes | str, where: str):
    """JSON data, or one UnsafeFileError naming ``where`` (bad text, too deep)."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise UnsafeFileError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} "
                              f"column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    except RecursionError:
        raise UnsafeFileError(f"{where}: JSON nested too deeply") from None


def load_json(path: str, *, cap: int = JSON_MAX, what: str = ""):
    """The JSON data of the regular file at ``path`` (capped), or one UnsafeFileError."""
    return parse_json(read_bytes(path, cap=cap, what=what), f"{what} {path}".strip())


def read_row_objects(path: str, what: str, keys: tuple[str, ...]) -> list[dict]:
    """The JSON rows of a stage's rows file (bounded, regular file only): every line an
    object whose ``keys`` are strings, else one StudyError naming the file and line."""
    from .errors import StudyError

    rows = []
    for n, line in enumerate(read_bytes(path, cap=ROWS_MAX, what=what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"{path} line {n}")
        except UnsafeFileError as exc:
            raise StudyError(str(exc)) from None
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in keys):
            raise StudyError(f"{path} line {n}: not a {what[:-1]} (an object with "
                             f"{', '.join(keys)})")
        rows.append(row)
    return rows


def regular_file(path: str) -> bool:
    """A regular file itself (not a link to one, not a FIFO or device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", **open_kwargs):
    """A file object whose content replaces ``path`` only when the block ends normally
    (flushed to disk first, so a crash after the rename leaves the whole file)."""
    with atomic_path(path) as tmp, open(tmp, mode, **open_kwargs) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def _file_mode() -> int:
    """The mode ``open(path, "w")`` would have given (mkstemp's is 0600)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def sha256(path: str) -> str:
    """The file's SHA-256, hex, read in 1 MiB blocks (bundles hold files of gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_text(path: str, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def write_json(path: str, data, **dump_kwargs) -> None:
    with atomic_write(path) as f:
        json.dump(data, f, **dump_kwargs)


@contextlib.contextmanager
def atomic_path(path: str):
    """A temporary path beside ``path`` for writers that want a file name (pandas,
    matplotlib); renamed over ``path`` when the block ends normally."""
    head = os.path.dirname(os.path.abspath(path))
    base, ext = os.path.splitext(os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{ext}", dir=head)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
