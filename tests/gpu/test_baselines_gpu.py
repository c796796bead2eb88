"""The newest baselines on a CUDA GPU, through the harness (``run_point``: each output and
its gradients checked against float64 before anything is timed, as ours): FlashAttention-4
(``fa4``), torch SDPA with FA4 as its flash impl (``sdpa_fa4``) and FlexAttention's FLASH
backend (``flex_flash``), forward and forward+backward at D 64..256, GQA and a decode point,
and every variant form FA4 and Flex FLASH express. Skipped, with the reason, where FA4 is not
importable (scripts/device-baselines.sh installs it on the device machine)."""

from __future__ import annotations

import pytest
import torch

from tiledattention.bench.config import from_dict
from tiledattention.bench.grid import Point
from tiledattention.bench.methods import fa4_import_error, sdpa_fa4_error
from tiledattention.bench.runner import run_point
from tiledattention.bench.variant_cases import VARIANT_NAMES, VARIANTS, VariantPoint, parts_for
from tiledattention.timing import L2Flusher


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch"
    return fa4_import_error()


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

CFG = {"timing": {"warmup": 1, "reps": 4, "rounds": 2}}


def _has_sdpa_fa4() -> bool:
    import torch.nn.attention as attn

    return hasattr(attn, "activate_flash_attention_impl") and \
        "FA4" in attn.list_flash_attention_impls()


def _rows(point, methods):
    cfg = from_dict({**CFG, "methods": methods})
    return {r["method"]: r for r in run_point(point, methods, cfg, torch.device("cuda"),
                                              L2Flusher())}


def _ok(row, pass_):
    assert row["status"] == "ok", (row["method"], row.get("reason"))
    assert row["correct"] and row["tflops"] > 0, row
    assert pass_ == "fwd" or row["grads_correct"], row


# (dtype, causal, D, Sq, Skv, B, H, GQA, pass)
POINTS = [
    ("bfloat16", False, 128, 1024, 1024, 2, 8, 1, "fwd"),
    ("float16", True, 64, 512, 512, 2, 8, 1, "fwd+bwd"),
    ("bfloat16", False, 256, 1024, 1024, 2, 8, 1, "fwd"),
    ("bfloat16", True, 256, 1024, 1024, 1, 8, 1, "fwd+bwd"),
    ("float16", False, 96, 512, 512, 2, 8, 1, "fwd+bwd"),
    ("bfloat16", True, 128, 1024, 1024, 2, 8, 4, "fwd+bwd"),  # GQA 4
    ("bfloat16", False, 128, 1, 4096, 4, 32, 4, "fwd"),  # decode, GQA 4
]


@pytest.mark.parametrize("spec", POINTS, ids=lambda s: "-".join(map(str, s)))
def test_fa4_and_sdpa_on_fa4_match_float64_beside_ours(spec):
    import torch.nn.attention as attn

    *shape, pass_ = spec
    point = Point(*shape, pass_)
    rows = _rows(point, ["tiledattention", "fa4", "sdpa_fa4"])
    _ok(rows["tiledattention"], pass_)
    _ok(rows["fa4"], pass_)
    assert rows["fa4"]["details"]["kwargs"] == {"causal": point.causal}
    if _has_sdpa_fa4() and sdpa_fa4_error() is None:
        _ok(rows["sdpa_fa4"], pass_)
        # The process-wide switch is undone once the method's calls are over.
        assert attn.current_flash_attention_impl() is None
    elif _has_sdpa_fa4():  # torch's FA4 impl cannot call this FA4 (4.0.0b36: 5 values)
        assert (rows["sdpa_fa4"]["status"], rows["sdpa_fa4"]["reason"]) == (
            "unavailable", sdpa_fa4_error())
    else:
        assert rows["sdpa_fa4"]["status"] == "unavailable" and rows["sdpa_fa4"]["reason"]


def test_fa4_refuses_a_head_dim_it_has_no_kernel_for_with_the_reason():
    point = Point("bfloat16", False, 264, 256, 256, 1, 2, 1, "fwd")
    rows = _rows(point, ["fa4"])
    assert rows["fa4"]["status"] == "unsupported" and "264" in rows["fa4"]["reason"]


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_each_variant_form_of_fa4_and_flex_flash_matches_float64_as_ours(name):
    point = VariantPoint("bfloat16", VARIANTS[name].causal, 128, 1024, 1024, 2, 4, 1,
                         "fwd+bwd", variant=name)
    rows = _rows(point, ["tiledattention", "fa4", "flex_flash"])
    _ok(rows["tiledattention"], "fwd+bwd")
    parts = parts_for(point, "cuda")
    if parts.fa4 is None:
        assert rows["fa4"]["status"] == "unsupported", rows["fa4"]
        assert rows["fa4"]["reason"] == parts.no_fa4
    else:
        _ok(rows["fa4"], "fwd+bwd")
    flex = rows["flex_flash"]
    if flex["status"] == "unavailable":  # a torch without the FLASH backend says so
        assert "FLASH backend" in flex["reason"], flex
        pytest.skip(flex["reason"])
    _ok(flex, "fwd+bwd")
