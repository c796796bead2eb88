"""The workloads stage on a CPU: its config refuses bad input in one line naming
`workloads.<key>` (exit 2), the seeded length generator follows its stated lognormal and
fills its totals exactly, the FLOP model counts ragged causal pairs per sequence, the tables
and headline come from synthetic rows, and an end-to-end run checks every row against
float64 (a wrong output is a `wrong` row, never timed; GPU methods `unavailable` with the
reason; rows recorded without a GPU set aside once one is there)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest
import torch

from tiledattention.bench import workload_cases as wc
from tiledattention.bench.config import ConfigError
from tiledattention.cli import main
from tiledattention.flops import attended_pairs, attention_flops, ragged_attention_flops
from tiledattention.stages import stage_from_dict

TINY = {"kinds": ["varlen", "decode", "prefill"], "varlen_tokens": [96],
        "varlen_head_dims": [32], "varlen_heads": 2, "varlen_gqa": [1, 2], "causal": [True],
        "doc_mu": 3.0, "doc_min": 4, "doc_max": 48, "page_sizes": [16], "decode_batches": [2],
        "prefill_batches": [2], "chunk": 8, "paged_heads": 4, "paged_gqa": 2,
        "paged_head_dim": 32, "context_mu": 3.5, "context_max": 60, "warmup": 0, "reps": 1,
        "rounds": 1}


def _cfg(**kw):
    return stage_from_dict("workloads", {**TINY, **kw})


# --- config -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--kinds", "train"], "argument --kinds: invalid choice: 'train'"),
    (["--config", "{cfg}"], "workloads: unknown key(s) ['seqz']; valid keys are"),
    (["--page-sizes", "48"], "workloads.page_sizes: 48 is not one of [16, 32, 64, 128, 256]"),
    (["--doc-min", "100", "--doc-max", "10"], "workloads.doc_min: 100 exceeds doc_max = 10"),
    (["--paged-heads", "32", "--paged-gqa", "5"],
     "workloads.paged_gqa: 5 does not divide paged_heads = 32"),
    (["--doc-sigma", "0"], "argument --doc-sigma: '0' must be a positive doc_sigma"),
])
def test_bad_input_is_one_line_naming_the_key_and_exit_2(argv, words, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("workloads: {seqz: [1024]}\n")
    argv = [a.replace("{cfg}", str(bad)) for a in argv]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["workloads", "--out", str(tmp_path / "out"), *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tiledattn workloads") and words in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "rows.jsonl").exists()


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^workloads.methods: 'eager' is not one of"):
        stage_from_dict("workloads", {"methods": ["eager"]})
    with pytest.raises(ConfigError, match=r"^workloads.varlen_gqa: \[3\] do not divide "):
        stage_from_dict("workloads", {"varlen_gqa": [1, 3]})
    with pytest.raises(ConfigError, match=r"^workloads.context_min: 9 exceeds context_max"):
        stage_from_dict("workloads", {"context_min": 9, "context_max": 8})


def test_the_default_grid_is_the_issues():
    from tiledattention.stages.workloads import points

    pts = points(stage_from_dict("workloads", {}))
    varlen = [p for p in pts if p.kind == "varlen"]
    assert {p.tokens for p in varlen} == {16384, 32768, 65536}
    assert {(p.head_dim, p.gqa) for p in varlen} == {(64, 1), (128, 1), (128, 4)}
    assert {p.pass_ for p in varlen} == {"fwd", "fwd+bwd"} and {p.heads for p in varlen} == {16}
    paged = [p for p in pts if p.paged]
    assert {p.page_size for p in paged} == {16, 64, 256}
    assert {(p.heads, p.heads_kv, p.head_dim) for p in paged} == {(32, 8, 128)}
    assert min(p.batch for p in paged) == 1 and max(p.batch for p in paged) == 64
    assert {p.chunk for p in paged if p.kind == "prefill"} == {512}
    assert all(set(p.seqs_q) == {1} for p in paged if p.kind == "decode")
    assert len({p.key() for p in pts}) == len(pts)


# --- lengths ------------------------------------------------------------------------------
DIST = wc.Lognormal(7.0, 1.0, 16, 8192)


def test_packed_lengths_are_seeded_and_fill_the_total_exactly():
    a = wc.packed_lengths(65536, DIST, 5)
    assert a == wc.packed_lengths(65536, DIST, 5)
    assert a != wc.packed_lengths(65536, DIST, 6)
    assert sum(a) == 65536 and all(16 <= n <= 8192 for n in a[:-1]) and 1 <= a[-1] <= 8192


def test_lengths_follow_the_stated_lognormal():
    draws = wc.context_lengths(20000, wc.Lognormal(7.0, 1.0, 1, 10**9), 3)
    assert statistics.median(draws) == pytest.approx(math.exp(7.0), rel=0.05)
    logs = [math.log(n) for n in draws]
    assert statistics.pstdev(logs) == pytest.approx(1.0, rel=0.05)
    assert DIST.describe() == \
        "lognormal(mu=7, sigma=1; median 1097 tokens) clipped to [16, 8192]"


def test_a_points_lengths_and_seed_are_in_its_rows_and_shared_across_its_passes():
    from tiledattention.stages.workloads import points

    pts = [p for p in points(_cfg()) if p.kind == "varlen"]
    assert len({p.seqs_q for p in pts}) == 1 and len({p.lengths_seed for p in pts}) == 1
    row = pts[0].as_dict()
    assert row["seqs_q"] == list(pts[0].seqs_q) and row["lengths_seed"] == pts[0].lengths_seed
    assert row["total_q"] == 96 and "lognormal(mu=3" in row["length_dist"]


# --- FLOPs --------------------------------------------------------------------------------
def _brute_pairs(sq, sk, causal):
    return sum(1 for i in range(sq) for j in range(sk) if not causal or j <= i + sk - sq)


@pytest.mark.parametrize("sq,sk", [(1, 100), (8, 100), (100, 100), (7, 3), (0, 5), (5, 0)])
def test_ragged_causal_flops_count_each_sequences_unmasked_pairs(sq, sk):
    assert attended_pairs(sq, sk, True) == _brute_pairs(sq, sk, True)
    assert attended_pairs(sq, sk, False) == sq * sk


def test_ragged_flops_count_useful_tokens_not_padding_nor_the_nominal_half():
    # Decode (Sq = 1) attends its whole context: the dense model's nominal half would halve it.
    assert ragged_attention_flops(32, [1], [4096], 128, True) == 4.0 * 32 * 128 * 4096
    assert attention_flops(1, 32, 1, 4096, 128, True) == 4.0 * 32 * 128 * 4096 / 2
    lens = [10, 300, 7]
    useful = ragged_attention_flops(16, lens, lens, 64, False)
    assert useful == 4.0 * 16 * 64 * sum(n * n for n in lens)
    assert useful < attention_flops(3, 16, 300, 300, 64, False)  # the padded batch's
    assert ragged_attention_flops(16, lens, lens, 64, True, "fwd+bwd") == \
        3.5 * 4.0 * 16 * 64 * sum(n * (n + 1) // 2 for n in lens)


def test_decode_bytes_count_the_context_read_and_q_and_out():
    from tiledattention.stages.workloads import points

    p = next(p for p in points(_cfg()) if p.kind == "decode")
    assert wc.bytes_read(p) == 2 * (2 * sum(p.seqs_kv) * 2 * 32 + 2 * p.batch * 4 * 32)


# --- tables and headline from synthetic rows ----------------------------------------------
def _rows():
    from tiledattention.stages.workloads import points

    pts = {p.kind: p for p in points(_cfg(varlen_gqa=[1])) if p.pass_ == "fwd"}
    out = []
    for p in pts.values():
        for m, ms, status in (("tiledattention", 1.0, "ok"), ("fa4", 1.2, "ok"),
                              ("sdpa_padded", 3.0, "ok"), ("flex", None, "unavailable")):
            r = {"point_key": p.key(), **p.as_dict(), "method": m, "status": status}
            if ms:
                r.update(time_ms={"median_ms": ms}, call_us=ms * 1e3, tflops=10 / ms,
                         gbytes_per_s=100 / ms if p.paged else None)
            else:
                r["reason"] = "FlexAttention runs here on a CUDA GPU only"
            out.append(r)
    return out


def test_each_table_puts_ours_against_the_fastest_baseline_named_and_each_baseline():
    from tiledattention.study.presentation import workloads_report as wr

    rows = _rows()
    tables = {t.name: t for t in wr.tables(rows)}
    assert list(tables) == list(wr.NAMES)
    fwd = tables["workloads_varlen_fwd"]
    cells = dict(zip(fwd.columns, fwd.rows[0]))
    assert cells["fastest baseline"] == "fa4" and cells["× fastest"] == pytest.approx(1.2)
    assert cells["× sdpa_padded"] == pytest.approx(3.0)
    assert cells["× flex"] == "unavailable" and cells["ours TFLOP/s"] == pytest.approx(10)
    assert any("lognormal(mu=3" in n for n in fwd.notes)
    assert any(n == "flex unavailable: FlexAttention runs here on a CUDA GPU only"
               for n in fwd.notes)
    dec = tables["workloads_decode"]
    cells = dict(zip(dec.columns, dec.rows[0]))
    assert cells["ours GB/s"] == pytest.approx(100) and cells["its GB/s"] == pytest.approx(
        100 / 1.2)
    assert tables["workloads_prefill"].rows and not tables["workloads_varlen_fwdbwd"].rows


def test_the_headline_and_the_readme_sentence_show_the_ratio_to_the_fastest_baseline():
    from tiledattention.study.presentation import workloads_report as wr
    from tiledattention.study.presentation.headline import table

    rows = _rows()
    head = table([], None, rows)
    labels = [r[0] for r in head.rows]
    assert "fastest baseline (workloads: packed varlen batches, forward)" in labels
    first = head.rows[labels.index("fastest baseline (workloads: packed varlen batches, "
                                   "forward)")]
    assert first[1] == 1 and first[3] == pytest.approx(1.2) and first[-1] == "fa4 1"
    text = wr.sentence(rows)
    assert "(lengths: contexts lognormal(mu=3.5" in text and "; documents lognormal(mu=3" in text
    assert "1.200x over 1 points" in text
    assert wr.sentence([]) == ""


def test_without_ours_ok_the_sentence_says_why():
    from tiledattention.study.presentation import workloads_report as wr

    rows = [{**r, "status": "unavailable", "reason": "needs a CUDA GPU"}
            if r["method"] in ("tiledattention", "fa4") else r for r in _rows()]
    assert "no speedup over a baseline measured (tiledattention unavailable: needs a CUDA " \
        "GPU)." in wr.sentence(rows)


# --- end to end on the CPU ----------------------------------------------------------------
def test_every_row_is_checked_against_float64_and_gpu_methods_say_why(tmp_path, monkeypatch):
    from tiledattention.bench import runner
    from tiledattention.stages.workloads import load_rows, points, run_workloads

    monkeypatch.setattr(runner, "no_gpu_reason", lambda: "no CUDA GPU visible on node7")
    cfg = _cfg()
    out = run_workloads(cfg, str(tmp_path))
    rows = load_rows(str(tmp_path))
    assert out["status"] == "unavailable"
    assert len(rows) == len(points(cfg)) * len(cfg.methods)
    for r in rows:
        if r["method"] == "sdpa_padded":
            assert r["status"] == "ok" and r["correct"], r
            assert r["rel_err"] <= r["rtol"] and r["time_ms"]["median_ms"] > 0
            if r["pass"] == "fwd+bwd":
                assert r["grads_correct"], r["grad_rel_err"]
            if r["kind"] == "decode":
                assert r["gbytes_per_s"] > 0
        else:
            assert r["status"] == "unavailable", r
            assert r["reason"] == "needs a CUDA GPU (no CUDA GPU visible on node7)"
    manifest = json.loads((tmp_path / "manifest-workloads.json").read_text())
    assert manifest["config"] == json.loads(json.dumps(cfg.as_dict()))


def test_a_wrong_output_is_a_wrong_row_and_never_timed(tmp_path, monkeypatch):
    from tiledattention.bench import methods, runner
    from tiledattention.stages.workloads import load_rows, run_workloads

    real = methods.METHODS["sdpa_padded"].workload

    def off_by_a_bit(inputs, point):  # the padded call, its output nudged
        prep = real(inputs, point)
        call = prep.call
        prep.call = lambda: call() * 1.05
        return prep

    monkeypatch.setitem(methods.METHODS, "sdpa_padded", dataclasses.replace(
        methods.METHODS["sdpa_padded"], workload=off_by_a_bit))
    monkeypatch.setattr(runner, "no_gpu_reason", lambda: "no GPU")
    run_workloads(_cfg(methods=["sdpa_padded"]), str(tmp_path))
    rows = load_rows(str(tmp_path))
    assert rows and all(r["status"] == "wrong" and "time_ms" not in r for r in rows), rows
    assert all(r["rel_err"] > r["rtol"] for r in rows)


def test_rows_measured_without_a_gpu_are_measured_again_where_one_is(tmp_path, monkeypatch):
    from tiledattention.bench import runner
    from tiledattention.stages.workloads import load_rows, points, run_workloads

    cfg = _cfg(kinds=["decode"], methods=["sdpa_padded", "fa4"])
    monkeypatch.setattr(runner, "no_gpu_reason", lambda: "no GPU")
    run_workloads(cfg, str(tmp_path))
    assert load_rows(str(tmp_path))
    planned = []
    monkeypatch.setattr(runner, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(runner, "resolve_device", lambda name: torch.device("cpu"))
    monkeypatch.setattr(runner, "measure", lambda plan, *a, **kw: planned.extend(plan))
    run_workloads(cfg, str(tmp_path))
    assert [p.key() for p, _ in planned] == [p.key() for p in points(cfg)]
    assert load_rows(str(tmp_path)) == [] and list(tmp_path.glob("stale-*"))


def test_a_resumed_run_keeps_the_run_that_measured_its_earlier_rows(tmp_path, monkeypatch):
    """As the bench's shards do: the study's manifest then checks that run's stack too."""
    from tiledattention.bench import runner
    from tiledattention.stages.workloads import run_workloads

    cfg = _cfg(kinds=["decode"], methods=["sdpa_padded"])
    monkeypatch.setattr(runner, "no_gpu_reason", lambda: "no GPU")
    run_workloads(cfg, str(tmp_path))
    path = tmp_path / "manifest-workloads.json"
    first = json.loads(path.read_text())
    assert first["earlier_runs"] == []
    run_workloads(cfg, str(tmp_path))
    again = json.loads(path.read_text())
    assert [e["started"] for e in again["earlier_runs"]] == [first["started"]]
    assert again["earlier_runs"][0]["git_commit"] == first["git_commit"]


