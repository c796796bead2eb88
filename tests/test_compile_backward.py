"""The backward kernels compile with tileiras for Hopper and Blackwell, no GPU needed.

A slice in which every compile-time flag of the three backward kernels takes each of its
values at least once on sm_90 (dtype, causal, even key tail, the three mask layouts, the
LSE gradient, one to three head-dim chunks, dQ by kernel or by atomics, queries or keys as
the dK/dV program's MMA rows), and a smaller
slice for sm_100 and sm_120, each into a fresh cuTile cache (tests/conftest.py). The full
dtype x causal x mask x D matrix (60 variants) would take over an hour per target on CI's
two cores.
"""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention.kernel.spec import DELTA, DKDV, DQ  # noqa: E402
from tiledattention.kernel.toolchain import (  # noqa: E402
    SASS_MISSING,
    sass_tool,
    tileiras_path,
)
from tiledattention.kernel.variant import BOOL_MASK, BwdVariant, mask_axes_for  # noqa: E402
from tiledattention.schedules.backward import BwdSchedule, default_bwd_schedule  # noqa: E402

KERNELS = tuple(s.name for s in (DELTA, DKDV, DQ))

if tileiras_path() is None:
    pytest.skip("tileiras not found: pip install 'cuda-tile[tileiras]'", allow_module_level=True)

EM_CUDA = 190
REDUCE_128 = "kv64x128_q128x64_o1_w8_atomic"
REDUCE_256 = "kv64x64_q64x64_o1_w8_atomic"
KEY_ROWS_128 = REDUCE_128 + "_keyrows"


def variant(dtype, d, causal, mask="none", *, even=True, dlse=False, schedule=None,
            one_head=True, bool_mask=False):
    mask_dtype = None if mask == "none" else BOOL_MASK if bool_mask else dtype
    return BwdVariant(dtype, d, causal, schedule or default_bwd_schedule(d, causal),
                      even_n=even, mask_dtype=mask_dtype,
                      mask_axes=mask_axes_for(mask), has_dlse=dlse, one_head=one_head)


HOPPER = [
    variant("float16", 64, False),
    variant("float16", 96, True, even=False),
    variant("bfloat16", 160, False, "full", dlse=True),
    variant("bfloat16", 128, True, "key_padding", even=False),
    variant("bfloat16", 128, True, "full", even=False, bool_mask=True),  # a bool mask's bytes
    variant("float16", 96, False, "key_padding", bool_mask=True,  # read transposed
            schedule=BwdSchedule.from_label("kv64x128_q128x64_o1_w8_keyrows")),
    variant("float16", 120, True, "full"),  # three chunks, the last padded
    variant("float16", 256, False, even=False, one_head=False),  # GQA: the loop over heads
    variant("bfloat16", 96, True, schedule=BwdSchedule(dq="atomic")),
    # the tuning space's occupancy-2 schedules (schedules.backward.BWD_QUICK_SPACE)
    variant("float16", 128, False, schedule=BwdSchedule.from_label("kv128x64_q64x128_o2")),
    variant("bfloat16", 64, True, schedule=BwdSchedule.from_label("kv64x128_q128x64_o2")),
    # dQ by TMA reduce-add (issue 37): 128-key programs over two warp groups; D = 256 (its
    # 256-wide chunk reduced as two 128-wide boxes) with a key tail
    variant("bfloat16", 128, True, schedule=BwdSchedule.from_label(REDUCE_128)),
    variant("float16", 256, False, even=False, schedule=BwdSchedule.from_label(REDUCE_256)),
    # keys as the dK/dV MMA rows (S^T = K Q^T): reduce-add, and the seven-matmul program
    # with two chunks, a key tail and a full additive mask (read transposed)
    variant("bfloat16", 128, False, schedule=BwdSchedule.from_label(KEY_ROWS_128)),
    variant("float16", 96, True, "full", even=False,
            schedule=BwdSchedule.from_label("kv64x128_q128x64_o1_w8_keyrows")),
]
BLACKWELL = [HOPPER[1], HOPPER[2]]
CASES = ([(v, "sm_90") for v in HOPPER] + [(v, t) for t in ("sm_100", "sm_120")
                                             for v in BLACKWELL])


