"""Citation and archive metadata of a study bundle: .zenodo.json, CITATION.cff and an
RO-Crate (Workflow Run Crate profile: the run as a CreateAction of the workflow, its input
config, its outputs and the container image), each validated before it is written. Each
names the source repository (``publication.repository``, else the project's URL in
pyproject.toml, else the checkout's ``git remote``)."""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import os
from dataclasses import dataclass

from ...errors import StudyError

PAPER = {"title": "TiledAttention: a CUDA Tile SDPA Kernel for PyTorch",
         "authors": [{"family-names": "Khan", "given-names": "Taimur"}],
         "arxiv": "2603.01960", "doi": "10.48550/arXiv.2603.01960"}
_SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
PROCESS_RUN_CRATE = "https://w3id.org/ro/wfrun/process/0.5"
WORKFLOW_RUN_CRATE = "https://w3id.org/ro/wfrun/workflow/0.5"
WORKFLOW_RO_CRATE = "https://w3id.org/workflowhub/workflow-ro-crate/1.0"
RO_CRATE = "https://w3id.org/ro/crate/1.1"
FORMAL_PARAMETER = "https://bioschemas.org/profiles/FormalParameter/1.0-RELEASE"
WFRUN_TERMS = "https://w3id.org/ro/terms/workflow-run#"
WORKFLOW_FILE = "workflow-snapshot.zip"  # the crate's main workflow: the Snakefile and rules


@dataclass(frozen=True)
class Creator:
    name: str  # "Family, Given" for a person, or an organisation's name
    affiliation: str | None = None
    orcid: str | None = None  # 0000-0002-1825-0097


@dataclass(frozen=True)
class Publication:
    title: str = "TiledAttention benchmark study"
    creators: tuple[Creator, ...] = (Creator("TiledAttention developers"),)
    description: str = ("Benchmark of the TiledAttention cuTile scaled-dot-product-attention "
                        "kernel against PyTorch's SDPA backends and eager attention.")
    license: str = "CC-BY-4.0"  # SPDX; the data and tables (the code snapshot is Apache-2.0)
    keywords: tuple[str, ...] = ("attention", "cuTile", "GPU", "benchmark", "PyTorch",
                                 "reproducibility")
    version: str = "0.1.0"
    repository: str | None = None  # the source repository's URL (see repository_url)

    @classmethod
    def from_dict(cls, data: dict | None, version: str) -> Publication:
        if data is not None and not isinstance(data, dict):
            raise StudyError(f"publication: a mapping of title, creators, description, "
                             f"license, keywords, version, repository; got {data!r:.60}")
        data = dict(data or {})
        valid = ["title", "creators", "description", "license", "keywords", "version",
                 "repository"]
        for key in ("title", "description", "license", "version", "repository"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise StudyError(f"publication.{key}: a string, got {data[key]!r:.60}")
        if "keywords" in data and not (isinstance(data["keywords"], (list, tuple)) and all(
                isinstance(k, str) for k in data["keywords"])):
            raise StudyError(f"publication.keywords: a list of strings, got "
                             f"{data['keywords']!r:.60}")
        if data.get("creators") is not None and not isinstance(data["creators"], (list, tuple)):
            raise StudyError(f"publication.creators: a list of {{name, affiliation, orcid}}, "
                             f"got {data['creators']!r:.60}")
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise StudyError(f"publication: unknown keys {unknown}; valid keys are {valid}")
        creators = data.pop("creators", None)
        if creators is not None:
            try:
                data["creators"] = tuple(Creator(**c) for c in creators)
            except TypeError as exc:
                raise StudyError(f"publication.creators: {exc} (keys: name, affiliation, "
                                 "orcid)") from exc
        if "keywords" in data:
            data["keywords"] = tuple(data["keywords"])
        data.setdefault("version", version)
        return cls(**data)


def _validate(instance: dict, schema_file: str, what: str) -> None:
    import jsonschema

    path = os.path.join(_SCHEMAS, schema_file)
    if os.path.exists(path + ".gz"):  # the large vendored schemas ship gzipped
        with gzip.open(path + ".gz", "rt", encoding="utf-8") as f:
            schema = json.load(f)
    else:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(instance),
                    key=lambda e: list(e.path))
    if errors:
        raise StudyError(f"{what} is invalid: " + "; ".join(
            f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in errors[:5]))


