"""The fused split-K forward (``FUSED_COMBINE``) compiles for Hopper, and its machine code
orders the partials as the design needs: plain stores (STG, not TMA) before a device-scope
release-acquire counter increment, plain loads (LDG) of the partials after it.

The SASS half needs cuobjdump (``pip download nvidia-cuda-cuobjdump==13.4.92 --no-deps``,
unzip, put its ``bin`` on PATH or in ``$CUOBJDUMP``); without it that test skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.compile import export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import tileiras_path  # noqa: E402
from tiledattention.kernel.variant import Variant  # noqa: E402
from tiledattention.schedules.schedule import Schedule, default_schedule  # noqa: E402

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)


def _fused(dtype="bfloat16", d=128, causal=False, **kw):
    return Variant(dtype, d, causal, kw.pop("schedule", default_schedule(d, causal)),
                   split_k=True, fused_combine=True, **kw)


# B1 GQA decode (packed, D 128); a key-padding mask with the LSE (D 96: two head-dim
# chunks); causal speculative decode on a 64x64 tile (D 256: the widest accumulators).
_CASES = [_fused(packed=True),
          _fused("float16", 96, mask_dtype="float16", mask_axes=(True, False, False),
                 return_lse=True),
          _fused("bfloat16", 256, True, schedule=Schedule(64, 64, 2), packed=True)]


@pytest.mark.compile
@pytest.mark.parametrize("variant", _CASES, ids=lambda v: v.label())
def test_the_fused_split_k_forward_compiles_for_sm90(variant):
    res = export_cubin(variant, "sm_90")
    assert res.cubin[:4] == b"\x7fELF" and b"attention_fwd_fused" in res.cubin


@pytest.mark.compile
@pytest.mark.parametrize("target", ["sm_100", "sm_120"])
def test_the_b1_gqa_fused_forward_compiles_for_blackwell(target):
    # The plan fuses on every GPU, so the default decode kernel must build there too.
    res = export_cubin(_CASES[0], target)
    assert res.cubin[:4] == b"\x7fELF" and b"attention_fwd_fused" in res.cubin


def _cuobjdump() -> str | None:
    return os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")


@pytest.mark.compile
def test_partials_are_plain_stores_released_and_acquired_by_the_counter():
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not on PATH (nor $CUOBJDUMP): the SASS cannot be read")
    cubin = export_cubin(_CASES[0], "sm_90").cubin
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    ops = [line.split("*/", 1)[1].strip() for line in sass.splitlines()
           if line.strip().startswith("/*") and "*/" in line and ";" in line]
    atom = next(i for i, op in enumerate(ops) if "ATOMG.E.ADD" in op)
    before, after = ops[:atom], ops[atom + 1:]
    assert "STRONG.GPU" in ops[atom]  # device scope
    assert any("MEMBAR.ALL.GPU" in op for op in before[-8:]), "no release fence"
    assert any("CCTL.IVALL" in op for op in after[:3]), "no acquire (L1 invalidate)"
    assert any("STG.E" in op for op in before), "partials not stored by plain stores"
    # The only TMA stores left are the final output's, after the combine.
    assert not any("UTMASTG" in op for op in before), "a partial stored by TMA"
    assert any("LDG.E" in op for op in after), "partials not loaded by plain loads"
    assert any("ATOMG.E.EXCH" in op for op in after), "the counter is not reset"
