"""The headline by head shape and dtype (study/presentation/headline.py ``by_shape``): per
stage, pass, head shape and dtype, the points where TiledAttention is the only method that
ran (each other method's refusal named) and where it leads or trails the fastest fused
baseline (geomean, naming the baseline); one table (``headline_shapes``) and the bundle
README's two sentences render the same lines. Synthetic rows here; the committed
references' groups recompute from their rows by plain arithmetic."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from tiledattention.study.presentation import headline as hl
from tiledattention.study.presentation import tables
from tiledattention.study.presentation.standing import GIST, refusal
from tiledattention.study.publication.metadata import Publication
from tiledattention.study.publication.prose import readme_text

ROOT = Path(__file__).resolve().parent.parent
FP8 = "float8_e4m3fn"


def _row(method, ms=None, *, d=128, dv=None, dtype="bfloat16", point=None, pass_="fwd",
         status="ok", reason=None):
    key = point or f"{dtype}-d{d}" + (f"v{dv}" if dv else "")
    r = {"point_key": key, "method": method, "status": status, "pass": pass_, "dtype": dtype,
         "causal": False, "head_dim": d, "seq_q": 4096, "seq_kv": 4096, "batch": 1,
         "heads": 16, "gqa": 1}
    if dv is not None:
        r["head_dim_v"] = dv
    if ms is not None:
        r["time_ms"] = {"median_ms": ms}
    if reason:
        r["reason"] = reason
    return r


def _only_ours_rows():
    """D 128: every method ran; D 512 and 576/512: FA4 and torch's flash backend refuse the
    head dim; FP8: only ours has the forward here, cuDNN's frontend is unavailable."""
    rows = [_row("tiledattention", 1.0), _row("fa4", 0.8), _row("flash", 1.2)]
    for d, dv in ((512, None), (576, 512)):
        shape = f"{d}" if dv is None else f"{d}/{dv}"
        rows += [_row("tiledattention", 2.0, d=d, dv=dv),
                 _row("fa4", d=d, dv=dv, status="unsupported",
                      reason=f"FA4 on sm_90 takes head dims 8..256, not {shape}"),
                 _row("flash", d=d, dv=dv, status="unsupported",
                      reason="torch's FLASH_ATTENTION backend takes head dims that are "
                             f"multiples of 8 up to 256, not {d}")]
    rows += [_row("tiledattention", 0.7, dtype=FP8),
             *[_row(m, dtype=FP8, status="unsupported",
                    reason=f"{m} has no FP8 (e4m3) forward here; its bfloat16 row of the "
                           "same shape is the comparison") for m in ("fa4", "flash")],
             _row("cudnn_fe", dtype=FP8, status="unavailable",
                  reason="sdpa fp8 forward with HALF/BFLOAT16 output is only supported on "
                         "Blackwell")]
    return rows


def test_a_refusal_is_the_status_and_the_first_clause_of_the_reason_without_its_name():
    assert refusal(None) == "no row"
    assert refusal(_row("fa4", status="unsupported")) == "unsupported"
    assert refusal(_row("flash", status="unsupported", reason="flash has no FP8 (e4m3) "
                        "forward here; its bfloat16 row")) == \
        "unsupported (has no FP8 (e4m3) forward here)"
    assert refusal(_row("fa4", status="unsupported", reason="FA4 on sm_90 takes head dims "
                        "8..256, not 512")) == "unsupported (on sm_90 takes head dims 8..256, " \
                                               "not 512)"
    long = refusal(_row("x", status="error", reason="word " * 40))
    assert long.startswith("error (word word") and long.endswith(" word…)")
    assert len(long) <= len("error ()") + GIST + 1


def test_each_group_where_only_ours_ran_names_the_refused_methods():
    found = {ln.label: ln for ln in hl.by_shape(_only_ours_rows())}
    assert not found["forward D=128 bfloat16"].alone  # every method ran there
    d512 = found["forward D=512 bfloat16"]
    assert [k for k, _ in d512.alone] == ["bfloat16-d512"] and d512.kernel.n == 0
    assert found["forward D=576/512 bfloat16"].alone[0][1]["fa4"] == \
        "unsupported (on sm_90 takes head dims 8..256, not 576/512)"
    fp8 = found[f"forward D=128 {FP8}"]
    assert hl._refused(fp8) == ("fa4, flash unsupported (has no FP8 (e4m3) forward here); "
                                "cudnn_fe unavailable (sdpa fp8 forward with HALF/BFLOAT16 "
                                "output is only supported on Blackwell)")
    assert hl.alone_sentence(list(found.values())) == (  # by head shape, then dtype
        f"Only tiledattention ran at 3 points: forward D=128 {FP8} at 1 ({hl._refused(fp8)}); "
        "forward D=512 bfloat16 at 1 (fa4 unsupported (on sm_90 takes head dims 8..256, not "
        "512); flash unsupported (torch's FLASH_ATTENTION backend takes head dims that are "
        "multiples of 8 up to…)); forward D=576/512 bfloat16 at 1 (fa4 unsupported (on sm_90 "
        "takes head dims 8..256, not 576/512); flash unsupported (torch's FLASH_ATTENTION "
        "backend takes head dims that are multiples of 8 up to…)).")


