"""The study's head shapes past one head dim (issue 48): V's head dim apart from Q/K's (MLA's
192/128) and D past 256 (forward only), from the config through the grid, the methods' rows,
the FLOP model and the tables. CPU only: the kernel's own rows need a GPU
(tests/gpu/test_head_shapes_bench_gpu.py)."""

import json
import os

import pytest
import torch
from study_kit import cli, one_line

from tiledattention.bench import methods as M
from tiledattention.bench.config import ConfigError, from_dict, load_config
from tiledattention.bench.grid import Point, expand, head_label
from tiledattention.bench.runner import run_point
from tiledattention.flops import attention_flops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = torch.device("cpu")
HEADS_CONFIG = os.path.join(ROOT, "config", "shapes-heads.yaml")


def _cfg(head_dims, methods=("tiledattention", "torch_sdpa"), passes=("fwd",), **grid):
    return from_dict({"grid": {"head_dims": head_dims, "passes": list(passes), **grid},
                      "methods": list(methods), "timing": {"warmup": 0, "reps": 1,
                                                           "rounds": 1}, "device": "cpu"})


def test_a_pair_gives_points_with_vs_head_dim_and_their_own_key():
    points = expand(_cfg([[192, 128], 128], seqs=[1024], dtypes=["bfloat16"], causal=[False]))
    assert [(p.head_dim, p.head_dim_v, p.head_label) for p in points] == [
        (192, 128, "192/128"), (128, None, 128)]
    assert points[0].key() == "bfloat16-full-d192v128-sq1024-skv1024-b16-h16-g1"
    assert points[0].as_dict()["head_dim_v"] == 128


def test_a_point_whose_v_head_dim_equals_d_reads_exactly_as_before():
    # The row JSON of a D_v = D point, spelt either way, is the one rows had before D_v.
    before = {"dtype": "float16", "causal": True, "head_dim": 128, "seq_q": 512,
              "seq_kv": 512, "batch": 32, "heads": 16, "gqa": 1, "pass": "fwd"}
    for p in (Point("float16", True, 128, 512, 512, 32, 16),
              Point("float16", True, 128, 512, 512, 32, 16, head_dim_v=128)):
        assert json.dumps(p.as_dict()) == json.dumps(before)
        assert p.key() == "float16-causal-d128-sq512-skv512-b32-h16-g1"
        assert Point.from_dict(p.as_dict()) == p
    assert _cfg([[128, 128]]).grid.head_dims == (128,)  # one spelling per shape


def test_the_heads_config_expands_to_every_shape_seq_mask_and_pass():
    cfg = load_config(HEADS_CONFIG)
    points = expand(cfg)
    assert len(points) == 4 * 5 * 2 * 2
    shapes = {(p.head_label, p.heads) for p in points}
    assert shapes == {("192/128", 16), ("128/64", 16), (512, 4), ("576/512", 16)}
    assert {p.seq_q for p in points} == {1024, 2048, 4096, 8192, 16384}
    assert all(p.batch * p.seq_q == 16384 for p in points)
    assert {p.pass_ for p in points} == {"fwd", "fwd+bwd"}
    assert len({p.key() for p in points}) == len(points)


def test_flops_count_each_matmul_at_its_own_head_dim():
    p = Point("bfloat16", True, 192, 4096, 4096, 4, 16, pass_="fwd+bwd", head_dim_v=128)
    want = 2.0 * 4 * 16 * 4096 * 4096 * (192 + 128) * 3.5 / 2
    assert p.flops() == pytest.approx(want)
    assert p.flops() == attention_flops(4, 16, 4096, 4096, 192, True, "fwd+bwd",
                                        head_dim_v=128)
    same = Point("bfloat16", False, 128, 1024, 1024, 1, 8)
    assert same.flops() == attention_flops(1, 8, 1024, 1024, 128, False)


