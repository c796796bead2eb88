"""A GPU stage is one thing: one module under tiledattention/stages/, one rule file, one
section of the config schema, one `tiledattn` verb; the registry is what the CLI, the
config loader and the workflow iterate, and the common config sits below every stage."""

from __future__ import annotations

import ast
import glob
import gzip
import json
import os

import pytest
import yaml

from tiledattention import stages
from tiledattention.bench.config import json_schema
from tiledattention.stages import SECTIONS, STAGES, stage_json_schema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "tiledattention")
RULES = os.path.join(ROOT, "workflow", "rules")


def _imports(path: str, name: str | None = None) -> set[str]:
    """Every module ``path`` (the module ``name``, default: from its path) imports,
    absolute (relative imports resolved), at any level: a function-level import is an
    import too."""
    rel = (name.split(".") if name else
           os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep))
    package = rel[:-1]
    out = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # `from . import model`
    return out


def _stage_module(name: str) -> str | None:
    """The stage a module of tiledattention.stages belongs to (profile_target is the
    profile stage's child process), None for the registry and the descriptor."""
    parts = name.split(".")
    if parts[:2] != ["tiledattention", "stages"] or len(parts) < 3:
        return None
    leaf = parts[2]
    leaf = "profile" if leaf == "profile_target" else leaf
    return leaf if leaf in STAGES else None


def _gpu_rule_files() -> set[str]:
    """The rule files whose rules run a job through the configured launcher (a GPU step):
    common.smk defines ``launcher_args`` and is no stage's."""
    out = set()
    for path in glob.glob(os.path.join(RULES, "*.smk")):
        with open(path) as f:
            if os.path.basename(path) != "common.smk" and "launcher_args()" in f.read():
                out.add(os.path.basename(path))
    return out


def test_the_registry_lists_every_stage_the_workflow_has_a_rule_file_for_and_no_other():
    assert set(stages.rule_files()) == _gpu_rule_files()
    assert stages.rule_files() == [s.rule_file for s in STAGES.values() if s.run]
    for f in stages.rule_files():
        assert os.path.isfile(os.path.join(RULES, f)), f
    # The ladder and the shapes grids: the bench stage's sweeps, its rules' (bench.smk).
    assert {n for n, s in STAGES.items() if s.run is None} == {"ladder", "shapes"}


def test_the_snakefile_includes_the_stage_rule_files_from_the_registry_not_by_name():
    with open(os.path.join(ROOT, "Snakefile")) as f:
        text = f.read()
    assert "for _rule_file in STAGE_RULE_FILES" in text
    for f in stages.rule_files():
        assert f'"workflow/rules/{f}"' not in text, f


def test_every_stage_section_is_generated_into_the_workflow_schema_not_pasted():
    with open(os.path.join(ROOT, "workflow", "schemas", "config.schema.yaml")) as f:
        written = yaml.safe_load(f)
    # The file holds the study's own keys only: no copy of a section to fall behind.
    assert not set(written["properties"]) & {"bench", *SECTIONS}
    schema = stages.study_schema(written)
    assert schema["properties"]["bench"] == json_schema()
    assert set(SECTIONS) == {n for n, s in STAGES.items() if s.config is not None}
    for name in SECTIONS:
        assert schema["properties"][name] == stage_json_schema(name)
    assert set(stages.schema()) == {"bench", *SECTIONS}
    assert schema["additionalProperties"] is False  # no key beyond the file's and theirs


def test_a_section_written_into_the_schema_file_is_refused():
    with pytest.raises(ValueError, match=r"generated section\(s\) \['model'\]"):
        stages.study_schema({"properties": {"model": {"type": "object"}}})


def test_every_stage_is_a_tiledattn_verb_with_its_registered_handler():
    from tiledattention.cli import build_parser

    verbs = build_parser()._subparsers._group_actions[0].choices
    for name, s in STAGES.items():
        if s.cli:
            assert verbs[name].get_default("handler") is s.cli.handler, name
        else:  # the ladder and the shapes grids: measured by the bench stage's sweep
            assert name not in verbs and s.run is None, name
    from tiledattention.stages import bench

    assert verbs["sweep"].get_default("handler") is bench.sweep


def test_no_stage_module_imports_another_stage():
    for path in glob.glob(os.path.join(PKG, "stages", "*.py")):
        own = _stage_module("tiledattention.stages." + os.path.basename(path)[:-3])
        if own is None:
            continue
        others = {_stage_module(m) for m in _imports(path)} - {None, own}
        assert not others, f"{os.path.relpath(path, ROOT)} imports the stage(s) {others}"
        assert "tiledattention.stages" not in _imports(path) - {
            "tiledattention.stages.base"}, f"{path} imports the registry"


