"""Make a committed reference (a compact bundle) again with today's ``bundle create``.

The studies the references came from are not kept; their bundles hold what ``bundle create
--compact`` reads: the rows (gzipped), the Markdown tables, the manifest, the exact config.
``rebundle`` lays those out as a study directory, takes the source from a clone of this
repository at the recorded revision (so the workflow snapshot and the bundle's wheel are
that revision's), makes the compact bundle again and replaces the reference only when
every measurement, table, manifest and config came through byte for byte::

    python -m tiledattention.study.references.rebundle results/reference/h100 results/reference/h200
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from ...errors import StudyError
from ..publication.archive import MARKER, SUMS, tree_files

# What must come through unchanged: the measurements and what was published of them.
KEPT = ("data/", "tables/", "compare/", "scaling/", "manifest.json", "config/")


def _sums(bundle: str) -> dict[str, str]:
    with open(os.path.join(bundle, SUMS), encoding="utf-8") as f:
        return {rel: digest for digest, rel in (ln.split("  ", 1) for ln in f.read().splitlines())}


def _gunzip(src: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with gzip.open(src, "rb") as g, open(dest, "wb") as f:
        shutil.copyfileobj(g, f)


def study_of(bundle: str, study: str) -> str:
    """The study directory ``bundle create --compact`` reads, laid out from a compact
    ``bundle`` in ``study``; returns the config file's path."""
    from ...stages import STAGES

    data = os.path.join(bundle, "data")
    agg = os.path.join(study, "aggregate")
    _gunzip(os.path.join(data, "rows.jsonl.gz"), os.path.join(agg, "rows.jsonl"))
    shutil.copytree(os.path.join(bundle, "tables"), os.path.join(agg, "tables"))
    for name in os.listdir(data):
        src = os.path.join(data, name)
        if name == "ladder-rows.jsonl.gz":
            _gunzip(src, os.path.join(study, "ladder", "rows-shard0of1.jsonl"))
        elif name.startswith("shapes-") and name.endswith("-rows.jsonl.gz"):
            grid = name[len("shapes-"):-len("-rows.jsonl.gz")]
            _gunzip(src, os.path.join(study, "shapes", grid, "rows-shard0of1.jsonl"))
        elif name == "columns.md":
            shutil.copyfile(src, os.path.join(agg, "columns.md"))
    for stage in STAGES.values():
        data_name, publish = stage.publish.data_name, stage.publish
        if data_name and os.path.isfile(os.path.join(data, data_name + ".gz")):
            _gunzip(os.path.join(data, data_name + ".gz"),
                    os.path.join(study, stage.name, stage.rows.file))
        for name in publish.copies:
            if os.path.isfile(os.path.join(data, name)):
                os.makedirs(os.path.join(study, stage.name), exist_ok=True)
                shutil.copyfile(os.path.join(data, name), os.path.join(study, stage.name, name))
        if publish.archive and os.path.isfile(os.path.join(bundle, publish.archive)):
            with zipfile.ZipFile(os.path.join(bundle, publish.archive)) as z:
                z.extractall(study)  # its top directory is the stage's
    for sub in ("compare", "scaling"):
        if os.path.isdir(os.path.join(bundle, sub)):
            shutil.copytree(os.path.join(bundle, sub), os.path.join(study, sub))
    shutil.copyfile(os.path.join(bundle, "manifest.json"), os.path.join(study, "manifest.json"))
    config = os.path.join(study, "plan", "study-config.yaml")
    os.makedirs(os.path.dirname(config))
    shutil.copyfile(os.path.join(bundle, "config", "study-config.yaml"), config)
    tables_added_since(study)
    return config