def zenodo(pub: Publication, headline: str, today: str | None = None) -> dict:
    meta = {
        "upload_type": "dataset",
        "publication_date": today or _dt.date.today().isoformat(),
        "title": pub.title,
        "creators": [{k: v for k, v in c.__dict__.items() if v} for c in pub.creators],
        "description": f"<p>{pub.description}</p><p>{headline}</p>",
        "access_right": "open",
        "license": pub.license.lower(),
        "keywords": list(pub.keywords),
        "version": pub.version,
        "related_identifiers": [
            {"identifier": f"arXiv:{PAPER['arxiv']}", "relation": "references",
             "scheme": "arxiv", "resource_type": "publication-preprint"},
        ] + ([{"identifier": pub.repository, "relation": "isSupplementTo", "scheme": "url",
               "resource_type": "software"}] if _is_web_url(pub.repository) else []),
    }
    validate_zenodo(meta)
    return meta


def validate_zenodo(meta: dict) -> None:
    _validate(meta, "zenodo-deposit.schema.json", ".zenodo.json")


def _cff_person(c: Creator) -> dict:
    if ", " in c.name:  # "Family, Given": a person
        family, given = c.name.split(", ", 1)
        out = {"family-names": family, "given-names": given}
    else:
        out = {"name": c.name}
    if c.affiliation:
        out["affiliation"] = c.affiliation
    if c.orcid:
        out["orcid"] = f"https://orcid.org/{c.orcid}"
    return out


def citation_cff(pub: Publication, today: str | None = None) -> dict:
    cff = {
        "cff-version": "1.2.0",
        "message": "If you use this dataset, please cite it as below.",
        "type": "dataset",
        "title": pub.title,
        "authors": [_cff_person(c) for c in pub.creators],
        "abstract": pub.description,
        "version": pub.version,
        "date-released": today or _dt.date.today().isoformat(),
        "license": pub.license,
        "keywords": list(pub.keywords),
        "references": [{"type": "article", "title": PAPER["title"], "authors": PAPER["authors"],
                        "doi": PAPER["doi"],
                        "identifiers": [{"type": "other", "value": f"arXiv:{PAPER['arxiv']}"}],
                        "year": 2026}],
    }
    if _is_web_url(pub.repository):
        cff["repository-code"] = pub.repository
    validate_cff(cff)
    return cff


def validate_cff(cff: dict) -> None:
    # The date must be a string for the schema; YAML readers may have made it a date.
    cff = {k: (v.isoformat() if isinstance(v, _dt.date) else v) for k, v in cff.items()}
    _validate(cff, "cff-1.2.0.json", "CITATION.cff")


def _is_web_url(url: str | None) -> bool:
    return bool(url) and url.startswith(("https://", "http://"))


