"""Citation and archive metadata of a study bundle: .zenodo.json, CITATION.cff and an
RO-Crate (Process Run Crate profile), each validated before it is written."""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass

from ..errors import StudyError

PAPER = {"title": "TiledAttention: a CUDA Tile SDPA Kernel for PyTorch",
         "authors": [{"family-names": "Khan", "given-names": "Taimur"}],
         "arxiv": "2603.01960", "doi": "10.48550/arXiv.2603.01960"}
_SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
PROCESS_RUN_CRATE = "https://w3id.org/ro/wfrun/process/0.5"


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

    @classmethod
    def from_dict(cls, data: dict | None, version: str) -> Publication:
        data = dict(data or {})
        valid = ["title", "creators", "description", "license", "keywords", "version"]
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

    with open(os.path.join(_SCHEMAS, schema_file)) as f:
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
        ],
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
    validate_cff(cff)
    return cff


def validate_cff(cff: dict) -> None:
    # The date must be a string for the schema; YAML readers may have made it a date.
    cff = {k: (v.isoformat() if isinstance(v, _dt.date) else v) for k, v in cff.items()}
    _validate(cff, "cff-1.2.0.json", "CITATION.cff")


def write_ro_crate(bundle_dir: str, pub: Publication, files: list[str], manifest: dict,
                   command: str, started: str | None, finished: str | None) -> str:
    """ro-crate-metadata.json describing the run (Process Run Crate: one CreateAction with
    the software as instrument and the bundle's files as results)."""
    from rocrate.model.contextentity import ContextEntity
    from rocrate.model.softwareapplication import SoftwareApplication
    from rocrate.rocrate import ROCrate

    crate = ROCrate()
    crate.name = pub.title
    crate.description = pub.description
    crate.license = pub.license
    crate.root_dataset["conformsTo"] = [{"@id": PROCESS_RUN_CRATE}]
    crate.add(ContextEntity(crate, PROCESS_RUN_CRATE, properties={
        "@type": "CreativeWork", "name": "Process Run Crate", "version": "0.5"}))
    stack = manifest.get("stack") or {}
    tool = crate.add(SoftwareApplication(crate, "#tiledattention", properties={
        "name": "TiledAttention", "softwareVersion": stack.get("tiledattention") or pub.version,
        "url": "https://doi.org/" + PAPER["doi"]}))
    results = []
    for rel in files:
        results.append(crate.add_file(os.path.join(bundle_dir, rel), dest_path=rel))
    action = ContextEntity(crate, "#study-run", properties={
        "@type": "CreateAction", "name": f"TiledAttention study: {command}",
        "description": "benchmark shards, aggregation, figures and profiles of one study",
        "startTime": started, "endTime": finished})
    action["instrument"] = tool
    action["result"] = results
    crate.add(action)
    crate.root_dataset["mentions"] = [action]
    crate.metadata.write(bundle_dir)
    return os.path.join(bundle_dir, "ro-crate-metadata.json")


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
    return problems


def _as_list(v):
    return v if isinstance(v, list) else [] if v is None else [v]
