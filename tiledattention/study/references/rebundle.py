"""Make a committed reference (a compact bundle) again with today's ``bundle create``.

The studies the references came from are not kept; their bundles hold what ``bundle create
--compact`` reads: the rows (gzipped), the Markdown tables, the manifest, the exact config.
``rebundle`` lays those out as a study directory, takes the source from a clone of this
repository at the recorded revision (so the workflow snapshot and the bundle's wheel are
that revision's), makes the compact bundle again and replaces the reference only when
every measurement, table, manifest and config came through byte for byte::

    python -m tiledattention.study.references.rebundle results/reference/h100 results/reference/h200

A reference made before a GPU stage existed gains that stage's rows, measured later on the
same GPU model with the section of ``--config`` (default ``config/reference.yaml``), and a
shapes grid of that config after its last (``shapes-g<N>``: the sweep's directory)::

    python -m tiledattention.study.references.rebundle --add workloads=DIR results/reference/h200
    python -m tiledattention.study.references.rebundle --add shapes-g2=DIR results/reference/h200

Every row published stays byte for byte; the manifest gains the run, the config the section,
and the bundle's source becomes the newest revision a run measured with, whose code makes
every table again from the rows (``GROWN``).

A stage measured again (the same section, newer kernels) replaces the reference's rows of it;
its earlier run moves to the manifest's ``replaced_runs``, every other stage's rows stay
byte for byte::

    python -m tiledattention.study.references.rebundle --replace workloads=DIR \\
        results/reference/h200
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

from ...errors import StudyError, TiledAttentionError
from ..publication.archive import MARKER, SUMS, tree_files

# What must come through unchanged: the measurements and what was published of them.
KEPT = ("data/", "tables/", "compare/", "scaling/", "manifest.json", "config/")
# What a stage added to a reference changes of them: the runs, the config's sections and
# the tables. The bundle's source becomes the revision the stage ran at, so every table is
# made again from the same rows by that code (the headline reads the new stage's rows too);
# the rows stay byte for byte.
GROWN = ("manifest.json", "config/study-config.yaml", "tables/")


def _sums(bundle: str) -> dict[str, str]:
    with open(os.path.join(bundle, SUMS), encoding="utf-8") as f:
        return {rel: digest for digest, rel in (ln.split("  ", 1) for ln in f.read().splitlines())}


def _gunzip(src: str, dest: str) -> None:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with gzip.open(src, "rb") as g, open(dest, "wb") as f:
        shutil.copyfileobj(g, f)


def study_of(bundle: str, study: str, added: dict[str, tuple[str, dict]] | None = None,
             replaced: tuple[str, ...] = ()) -> str:
    """The study directory ``bundle create --compact`` reads, laid out from a compact
    ``bundle`` in ``study``, with the ``added`` stages (name: (directory, config section),
    ``add_stage``), those ``replaced`` taken out first (``drop_stage``); returns the config
    file's path."""
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
    for name in replaced:
        drop_stage(study, name)
    for name, (measured, section) in (added or {}).items():
        add_stage(study, name, measured, section, "--replace" if name in replaced else "--add")
    tables_added_since(study, again=bool(added))
    return config


def drop_stage(study: str, name: str) -> None:
    """GPU stage ``name``'s rows out of the laid-out ``study``, to be measured again: its
    directory goes, and its run moves from the manifest's ``runs`` to ``replaced_runs`` (the
    record keeps it; ``mismatches`` still names its revisions)."""
    dest = os.path.join(study, name)
    if not os.path.isdir(dest):
        raise StudyError(f"--replace {name}: the reference holds no {name} stage's rows "
                         f"(--add {name}=DIR adds them)")
    shutil.rmtree(dest)
    path = os.path.join(study, "manifest.json")
    with open(path, encoding="utf-8") as f:
        merged = json.load(f)
    runs = merged.get("runs", [])
    gone = [r for r in runs if str(r.get("manifest", "")).startswith(f"{name}/")]
    merged = {**merged, "runs": [r for r in runs if r not in gone],
              "replaced_runs": [*merged.get("replaced_runs", []), *gone]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)


