"""The GPU stages, one module each, and their one registry.

A stage module holds its config section (a frozen dataclass the schema, the workflow and the
``tiledattn`` verb read), its launcher task, its run entry and its ``STAGE`` record
(``base.Stage``: name, config, run, task, and its ``Rows``, ``Publish`` and ``Cli``
records); its rules are one file, ``workflow/rules/<stage>.smk``. The ladder and the
shapes grids are entries too, bench configs the bench stage sweeps (``bench.LADDER``,
``bench.SHAPES``). The CLI, the config
loader and the workflow iterate ``STAGES``; no stage imports another, and the common config
(``bench/config.py``) imports none of them.
"""

from __future__ import annotations

from ..bench.config import section_from_dict
from . import bench, model, profile, tune, variants, workloads
from .base import Cli, Publish, Rows, Stage, section_json_schema

# In the order the workflow includes their rule files; the ladder and the shapes grids after
# the bench stage that sweeps them (their rules are bench.smk's).
STAGES: dict[str, Stage] = {s.name: s for s in (bench.STAGE, bench.LADDER, bench.SHAPES,
                                                tune.STAGE, profile.STAGE, model.STAGE,
                                                variants.STAGE, workloads.STAGE)}
# The stages with a section of their own (bench's is the common BenchConfig).
SECTIONS = {name: s.config for name, s in STAGES.items() if s.config is not None}

__all__ = ["SECTIONS", "STAGES", "Cli", "Publish", "Rows", "Stage", "rule_files", "schema",
           "stage_from_dict",
           "stage_json_schema", "study_schema"]


def stage_from_dict(name: str, data: dict | None):
    """The config's ``name`` section, validated once; errors name ``<name>.<key>``."""
    return section_from_dict(SECTIONS[name], name, data)


def stage_json_schema(name: str) -> dict:
    """The study config's ``name`` section (tune, profile, model, variants), from its
    dataclass."""
    return section_json_schema(SECTIONS[name])


def schema() -> dict:
    """The generated sections of the workflow's config schema: ``bench`` and each stage's."""
    from ..bench.config import json_schema

    return {"bench": json_schema(), **{name: stage_json_schema(name) for name in SECTIONS}}


def study_schema(study: dict) -> dict:
    """The workflow's whole config schema: ``study``, its schema file of the study's own
    keys (workflow/schemas/config.schema.yaml), with the generated sections added where it
    is used (no pasted copy to fall behind the dataclasses), and no key beyond the two."""
    generated = schema()
    both = sorted(set(study.get("properties", {})) & set(generated))
    if both:  # a section written by hand would shadow the dataclass's
        raise ValueError(f"the study schema file writes the generated section(s) {both}")
    return {**study, "additionalProperties": False,
            "properties": {**study.get("properties", {}), **generated}}


def rule_files() -> list[str]:
    """The stages' rule files, in registry order (the Snakefile includes them)."""
    return [s.rule_file for s in STAGES.values() if s.rule_file]
