"""docs/API.md, "Writing your own variant": its three blocks as written. On a CPU: the variant's
gradient is derived, and as a variants-stage entry its eager and SDPA-mask rows pass the
harness' float64 check (ours and FlexAttention need a GPU: those rows say so). The GPU half
is tests/gpu/test_readme_variant_gpu.py."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import torch  # noqa: E402
from readme_blocks import install_module  # noqa: E402  (tests/readme_blocks.py)

from tiledattention.bench import variant_cases as registry  # noqa: E402
from tiledattention.bench.runner import run_point  # noqa: E402
from tiledattention.bench.variant_cases import VariantPoint  # noqa: E402
from tiledattention.stages import stage_from_dict  # noqa: E402


def test_the_readme_has_the_module_the_test_and_the_stage_entry():
    from readme_blocks import blocks

    module, test, entry = blocks()
    assert "def distance_decay(alpha: float)" in module
    assert "def test_distance_decay_matches_float64_forward_and_gradients" in test
    assert 'DECAY = Variant("decay"' in entry


def test_the_readme_variant_gets_a_derived_gradient(tmp_path, monkeypatch):
    _, test, _ = install_module(tmp_path, monkeypatch)
    scope: dict = {}
    exec(compile(test, "README test block", "exec"), scope)  # noqa: S102
    scope["test_distance_decay_gradient_is_derived"]()


def test_the_readme_stage_entry_measures_eager_and_sdpa_mask_against_float64(
        tmp_path, monkeypatch):
    _, _, entry = install_module(tmp_path, monkeypatch)
    scope = dict(vars(registry))  # the block is written to sit in bench/variant_cases.py
    exec(compile(entry, "README stage block", "exec"), scope)  # noqa: S102
    monkeypatch.setattr(registry, "VARIANTS", {**registry.VARIANTS, "decay": scope["DECAY"]})
    registry._parts.cache_clear()
    cfg = stage_from_dict("variants", {"warmup": 0, "reps": 1, "rounds": 1}).bench_config()
    methods = ["tiledattention", "flex", "sdpa_mask", "eager"]
    for pass_ in ("fwd", "fwd+bwd"):
        point = VariantPoint("float32", True, 16, 64, 64, 2, 2, 1, pass_, variant="decay")
        rows = {r["method"]: r for r in run_point(point, methods, cfg, torch.device("cpu"),
                                                  None)}
        for m in ("sdpa_mask", "eager"):
            assert rows[m]["status"] == "ok" and rows[m]["correct"], rows[m]
            assert pass_ == "fwd" or rows[m]["grads_correct"], rows[m]
        for m in ("tiledattention", "flex"):
            assert rows[m]["status"] == "unavailable", rows[m]
            assert "needs a CUDA GPU" in rows[m]["reason"]
    registry._parts.cache_clear()
