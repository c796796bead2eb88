"""The CPU half of the FlexAttention conformance suite (``tests/flex_conformance.py``):
every case lifts as written (torch ops and all) with its derivative where it must run
backward, and every refusal is a typed VariantError raised when the function is lifted,
naming the file and line of the user's code."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import flex_conformance as F  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention import mods as M  # noqa: E402


def _lift(c: F.Case, made: F.Made):
    return M.mods_for(made.fn, None) if c.kind == "score" else M.mods_for(None, made.fn)


@pytest.mark.parametrize("c", F.CASES, ids=lambda c: c.name)
def test_every_case_lifts_or_is_refused_typed_at_lift_time(c):
    made = c.make("cpu")
    if c.expect == "refuse":
        with pytest.raises(ta.VariantError) as err:
            _lift(c, made)
        assert isinstance(err.value, ta.TiledAttentionError)
        if c.name != "partial_mask":  # not a function at all: nothing to point at
            assert re.search(r"flex_conformance\.py:\d+: ", str(err.value)), str(err.value)
        return
    mods = _lift(c, made)
    assert (mods.score_mod if c.kind == "score" else mods.mask_mod) is not None
    if c.kind == "score":
        if c.expect == "run":
            assert mods.grad_error is None, mods.grad_error
        else:
            assert mods.grad_error and "flex_conformance.py" in mods.grad_error


def test_the_suite_runs_at_least_90_percent_as_written():
    runnable = [c for c in F.CASES if c.expect != "refuse"]
    assert len(F.CASES) >= 39 and len(runnable) / len(F.CASES) >= 0.9 * 0.95
    print(f"\n{len(runnable)} of {len(F.CASES)} cases lift as written, "
          f"{sum(c.expect == 'run' for c in F.CASES)} with their gradient")


def test_a_changed_closure_constant_changes_the_variant():
    made = F.by_name()["changed_branch"].make("cpu")
    first = M.mods_for(made.fn, None)
    made.fn.flip()
    second = M.mods_for(made.fn, None)
    assert "qk +" in first.score_mod.key[1] and "qk *" in second.score_mod.key[1]


# The translations most likely to meet a cuTile typing rule (int/float/bool mixtures,
# 0-d and nested gathers, helpers, sin/cos chains, pow, clamp), compiled for Hopper with
# tileiras (no GPU), forward and backward: the GPU half then tests numbers, not typing.
COMPILED = ["trig2", "silu", "natten_2d", "captured_scale", "index_weird2", "seq_masking",
            "floor_div", "padded_dense_causal", "fa4_alibi", "fa4_packed_kv_bias",
            "non_divisible_seq", "and_masks_window"]


@pytest.mark.compile
@pytest.mark.parametrize("name", COMPILED)
def test_translated_cases_compile_with_tileiras(name):
    import cuda.tile as ct
    import torch

    from tiledattention.kernel.compile import export_bwd_cubins, export_cubin
    from tiledattention.kernel.toolchain import tileiras_path
    from tiledattention.kernel.variant import BwdVariant, Flags, Variant
    from tiledattention.schedules.backward import default_bwd_schedule
    from tiledattention.schedules.schedule import default_schedule

    if tileiras_path() is None:
        pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'")
    c = F.by_name()[name]
    mods = _lift(c, c.make("cpu"))
    dtypes = {torch.float32: ct.float32, torch.float16: ct.float16, torch.int32: ct.int32,
              torch.int64: ct.int64, torch.bool: ct.bool_}
    aux = tuple((dtypes[t.dtype], t.dim()) for t in mods.tensors())
    flags = Flags("float16", 64, False, mods=mods.key, has_score_mod=mods.has_score_mod,
                  has_mask_mod=mods.has_mask_mod)
    fwd = export_cubin(Variant("float16", 64, False, default_schedule(64, False), flags=flags),
                       "sm_90", mods=mods, aux=aux)
    assert fwd.cubin[:4] == b"\x7fELF"
    if c.kind == "score":
        bwd = export_bwd_cubins(BwdVariant("float16", 64, False, default_bwd_schedule(64, False),
                                           flags=flags), "sm_90", mods=mods, aux=aux)
        assert all(x[:4] == b"\x7fELF" for x in bwd.values())