@pytest.mark.parametrize("head_dims,methods,passes,words", [
    ([[192, 1024]], None, ["fwd"], r"grid.head_dims: \[192, 1024\]: V's head dim 1024 is "
     "over 512"),
    ([[192, 128, 64]], None, ["fwd"], r"\[192, 128, 64\] is not a head dim nor a pair"),
    ([[192, "128"]], None, ["fwd"], r"not a head dim nor a pair \[D, D_v\] of integers"),
    ([[0, 64]], None, ["fwd"], r"grid.head_dims: 0 must be >= 1"),
    ([[128, 64]], ["fa4", "flash"], ["fwd"],
     r"128/64 \(fwd\): no listed method runs it \(fa4: FA4 takes D_v != D only as 192/128.*"
     r"methods that do: tiledattention, torch_sdpa"),
    ([512], ["tiledattention", "fa4"], ["fwd", "fwd+bwd"],
     r"512 \(fwd\+bwd\): no listed method runs it \(tiledattention: D 512: the kernel's "
     r"backward takes head dims up to 256 .*BackwardNotSupportedError.*methods that do: "
     r"torch_sdpa"),
])
def test_a_head_shape_no_listed_method_can_run_is_refused_in_one_line(head_dims, methods,
                                                                      passes, words):
    with pytest.raises(ConfigError, match=words) as err:
        _cfg(head_dims, methods or ("tiledattention", "torch_sdpa"), passes)
    assert "\n" not in str(err.value)


def test_the_cli_says_a_bad_pair_in_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("grid: {head_dims: [[128, 64]], seqs: [64]}\nmethods: [fa4]\n")
    err = one_line(cli("bench", "--config", str(path), "--out", str(tmp_path / "out")))
    assert "128/64 (fwd): no listed method runs it" in err and "tiledattention" in err


@pytest.mark.parametrize("method,d,dv,pass_,runs", [
    ("tiledattention", 192, 128, "fwd+bwd", True),
    ("tiledattention", 128, 64, "fwd+bwd", True),
    ("tiledattention", 512, 512, "fwd", True),
    ("tiledattention", 576, 512, "fwd", True),
    ("tiledattention", 512, 512, "fwd+bwd", False),
    ("tiledattention", 576, 512, "bwd", False),
    ("tiledattention", 192, 576, "fwd", False),  # V past 512
    ("fa4", 192, 128, "fwd+bwd", True),
    ("fa4", 128, 64, "fwd", False),
    ("fa4", 512, 512, "fwd", False),
    ("flash", 192, 128, "fwd", False),
    ("flash_attn", 512, 512, "fwd", False),
    ("sdpa_fa4", 192, 128, "fwd", False),
    ("torch_sdpa", 576, 512, "fwd+bwd", True),
    ("math", 576, 512, "fwd+bwd", True),
    ("eager", 192, 128, "fwd+bwd", True),
])
def test_each_method_declares_the_head_shapes_it_runs(method, d, dv, pass_, runs):
    why = M.get_method(method).head_limits(d, dv, pass_)
    assert (why is None) == runs, why


def test_fa4_on_hopper_takes_192_128_and_not_128_64():
    assert M.fa4_head_dim_error(192, 9, 128) is None
    assert "192/128" in M.fa4_head_dim_error(128, 9, 64)
    assert M.fa4_head_dim_error(128, 9, 128) is None  # D_v = D: as before


def _small(d, dv, pass_="fwd"):
    return Point("float32", False, d, 24, 24, 1, 2, pass_=pass_, head_dim_v=dv)


def _rows(point, methods):
    cfg = _cfg([64], methods)
    return {r["method"]: r for r in run_point(point, list(methods), cfg, CPU, None)}


