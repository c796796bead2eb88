"""The variants stage on a CUDA GPU: a small grid through the harness, every variant; ours
is ok and correct (outputs and gradients against float64) at every point, FlexAttention is
ok or says why it cannot run, SDPA + mask runs every variant a mask expresses."""

from __future__ import annotations

from tiledattention.bench.variant_cases import VARIANT_NAMES
from tiledattention.stages import stage_from_dict
from tiledattention.stages.variants import load_rows, run_variants
from tiledattention.study.presentation.variants_report import ratio_rows


def test_a_small_stage_measures_every_variant_correctly(tmp_path):
    cfg = stage_from_dict("variants", {"seqs": [512], "head_dims": [64], "dtypes":
                                       ["bfloat16"], "tokens": 1024, "width": 256,
                                       "warmup": 1, "reps": 2, "rounds": 1})
    out = run_variants(cfg, str(tmp_path))
    assert out["status"] == "ok", out  # "incomplete": which rows are missing, and why
    rows = load_rows(str(tmp_path))
    assert len(rows) == len(VARIANT_NAMES) * 2 * len(cfg.methods)
    for r in rows:
        m, st = r["method"], r["status"]
        if m == "tiledattention":
            assert st == "ok" and r["correct"], r
            assert r["pass"] == "fwd" or r["grads_correct"], r
        elif m == "flex":
            assert st == "ok" or (st == "unavailable" and r["reason"]), r
        elif m in ("fa4", "flex_flash"):  # not installed, or a variant FA4 cannot express
            assert st == "ok" or (st in ("unavailable", "unsupported") and r["reason"]), r
        elif m == "sdpa_mask":
            assert st == ("unsupported" if r["variant"] == "softcap" else "ok"), r
        else:
            assert st in ("ok", "unsupported"), r
    if all(r["status"] == "ok" for r in rows if r["method"] == "flex"):
        assert all(r["x_flex"] for r in ratio_rows(rows))
