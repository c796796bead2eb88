"""The model stage on a GPU: every phase of the tiny Llama (prefill, decode, the training
step, eager and compiled) gives an ok row with tokens/s for each implementation it times."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers not installed: pip install "
                    "'tiledattention[hf]'")

from tiledattention.stages import model as model_bench  # noqa: E402
from tiledattention.stages.model import model_from_dict  # noqa: E402


def test_every_phase_of_the_model_stage_measures_on_a_gpu(tmp_path):
    cfg = model_from_dict({"enabled": True, "batches": [1], "prompt": 256, "steps": 4,
                           "reps": 1})
    result = model_bench.run_model(cfg, str(tmp_path))
    rows = model_bench.load_rows(str(tmp_path))
    # FA4 (transformers' flash_attention_4) where it is installed; else its rows say why.
    fa4_missing = model_bench.impl_unavailable("fa4")
    bad = {(r["phase"], r["method"]): r.get("reason") for r in rows if r["status"] != "ok"
           and not (fa4_missing and r["method"] == "fa4")}
    assert result["status"] == "ok" and not bad, bad
    assert {(r["phase"], r["method"]) for r in rows} == {
        (ph, impl) for ph in cfg.phases for impl in model_bench.impls_of(ph)}
    assert all(r["tokens_per_s"] > 0 and len(r["times_ms"]) == 1 for r in rows
               if r["status"] == "ok")
    assert all(r["reason"] == fa4_missing for r in rows if r["status"] != "ok")