def test_a_v_head_dim_row_is_measured_with_v_and_its_flops():
    p = _small(192, 128, "fwd+bwd")
    rows = _rows(p, ["torch_sdpa", "eager", "fa4"])
    for m in ("torch_sdpa", "eager"):
        assert rows[m]["status"] == "ok", rows[m]
        assert rows[m]["head_dim_v"] == 128 and rows[m]["grads_correct"]
        assert rows[m]["flops"] == p.flops()
        # q, k, dq, dk at 192; v, out, dO, dv at 128
        assert rows[m]["bytes_moved"] == 4 * 3 * (2 * 24 + 2 * 24) * (192 + 128)
    assert rows["fa4"]["status"] == "unavailable"  # a shape it runs, on a machine it cannot


def test_our_backward_past_256_is_an_unsupported_row_with_the_reason_not_a_crash():
    rows = _rows(_small(512, None, "fwd+bwd"), ["tiledattention", "torch_sdpa"])
    ours = rows["tiledattention"]
    assert ours["status"] == "unsupported"
    assert "backward takes head dims up to 256" in ours["reason"]
    assert "BackwardNotSupportedError" in ours["reason"]
    assert rows["torch_sdpa"]["status"] == "ok"
    unrun = _rows(_small(128, 64), ["fa4"])["fa4"]  # a shape FA4 never runs: on any machine
    assert unrun["status"] == "unsupported" and "192/128" in unrun["reason"]


def test_the_tables_label_a_v_head_dim_as_192_128(tmp_path):
    from tiledattention.study.presentation.tables import write_all

    rows = list(_rows(_small(192, 128), ["torch_sdpa", "eager"]).values())
    # The subject's row: torch SDPA's, renamed (the kernel needs a GPU; the table is the test)
    rows.append({**rows[0], "method": "tiledattention"})
    rows += _rows(_small(64, None), ["torch_sdpa", "eager"]).values()
    write_all(rows, str(tmp_path))
    per_point = (tmp_path / "ratios_per_point.md").read_text()
    assert "| 192/128 |" in per_point and "| 64 |" in per_point
    by_d = (tmp_path / "ratios_by_head_dim.md").read_text()
    assert "| 192/128 |" in by_d
    assert "D=192/128" in (tmp_path / "headline.md").read_text()


def test_figure_names_spell_a_pair_as_point_keys_do():
    from tiledattention.study.presentation.figures import names

    got = names([[192, 128], 128, 512], ["fwd"])
    assert got[:3] == ["throughput_fwd_d128", "throughput_fwd_d192v128", "throughput_fwd_d512"]
    assert head_label(192, 128) == "192/128" and head_label(128, 128) == 128


def test_a_v_head_dim_gets_its_own_throughput_figure(tmp_path):
    from tiledattention.study.presentation.figures import throughput_vs_seq

    rows = list(_rows(_small(192, 128), ["torch_sdpa"]).values())
    rows += _rows(_small(192, None), ["torch_sdpa"]).values()
    stems = {os.path.splitext(os.path.basename(p))[0]
             for p in throughput_vs_seq(rows, str(tmp_path))}
    assert stems == {"throughput_fwd_d192", "throughput_fwd_d192v128"}


def test_a_decode_section_takes_mlas_absorbed_shape_and_counts_v_in_the_cache_cap():
    cfg = from_dict({"decode": {"enabled": True, "head_dims": [[576, 512]], "seqs_q": [1],
                                "seqs_kv": [4096, 65536], "batches": [1], "heads": 16,
                                "gqa": [16], "max_kv_gib": 0.07},
                     "grid": {"seqs": [64], "head_dims": [64], "dtypes": ["bfloat16"],
                              "causal": [False]}})
    (point,) = [p for p in expand(cfg) if p.seq_q == 1]  # K/V at 65536: 0.13 GiB > the cap
    assert (point.head_dim, point.head_dim_v, point.heads_kv) == (576, 512, 1)
    assert "d576v512-sq1-skv4096" in point.key()
    with pytest.raises(ConfigError, match=r"decode.head_dims: 576/512 \(fwd\): no listed"):
        from_dict({"decode": {"enabled": True, "head_dims": [[576, 512]]},
                   "methods": ["fa4", "flash"]})