def tables_added_since(study: str) -> list[str]:
    """The tables a study needs that its reference predates (``headline_shapes`` was added
    after the references were made), written into its aggregate from its rows by today's
    code, as ``tiledattn aggregate`` would: the benchmark's rows and the stages' own
    (model, variants, workloads). The tables the reference published stay as they were,
    byte for byte. Returns the stems written."""
    from ...stages import STAGES
    from ..presentation.tables import write_all
    from ..publication.create import needed_tables
    from ..publication.prose import stage_rows_in

    tables = os.path.join(study, "aggregate", "tables")
    missing = [n for n in needed_tables(study)
               if not os.path.isfile(os.path.join(tables, f"{n}.md"))]
    if not missing:
        return []
    with open(os.path.join(study, "aggregate", "rows.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(study, "manifest.json"), encoding="utf-8") as f:
        gpu = (json.load(f).get("gpu") or {}).get("name")
    stage_rows = {s.name: stage_rows_in(study, s.name) for s in STAGES.values()
                  if s.rows and s.rows.file}
    with tempfile.TemporaryDirectory(prefix="tiledattn-tables-") as tmp:
        write_all(rows, tmp, stage_rows=stage_rows, gpu=gpu)
        for n in missing:
            shutil.copyfile(os.path.join(tmp, f"{n}.md"), os.path.join(tables, f"{n}.md"))
    return missing


def recorded_revision(bundle: str, repo: str) -> str:
    """The revision the reference's source is: the one its marker records, else the newest
    revision its manifest records (the runs' latest code: a study's later stage re-run)."""
    with open(os.path.join(bundle, MARKER), encoding="utf-8") as f:
        named = (json.load(f).get("source") or {}).get("revision")
    if named:
        return named
    with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    revs = {(manifest.get("stack") or {}).get("git_commit")} | set(
        (manifest.get("mismatches") or {}).get("git_commit") or [])
    revs.discard(None)
    if not revs:
        raise StudyError(f"{bundle}: its manifest records no revision to take the source from")
    run = _git("-C", repo, "rev-list", "--no-walk", "--date-order", *sorted(revs))
    if run.returncode != 0:
        raise StudyError(f"{bundle}: the recorded revisions {sorted(revs)} are not all in "
                         f"{repo}'s history ({run.stderr.strip()[:200]})")
    return run.stdout.split()[0]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, timeout=600)


def _checkout(repo: str, revision: str, dest: str) -> None:
    """A clone of ``repo`` at ``revision`` (the repository's own checkout is never touched)
    whose remote is ``repo``'s own (a bundle records it), never the local path cloned."""
    origin = _git("-C", repo, "remote", "get-url", "origin")
    for args in (["clone", "--quiet", "--shared", "--no-checkout", repo, dest],
                 ["-C", dest, "checkout", "--quiet", "--detach", revision],
                 ["-C", dest, "remote", "remove", "origin"],
                 *([["-C", dest, "remote", "add", "origin", origin.stdout.strip()]]
                   if origin.returncode == 0 and origin.stdout.strip() else [])):
        run = _git(*args)
        if run.returncode != 0:
            raise StudyError(f"git {args[-2] if args[0] == '-C' else args[0]}: "
                             f"{run.stderr.strip()[:300]}")


def rebundle(ref: str, repo: str) -> str:
    """``ref`` made again; returns the revision its source is."""
    from ...yamlio import load_yaml
    from ..publication.create import create
    from ..publication.metadata import Publication
    from ..publication.verify import verify

    old = _sums(ref)
    extra = sorted(set(tree_files(ref)) - set(old) - {SUMS})
    if extra:  # never removed: not the bundle's
        raise StudyError(f"{ref}: holds {len(extra)} file(s) its {SUMS} does not list "
                         f"({', '.join(extra[:3])}); move them away first")
    revision = recorded_revision(ref, repo)
    with tempfile.TemporaryDirectory(prefix="tiledattn-rebundle-") as tmp:
        config = study_of(ref, os.path.join(tmp, "study"))
        _checkout(repo, revision, os.path.join(tmp, "source"))
        cfg = load_yaml(config)
        from ... import __version__

        out = os.path.join(tmp, "bundle")
        create(os.path.join(tmp, "study"), out, config=cfg, config_name="study-config.yaml",
               repo_root=os.path.join(tmp, "source"),
               publication=Publication.from_dict(cfg.get("publication"), __version__),
               command="tiledattn bundle create", compact=True)
        new = _sums(out)
        lost = sorted(rel for rel in old if rel.startswith(KEPT) and new.get(rel) != old[rel])
        if lost:
            raise StudyError(f"{ref}: made again, {len(lost)} file(s) would change "
                             f"({', '.join(lost[:3])}); the reference is left as it was")
        problems = verify(out)
        if problems:
            raise StudyError(f"{ref}: made again, it does not verify ({problems[0]}); the "
                             "reference is left as it was")
        for rel in tree_files(ref):
            os.remove(os.path.join(ref, rel))  # every file is in the bundle made again
        for d, _, _ in sorted(os.walk(ref), reverse=True):
            if d != ref and not os.listdir(d):
                os.rmdir(d)
        shutil.copytree(out, ref, dirs_exist_ok=True)
    return revision


def main(argv: list[str] | None = None) -> int:
    refs = sys.argv[1:] if argv is None else argv
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    if not refs:
        print("usage: python -m tiledattention.study.references.rebundle REFERENCE_DIR...",
              file=sys.stderr)
        return 2
    for ref in refs:
        try:
            if not os.path.isfile(os.path.join(ref, SUMS)):
                raise StudyError(f"{ref}: not a committed reference (no {SUMS})")
            print(f"rebundle: {ref} made again, its source revision "
                  f"{rebundle(ref, repo)}", file=sys.stderr)
        except StudyError as exc:
            print(f"rebundle: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
