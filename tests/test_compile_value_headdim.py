"""D_qk != D_v (V's head dim differs from Q/K's, as torch's SDPA allows; MLA's (192, 128))
forward and backward kernels compile with tileiras for Hopper and Blackwell, no GPU
needed: causal and not, GQA packing with split-K (decode), the backward's GQA loop, keys
as rows and dQ by reduce-add, into a fresh cuTile cache (tests/conftest.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.compile import export_combine_cubin, export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import tileiras_path  # noqa: E402
from tiledattention.kernel.variant import Variant  # noqa: E402
from tiledattention.schedules.schedule import default_schedule  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)

# (D_qk, D_v, causal, target); the schedule is D_qk's (``validate.schedule_head_dim``).
CASES = [(192, 128, c, t) for c in (False, True) for t in ("sm_90", "sm_100", "sm_120")] + [
    (128, 64, c, t) for c in (False, True) for t in ("sm_90", "sm_100", "sm_120")]


@pytest.mark.compile
@pytest.mark.parametrize("dqk,dv,causal,target", CASES, ids=lambda x: str(x))
def test_value_head_dim_forward_compiles(dqk, dv, causal, target):
    v = Variant("bfloat16", dqk, causal, default_schedule(dqk, causal), head_dim_v=dv,
                return_lse=True)
    cubin = export_cubin(v, target).cubin
    assert cubin[:4] == b"\x7fELF" and b"attention_fwd" in cubin


@pytest.mark.compile
@pytest.mark.parametrize("dqk,dv", [(192, 128), (128, 64)])
def test_gqa_decode_of_a_value_head_dim_compiles_split_and_packed(dqk, dv):
    # GQA decode: query heads packed into one K/V head's rows, keys split (then the
    # combine kernel, which runs over V's head dim only).
    v = Variant("float16", dqk, False, default_schedule(dqk, False), head_dim_v=dv,
                split_k=True, packed=True, return_lse=True)
    assert export_cubin(v, "sm_90").cubin[:4] == b"\x7fELF"
    assert export_combine_cubin("float16", dv, True, "sm_90")[:4] == b"\x7fELF"


def _bwd_compiles(variant, target):
    from tiledattention.kernel.compile import export_bwd_cubins

    cubins = export_bwd_cubins(variant, target)
    assert sorted(cubins) == ["attention_bwd_delta", "attention_bwd_dkdv", "attention_bwd_dq"]
    assert all(c[:4] == b"\x7fELF" for c in cubins.values())


@pytest.mark.compile
@pytest.mark.parametrize("dqk,dv,causal,target", CASES, ids=lambda x: str(x))
def test_value_head_dim_backward_compiles(dqk, dv, causal, target):
    # The schedule the plan runs: Q/K's (``plan.choose_bwd_schedule``); delta, dQ and dK/dV.
    from tiledattention.kernel.variant import BwdVariant
    from tiledattention.schedules.backward import default_bwd_schedule

    _bwd_compiles(BwdVariant("bfloat16", dqk, causal, default_bwd_schedule(dqk, causal),
                             head_dim_v=dv), target)


@pytest.mark.compile
@pytest.mark.parametrize("dqk,dv", [(192, 128), (128, 64), (64, 128)])
def test_gqa_backward_of_a_value_head_dim_compiles_with_keys_as_rows_and_dq_reduce_add(dqk,
                                                                                      dv):
    # The other code paths V's chunks pass through: the dK/dV program's loop over a GQA
    # group, keys as the MMA rows (dP^T = V dO^T), dQ by reduce-add (the delta kernel
    # zeroing Q's columns of dQacc); (64, 128) a V wider than Q/K (V's default schedule).
    from tiledattention.kernel.variant import BwdVariant
    from tiledattention.schedules.backward import BwdSchedule

    s = BwdSchedule(64, 64, 64, 64, 1, dq="atomic", worker_warps=8, key_rows=True)
    _bwd_compiles(BwdVariant("float16", dqk, True, s, head_dim_v=dv, one_head=False),
                  "sm_90")