def test_the_slice_covers_every_flag_value():
    seen: dict[str, set] = {}
    for v in HOPPER:
        for k in KERNELS:
            for name, value in v.constants(k).items():
                seen.setdefault(f"{k}.{name}", set()).add(value)
    for key in ("CAUSAL", "EVEN_N", "HAS_MASK", "MASK_ROWS", "MASK_BOOL", "DQ_ATOMIC",
                "KEY_ROWS", "ONE_HEAD"):
        assert seen[f"attention_bwd_dkdv.{key}"] == {False, True}, key
    assert seen["attention_bwd_dkdv.NCHUNK"] == {1, 2, 3}
    assert seen["attention_bwd_delta.HAS_DLSE"] == {False, True}
    assert seen["attention_bwd_delta.ZERO_DQ"] == {False, True}
    assert seen["attention_bwd_dq.HAS_DLSE"] == {False, True}
    assert seen["attention_bwd_dq.DELTA"] == {False, True}


def test_backward_constants_are_the_kernels_constant_parameters():
    v = HOPPER[2]
    for spec in (DELTA, DKDV, DQ):
        assert set(v.constants(spec.name)) == spec.constants()


@pytest.mark.compile
@pytest.mark.parametrize("v,target", CASES, ids=lambda x: x.label() if hasattr(x, "label") else x)
def test_backward_kernels_compile_to_cuda_cubins(v, target):
    from tiledattention.kernel.compile import export_bwd_cubins

    cubins = export_bwd_cubins(v, target)
    assert set(cubins) == set(KERNELS)
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", f"{name}: not an ELF file"
        (machine,) = struct.unpack_from("<H", cubin, 18)
        assert machine == EM_CUDA, f"{name}: ELF machine {machine}"
        assert name.encode() in cubin


@pytest.mark.compile
def test_dq_reduce_add_compiles_to_tma_reductions_without_spills():
    """The five-matmul dK/dV program adds dQ with UTMAREDG (cp.reduce.async.bulk.tensor),
    keeps its warp-group MMAs, and neither emits per-element atomics nor spills (read from
    the sm_90 SASS; needs cuobjdump and nvdisasm, e.g. pip nvidia-cuda-cuobjdump)."""
    from tiledattention.kernel.compile import export_bwd_cubins

    cuobjdump = sass_tool()
    if cuobjdump is None:
        pytest.skip(SASS_MISSING)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bwd_sass import sass_counts

    v = variant("bfloat16", 128, False, schedule=BwdSchedule.from_label(REDUCE_128))
    counts = sass_counts(export_bwd_cubins(v, "sm_90")["attention_bwd_dkdv"], cuobjdump)
    assert counts["UTMAREDG"] > 0 and counts["HGMMA"] > 0, counts
    assert counts["ATOMG"] == counts["REDG"] == 0, counts
    assert counts["STL"] == counts["LDL"] == 0, counts


def _sass_tools():
    import sys
    from pathlib import Path

    cuobjdump = sass_tool()
    if cuobjdump is None:
        pytest.skip(SASS_MISSING)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bwd_sass

    return cuobjdump, bwd_sass


@pytest.mark.compile
@pytest.mark.parametrize("label", (REDUCE_128, "kv64x128_q128x64_o1_w8"))
def test_keys_as_rows_drop_the_transposes_of_p_and_ds_from_each_step(label):
    """With keys as the dK/dV MMA rows, P^T and dS^T leave their MMAs as the row operands
    of dV and dK: one step of the query loop stores and loads less shared memory, has no
    byte permutes (the transposes' repacking) and fewer CTA barriers, keeps its warp-group
    MMAs with the row operand of dV and dK in registers, and spills nothing (sm_90 SASS,
    D = 128 bf16, read with benchmarks/bwd_sass.py)."""
    from tiledattention.kernel.compile import export_bwd_cubins

    cuobjdump, bwd_sass = _sass_tools()
    step, whole = {}, {}
    for rows in ("", "_keyrows"):
        v = variant("bfloat16", 128, False, schedule=BwdSchedule.from_label(label + rows))
        cubin = export_bwd_cubins(v, "sm_90")["attention_bwd_dkdv"]
        whole[rows] = bwd_sass.sass_counts(cubin, cuobjdump)
        step[rows] = bwd_sass.step_counts(bwd_sass.disassemble(cubin, cuobjdump)[0])
    queries, keys = step[""], step["_keyrows"]
    assert queries["PRMT"] > 0 and keys["PRMT"] == 0, (queries, keys)
    assert keys["STS"] + keys["STSM"] < queries["STS"] + queries["STSM"], (queries, keys)
    assert keys["BAR"] < queries["BAR"], (queries, keys)
    assert keys["HGMMA_REG"] == queries["HGMMA_REG"] > 0, (queries, keys)
    assert whole["_keyrows"]["STL"] == whole["_keyrows"]["LDL"] == 0, whole
