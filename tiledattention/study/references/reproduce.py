"""Re-run the study a bundle records, and hold the new run against it.

``tiledattn reproduce BUNDLE --out DIR``: the bundle is verified first; DIR gets the
workflow (the bundle's ``workflow-snapshot.zip``, or with ``--source checkout`` a checkout
of the recorded revision from the recorded repository) and the bundle's exact study config
(``config/study-config.yaml``); Snakemake runs it there through the chosen profile
(``local``, ``slurm`` from the workflow, or the path of the user's own), so the jobs run
where that profile sends them and in the container image the config names. The new
study's bundle is verified, compared against the original (or ``--reference``) with
``tiledattn compare``, rebuilt with the comparison in it, and verified again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
import zlib
from dataclasses import dataclass

from ...errors import StudyError
from ...safeio import UnsafeFileError, load_json
from ..publication.archive import SNAPSHOT_SOURCE, confined
from ..publication.create import create as create_bundle
from ..publication.verify import verify as verify_bundle

CONFIG = "config/study-config.yaml"
# What a prepared --out records of its bundle, so that the same command again continues the
# re-run there (an allocation that ended mid-study) instead of refusing a non-empty directory.
MARK = ".tiledattn-reproduce.json"


@dataclass(frozen=True)
class Recorded:
    """What the bundle records of its run."""

    config: bytes  # config/study-config.yaml, byte for byte
    snapshot: bytes  # workflow-snapshot.zip
    commit: str | None
    repository: str | None
    version: str | None
    image: str | None
    gpu: str | None = None  # the GPU the bundle's study ran on (None: the CPU)


def _read_member(path: str, rel: str) -> bytes:
    if os.path.isdir(path):
        with open(os.path.join(path, rel), "rb") as f:
            return f.read()
    with zipfile.ZipFile(path) as z:
        names = {n.split("/", 1)[1] if "/" in n else n: n for n in z.namelist()}
        return z.read(names[rel])


def read_bundle(path: str) -> Recorded:
    """The recorded run of a bundle that verifies (bad input otherwise)."""
    if not os.path.exists(path):
        raise StudyError(f"{path}: no such bundle directory or zip")
    problems = verify_bundle(path)
    if problems:
        raise StudyError(f"{path}: the bundle does not verify ({len(problems)} problem(s), "
                         f"first: {problems[0]}); see tiledattn bundle verify {path}")
    try:
        manifest = json.loads(_read_member(path, "manifest.json"))
        config = _read_member(path, CONFIG)
        snapshot = _read_member(path, "workflow-snapshot.zip")
        crate = json.loads(_read_member(path, "ro-crate-metadata.json"))
    except KeyError as exc:
        raise StudyError(f"{path}: the bundle lacks {exc.args[0]} (made before tiledattn "
                         "reproduce existed?)") from None
    except FileNotFoundError as exc:
        raise StudyError(f"{path}: the bundle lacks {exc.filename}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise StudyError(f"{path}: manifest.json or ro-crate-metadata.json is not JSON "
                         f"({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(crate, dict):
        raise StudyError(f"{path}: manifest.json and ro-crate-metadata.json must be JSON "
                         "objects")
    stack, container = _part(manifest, "stack", path), _part(manifest, "container", path)
    _part(manifest, "gpu", path)
    graph = crate.get("@graph") if isinstance(crate.get("@graph"), list) else []
    workflow = next((e for e in graph if isinstance(e, dict)
                     and "ComputationalWorkflow" in _listed(e.get("@type"))), {})
    return Recorded(config, snapshot, _text(stack.get("git_commit")),
                    _text(workflow.get("codeRepository")), _text(stack.get("tiledattention")),
                    _text(container.get("image")), _text(_part(manifest, "gpu", path)
                                                         .get("name")))


def _part(manifest: dict, key: str, path: str) -> dict:
    """manifest[key] as an object ({} when absent); another type is bad input."""
    value = manifest.get(key)
    if value is not None and not isinstance(value, dict):
        raise StudyError(f"{path}: manifest.json's {key} is not an object ({value!r:.60})")
    return value or {}


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _fresh(out: str) -> None:
    if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise StudyError(f"--out {out}: exists and is neither empty nor a re-run of this "
                         "bundle that this command laid out; name a new one (nothing there "
                         "is replaced)")
    os.makedirs(out, exist_ok=True)


# A workflow snapshot holds source and configs: far below these.
SNAPSHOT_MEMBER_MAX = 64 << 20
SNAPSHOT_TOTAL_MAX = 512 << 20


def _snapshot_zip(data: bytes) -> zipfile.ZipFile:
    import io

    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise StudyError(f"workflow-snapshot.zip: not a readable zip ({exc})") from None


def _unpack_snapshot(data: bytes, out: str) -> int:
    import shutil

    with _snapshot_zip(data) as z:
        # The package's source is the README's to install: the workflow laid out here runs
        # the installed tiledattention (Snakemake puts the workflow directory first on the
        # path: a copy here would stand in for it).
        infos = [i for i in z.infolist() if not i.is_dir()
                 and i.filename.split("/")[0] not in SNAPSHOT_SOURCE]
        names = [i.filename for i in infos]
        bad = [n for n in names if not confined(n)]
        if bad:
            raise StudyError(f"workflow-snapshot.zip: unsafe member name {bad[0]!r}")
        big = [i for i in infos if i.file_size > SNAPSHOT_MEMBER_MAX]
        if big or sum(i.file_size for i in infos) > SNAPSHOT_TOTAL_MAX:
            what = f"{big[0].filename} holds {big[0].file_size} bytes" if big else \
                f"{sum(i.file_size for i in infos)} bytes in all"
            raise StudyError(f"workflow-snapshot.zip: {what}, over the limit of "
                             f"{SNAPSHOT_MEMBER_MAX} a file and {SNAPSHOT_TOTAL_MAX} in all "
                             "(a workflow is source and configs); not unpacked")
        for n in names:
            dest = os.path.join(out, n)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            try:  # in blocks: read() stops at the declared size, checked above
                with z.open(n) as src, open(dest, "wb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
                raise StudyError(f"workflow-snapshot.zip: {n} unreadable ({exc})") from None
            # The snapshot's own times: a workflow script laid out now would be newer than
            # every output of a re-run continued here, and Snakemake reruns a script's
            # outputs when they are older than it (whatever --rerun-triggers says).
            t = time.mktime((*z.getinfo(n).date_time, 0, 0, -1))
            os.utime(dest, (t, t))
    return len(names)


def _checkout(rec: Recorded, out: str) -> None:
    if not rec.repository:
        raise StudyError("--source checkout: the bundle records no repository URL (it is set "
                         "by publication.repository in the study config when the bundle is "
                         "made); use --source snapshot, the bundle's own copy of the workflow")
    if not rec.commit:
        raise StudyError("--source checkout: the bundle records no revision to check out; "
                         "use --source snapshot, the bundle's own copy of the workflow")

    def git(*args: str) -> None:
        run = subprocess.run(["git", *args], capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise StudyError(f"--source checkout: git {args[0]} failed: {last}; use "
                             "--source snapshot (the bundle's own copy of the workflow)")

    git("clone", "--quiet", "--no-checkout", rec.repository, out)
    git("-C", out, "checkout", "--quiet", rec.commit)


def _profile(profile: str, out: str) -> str:
    """A profile name of the workflow's (profiles/<name>) or the path of the user's own."""
    if os.sep not in profile and os.path.isdir(os.path.join(out, "profiles", profile)):
        return os.path.join("profiles", profile)
    path = os.path.abspath(profile)
    if not os.path.isfile(os.path.join(path, "config.yaml")):
        have = sorted(os.listdir(os.path.join(out, "profiles"))) \
            if os.path.isdir(os.path.join(out, "profiles")) else []
        raise StudyError(f"--profile {profile}: neither a profile of the workflow "
                         f"({', '.join(have) or 'none'}) nor a directory with a config.yaml")
    return path


def _profile_in_snapshot(profile: str, snapshot: bytes) -> None:
    with _snapshot_zip(snapshot) as z:
        have = sorted({n.split("/")[1] for n in z.namelist()
                       if n.startswith("profiles/") and n.endswith("/config.yaml")})
    if profile in have and os.sep not in profile:
        return
    if not os.path.isfile(os.path.join(profile, "config.yaml")):
        raise StudyError(f"--profile {profile}: neither a profile of the workflow "
                         f"({', '.join(have) or 'none'}) nor a directory with a config.yaml")


def _results_dir(config: dict) -> str:
    d = config.get("results_dir") if isinstance(config, dict) else None
    if not isinstance(d, str) or not d:
        raise StudyError(f"{CONFIG}: no results_dir")
    if os.path.isabs(d) or ".." in d.split("/") or d.startswith("~") or "$" in d:
        raise StudyError(f"{CONFIG}: results_dir {d!r} is outside the workflow directory; "
                         "reproduce keeps the config as it is, so it would write there")
    return d


def _mark(rec: Recorded, source: str) -> dict:
    return {"config_sha256": hashlib.sha256(rec.config).hexdigest(),
            "snapshot_sha256": hashlib.sha256(rec.snapshot).hexdigest(),
            "commit": rec.commit, "source": source}


def _prepared_from(out: str, rec: Recorded, source: str) -> bool:
    """Whether OUT is a re-run of this bundle laid out earlier (then it continues there)."""
    try:
        mark = load_json(os.path.join(out, MARK), what="re-run marker")
    except UnsafeFileError:  # none, or not ours: the directory is not a prepared re-run
        return False
    if mark != _mark(rec, source):
        raise StudyError(f"--out {out}: holds the re-run of another bundle (or of this one "
                         f"from another --source); name a new directory")
    return True


def prepare(bundle_path: str, out: str, *, source: str = "snapshot",
            profile: str = "local", check=None) -> tuple[Recorded, str, str, bool]:
    """DIR with the workflow and the study config in place: (recorded, profile, results,
    continued), continued when DIR already held this bundle's re-run."""
    import yaml

    from .compare import check_out

    check_out(out)  # never inside a bundle: its files are checksummed
    rec = read_bundle(bundle_path)
    if check is not None:  # the caller's refusal, before anything is written
        check(rec)
    try:
        results = _results_dir(yaml.safe_load(rec.config))
    except yaml.YAMLError as exc:
        raise StudyError(f"{bundle_path}: {CONFIG} is not YAML ({' '.join(str(exc).split())})"
                         ) from None
    if source == "snapshot":  # a bad --profile fails before anything is written
        _profile_in_snapshot(profile, rec.snapshot)
    if os.path.isdir(out) and _prepared_from(out, rec, source):
        return rec, _profile(profile, out), results, True
    if source == "checkout":
        if os.path.lexists(out) and (not os.path.isdir(out) or os.listdir(out)):
            _fresh(out)  # raises: git clone needs it new or empty
        _checkout(rec, out)
    else:
        _fresh(out)
        _unpack_snapshot(rec.snapshot, out)
    os.makedirs(os.path.join(out, "config"), exist_ok=True)
    with open(os.path.join(out, CONFIG), "wb") as f:
        f.write(rec.config)  # the exact config, byte for byte (the snapshot lacks it)
    with open(os.path.join(out, MARK), "w", encoding="utf-8") as f:
        json.dump(_mark(rec, source), f)
    return rec, _profile(profile, out), results, False