def test_no_stage_module_imports_the_study_which_reads_the_stages():
    """The study (its presentation: tables, figures, the report) reads the stages' rows;
    a stage's own run summary reads them below it, function-level imports included."""
    for path in glob.glob(os.path.join(PKG, "stages", "*.py")):
        bad = {m for m in _imports(path) if m.startswith("tiledattention.study")}
        assert not bad, f"{os.path.relpath(path, ROOT)} imports {sorted(bad)}"


def _verb_options(name: str) -> dict[str, tuple[str, ...]]:
    """A stage verb's options: dest -> its flags."""
    from tiledattention.cli import build_parser

    verb = build_parser()._subparsers._group_actions[0].choices[name]
    return {a.dest: tuple(a.option_strings) for a in verb._actions if a.option_strings}


# The options a stage verb takes that are no config field, each stage's own.
NOT_FIELDS = {"-h", "--help", "--out", "--config", "--launcher", "--launcher-options", "--grid",
              "--state", "--reps", "--compile-timeout"}


def test_every_stage_verb_accepts_exactly_its_config_fields_as_flags():
    from dataclasses import fields

    for name, cls in SECTIONS.items():
        opts = _verb_options(name)
        flags = {f.name: (f.metadata["flag"],) for f in fields(cls) if "flag" in f.metadata}
        assert {f.name for f in fields(cls)} - set(flags) == {"enabled"}, name
        assert {d: opts[d] for d in flags if d in opts} == flags, name
        others = {o for d, o in opts.items() if d not in flags}
        assert set().union(*others) <= NOT_FIELDS, (name, others)


def test_a_field_option_reads_values_as_its_config_holds_them(tmp_path, capsys):
    """Lists take one or more, choices come from the field, an option left out keeps the
    --config file's value, and the dataclass's default under it."""
    import argparse

    from tiledattention.cli import build_parser
    from tiledattention.stages.base import config_section

    args = build_parser().parse_args(["workloads", "--out", "o", "--causal", "true", "false",
                                      "--doc-mu", "2.5", "--page-sizes", "16", "64"])
    assert (args.causal, args.doc_mu, args.page_sizes, args.kinds) == (
        [True, False], 2.5, [16, 64], None)
    cfg = tmp_path / "w.yaml"
    cfg.write_text("workloads: {chunk: 64, doc_mu: 1.0}\n")
    args = argparse.Namespace(**{**vars(args), "config": str(cfg)})
    section = config_section(args, "workloads", SECTIONS["workloads"])
    assert section["chunk"] == 64 and section["doc_mu"] == 2.5 and "kinds" not in section
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["profile", "--out", "o"])  # a shape must be given
    assert exc.value.code == 2 and "--shape" in capsys.readouterr().err


def test_the_stages_method_help_is_the_registrys_each_method_named_once():
    from tiledattention.bench.methods import METHODS

    for name in ("variants", "workloads"):
        field = next(f for f in fields_of(name) if f.name == "methods")
        text = field.metadata["help"]
        for m in field.metadata["choices"]:
            assert f"{m}, {METHODS[m].description}" in text, (name, m)
            assert text.count(f"; {m}, ") + text.startswith(f"Methods compared - {m}, ") == 1


def fields_of(name: str):
    from dataclasses import fields

    return fields(SECTIONS[name])


def test_the_common_config_the_harness_and_the_launchers_import_no_stage():
    """bench/ (the common config, the grid, the harness, the methods) and launchers/ sit
    below the stages: nothing in them imports tiledattention.stages (or the CLI),
    function-level imports included; the launchers run any task and import no harness."""
    for path in glob.glob(os.path.join(PKG, "launchers", "*.py")):
        assert not {m for m in _imports(path) if m.startswith("tiledattention.bench.runner")}
    for path in (glob.glob(os.path.join(PKG, "bench", "*.py"))
                 + glob.glob(os.path.join(PKG, "launchers", "*.py"))):
        bad = {m for m in _imports(path)
               if m.startswith(("tiledattention.stages", "tiledattention.cli"))}
        assert not bad, f"{os.path.relpath(path, ROOT)} imports {sorted(bad)}"


def test_the_import_walker_sees_function_level_and_relative_imports(tmp_path):
    """The checks above can fail: a function-level relative import of a stage is seen."""
    mod = os.path.join(PKG, "bench", "config.py")
    assert "tiledattention.errors.ConfigError" in _imports(mod)
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from . import model\n    from ..bench import grid\n")
    seen = _imports(str(probe), "tiledattention.stages.probe")
    assert "tiledattention.stages.model" in seen
    assert _stage_module("tiledattention.stages.model") == "model"
    assert "tiledattention.bench.grid" in seen