def add_stage(study: str, name: str, measured: str, section: dict, flag: str = "--add") -> None:
    """GPU stage ``name``'s rows, measured after the reference was made (``measured``: the
    stage's output directory, its rows and run manifest), into the ``study`` laid out from
    it: the config gains ``section`` (the one the rows were measured with: its digest is
    the run's), the manifest the run (``manifest.extend``: the same GPU model). A shapes
    grid is ``shapes-g<N>``, the grid after the reference's last (``section``: the grid).
    ``flag``: the option that named it, as its refusals say."""
    from ...stages import STAGES, stage_from_dict
    from ...yamlio import load_yaml

    config = os.path.join(study, "plan", "study-config.yaml")
    cfg = load_yaml(config)
    if name.startswith("shapes-g"):
        cfg, digest, dest, files = _shapes_grid(study, cfg, name, measured, section)
    else:
        stage = STAGES.get(name)
        if stage is None or stage.rows is None or not stage.rows.file or stage.config is None:
            takes = [s.name for s in STAGES.values() if s.rows and s.rows.file and s.config]
            raise StudyError(f"--add {name}: not a GPU stage with rows of its own "
                             f"({', '.join(takes)}, or shapes-g<N>: a shapes grid)")
        dest = os.path.join(study, name)
        if os.path.exists(dest):
            raise StudyError(f"--add {name}: the reference holds the {name} stage's rows "
                             "already")
        if not os.path.isfile(os.path.join(measured, stage.rows.file)):
            raise StudyError(f"{flag} {name}={measured}: not the stage's output directory (its "
                             f"{stage.rows.file} and one manifest-*.json)")
        cfg, digest = {**cfg, name: section}, stage_from_dict(name, section).digest()
        files = [stage.rows.file]
        stage.rows.load(measured)  # read as the stage reads them: a damaged file is one error
    _record_run(study, name, measured, cfg, digest, dest, files, flag)


def _shapes_grid(study: str, cfg: dict, name: str, measured: str, grid: dict):
    """``--add shapes-g<N>``: the study config with the grid appended as its N-th, the
    digest its sweep's bench config has (``stages.bench.shapes_config``: the study's own
    timing), the grid's directory and its rows files."""
    import glob

    from ...stages.bench import SHAPES, shapes_bench_config

    shapes = dict(cfg.get("shapes") or {})
    grids = list(shapes.get("grids") or [])
    if name != f"shapes-g{len(grids)}":
        raise StudyError(f"--add {name}: the reference holds shapes grids g0..g{len(grids) - 1}"
                         f"; the next one it can gain is shapes-g{len(grids)}")
    cfg = {**cfg, "shapes": {**shapes, "enabled": True, "grids": grids + [grid]}}
    digest = shapes_bench_config(cfg, len(grids)).digest()
    files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(measured, "rows-*.jsonl")))
    if not files:
        raise StudyError(f"--add {name}={measured}: not a shapes grid's sweep directory (its "
                         "rows-*.jsonl and one manifest-*.json)")
    SHAPES.rows.load(measured)  # read as the tables read them: a damaged file is one error
    return cfg, digest, os.path.join(study, "shapes", f"g{len(grids)}"), files


