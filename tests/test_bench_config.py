"""Benchmark configs: validated once, unknown keys rejected with the valid ones."""

import dataclasses

import pytest

from tiledattention.bench.config import BenchConfig, ConfigError, from_dict, load_config
from tiledattention.bench.grid import Point, expand, parse_shard, shard, tokens_shape


def test_defaults_are_the_papers_80_point_grid():
    points = expand(from_dict({}))
    assert len(points) == 80
    assert all(p.batch * p.seq_q == 16384 for p in points)
    assert {(p.head_dim, p.heads) for p in points} == {(64, 32), (96, 16), (128, 16), (160, 16)}


@pytest.mark.parametrize("data,words", [
    ({"grid": {"seq": [1]}}, r"grid: unknown key\(s\) \['seq'\]; valid keys are \['seqs'"),
    ({"mehtods": ["eager"]}, r"unknown key\(s\) \['mehtods'\]; valid keys are"),
    ({"grid": {"seqs": [64, "x"]}}, r"grid.seqs: 'x' is not an integer"),
    ({"grid": {"seqs": []}}, r"grid.seqs: must not be empty"),
    ({"grid": {"seqs": [0]}}, r"grid.seqs: 0 must be >= 1"),
    ({"grid": {"dtypes": ["float64"]}}, r"grid.dtypes: 'float64' is not one of"),
    ({"grid": {"causal": ["yes"]}}, r"grid.causal: 'yes' is not true/false"),
    ({"grid": {"shape_policy": "auto"}}, r"grid.shape_policy"),
    ({"methods": ["triton"]}, r"methods: 'triton' is not one of \["),
    ({"methods": ["eager", "eager"]}, r"more than once"),
    ({"timing": {"reps": 0}}, r"timing.reps: 0 must be >= 1"),
    ({"correctness": {"rtol_float16": float("nan")}}, r"rtol_float16: nan must be > 0"),
    ({"timing": {"flush_l2": 1}}, r"timing.flush_l2: 1 is not true/false"),
    ({"device": "tpu"}, r"device: 'tpu' is not one of"),
    ({"grid": [1, 2]}, r"grid: expected a mapping"),
])
def test_bad_configs_name_the_key_and_the_problem(data, words):
    with pytest.raises(ConfigError, match=words):
        from_dict(data)


def test_config_files_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml: cannot read"):
        load_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: {seqs: [1, 2}\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(str(bad))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("grid:\n  heads_per_gpu: 3\n")
    with pytest.raises(ConfigError, match="unknown.yaml: grid: unknown key"):
        load_config(str(unknown))


def test_the_smoke_config_loads():
    cfg = load_config("config/bench-smoke.yaml")
    assert len(expand(cfg)) == 8 and cfg.grid.shape_policy == "explicit"


def test_the_sdpa_comparison_config_is_the_paper_grid_against_fused_backends():
    cfg = load_config("config/bench-sdpa.yaml")
    assert expand(cfg) == expand(from_dict({}))
    assert cfg.methods == ("tiledattention", "torch_sdpa", "flash", "cudnn", "fa4", "sdpa_fa4")


def test_the_backward_config_is_the_paper_grid_timed_forward_plus_backward():
    cfg = load_config("config/bench-backward.yaml")
    assert [dataclasses.replace(p, pass_="fwd") for p in expand(cfg)] == expand(from_dict({}))
    assert {p.pass_ for p in expand(cfg)} == {"fwd+bwd"}
    assert cfg.methods == ("tiledattention", "torch_sdpa", "flash", "cudnn", "fa4", "sdpa_fa4")


def test_one_shape_rule_gives_16_heads_where_width_is_not_a_multiple_of_d():
    assert tokens_shape(4096, 96) == (4, 16) and tokens_shape(4096, 128) == (4, 16)
    assert tokens_shape(512, 64) == (32, 32) and tokens_shape(32768, 160) == (1, 16)
    assert Point.of_tokens("float16", True, 96, 4096).key() == \
        "float16-causal-d96-sq4096-skv4096-b4-h16-g1"


def test_config_hash_changes_with_the_config():
    assert from_dict({}).digest() == BenchConfig().digest()
    assert from_dict({"seed": 1}).digest() != BenchConfig().digest()


@pytest.mark.parametrize("n", [1, 2, 3, 7, 80, 100])
def test_shards_partition_the_grid_exactly(n):
    points = expand(from_dict({}))
    parts = [shard(points, i, n) for i in range(n)]
    flat = [p for part in parts for p in part]
    assert sorted(flat, key=lambda p: p.key()) == sorted(points, key=lambda p: p.key())
    assert len({p.key() for p in flat}) == len(points)
    assert parts == [shard(expand(from_dict({})), i, n) for i in range(n)]  # deterministic


@pytest.mark.parametrize("text", ["1", "2/2", "-1/3", "a/b", "1/0"])
def test_bad_shard_specs_are_refused(text):
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(text)


def test_gqa_and_cross_attention_axes_expand():
    cfg = from_dict({"grid": {"seqs": [1, 128], "seqs_kv": [1000], "gqa": [1, 4],
                              "shape_policy": "explicit", "heads": 8, "head_dims": [64],
                              "dtypes": ["float16"], "causal": [False]}})
    keys = [p.key() for p in expand(cfg)]
    assert keys == ["float16-full-d64-sq1-skv1000-b1-h8-g1",
                    "float16-full-d64-sq1-skv1000-b1-h8-g4",
                    "float16-full-d64-sq128-skv1000-b1-h8-g1",
                    "float16-full-d64-sq128-skv1000-b1-h8-g4"]


def test_the_decode_section_adds_capped_non_causal_points_only_when_enabled():
    base = {"grid": {"seqs": [512], "head_dims": [64], "dtypes": ["float16"],
                     "causal": [False]}}
    assert len(expand(from_dict(base))) == 1
    cfg = from_dict({**base, "decode": {"enabled": True, "seqs_q": [1, 4],
                                        "seqs_kv": [1024, 32768], "batches": [1, 64],
                                        "gqa": [1, 4], "max_kv_gib": 4}})
    dec = expand(cfg)[1:]
    assert all(not p.causal and p.heads == 32 and p.gqa in (1, 4) for p in dec)
    # B64 x 32 heads x 32k x 128 x bf16 x (K, V) = 32 GiB (MHA) and 8 GiB (GQA 4): over 4
    assert not any(p.batch == 64 and p.seq_kv == 32768 for p in dec)
    assert {(p.seq_q, p.seq_kv, p.batch, p.gqa) for p in dec} >= {(1, 1024, 1, 1),
                                                                  (4, 32768, 1, 4)}
    with pytest.raises(ConfigError, match="decode: unknown key"):
        from_dict({"decode": {"enabled": True, "batch": 3}})


def test_the_shipped_decode_config_expands_to_decode_points_under_the_kv_cap():
    cfg = load_config("config/bench-decode.yaml")
    assert {"fa4", "sdpa_fa4"} <= set(cfg.methods)  # FA4 with its own split/pack heuristics
    points = expand(cfg)[1:]
    assert len(points) > 100 and {p.seq_q for p in points} == {1, 4, 8, 16}
    assert max(2 * p.batch * p.heads_kv * p.seq_kv * p.head_dim * 2 for p in points) <= 8 << 30
