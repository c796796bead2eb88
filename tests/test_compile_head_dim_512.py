"""The forward-only head dims past 256 (D 512, MLA decode's (576, 512), 384) compile with
tileiras for Hopper and Blackwell with their default schedule (64x64, 8 worker warps), no
GPU needed; on sm_90 without a spill where cuobjdump is found (benchmarks/repro/
d512_forward.py has the candidates that spill)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.compile import export_combine_cubin, export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    cuobjdump_text,
    sass_tool,
    tileiras_path,
)  # noqa: E402
from tiledattention.kernel.variant import Variant  # noqa: E402
from tiledattention.schedules.schedule import default_schedule  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)

CUOBJDUMP = sass_tool()  # tiledattention[dev] installs it


def variant(dqk, dv, causal, **kw):
    return Variant("bfloat16", dqk, causal, default_schedule(max(dqk, dv), causal),
                   head_dim_v=None if dv == dqk else dv, return_lse=True, **kw)


def stack_and_registers(cubin: bytes) -> tuple[int, int]:
    res = cuobjdump_text(cubin, "-res-usage")
    return (int(re.search(r"STACK:(\d+)", res).group(1)),
            int(re.search(r"REG:(\d+)", res).group(1)))


@pytest.mark.compile
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("target", ["sm_90", "sm_100", "sm_120"])
def test_d512_forward_compiles(causal, target):
    cubin = export_cubin(variant(512, 512, causal), target).cubin
    assert cubin[:4] == b"\x7fELF" and b"attention_fwd" in cubin


@pytest.mark.compile
@pytest.mark.parametrize("dqk,dv,causal", [(512, 512, True), (576, 512, False),
                                           (384, 384, True)])
def test_wide_forward_does_not_spill_on_hopper(dqk, dv, causal):
    if CUOBJDUMP is None:
        pytest.skip(SASS_MISSING)
    stack, regs = stack_and_registers(export_cubin(variant(dqk, dv, causal), "sm_90").cubin)
    assert stack == 0 and regs <= 168  # 8 worker warps + producer: 168 at launch


@pytest.mark.compile
def test_mla_decode_compiles_split_and_packed_with_its_combine():
    # MLA decode: the query heads packed into the one latent K/V head's rows, keys split;
    # the combine runs over D_v 512 in 16-row tiles.
    cubin = export_cubin(variant(576, 512, False, split_k=True, packed=True), "sm_90").cubin
    assert cubin[:4] == b"\x7fELF"
    assert export_combine_cubin("bfloat16", 512, True, "sm_90")[:4] == b"\x7fELF"
    if CUOBJDUMP is not None:
        assert stack_and_registers(cubin)[0] == 0