def test_the_model_stage_names_registry_methods_through_one_alias():
    """The model stage's rows say `sdpa` (transformers' attn_implementation name) for the
    registry's torch_sdpa, as the published references do; study/tables.MODEL_METHODS is
    the one alias, and every implementation the stage times is a registry method."""
    from tiledattention.bench.methods import METHODS
    from tiledattention.stages.model import IMPLS
    from tiledattention.study.presentation.tables import MODEL_METHODS

    assert MODEL_METHODS == {"sdpa": "torch_sdpa"}
    for impl in IMPLS:
        assert MODEL_METHODS.get(impl, impl) in METHODS, impl


def test_published_model_rows_with_the_sdpa_label_still_give_the_ratio_column():
    from tiledattention.study.presentation.tables import model_e2e

    paths = sorted(glob.glob(os.path.join(ROOT, "results", "reference", "*", "data",
                                          "model-rows.jsonl.gz")))
    assert paths, "no reference model rows"
    for path in paths:
        with gzip.open(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        assert "sdpa" in {r["method"] for r in rows}, path
        t = model_e2e(rows)
        ratio = t.columns.index("÷ sdpa")
        sdpa_ok = [r for r in t.rows if r[2] == "sdpa" and r[3] is not None]
        assert sdpa_ok and all(r[ratio] == 1.0 for r in sdpa_ok), path


def test_every_stage_with_rows_the_verbs_read_has_its_writers_registered_by_name():
    """The presentation registers each stage's table and figure writers by stage name (the
    stages import no presentation): every stage whose rows aggregate reads has tables, every
    one figures reads has figures, and no writer names a stage the registry lacks."""
    from tiledattention.study.presentation import figures, tables

    def reads(verb):
        return {n for n, s in STAGES.items() if s.rows and any(v == verb for v, _ in
                                                               s.rows.verbs)}
    assert set(tables.STAGE_TABLES) == reads("aggregate")
    assert set(figures.STAGE_FIGURES) == reads("figures")


def test_a_stage_added_to_the_registry_reaches_the_bundle_aggregate_and_its_readme(
        monkeypatch, tmp_path):
    """A new GPU stage is its descriptor: the bundle copies (and gzips) its rows, the rebuild
    lines unpack them and pass --<name> to aggregate, aggregate reads them, and its not-run
    hook writes the README's bullets, without a line naming it in the publication code."""
    import argparse
    import dataclasses
    import json

    from tiledattention import cli, stages
    from tiledattention.study.publication import create, prose

    def load(out_dir):
        with open(os.path.join(out_dir, "rows.jsonl")) as f:
            return [json.loads(line) for line in f]

    fake = dataclasses.replace(
        stages.STAGES["model"], name="fake",
        rows=stages.Rows(load, "rows.jsonl", verbs=(("aggregate", "the fake table"),)),
        publish=stages.Publish("fake-rows.jsonl", "the fake stage's rows",
                               not_run=lambda d, checked: [f"- fake: {len(load(d))} row(s) "
                                                           "not run"]))
    monkeypatch.setitem(stages.STAGES, "fake", fake)
    study = tmp_path / "study"
    (study / "fake").mkdir(parents=True)
    (study / "fake" / "rows.jsonl").write_text('{"status": "unavailable"}\n')
    assert ("fake/rows.jsonl", "fake-rows.jsonl") in create.stage_rows()
    out = tmp_path / "bundle"
    create._copy_data(str(out), str(study))
    assert (out / "data" / "fake-rows.jsonl").read_bytes() == \
        (study / "fake" / "rows.jsonl").read_bytes()
    assert "data/fake-rows.jsonl.gz" in create._compact_data(str(tmp_path / "c"), str(study))
    lines = prose.rebuild_commands(["data/rows.jsonl.gz", "data/fake-rows.jsonl.gz"])
    assert "gunzip -c data/fake-rows.jsonl.gz > $R/fake/rows.jsonl" in lines
    assert lines[-1].endswith(" --fake $R/fake")
    assert "- fake: 1 row(s) not run" in prose.not_run(str(study), [])
    args = argparse.Namespace(**{**dict.fromkeys(stages.STAGES), "fake": str(study / "fake")})
    assert cli._stage_rows_of(args, "aggregate")["fake"] == [{"status": "unavailable"}]