def test_the_table_and_the_readme_render_the_same_groups():
    rows = _only_ours_rows()
    t = hl.shape_table(rows)
    assert t.name == "headline_shapes" and "headline_shapes" in tables.NAMES
    assert [r[0] for r in t.rows] == [ln.label for ln in hl.by_shape(rows)]
    by = {r[0]: r for r in t.rows}
    assert by["forward D=512 bfloat16"][6:9] == ["—", "—", 1]
    assert by["forward D=128 bfloat16"][6:9] == ["trails", "fa4 1", 0]
    text = readme_text(Publication(), rows, {}, "", "config/c.yaml", (0, "abc"),
                       wheel="source/x.whl")
    headline = text.split("## What was measured", 1)[0]
    assert hl.alone_sentence(hl.by_shape(rows)) in headline
    assert hl.lead_sentence(hl.by_shape(rows)) in headline


def _lead_trail_rows():
    """D 64: ours 2x cuDNN (the fastest) and 1.25x; D 128: 0.5x FA4; forward+backward at D
    64 trails: never mixed with the forward."""
    rows = []
    for i, (ours, cudnn, fa4) in enumerate(((1.0, 2.0, 3.0), (1.0, 1.25, 4.0))):
        p = f"d64-{i}"
        rows += [_row("tiledattention", ours, d=64, point=p), _row("cudnn", cudnn, d=64, point=p),
                 _row("fa4", fa4, d=64, point=p),
                 _row("tiledattention", 4 * ours, d=64, point=p + "-fwdbwd", pass_="fwd+bwd"),
                 _row("fa4", 2 * ours, d=64, point=p + "-fwdbwd", pass_="fwd+bwd")]
    rows += [_row("tiledattention", 2.0, point="d128"), _row("fa4", 1.0, point="d128"),
             _row("cudnn", 1.5, point="d128")]
    return rows


def test_each_group_leads_or_trails_by_its_geomean_naming_the_fastest_baseline():
    found = {ln.label: ln for ln in hl.by_shape(_lead_trail_rows())}
    lead, trail, train = (found["forward D=64 bfloat16"], found["forward D=128 bfloat16"],
                          found["forward+backward D=64 bfloat16"])
    assert lead.kernel.geomean == pytest.approx(math.sqrt(2.0 * 1.25))
    assert (hl.standing_word(lead), lead.fastest) == ("leads", {"cudnn": 2})
    assert (trail.kernel.geomean, hl.standing_word(trail), trail.fastest) == (
        0.5, "trails", {"fa4": 1})
    assert (train.kernel.geomean, hl.standing_word(train)) == (0.5, "trails")
    assert hl.lead_sentence(list(found.values())) == (
        "By head shape and dtype against the fastest fused baseline (geometric mean by kernel "
        "time), tiledattention leads in 1 of 3 groups (forward D=64 bfloat16 1.581x over "
        "cudnn) and trails in 2 (forward D=128 bfloat16 0.500x behind fa4; forward+backward "
        "D=64 bfloat16 0.500x behind fa4) (every group: tables/headline_shapes).")
    assert hl.alone_sentence(list(found.values())) == ""  # nothing to say: no sentence


def test_no_rows_say_nothing():
    assert hl.by_shape([]) == [] and hl.shape_sentences([], []) == []
    assert hl.shape_table([]).rows == []


@pytest.mark.parametrize("system", ["h100", "h200"])
def test_each_reference_groups_geomean_recomputes_from_the_committed_rows(system):
    from tiledattention.bench.methods import METHODS

    fused = {m.name for m in METHODS.values() if m.fused and m.name != "tiledattention"}
    with gzip.open(ROOT / "results" / "reference" / system / "data" / "rows.jsonl.gz",
                   "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    ours, best = {}, {}
    for r in rows:
        if r["status"] != "ok":
            continue
        g = (r.get("pass", "fwd"), r["head_dim"], r["dtype"])
        t = r["time_ms"]["median_ms"]
        if r["method"] == "tiledattention":
            ours[(g, r["point_key"])] = t
        elif r["method"] in fused:
            best[(g, r["point_key"])] = min(t, best.get((g, r["point_key"]), math.inf))
    by_group: dict[tuple, list[float]] = {}
    for k, t in ours.items():
        by_group.setdefault(k[0], []).append(best[k] / t)
    lines = hl.by_shape(rows)
    assert len(lines) == len(by_group) and not any(ln.alone for ln in lines)
    for ln in lines:
        v = by_group[(ln.pass_, ln.head_dim, ln.dtype)]
        assert ln.kernel.n == len(v)
        assert ln.kernel.geomean == pytest.approx(math.exp(sum(map(math.log, v)) / len(v)),
                                                  rel=1e-12)
