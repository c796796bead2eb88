"""D_qk != D_v (V's head dim differs from Q/K's, as torch's SDPA allows; MLA's (192, 128))
forward kernels compile with tileiras for Hopper and Blackwell, no GPU needed: causal and
not, GQA packing with split-K (decode), into a fresh cuTile cache (tests/conftest.py)."""

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
