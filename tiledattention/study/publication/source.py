"""The package source a publication bundle carries: a wheel of the revision that ran.

A reader holding only the bundle installs tiledattention from ``source/`` (no clone, no
package index: the project has no release there), so the bundle alone re-runs. The wheel
is built offline from the recorded revision's committed tree (``git archive``), its
version carrying that revision as a PEP 440 local label (``0.1.0+g<commit>``), or, where
no recorded revision's checkout is at hand, from the package that ran (its version as is).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

from ...errors import StudyError

SOURCE_DIR = "source"  # in the bundle
WHEEL_GLOB = "tiledattention-*.whl"
# The version's local label naming the revision the wheel was built from.
REVISION_LABEL = re.compile(r"\+g([0-9a-f]{7,40})$")
_VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"\s*$', re.M)
# Built wheels by what they were built from: one study's tests build many bundles of it.
_BUILT: dict[tuple, tuple[str, bytes]] = {}


def wheel_revision(name: str) -> str | None:
    """The revision a wheel's file name records (``…-0.1.0+g<commit>-py3-none-any.whl``)."""
    version = os.path.basename(name).split("-")[1] if name.count("-") >= 2 else ""
    found = REVISION_LABEL.search(version)
    return found.group(1) if found else None


def write_wheel(dest_dir: str, repo_root: str, revision: str | None,
                files: dict[str, str]) -> str:
    """Build the wheel into ``dest_dir`` (created); returns its file name. ``revision``: a
    commit of the checkout ``repo_root`` (the recorded one), built from its committed tree;
    else ``files`` ({name in the source tree: path}: the package that ran, with
    pyproject.toml and its README)."""
    key = ("rev", os.path.realpath(repo_root), revision) if revision else \
        ("files", tuple(sorted((rel, _stamp(p)) for rel, p in files.items())))
    if key not in _BUILT:
        _BUILT[key] = _build(repo_root, revision, files)
    name, data = _BUILT[key]
    os.makedirs(dest_dir, exist_ok=True)
    with open(os.path.join(dest_dir, name), "wb") as f:
        f.write(data)
    return name


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _build(repo_root: str, revision: str | None,
           files: dict[str, str]) -> tuple[str, bytes]:
    """(the wheel's file name, its bytes), built in a scratch directory."""
    tmp = tempfile.mkdtemp(prefix="tiledattn-wheel-")
    try:
        src = os.path.join(tmp, "src")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        if revision:
            _export(repo_root, revision, src, tmp)
            _label_version(os.path.join(src, "pyproject.toml"), revision)
            env["SOURCE_DATE_EPOCH"] = _commit_time(repo_root, revision)  # the same bytes
        else:
            for rel, path in files.items():
                os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
                shutil.copyfile(path, os.path.join(src, rel))
        if not os.path.isfile(os.path.join(src, "pyproject.toml")):
            raise StudyError("bundle: the package source has no pyproject.toml; build the "
                             "bundle from a checkout of tiledattention")
        out = os.path.join(tmp, "dist")
        try:
            run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                                  "--no-build-isolation", "--no-index", "-q", src, "-w", out],
                                 capture_output=True, text=True, timeout=600, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StudyError(f"bundle: building the package's wheel failed ({exc})") from None
        built = glob.glob(os.path.join(out, WHEEL_GLOB))
        if run.returncode != 0 or len(built) != 1:
            last = (run.stderr.strip().splitlines() or ["no output"])[-1]
            raise StudyError(f"bundle: building the package's wheel (pip wheel, offline) "
                             f"failed: {last}; the workflow extra's setuptools>=77 must be "
                             "installed (pip install 'setuptools>=77')")
        with open(built[0], "rb") as f:
            return os.path.basename(built[0]), f.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _git(repo_root: str, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", repo_root, *args], capture_output=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StudyError(f"bundle: git {args[0]} in {repo_root} failed ({exc})") from None


def _export(repo_root: str, revision: str, src: str, tmp: str) -> None:
    """The committed tree of ``revision`` (not the working tree: the recorded revision)."""
    archive = os.path.join(tmp, "tree.zip")
    run = _git(repo_root, "archive", "--format=zip", "-o", archive, revision)
    if run.returncode != 0:
        raise StudyError(f"bundle: git archive {revision} in {repo_root} failed: "
                         f"{run.stderr.decode(errors='replace').strip()[:200]}")
    with zipfile.ZipFile(archive) as z:
        z.extractall(src)  # git's own archive of a commit: names inside it


def _commit_time(repo_root: str, revision: str) -> str:
    run = _git(repo_root, "log", "-1", "--format=%ct", revision)
    out = run.stdout.decode().strip()
    return out if run.returncode == 0 and out.isdigit() else "315532800"  # 1980: zip's floor


def _label_version(pyproject: str, revision: str) -> None:
    """pyproject's static version with the revision as its local label."""
    if not os.path.isfile(pyproject):
        return
    with open(pyproject, encoding="utf-8") as f:
        text = f.read()
    found = _VERSION_LINE.search(text)
    if found is None:
        raise StudyError("bundle: the recorded revision's pyproject.toml has no static "
                         "version line; the wheel could not record its revision")
    base = found.group(1).split("+")[0]
    text = text[:found.start(1)] + f"{base}+g{revision}" + text[found.end(1):]
    with open(pyproject, "w", encoding="utf-8") as f:
        f.write(text)
