"""The workflow's config schema and tiledattention's config classes cannot disagree: the
schema's `bench` and stage sections are generated from the dataclasses where the workflow
uses them (``stages.study_schema``), and its enums are the Python ones."""

from __future__ import annotations

import copy

import pytest
import yaml
from jsonschema import Draft202012Validator

from tiledattention.bench.config import ConfigError, from_dict, json_schema
from tiledattention.stages.model import model_from_dict, model_json_schema

SCHEMA_PATH = "workflow/schemas/config.schema.yaml"


@pytest.fixture(scope="module")
def schema():
    """The workflow's schema as common.smk builds it: the file's study keys and the sections
    generated from the dataclasses."""
    from tiledattention.stages import study_schema

    with open(SCHEMA_PATH) as f:
        return study_schema(yaml.safe_load(f))


def test_bench_section_is_generated_from_the_dataclasses(schema):
    assert schema["properties"]["bench"] == json_schema()


@pytest.mark.parametrize("stage", ["tune", "profile", "variants"])
def test_gpu_stage_sections_are_generated_from_their_dataclasses(schema, stage):
    from tiledattention.stages import stage_json_schema

    assert schema["properties"][stage] == stage_json_schema(stage)


@pytest.mark.parametrize("stage,section", [
    ("tune", {"space": "huge"}), ("tune", {"passes": ["bwd"]}), ("tune", {"seqs": [0]}),
    ("profile", {"methods": ["eager"]}), ("profile", {"warmup": -1}),
    ("profile", {"clock_control": "boost"}), ("profile", {"tokenz": 1}),
    ("variants", {"variants": ["sinkz"]}), ("variants", {"seqs": [0]}),
    ("variants", {"passes": ["bwd"]}), ("variants", {"head_dims": [512]})])
def test_schema_and_python_refuse_the_same_stage_sections(schema, stage, section):
    from tiledattention.stages import stage_from_dict

    config = {"results_dir": "r", "shards": 1, "launcher": "local", stage: section}
    assert list(Draft202012Validator(schema).iter_errors(config)), f"the schema accepts {section}"
    with pytest.raises(ConfigError, match=rf"^{stage}"):
        stage_from_dict(stage, section)


def test_a_stage_command_line_is_written_from_its_config():
    from tiledattention.bench.config import stage_args
    from tiledattention.stages import stage_from_dict

    tune = stage_from_dict("tune", {"seqs": [512], "passes": ["fwd", "fwd+bwd"]})
    assert stage_args(tune) == "--space quick --seqs 512 --pass fwd fwd+bwd"
    prof = stage_from_dict("profile", {"shapes": ["float16:causal:128:4096"]})
    assert stage_args(prof).startswith("--shape float16:causal:128:4096 --methods "
                                       "tiledattention torch_sdpa --clock-control base")


def test_model_section_is_generated_from_the_dataclasses(schema):
    assert schema["properties"]["model"] == model_json_schema()


@pytest.mark.parametrize("model", [
    {"batches": [0]}, {"batches": []}, {"batches": [1, 1]}, {"prompt": 0},
    {"prompt": 8000}, {"steps": True}, {"reps": 0}, {"enabled": "yes"}, {"layers": 2},
])
def test_schema_and_python_refuse_the_same_model_sections(schema, model):
    config = {"results_dir": "r", "shards": 1, "launcher": "local", "model": model}
    assert list(Draft202012Validator(schema).iter_errors(config)), f"the schema accepts {model}"
    with pytest.raises(ConfigError, match=r"^model"):
        model_from_dict(model)


def study(bench: dict) -> dict:
    return {"results_dir": "r", "shards": 1, "launcher": "local", "bench": bench}


@pytest.mark.parametrize("bench", [
    {"grid": {"seqs": [0]}}, {"grid": {"seqs": []}}, {"grid": {"tokens": 0}},
    {"grid": {"dtypes": ["float64"]}}, {"grid": {"shape_policy": "auto"}},
    {"grid": {"seqs_kv": [0]}}, {"grid": {"heads_per_gpu": 3}}, {"timing": {"warmup": -1}},
    {"timing": {"reps": 0}}, {"timing": {"flush_l2": 1}},
    {"correctness": {"rtol_float16": 0}}, {"correctness": {"rtol_float16": float("inf")}},
    {"correctness": {"rtol_bfloat16": 2.0}}, {"correctness": {"rtol_float32": -1e-3}},
    {"methods": ["eager", "eager"]}, {"device": "tpu"}, {"seed": "x"},
])
def test_schema_and_python_refuse_the_same_configs(schema, bench):
    errors = list(Draft202012Validator(schema).iter_errors(study(copy.deepcopy(bench))))
    assert errors, f"the schema accepts {bench}"
    with pytest.raises(ConfigError):
        from_dict(bench)


def test_nan_which_json_cannot_write_is_refused_by_python():
    # YAML's .nan reaches the config; JSON schema has no NaN to compare against.
    with pytest.raises(ConfigError, match="rtol_float16: nan must be > 0"):
        from_dict({"correctness": {"rtol_float16": float("nan")}})


@pytest.mark.parametrize("path", ["config/config.yaml", "config/smoke.yaml"])
def test_schema_and_python_accept_the_shipped_study_configs(schema, path):
    with open(path) as f:
        config = yaml.safe_load(f)
    if "bench" not in config:
        pytest.skip(f"{path} has no bench section")
    assert not list(Draft202012Validator(schema).iter_errors(study(config["bench"])))
    from_dict(config["bench"])


def test_the_schemas_enums_are_the_ones_python_holds(schema):
    from tiledattention.launchers.base import LAUNCHERS
    from tiledattention.schedules.space import SPACES
    from tiledattention.stages.profile import CLOCK_CONTROL, KERNEL_FILTERS

    props = schema["properties"]
    assert sorted(props["launcher"]["enum"]) == sorted(LAUNCHERS)
    assert props["tune"]["properties"]["space"]["enum"] == list(SPACES)
    profile = props["profile"]["properties"]
    assert sorted(profile["methods"]["items"]["enum"]) == sorted(KERNEL_FILTERS)
    assert profile["clock_control"]["enum"] == list(CLOCK_CONTROL)