def _say(text: str) -> None:
    print(f"reproduce: {text}", file=sys.stderr, flush=True)


def _check_gpu(rec: Recorded, profile: str, dry_run: bool, without_gpu: bool) -> None:
    """A GPU study re-run by the local profile on a machine without a CUDA GPU would run
    for hours on the CPU and compare nothing alike: refused up front, unless asked for."""
    if rec.gpu is None or dry_run or without_gpu or profile != "local":
        return
    try:
        import torch

        have = torch.cuda.is_available()
    except ImportError:
        have = False
    if not have:
        raise StudyError(f"the bundle's study ran on {rec.gpu} and this machine has no CUDA "
                         "GPU: the local profile would measure it on the CPU for hours; run it "
                         "where its GPU is (or --profile slurm), or pass --without-gpu")


def reproduce(bundle_path: str, out: str, *, source: str = "snapshot", profile: str = "local",
              reference: str | None = None, tolerance: list[str] | None = None,
              snakemake_args: tuple[str, ...] = (), without_gpu: bool = False) -> int:
    """Re-run, verify, compare, re-bundle; 0 when the new run is within tolerance, 1 when
    a step failed or compare found a regression (bad input raises StudyError)."""
    from ... import __version__
    from ..references import compare as _compare

    dry_run = any(a in ("-n", "--dry-run", "--dryrun") for a in snakemake_args)
    tol = _compare.parse_tolerance(tolerance)  # bad input fails before anything runs
    if reference:
        _compare.load_reference(reference, tol)
    rec, prof, results, continued = prepare(
        bundle_path, out, source=source, profile=profile,
        check=lambda rec: _check_gpu(rec, profile, dry_run, without_gpu))
    if continued:
        _say(f"{out} holds this bundle's re-run already: continuing it (Snakemake reruns only "
             "what is missing; a GPU step resumes from its finished rows)")
    _say(f"workflow from the bundle's {'snapshot' if source == 'snapshot' else 'checkout of '}"
         f"{'' if source == 'snapshot' else f'{rec.repository} at {rec.commit}'} in {out}; "
         f"recorded revision {rec.commit or '—'}, tiledattention {rec.version or '—'} "
         f"(installed: {__version__}); image {rec.image or 'none'}; profile {prof}")
    if rec.version and rec.version != __version__:
        _say(f"note: the bundle ran tiledattention {rec.version}, this is {__version__}: "
             "install the recorded revision (the bundle README's install step)")
    # The bundle's workflow and config do not change under a re-run: only a missing or older
    # output reruns a step, so a re-run continued elsewhere (another node, a lost .snakemake
    # with its records) does not start over.
    cmd = [sys.executable, "-m", "snakemake", "--profile", prof, "--configfile", CONFIG,
           "--rerun-triggers", "mtime", *snakemake_args]
    _say("running " + " ".join(cmd[2:]))
    if subprocess.run(cmd, cwd=out).returncode != 0:
        _say(f"snakemake failed (its log: {os.path.join(out, '.snakemake', 'log')})")
        return 1
    if dry_run:
        return 0
    study = os.path.join(out, results)
    new_bundle = os.path.join(study, "bundle")
    problems = verify_bundle(new_bundle)
    if problems:
        for p in problems:
            _say(f"new bundle: {p}")
        return 1
    reference = reference or os.path.abspath(bundle_path)
    checks, paths = _compare.run(study, reference,
                                 tolerance=tolerance, out=os.path.join(study, "compare"))
    _rebundle(study, out)
    problems = verify_bundle(new_bundle)
    for p in problems:
        _say(f"new bundle with the comparison: {p}")
    _say(f"new bundle {new_bundle} (and .zip) {'FAILED' if problems else 'verified'}; "
         f"compare against {reference}: {_compare.verdict_line(checks)} "
         f"({paths[1]})")
    return 1 if problems or _compare.failed(checks) else 0


def _rebundle(study: str, workdir: str) -> None:
    """The study's bundle again, now holding compare/ (as the workflow's bundle rule makes
    it: the snapshot from the workflow directory, the publication from the config)."""
    from ... import __version__
    from ...yamlio import load_yaml
    from ..publication.metadata import Publication

    config = load_yaml(os.path.join(study, "plan", "study-config.yaml"))  # the rule's
    pub = Publication.from_dict(config.get("publication"), __version__)
    create_bundle(study, os.path.join(study, "bundle"), config=config,
                   config_name=os.path.basename(CONFIG), repo_root=workdir, publication=pub,
                   command="tiledattn reproduce")
