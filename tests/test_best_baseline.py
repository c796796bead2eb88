"""TiledAttention against the fastest fused baseline at each point
(study/presentation/ratios.py BEST): which methods count, ties, points where none is ok, rows
that are not ok ignored, each pass and each measure on its own; the headline computed once
(study/presentation/headline.py) for the table and the README's sentences."""

from __future__ import annotations

import pytest

from tiledattention.bench import methods
from tiledattention.study.presentation import headline, tables
from tiledattention.study.presentation.ratios import (
    BEST,
    best_rows,
    compare,
    fastest_counts,
    fused_baselines,
    with_best,
)
from tiledattention.study.publication import prose


def _row(method, kernel_ms=None, call_us=None, *, point="p1", pass_="fwd", status="ok",
         head_dim=64, dtype="float16"):
    key = point if pass_ == "fwd" else f"{point}-{pass_.replace('+', '')}"
    r = {"point_key": key, "method": method, "status": status, "pass": pass_,
         "dtype": dtype, "causal": False, "head_dim": head_dim, "seq_q": 512, "seq_kv": 512,
         "batch": 1, "heads": 8, "gqa": 1}
    if kernel_ms is not None:
        r["time_ms"] = {"median_ms": kernel_ms}
    if call_us is not None:
        r["call_us"] = call_us
    if status != "ok":
        r["reason"] = "why not"
    return r


def _best(rows):
    return {r["point_key"]: r for r in best_rows(rows)}


def test_the_fused_baselines_are_the_registrys_less_math_eager_and_the_subject():
    every = list(methods.METHODS) + ["tiledattention@64x64_o1_c1_lk2_lv4", "sdpa", "x"]
    fused = fused_baselines(every)
    assert {"torch_sdpa", "flash", "cudnn", "efficient", "flash_attn", "flex",
            "sdpa_mask"} <= set(fused)
    assert not {"math", "eager", "tiledattention", "sdpa", "x"} & set(fused)
    assert not [n for n in fused if "@" in n]
    assert fused == [m for m in methods.METHODS if m in fused]  # registry order


def test_the_fastest_ok_fused_row_is_taken_per_measure_and_named():
    rows = [_row("tiledattention", 1.0, 100.0), _row("torch_sdpa", 1.2, 90.0),
            _row("cudnn", 0.9, 120.0), _row("flash", 1.5, 95.0), _row("eager", 0.1, 10.0)]
    b = _best(rows)["p1"]
    assert b["method"] == BEST and b["status"] == "ok"
    assert b["time_ms"]["median_ms"] == 0.9 and b["best_of"]["kernel"] == "cudnn"
    assert b["call_us"] == 90.0 and b["best_of"]["call"] == "torch_sdpa"  # not eager (unfused)
    assert compare(with_best(rows), "tiledattention", BEST).geomean == pytest.approx(0.9)
    assert compare(with_best(rows), "tiledattention", BEST, measure="call").geomean == \
        pytest.approx(0.9)


def test_a_tie_names_every_fastest_baseline_in_registry_order():
    rows = [_row("tiledattention", 1.0), _row("cudnn", 0.8), _row("torch_sdpa", 0.8)]
    assert _best(rows)["p1"]["best_of"]["kernel"] == "torch_sdpa=cudnn"
    assert fastest_counts(rows, "tiledattention") == {"torch_sdpa=cudnn": 1}


def test_error_unavailable_and_wrong_rows_never_count_as_the_fastest():
    rows = [_row("tiledattention", 1.0), _row("cudnn", 0.1, status="error"),
            _row("flash", 0.2, status="wrong"), _row("flash_attn", status="unavailable"),
            _row("torch_sdpa", 1.5)]
    b = _best(rows)["p1"]
    assert b["best_of"] == {"kernel": "torch_sdpa"} and b["time_ms"]["median_ms"] == 1.5
    assert "call_us" not in b  # no fused row has a call latency: none invented