def _record_run(study: str, name: str, measured: str, cfg: dict, digest: str, dest: str,
                files: list[str], flag: str = "--add") -> None:
    """The run in ``measured`` (one manifest, measured with ``digest``) into the study:
    its rows ``files`` and manifest into ``dest``, ``cfg`` as the study's config, the run
    into its manifest."""
    import yaml

    from ..publication.manifest import extend, load_manifests

    manifests = load_manifests([measured])
    if len(manifests) != 1:
        raise StudyError(f"{flag} {name}={measured}: not one run's output directory (it holds "
                         f"{len(manifests)} manifest-*.json)")
    (path, run), = manifests.items()
    if run.get("config_hash") != digest:
        raise StudyError(f"{flag} {name}: {path} was measured with another config (digest "
                         f"{run.get('config_hash')}) than the reference's with this {name} "
                         f"section ({digest})")
    os.makedirs(dest)
    for src in [os.path.join(measured, f) for f in files] + [path]:
        shutil.copyfile(src, os.path.join(dest, os.path.basename(src)))
    config = os.path.join(study, "plan", "study-config.yaml")
    with open(config, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)  # as ``bundle create`` writes it
    with open(os.path.join(study, "manifest.json"), encoding="utf-8") as f:
        merged = json.load(f)
    merged = extend(merged, {os.path.join(dest, os.path.basename(path)): run}, config=cfg,
                    base_dir=study)
    with open(os.path.join(study, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)


def tables_added_since(study: str, again: bool = False) -> list[str]:
    """The tables a study needs that its reference predates (``headline_shapes`` was added
    after the references were made), written into its aggregate from its rows by today's
    code, as ``tiledattn aggregate`` would: the benchmark's rows and the stages' own
    (model, variants, workloads). The tables the reference published stay as they were,
    byte for byte, unless ``again`` (a stage added: ``GROWN``): then every table is made
    again. Returns the stems written."""
    from ..presentation.tables import write_all
    from ..publication.create import needed_tables

    tables = os.path.join(study, "aggregate", "tables")
    missing = [n for n in needed_tables(study)
               if again or not os.path.isfile(os.path.join(tables, f"{n}.md"))]
    if not missing:
        return []
    with open(os.path.join(study, "aggregate", "rows.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(study, "manifest.json"), encoding="utf-8") as f:
        gpu = (json.load(f).get("gpu") or {}).get("name")
    with tempfile.TemporaryDirectory(prefix="tiledattn-tables-") as tmp:
        write_all(rows, tmp, stage_rows=_stage_rows(study), gpu=gpu)
        for n in missing:
            shutil.copyfile(os.path.join(tmp, f"{n}.md"), os.path.join(tables, f"{n}.md"))
    return missing


def _stage_rows(study: str) -> dict[str, list[dict]]:
    """Each stage's rows in the laid-out study (``study_of``), as ``tiledattn aggregate
    --<stage> DIR`` reads them: the ladder's, each shapes grid's, the measured stages'."""
    from ...stages import STAGES
    from ..publication.prose import stage_rows_in

    return {s.name: stage_rows_in(study, s.name) for s in STAGES.values() if s.rows}


def recorded_revision(bundle: str, repo: str, manifest_path: str | None = None) -> str:
    """The revision the reference's source is: the one its marker records, else the newest
    revision its manifest records (the runs' latest code: a study's later stage re-run).
    ``manifest_path``: a study's manifest with a stage added, whose newest revision it is."""
    if manifest_path is None:
        with open(os.path.join(bundle, MARKER), encoding="utf-8") as f:
            named = (json.load(f).get("source") or {}).get("revision")
        if named:
            return named
        manifest_path = os.path.join(bundle, "manifest.json")
    with open(manifest_path, encoding="utf-8") as f:
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


def recorded_repository(bundle: str) -> str | None:
    """The source repository the reference records (its marker's), None where it records
    none: a reference made again keeps it, whatever checkout makes it."""
    with open(os.path.join(bundle, MARKER), encoding="utf-8") as f:
        return (json.load(f).get("source") or {}).get("repository") or None


def _checkout(repo: str, revision: str, dest: str, origin: str | None) -> None:
    """A clone of ``repo`` at ``revision`` (the repository's own checkout is never touched)
    whose remote is ``origin`` (a bundle records it; none where None), never the local path
    cloned."""
    for args in (["clone", "--quiet", "--shared", "--no-checkout", repo, dest],
                 ["-C", dest, "checkout", "--quiet", "--detach", revision],
                 ["-C", dest, "remote", "remove", "origin"],
                 *([["-C", dest, "remote", "add", "origin", origin]] if origin else [])):
        run = _git(*args)
        if run.returncode != 0:
            raise StudyError(f"git {args[-2] if args[0] == '-C' else args[0]}: "
                             f"{run.stderr.strip()[:300]}")


def rebundle(ref: str, repo: str, added: dict[str, tuple[str, dict]] | None = None,
             replaced: tuple[str, ...] = ()) -> str:
    """``ref`` made again, with the ``added`` stages (``study_of``), those ``replaced``
    measured again; returns the revision its source is."""
    from ...yamlio import load_yaml
    from ..publication.create import create
    from ..publication.metadata import Publication
    from ..publication.verify import verify

    old = _sums(ref)
    extra = sorted(set(tree_files(ref)) - set(old) - {SUMS})
    if extra:  # never removed: not the bundle's
        raise StudyError(f"{ref}: holds {len(extra)} file(s) its {SUMS} does not list "
                         f"({', '.join(extra[:3])}); move them away first")
    with tempfile.TemporaryDirectory(prefix="tiledattn-rebundle-") as tmp:
        config = study_of(ref, os.path.join(tmp, "study"), added, replaced)
        revision = recorded_revision(ref, repo, os.path.join(tmp, "study", "manifest.json")
                                     if added else None)
        _checkout(repo, revision, os.path.join(tmp, "source"), recorded_repository(ref))
        cfg = load_yaml(config)
        from ... import __version__

        out = os.path.join(tmp, "bundle")
        create(os.path.join(tmp, "study"), out, config=cfg, config_name="study-config.yaml",
               repo_root=os.path.join(tmp, "source"),
               publication=Publication.from_dict(cfg.get("publication"), __version__),
               command="tiledattn bundle create", compact=True)
        new = _sums(out)
        # what gains the added stages, checked in add_stage; a replaced stage's rows
        grown = (GROWN + _published(replaced)) if added else ()
        lost = sorted(rel for rel in old if rel.startswith(KEPT) and not rel.startswith(grown)
                      and new.get(rel) != old[rel])
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


def _published(stages: tuple[str, ...]) -> tuple[str, ...]:
    """What a bundle publishes of these stages' rows (``data/<stage>-rows.jsonl.gz``)."""
    from ...stages import STAGES

    return tuple(f"data/{STAGES[n].publish.data_name}.gz" for n in stages
                 if STAGES[n].publish.data_name)


def _added(adds: list[str], config: str, refs: list[str], flag: str = "--add"
           ) -> dict[str, tuple[str, dict]]:
    """``--add STAGE=DIR`` (or ``--replace``) as (directory, the section of ``config``) per
    stage."""
    from ...yamlio import load_yaml

    if not adds:
        return {}
    if len(refs) != 1:
        raise StudyError(f"{flag}: one reference at a time (the rows are one system's)")
    cfg = load_yaml(config)
    added = {}
    for add in adds:
        name, sep, measured = add.partition("=")
        if not sep or not name or not measured:
            raise StudyError(f"{flag} {add}: give STAGE=DIR (the stage's output directory)")
        if flag == "--replace" and name.startswith("shapes-g"):
            raise StudyError(f"--replace {name}: a shapes grid is not replaced (measure it "
                             "as the next grid, --add shapes-g<N>)")
        added[name] = (measured, _section(cfg, name, config))
    return added


def _section(cfg: dict, name: str, config: str) -> dict:
    """``name``'s section of the study config ``cfg`` (``config``'s): a stage's, or for
    ``shapes-g<N>`` the shapes grid N."""
    if name.startswith("shapes-g"):
        grids = (cfg.get("shapes") or {}).get("grids") or []
        n = name[len("shapes-g"):]
        if not n.isdigit() or int(n) >= len(grids):
            raise StudyError(f"--add {name}: {config} has no shapes grid {n} "
                             f"({len(grids)} grids)")
        return grids[int(n)]
    if not isinstance(cfg.get(name), dict):
        raise StudyError(f"--add {name}: {config} has no {name} section to record")
    return cfg[name]


def main(argv: list[str] | None = None) -> int:
    import argparse

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    p = argparse.ArgumentParser(prog="python -m tiledattention.study.references.rebundle",
                                description="make committed references again")
    p.add_argument("refs", nargs="+", metavar="REFERENCE_DIR")
    p.add_argument("--add", action="append", default=[], metavar="STAGE=DIR",
                   help="a GPU stage's rows measured since, into the one reference given "
                   "(STAGE: a stage, or shapes-g<N> for the config's shapes grid N)")
    p.add_argument("--replace", action="append", default=[], metavar="STAGE=DIR",
                   help="a GPU stage measured again with the same section: its rows replace "
                   "the reference's")
    p.add_argument("--config", default=os.path.join(repo, "config", "reference.yaml"),
                   help="the study config whose section an added stage ran with")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    for ref in a.refs:
        try:
            if not os.path.isfile(os.path.join(ref, SUMS)):
                raise StudyError(f"{ref}: not a committed reference (no {SUMS})")
            added = _added(a.add, a.config, a.refs)
            again = _added(a.replace, a.config, a.refs, "--replace")
            both = sorted(set(added) & set(again))
            if both:
                raise StudyError(f"--add and --replace both name {both[0]}")
            print(f"rebundle: {ref} made again, its source revision "
                  f"{rebundle(ref, repo, {**added, **again}, tuple(again))}", file=sys.stderr)
        except TiledAttentionError as exc:  # a study's, a config's or a rows file's
            print(f"rebundle: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
