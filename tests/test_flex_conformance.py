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
from tiledattention.kernel import mods as M  # noqa: E402


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