def repository_url(configured: str | None, repo_root: str) -> str | None:
    """The source repository: the config's ``publication.repository``, else pyproject's
    ``[project.urls]`` (Repository, Source, Homepage), else ``git remote get-url origin``
    of the checkout; None when none says (the bundle's README then says how to set it)."""
    if configured:
        return configured
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = None
    path = os.path.join(repo_root, "pyproject.toml")
    if tomllib and os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                project = tomllib.load(f).get("project")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise StudyError(f"bundle: {path} is not readable TOML ({exc}); fix it, or name "
                             "the repository in the config's publication.repository") from None
        urls = project.get("urls") if isinstance(project, dict) else None
        for key in ("Repository", "Source", "Homepage"):
            if isinstance(urls, dict) and isinstance(urls.get(key), str) and urls[key]:
                return urls[key]
    import subprocess

    try:
        run = subprocess.run(["git", "-C", repo_root, "remote", "get-url", "origin"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _as_url(run.stdout.strip()) if run.returncode == 0 else None


def _as_url(remote: str) -> str | None:
    """A git remote as a URL pip and readers understand: a local path as file://, scp-like
    git@host:org/repo.git as https://host/org/repo."""
    if not remote:
        return None
    if os.path.isabs(remote):
        return "file://" + remote
    if "://" not in remote and ":" in remote and "@" in remote.split(":", 1)[0]:
        host, path = remote.split("@", 1)[1].split(":", 1)
        return f"https://{host}/{path.removesuffix('.git')}"
    return remote


def _profile(uri: str, name: str) -> dict:
    return {"@id": uri, "@type": "CreativeWork", "name": name, "version": uri.rsplit("/", 1)[1]}


def _encoding(rel: str) -> str | None:
    return {".json": "application/json", ".jsonl": "application/jsonl", ".csv": "text/csv",
            ".md": "text/markdown", ".png": "image/png", ".pdf": "application/pdf",
            ".zip": "application/zip", ".yaml": "application/yaml", ".tex": "text/x-tex",
            ".parquet": "application/vnd.apache.parquet", ".cff": "application/yaml",
            ".gz": "application/gzip"}.get(
        os.path.splitext(rel)[1])


def _image_entity(container: dict | None) -> dict | None:
    """The container image the jobs ran in (Workflow Run Crate's ContainerImage)."""
    if not container or not container.get("image"):
        return None
    image = container["image"]
    kind = "SIFImage" if image.endswith(".sif") else "DockerImage"
    ent = {"@id": "#container-image", "@type": "ContainerImage", "name": image,
           "additionalType": {"@id": WFRUN_TERMS + kind}}
    if container.get("digest"):
        ent["sha256"] = container["digest"].removeprefix("sha256:")
    if kind == "DockerImage" and "@" not in image:
        name, _, tag = image.rpartition(":")
        if name and "/" not in tag:
            ent["tag"] = tag
    return ent


# What the workflow takes and gives, as the crate's FormalParameters: (id, name, the file
# that is its value in this run, its kind).
_INPUTS = (("#param-config", "study config", "config/study-config.yaml", "File"),)
_OUTPUTS = (("#param-rows", "benchmark rows", "data/rows.jsonl", "File"),
            ("#param-manifest", "version manifest", "manifest.json", "File"),
            ("#param-headline", "headline table", "tables/headline.csv", "File"))


def write_ro_crate(bundle_dir: str, pub: Publication, files: list[str], manifest: dict,
                   command: str, started: str | None, finished: str | None) -> str:
    """ro-crate-metadata.json, a Workflow Run Crate: the workflow (the snapshot's Snakefile
    and rules, in Snakemake) as the crate's main entity with its formal inputs and outputs;
    the study run as one CreateAction of it, the config as object, every other file as
    result, and the container image the jobs ran in."""
    stack = manifest.get("stack") or {}
    snakemake = (manifest.get("workflow") or {}).get("snakemake")
    present = set(files)
    params, examples = [], {}
    for pid, name, rel, kind in _INPUTS + _OUTPUTS:
        if rel in present:
            params.append({"@id": pid, "@type": "FormalParameter", "name": name,
                           "additionalType": kind, "conformsTo": {"@id": FORMAL_PARAMETER},
                           "workExample": {"@id": rel}})
            examples[rel] = pid
    inputs = [p for p in params if p["@id"] in {i[0] for i in _INPUTS}]
    outputs = [p for p in params if p not in inputs]
    workflow = {"@id": WORKFLOW_FILE, "@type": ["File", "SoftwareSourceCode",
                                                "ComputationalWorkflow"],
                "name": "TiledAttention study workflow (Snakefile, rules, configs, profiles)",
                "programmingLanguage": {"@id": "#snakemake"},
                "encodingFormat": "application/zip",
                "input": [{"@id": p["@id"]} for p in inputs],
                "output": [{"@id": p["@id"]} for p in outputs]}
    if stack.get("git_commit"):
        workflow["version"] = stack["git_commit"]
    if pub.repository:
        workflow["codeRepository"] = pub.repository
    language = {"@id": "#snakemake", "@type": "ComputerLanguage", "name": "Snakemake",
                "identifier": {"@id": "https://snakemake.readthedocs.io"},
                "url": {"@id": "https://snakemake.readthedocs.io"}}
    if snakemake:
        language["version"] = snakemake
    data = []
    for rel in files:
        ent = {"@id": rel, "@type": "File",
               "contentSize": str(os.path.getsize(os.path.join(bundle_dir, rel)))}
        if _encoding(rel):
            ent["encodingFormat"] = _encoding(rel)
        if rel in examples:
            ent["exampleOfWork"] = {"@id": examples[rel]}
        if rel == WORKFLOW_FILE:
            ent = {**workflow, "contentSize": ent["contentSize"]}
        data.append(ent)
    inputs_used = [{"@id": r} for r in files if r == "config/study-config.yaml"]
    action = {"@id": "#study-run", "@type": "CreateAction",
              "name": f"TiledAttention study: {command}",
              "description": "benchmark shards, aggregation, figures and profiles of one study "
                             f"(tiledattention {stack.get('tiledattention') or pub.version})",
              "instrument": {"@id": WORKFLOW_FILE}, "object": inputs_used,
              "result": [{"@id": r} for r in files
                         if r not in (WORKFLOW_FILE, "config/study-config.yaml")]}
    for key, value in (("startTime", started), ("endTime", finished)):
        if value:
            action[key] = value
    image = _image_entity(manifest.get("container"))
    if image:
        action["containerImage"] = {"@id": image["@id"]}
    root = {"@id": "./", "@type": "Dataset", "name": pub.title, "description": pub.description,
            "license": pub.license, "datePublished": _dt.date.today().isoformat(),
            "conformsTo": [{"@id": u} for u in (PROCESS_RUN_CRATE, WORKFLOW_RUN_CRATE,
                                                WORKFLOW_RO_CRATE)],
            "hasPart": [{"@id": r} for r in files], "mentions": [{"@id": "#study-run"}]}
    if WORKFLOW_FILE in present:
        root["mainEntity"] = {"@id": WORKFLOW_FILE}
    if _is_web_url(pub.repository):
        root["isBasedOn"] = {"@id": pub.repository}
    graph = [{"@id": "ro-crate-metadata.json", "@type": "CreativeWork", "about": {"@id": "./"},
              "conformsTo": [{"@id": RO_CRATE}, {"@id": WORKFLOW_RO_CRATE}]}, root,
             _profile(PROCESS_RUN_CRATE, "Process Run Crate"),
             _profile(WORKFLOW_RUN_CRATE, "Workflow Run Crate"),
             _profile(WORKFLOW_RO_CRATE, "Workflow RO-Crate"), language, action, *params,
             *data] + ([image] if image else [])
    context = ["https://w3id.org/ro/crate/1.1/context",
               {k: WFRUN_TERMS + k for k in ("ContainerImage", "containerImage", "registry",
                                              "tag", "sha256", "DockerImage", "SIFImage")}]
    path = os.path.join(bundle_dir, "ro-crate-metadata.json")
    with open(path, "w") as f:
        json.dump({"@context": context, "@graph": graph}, f, indent=1)
    return path


def check_ro_crate(bundle_dir: str) -> list[str]:
    """Problems with the bundle's RO-Crate (empty: fine)."""
    from rocrate.rocrate import ROCrate

    try:
        crate = ROCrate(bundle_dir)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the finding
        return [f"ro-crate-metadata.json does not parse: {exc}"]
    problems = []
    conforms = [c.get("@id") if isinstance(c, dict) else getattr(c, "id", c)
                for c in _as_list(crate.root_dataset.get("conformsTo"))]
    if PROCESS_RUN_CRATE not in conforms:
        problems.append(f"ro-crate: root dataset does not conform to {PROCESS_RUN_CRATE}")
    actions = [e for e in crate.get_entities() if e.type == "CreateAction"]
    if not actions:
        problems.append("ro-crate: no CreateAction describes the run")
    if WORKFLOW_RUN_CRATE not in conforms:  # a bundle from before the Workflow Run Crate
        return problems
    main = crate.root_dataset.get("mainEntity")
    if main is None or "ComputationalWorkflow" not in _as_list(getattr(main, "type", None)):
        problems.append("ro-crate: no main entity of type ComputationalWorkflow (the workflow)")
    elif actions and all(getattr(a.get("instrument"), "id", None) != main.id for a in actions):
        problems.append("ro-crate: no CreateAction has the workflow as its instrument")
    return problems


def _as_list(v):
    return v if isinstance(v, list) else [] if v is None else [v]
