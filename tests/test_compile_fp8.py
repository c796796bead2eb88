"""The FP8 forward compiles with tileiras for Hopper (no GPU needed): at D 64, 128 and 256
(128x128 on 8 worker warps) both products are e4m3 warp-group MMAs (QGMMA ... E4M3), the
loads are TMA and nothing spills, read from the sm_90 SASS where cuobjdump is found
(benchmarks/notes/head-shapes.md §40h)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.compile import export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    cuobjdump_text,
    sass_tool,
    tileiras_path,
)  # noqa: E402
from tiledattention.kernel.variant import Variant  # noqa: E402
from tiledattention.schedules.schedule import default_fp8_schedule  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)

CUOBJDUMP = sass_tool()  # tiledattention[dev] installs it


def fp8_variant(d, causal, *, even=True, lse=True, out="bfloat16"):
    return Variant("float8_e4m3fn", d, causal, default_fp8_schedule(d, causal), even_n=even,
                   return_lse=lse, out_dtype=out)


def sass_and_resources(cubin: bytes) -> tuple[str, str]:
    return cuobjdump_text(cubin, "-sass"), cuobjdump_text(cubin, "-res-usage")


@pytest.mark.compile
@pytest.mark.parametrize("d,causal,even,out", [(64, False, True, "bfloat16"),
                                               (128, True, False, "float16"),
                                               (256, True, True, "bfloat16")])
def test_fp8_forward_runs_both_products_on_e4m3_mmas_without_spilling(d, causal, even, out):
    cubin = export_cubin(fp8_variant(d, causal, even=even, out=out), "sm_90").cubin
    assert cubin[:4] == b"\x7fELF" and b"attention_fwd_fp8" in cubin
    if CUOBJDUMP is None:
        pytest.skip(SASS_MISSING)
    sass, res = sass_and_resources(cubin)
    mmas = re.findall(r"\b([QH]GMMA\.\w+(?:\.\w+)*)", sass)
    # Q K^T (64 x keys) and P V (64 x D): fp8 on both, no bf16/fp16 MMA left
    assert mmas and all(m.startswith("QGMMA") and m.endswith("E4M3.E4M3") for m in mmas), mmas
    assert any(f"x{min(d, 256)}x32" in m for m in mmas), mmas  # P V over D
    assert "UTMALDG" in sass  # TMA loads: 16-byte strides of the 1-byte arrays
    assert not re.search(r"\b(STL|LDL)\b", sass)
    assert int(re.search(r"STACK:(\d+)", res).group(1)) == 0
    assert int(re.search(r"REG:(\d+)", res).group(1)) <= 168


@pytest.mark.compile
@pytest.mark.parametrize("d,s", [(64, 4096), (96, 1000), (256, 1000)])
def test_the_v_transpose_compiles_without_local_memory(d, s):
    # the copy that replaced torch's 1-byte transpose (benchmarks/notes/head-shapes.md
    # §42g): the permute stays on chip (shared memory, no STL/LDL); D 96 pads to 128
    from tiledattention.kernel.compile import export_transpose_cubin

    cubin = export_transpose_cubin(d, s, "sm_90")
    assert cubin[:4] == b"\x7fELF" and b"keys_last" in cubin
    if CUOBJDUMP is None:
        pytest.skip(SASS_MISSING)
    sass, res = sass_and_resources(cubin)
    assert re.search(r"\bLDG\.E", sass) and re.search(r"\bSTG\.E", sass)
    assert not re.search(r"\b(STL|LDL)\b", sass)
    assert int(re.search(r"STACK:(\d+)", res).group(1)) == 0