def test_a_point_where_no_fused_baseline_is_ok_says_so_and_is_not_compared():
    rows = [_row("tiledattention", 1.0), _row("cudnn", status="unavailable"),
            _row("flash", status="error"), _row("tiledattention", 1.0, point="p2"),
            _row("torch_sdpa", 2.0, point="p2"), _row("tiledattention", 1.0, point="p3")]
    best = _best(rows)
    assert best["p1"]["status"] == "none" and "ratio" not in best["p1"]
    assert best["p1"]["reason"] == "no fused baseline ok here (flash error, cudnn unavailable)"
    assert "p3" not in best  # no fused baseline ran there at all
    s = compare(with_best(rows), "tiledattention", BEST)
    assert (s.n, s.geomean, s.not_compared) == (1, 2.0, 2)  # p1 and p3 counted, not invented


def test_each_pass_has_its_own_fastest_baseline():
    rows = [_row("tiledattention", 1.0), _row("cudnn", 0.9), _row("flash", 1.1),
            _row("tiledattention", 4.0, pass_="fwd+bwd"), _row("cudnn", 5.0, pass_="fwd+bwd"),
            _row("flash", 4.5, pass_="fwd+bwd")]
    best = _best(rows)
    assert best["p1"]["best_of"]["kernel"] == "cudnn"
    assert best["p1-fwdbwd"]["best_of"]["kernel"] == "flash"
    assert best["p1-fwdbwd"]["pass"] == "fwd+bwd"
    assert len(with_best(with_best(rows))) == len(rows) + 2  # never added twice


def test_a_new_fused_registry_entry_competes_without_an_edit_under_study(monkeypatch):
    new = methods.Method("fa_new", "a new fused kernel", True, methods.eager_attention)
    monkeypatch.setitem(methods.METHODS, "fa_new", new)
    rows = [_row("tiledattention", 1.0), _row("cudnn", 0.9), _row("fa_new", 0.7)]
    assert _best(rows)["p1"]["best_of"]["kernel"] == "fa_new"
    t = tables.headline(rows)
    first = t.rows[0]
    assert first[0] == "fastest fused baseline, all points" and first[-1] == "fa_new 1"
    assert first[3] == pytest.approx(0.7)


def _study():
    rows = []
    for d, (ours, cudnn, flash) in ((64, (1.0, 0.9, 1.2)), (128, (1.0, 1.3, 1.1))):
        p = f"d{d}"
        rows += [_row("tiledattention", ours, 100 * ours, point=p, head_dim=d),
                 _row("cudnn", cudnn, 100 * cudnn, point=p, head_dim=d),
                 _row("flash", flash, 100 * flash, point=p, head_dim=d),
                 _row("tiledattention", 3 * ours, point=p, head_dim=d, pass_="fwd+bwd"),
                 _row("cudnn", 3 * cudnn, point=p, head_dim=d, pass_="fwd+bwd")]
    return rows


def test_the_headline_table_and_the_readme_sentence_come_from_the_same_lines():
    rows = _study()
    lines = headline.lines(rows)
    best = lines[0]
    assert (best.baseline, best.pass_, best.head_dim) == (BEST, "fwd", None)
    assert best.kernel.geomean == pytest.approx((0.9 * 1.1) ** 0.5)  # cudnn at D64, flash at D128
    assert best.fastest == {"cudnn": 1, "flash": 1}
    t = tables.headline(rows)
    assert [ln.cells() for ln in lines] == t.rows
    text = prose.headline(rows, {"gpu": {"name": "GPU X"}})
    assert text.startswith(f"Measured on GPU X: tiledattention reaches a geometric mean of "
                           f"{best.kernel.geomean:.3f}x the throughput of the fastest fused "
                           "baseline at each point (by kernel time cudnn at 1, flash at 1)")
    train = next(ln for ln in lines if (ln.baseline, ln.pass_) == (BEST, "fwd+bwd"))
    assert f"{train.kernel.geomean:.3f}x the fastest fused baseline" in text
    assert "fastest fused, D=128" in [r[0] for r in t.rows]


def test_without_a_fused_baseline_the_headline_reports_no_ratio():
    rows = [_row("tiledattention", 1.0), _row("eager", 3.0)]
    assert "never both ok" in prose.headline(rows, {})
    assert [r[0] for r in tables.headline(rows).rows] == ["eager attention"]