# --- baselines that cannot run say why --------------------------------------------------
def _point(kind):
    from tiledattention.stages.workloads import points

    return next(p for p in points(_cfg()) if p.kind == kind)


def test_flashinfer_without_its_wheel_is_unavailable_with_the_reason(monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    from tiledattention.bench.methods import METHODS, Unavailable

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "flashinfer" else real(name, *a))
    on_gpu = SimpleNamespace(q=SimpleNamespace(device=torch.device("cuda")))
    with pytest.raises(Unavailable, match=r"flashinfer wheel \(flashinfer-python.*not installed"):
        METHODS["flashinfer"].workload(on_gpu, _point("decode"))


def test_torch_varlen_takes_what_the_installed_torch_offers(monkeypatch):
    """Causality through is_causal (PyTorch 2.10) or window_size=(-1, 0) (later); a paged
    cache only where varlen_attn takes a block_table, else unavailable, naming why."""
    import torch.nn.attention.varlen as varlen

    from tiledattention.bench import methods
    from tiledattention.bench.methods import METHODS, Unavailable
    from tiledattention.stages.workloads import points

    monkeypatch.setattr(methods, "_cuda_only", lambda point, device: None)
    seen = {}

    def old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
            return_aux=None):
        seen.update(is_causal=is_causal)
        return query

    def new(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None,
            scale=None, window_size=(-1, -1), enable_gqa=False, seqused_k=None,
            block_table=None):
        seen.update(window_size=window_size, enable_gqa=enable_gqa, block_table=block_table)
        return query

    point = _point("varlen")
    inputs = wc.make_inputs(point, 0, torch.device("cpu"))
    monkeypatch.setattr(varlen, "varlen_attn", old)
    METHODS["torch_varlen"].workload(inputs, point).call()
    assert seen == {"is_causal": True}
    with pytest.raises(Unavailable, match="takes no block_table"):
        paged = _point("decode")
        METHODS["torch_varlen"].workload(wc.make_inputs(paged, 0, torch.device("cpu")), paged)
    monkeypatch.setattr(varlen, "varlen_attn", new)
    gqa = next(p for p in points(_cfg()) if p.kind == "varlen" and p.gqa == 2)
    METHODS["torch_varlen"].workload(wc.make_inputs(gqa, 0, torch.device("cpu")), gqa).call()
    assert seen["window_size"] == (-1, 0) and seen["enable_gqa"] is True
    paged = _point("prefill")
    METHODS["torch_varlen"].workload(wc.make_inputs(paged, 0, torch.device("cpu")),
                                     paged).call()
    assert seen["block_table"] is not None
